"""`llmplan ui`'s server and JSON API, over HTTP (urllib) against a server on a free port:
the page's figures are `llmplan ... --json`'s for the same inputs, and the command line it
offers to copy gives that JSON; a bad value gets the CLI's own one-line error with its field;
a body over the limit is refused before it is read; garbage leaves the server serving."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="the ui extra (plotly) is not installed")

from planner.ui import api  # noqa: E402
from planner.ui.server import is_loopback  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BASE = {"model": "llama-3.1-8b", "gpu": "h100-sxm"}


@pytest.fixture(scope="module")
def url(ui_url):
    return ui_url


def post(url: str, path: str, body: object) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path.lstrip("/"), data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def cli(argv: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", *argv], capture_output=True,
                          text=True, cwd=cwd, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                                   "COLUMNS": "80"}, timeout=300)


def cli_json(command: str, cwd: Path = ROOT) -> dict:
    """The command line the page offers to copy, run: its JSON."""
    argv = shlex.split(command)
    assert argv[0] == "llmplan"
    r = cli(argv[1:], cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("fields", [
    {**BASE, "batch": "16"},
    {**BASE, "weights": "fp8", "kv_cache": "fp8", "tp": "2", "batch": "64",
     "prompt_tokens": "4096", "output_tokens": "512", "engine": "sglang"},
    {"model": "llama-3.1-70b", "gpu": "h100-sxm", "tp": "4", "pp": "2", "batch": "8"},
    {"model": "mixtral-8x7b", "gpu": "h100-sxm", "ep": "2", "tp": "2", "batch": "32"},
], ids=["8b", "fp8-tp2-sglang", "70b-pp2", "moe-ep2"])
def test_estimate_is_the_cli_json_and_its_command_gives_it(url, fields):
    status, r = post(url, "/api/estimate", {"fields": fields})
    assert status == 200, r
    assert r["command"].endswith(" --json")
    assert r["json"] == cli_json(r["command"])
    d = r["json"]
    assert d["batch"] == int(fields["batch"])
    assert "tpot_s_low" in d and d["operators"]["decode"]
    # the memory a GPU of the layout needs: a pipeline stage's, an EP GPU's, else the estimate's
    need = d["pipeline"]["max_memory_per_gpu_bytes"] if "pipeline" in d else \
        d["expert_parallel"]["total_bytes"] if "expert_parallel" in d else d["total_memory_bytes"]
    assert r["extra"]["memory_per_gpu_bytes"] == pytest.approx(need)
    assert r["extra"]["layout_section"] == ("pipeline" if "pipeline" in d else
                                            "expert_parallel" if "expert_parallel" in d else None)


@pytest.mark.parametrize(("field", "value"), [
    ("batch", "nan"), ("batch", "-3"), ("batch", "0"), ("prompt_tokens", "1.5"),
    ("tp", "3"), ("gpu", "no-such-gpu"), ("model", "no-such-model"), ("weights", "fp9"),
    ("output_tokens", "-1"), ("ep", "4"),
])
def test_a_bad_value_gets_the_cli_error_with_its_field(url, field, value):
    fields = {**BASE, field: value}
    status, r = post(url, "/api/estimate", {"fields": fields})
    assert status == 400
    expected = cli(["estimate", *api.argv_of("estimate", fields)])
    assert expected.returncode == 2
    assert r["error"] == expected.stderr.strip()
    assert r["field"] == field
    assert "Traceback" not in r["error"] and "\n" not in r["error"]


@pytest.mark.parametrize(("text", "field"), [
    ('{"hidden_size": 4096,', "model"),
    ('{"hidden_size": 4096}', "model"),
    ("[1, 2]", "model"),
])
def test_an_uploaded_config_gets_the_cli_error(url, tmp_path, text, field):
    status, r = post(url, "/api/estimate", {"fields": {"gpu": "h100-sxm"},
                                            "config": {"name": "config.json", "text": text}})
    assert status == 400 and r["field"] == field
    (tmp_path / "config.json").write_text(text)
    expected = cli(["estimate", "--model", "config.json", "--gpu", "h100-sxm", "--json"],
                   tmp_path)
    assert r["error"] == expected.stderr.strip()


def test_an_uploaded_config_is_estimated_as_the_cli_does(url, tmp_path):
    text = (ROOT / "tests" / "fixtures" / "hf" / "llama-3.1-8b.json").read_text()
    status, r = post(url, "/api/estimate", {"fields": {"gpu": "h100-sxm", "batch": "4"},
                                            "config": {"name": "config.json", "text": text}})
    assert status == 200, r
    assert "--model config.json" in r["command"]
    (tmp_path / "config.json").write_text(text)
    assert r["json"] == cli_json(r["command"], tmp_path)


def test_an_upload_over_the_file_limit_gets_the_cli_error(url, tmp_path):
    text = '{"pad": "' + "x" * (5 * 2**20) + '"}'
    status, r = post(url, "/api/estimate", {"fields": {"gpu": "h100-sxm"},
                                            "config": {"name": "config.json", "text": text}})
    assert status == 400 and r["field"] == "model"
    (tmp_path / "config.json").write_text(text)
    expected = cli(["estimate", "--model", "config.json", "--gpu", "h100-sxm"], tmp_path)
    assert r["error"] == expected.stderr.strip()


def test_a_body_over_the_limit_is_refused_before_it_is_read(url):
    """Content-Length says 50 MB and no byte follows: an answer at once (a server that read
    the body first would wait for it until the client gave up)."""
    host, port = url.split("//")[1].rstrip("/").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /api/estimate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 52428800\r\n\r\n")
        head = b""
        while chunk := s.recv(65536):  # the server closes the connection after its answer
            head += chunk
        head = head.decode()
    assert head.startswith("HTTP/1.1 413")
    body = json.loads(head.split("\r\n\r\n", 1)[1])
    assert body["field"] == "model" and "50.0 MiB" in body["error"] and "8 MiB" in body["error"]


@pytest.mark.parametrize("raw", [
    b"\x00\xff garbage\r\n\r\n",
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
    *(b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n%s"
      % (path, rest) for path, rest in (
          (b"/api/estimate", b"Content-Length: -5\r\n\r\n"),
          (b"/api/estimate", b"Content-Length: 12\r\n\r\n\xff\xfe{not json}"),
          (b"/api/estimate", b"Content-Length: x\r\n\r\n{}"),
          (b"/api/estimate", b"\r\n{}"),  # no length
          (b"/api/nothing", b"Content-Length: 2\r\n\r\n{}"),
          (b"/api/estimate", b"Content-Length: 5\r\n\r\n"))),  # the body never comes
    b"BREW /pot HTTP/1.1\r\n\r\n",
])
def test_the_server_survives_garbage(url, raw, capfd):
    host, port = url.split("//")[1].rstrip("/").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert b"Traceback" not in answer
    status, r = post(url, "/api/estimate", {"fields": {**BASE, "batch": "2"}})
    assert status == 200 and r["json"]["batch"] == 2
    out, err = capfd.readouterr()
    assert "Traceback" not in err and out == ""  # one line a request, on stderr


@pytest.mark.parametrize("body", [
    [1, 2], "text", {"fields": [1]}, {"fields": {"batch": {"a": 1}}},
    {"fields": {"no_such": "1"}}, {"fields": BASE, "config": "x"},
    {"fields": BASE, "config": {"name": "../../etc/passwd.json", "text": "{}"}},
    {"fields": {**BASE, "model": "/etc/passwd"}}, {"fields": {**BASE, "gpu": "../x.yaml"}},
])
def test_wrong_shapes_get_one_line_json_errors(url, body):
    status, r = post(url, "/api/estimate", body)
    assert status == 400
    assert r["error"].startswith("llmplan") and "\n" not in r["error"]
    assert "Traceback" not in r["error"]


def test_only_loopback_names_and_json_are_answered(url):
    """DNS rebinding (another site's name pointed at 127.0.0.1) and a cross-site form's
    text/plain POST are refused; the page's own requests are not."""
    host, port = url.split("//")[1].rstrip("/").rsplit(":", 1)
    body = json.dumps({"fields": {**BASE, "batch": "2"}}).encode()

    def raw(host_header: str, content_type: str) -> int:
        with socket.create_connection((host, int(port)), timeout=60) as s:
            s.sendall(b"POST /api/estimate HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\n"
                      b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                      % (host_header.encode(), content_type.encode(), len(body), body))
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        return int(answer.split(b" ", 2)[1])

    assert raw(f"evil.example:{port}", "application/json") == 403
    assert raw("evil.example", "application/json") == 403
    assert raw(f"127.0.0.1:{port}", "text/plain") == 415
    assert raw(f"localhost:{port}", "application/json") == 200
    assert raw(f"127.0.0.1:{port}", "application/json; charset=utf-8") == 200
    assert raw(f"[::1]:{port}", "application/json") == 200
    req = urllib.request.Request(url, headers={"Host": "evil.example"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 403


def test_the_page_and_plotly_come_from_this_server(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        page = r.read().decode()
    assert '<script src="/static/plotly.min.js">' in page and "cdn" not in page.lower()
    import plotly

    bundled = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    with urllib.request.urlopen(url + "static/plotly.min.js", timeout=10) as r:
        assert r.read() == bundled.read_bytes()
    with urllib.request.urlopen(url + "api/meta", timeout=10) as r:
        meta = json.loads(r.read())
    assert "llama-3.1-8b" in meta["models"] and "h100-sxm" in meta["gpus"]
    assert meta["defaults"]["estimate"]["batch"] == 1
    # simulate's form (the random dataset) shows the lengths the command takes
    assert (meta["defaults"]["simulate"]["prompt_tokens"],
            meta["defaults"]["simulate"]["output_tokens"]) == (1024, 256)


def test_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")


def test_the_command_warns_off_loopback_and_prints_its_url():
    p = subprocess.Popen([sys.executable, "-m", "planner", "ui", "--host", "0.0.0.0",
                          "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"})
    try:
        line = p.stdout.readline()
        assert line.startswith("llmplan ui: serving http://0.0.0.0:")
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    assert "warning: listening on 0.0.0.0, not a loopback address" in err


def test_a_bad_port_or_a_taken_one_is_one_line(run_cli):
    code, out, err = run_cli("ui", "--port", "70000")
    assert code == 2 and err.strip() == "llmplan: error: --port: must be 0 to 65535, got 70000"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run_cli("ui", "--port", str(port))
    assert code == 2 and out == ""
    assert err.startswith(f"llmplan: error: --host 127.0.0.1 --port {port}: cannot listen: ")
    assert len(err.strip().splitlines()) == 1


def test_without_plotly_the_command_says_what_to_install():
    code = ("import sys; sys.modules['plotly'] = None; from planner.cli.app import main; "
            "sys.exit(main(['ui', '--port', '0']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"}, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == 'llmplan ui needs the ui extra: pip install "llmplan[ui]"'
    assert r.stdout == ""


SMALL_PLAN = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "ttft": "2s", "tpot": "50ms",
              "rps": "6", "tp": "1,2", "pp": "1", "weights": "bf16,fp8", "kv_cache": "16",
              "disaggregated": "off", "sim_requests": "60"}


def test_plan_is_the_cli_json_ranked_the_same(url):
    status, r = post(url, "/api/plan", {"fields": SMALL_PLAN})
    assert status == 200, r
    rows = r["json"]
    assert rows == cli_json(r["command"])
    assert [x["rank"] for x in rows] == list(range(1, len(rows) + 1)) and len(rows) == 4
    extra = r["extra"]
    assert extra["price_set"] == rows[0]["price_set"] == "hyperscaler-on-demand"
    assert extra["layout"] == [f"TP{x['tp']}" for x in rows]
    # the front: no configuration both cheaper and faster than one on it
    cost = "cost_usd_per_million_output_tokens_at_traffic"
    front = [x for x in rows if x["rank"] in extra["pareto_ranks"]]
    assert front
    for f in front:
        assert not any(x[cost] < f[cost] and x["latency_s"] < f["latency_s"] for x in rows)
    assert extra["ttft_key"] == "p90_ttft_s" and "p90_ttft_s" in rows[0]


@pytest.mark.parametrize(("field", "value"), [
    ("ttft", "soon"), ("rps", "-1"), ("tpot", "nan"), ("gpu", "h100-sxm,nosuch"),
    ("tp", "1,x"), ("percentile", "75"), ("prices", "no-such-set"),
])
def test_a_bad_plan_value_gets_the_cli_error_with_its_field(url, field, value):
    fields = {**SMALL_PLAN, field: value}
    status, r = post(url, "/api/plan", {"fields": fields})
    assert status == 400, r
    expected = cli(["plan", *api.argv_of("plan", fields)])
    assert expected.returncode == 2
    assert r["error"] == expected.stderr.strip()
    assert r["field"] == field


def test_simulate_is_the_cli_json_once_per_rate(url):
    fields = {**BASE, "request_rate": "2,8,inf", "num_requests": "150", "seed": "3"}
    status, r = post(url, "/api/simulate", {"fields": fields})
    assert status == 200, r
    assert r["command"].startswith('for rate in 2 8 inf; do llmplan simulate --model ')
    assert '--request-rate "$rate"' in r["command"] and r["command"].endswith("; done")
    # the loop the page offers to copy, run by a shell: one JSON object per rate
    out = subprocess.run(["bash", "-c", f'llmplan() {{ "{sys.executable}" -m planner "$@"; }}; '
                          + r["command"]], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert out.returncode == 0, out.stderr
    objects, text = [], out.stdout.strip()
    while text:
        obj, end = json.JSONDecoder().raw_decode(text)
        objects.append(obj)
        text = text[end:].strip()
    assert r["json"] == objects
    assert [d["request_rate"] for d in objects] == [2.0, 8.0, "inf"]
    assert all(d["num_prompts"] == 150 for d in objects)
    # one rate: the plain command
    status, one = post(url, "/api/simulate", {"fields": {**fields, "request_rate": "8"}})
    assert one["command"].startswith("llmplan simulate ") and one["json"] == [objects[1]]


@pytest.mark.parametrize(("value", "expected"), [
    ("2,-1", "llmplan: error: --request-rate: must be positive, got -1"),
    ("2,,4", "--request-rate: give 1 to 12 values, comma-separated"),
    (",".join(["1"] * 13), "--request-rate: give 1 to 12 values"),
    ("", "--request-rate: give one or more values"),
], ids=["negative", "empty-item", "13-rates", "none"])
def test_a_bad_rate_list_names_the_field(url, value, expected):
    status, r = post(url, "/api/simulate", {"fields": {**BASE, "request_rate": value}})
    assert status == 400 and r["field"] == "request_rate"
    assert expected in r["error"]
