"""`llmplan watch` against a live metrics endpoint (tests/fake_metrics.py), and its
re-exported gauges scraped by a real Prometheus server where the binary is installed."""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import fake_metrics as fm
import pytest
from prometheus_client.parser import text_string_to_metric_families

from planner.core.estimate import estimate
from planner.core.memory import kv_cache_bytes_per_token, kv_capacity_tokens, weight_bytes
from planner.core.specs import Options, Precision, Workload
from planner.io import catalog
from planner.io.watch import Histogram, parse, window

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def endpoint():
    url, col, server = fm.serve("vllm")
    yield url, col
    server.shutdown()
    server.server_close()


def test_histogram_quantile_is_promqls():
    # 10 observations: 4 in (0, 0.1], 4 in (0.1, 0.2], 2 in (0.2, +Inf)
    h = Histogram({0.1: 4, 0.2: 8, math.inf: 10}, sum=1.5, count=10)
    assert h.mean() == 0.15
    assert h.quantile(0.5) == pytest.approx(0.1 + 0.1 * (5 - 4) / 4)  # 0.125
    assert h.quantile(0.2) == pytest.approx(0.05)
    assert h.quantile(0.99) == 0.2  # in +Inf: the highest finite bound, as PromQL
    assert Histogram().quantile(0.5) is None


def test_once_json_reads_the_window(run_cli, endpoint):
    url, col = endpoint
    code, out, err = run_cli("watch", url, "-m", "llama-3.1-8b", "-g", "h100-sxm", "--once",
                             "--json", "--interval", "0.3",
                             "--model-name", "meta-llama/Llama-3.1-8B-Instruct")
    assert code == 0, err
    d = json.loads(out)
    assert col.scrapes == 2
    assert d["server"] == "vllm" and d["running_requests"] == fm.RUNNING
    assert d["waiting_requests"] == fm.WAITING and d["kv_cache_used_frac"] == fm.KV_USAGE
    dt = d["window_s"]
    assert 0.3 <= dt < 5
    # one scrape's increments over the measured window
    assert d["output_tokens_per_s"] == pytest.approx(200 / dt)
    assert d["prompt_tokens_per_s"] == pytest.approx(2000 / dt)
    assert d["mean_prompt_tokens"] == 1000 and d["mean_output_tokens"] == 100
    assert d["mean_ttft_s"] == pytest.approx(0.125)
    assert d["mean_tpot_s"] == pytest.approx(fm.TPOT_VALUE)
    assert 0.01 < d["p50_tpot_s"] <= 0.015  # inside the bucket holding 0.012
    # the derived figures, by hand from the planner's own pieces
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("vllm")
    p = Precision()
    opts = Options(prefill_chunk_tokens=eng.max_num_batched_tokens)
    kv = fm.KV_USAGE * kv_capacity_tokens(m, hw, p, options=opts, engine=eng) * \
        kv_cache_bytes_per_token(m, p)
    # the weights a step of that many sequences reads (not the embedding table: its rows)
    read = sum(t.op.weight_bytes * t.op.count for t in estimate(
        m, hw, workload=Workload(batch=round(fm.RUNNING), prompt_tokens=1000,
                                 output_tokens=100), options=opts, engine=eng).decode.ops)
    assert read == pytest.approx(weight_bytes(m, p) - m.vocab_size * m.hidden_size * 2,
                                 rel=1e-3)
    step_bytes = read + kv
    bw = step_bytes * (200 / dt) / fm.RUNNING
    assert d["achieved_bandwidth_bytes_per_s"] == pytest.approx(bw, rel=1e-9)
    assert d["mbu"] == pytest.approx(bw / 3.35e12, rel=1e-9)
    assert 0 < d["mfu"] < 1
    e = estimate(m, hw, workload=Workload(batch=16, prompt_tokens=1000, output_tokens=100),
                 options=opts, engine=eng)
    assert d["predicted_tpot_s"] == pytest.approx(e.tpot_s, rel=1e-9)
    assert d["metric_names"]["tpot"] == "vllm:time_per_output_token_seconds"


def test_sglang_names(run_cli):
    url, col, server = fm.serve("sglang")
    try:
        code, out, err = run_cli("watch", url, "-m", "llama-3.1-8b", "-g", "h100-sxm",
                                 "--once", "--json", "--interval", "0.2")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, err
    d = json.loads(out)
    assert d["server"] == "sglang" and d["running_requests"] == fm.RUNNING
    assert d["mean_tpot_s"] == pytest.approx(fm.TPOT_VALUE)
    assert d["metric_names"]["tpot"] == "sglang:inter_token_latency_seconds"


def test_a_text_without_server_metrics_is_one_line():
    with pytest.raises(Exception, match="no vLLM or SGLang metric"):
        parse("# TYPE up gauge\nup 1\n")


def test_counter_reset_counts_from_zero():
    a = parse("vllm:generation_tokens_total 5000\nvllm:num_requests_running 3\n", t_s=0.0)
    b = parse("vllm:generation_tokens_total 100\nvllm:num_requests_running 3\n", t_s=2.0)
    assert window(a, b).output_tokens_per_s == 50  # the server restarted: 100 since


@pytest.mark.parametrize("args,msg", [
    (["http://127.0.0.1:9/metrics", "--once"], "cannot scrape"),
    (["ftp://x/metrics", "--once"], "http"),
    (["http://127.0.0.1:99999/metrics", "--once"], "port"),
    (["http://127.0.0.1:9/metrics", "--interval", "-1", "--once"], "--interval"),
    (["http://127.0.0.1:9/metrics", "--json"], "--once or --count"),
    (["http://127.0.0.1:9/metrics", "--once", "--serve-metrics", "70000"], "--serve-metrics"),
])
def test_bad_input_is_one_line(run_cli, args, msg):
    extra = [] if "--interval" in args else ["--interval", "0.1"]
    code, _, err = run_cli("watch", *args, *extra, "-m", "llama-3.1-8b", "-g", "h100-sxm",
                           "--timeout", "1")
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def test_serve_metrics_reexports_the_gauges(endpoint):
    """--serve-metrics: another process (here urllib) scrapes llmplan's own gauges."""
    url, _ = endpoint
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "planner", "watch", url, "-m", "llama-3.1-8b",
                             "-g", "h100-sxm", "--interval", "0.3", "--count", "100",
                             "--serve-metrics", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        text = ""
        for _ in range(100):
            time.sleep(0.2)
            try:
                text = _get(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                continue
            if "llmplan_mbu{" in text and 'llmplan_mbu{gpu="h100-sxm",model="llama-3.1-8b"} NaN' \
                    not in text:
                break
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        mbu = fams["llmplan_mbu"].samples[0]
        assert mbu.labels == {"gpu": "h100-sxm", "model": "llama-3.1-8b"}
        assert 0 < mbu.value < 1
        assert fams["llmplan_predicted_tpot_seconds"].samples[0].value > 0
        assert fams["llmplan_running_requests"].samples[0].value == fm.RUNNING
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="the prometheus binary is not installed (Debian: apt-get install "
                           "prometheus); the gauges are still checked over HTTP above")
def test_real_prometheus_scrapes_serve_metrics(endpoint, tmp_path):
    """A real Prometheus server scrapes `llmplan watch --serve-metrics` and answers a query
    for llmplan_mbu through its HTTP API."""
    url, _ = endpoint
    port, prom_port = _free_port(), _free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: llmplan\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{port}']\n")
    watch = subprocess.Popen([sys.executable, "-m", "planner", "watch", url, "-m",
                              "llama-3.1-8b", "-g", "h100-sxm", "--interval", "0.3", "--count",
                              "300", "--serve-metrics", str(port)], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        q = urllib.parse.urlencode({"query": "llmplan_mbu > 0"})
        result = []
        for _ in range(60):
            time.sleep(0.5)
            try:
                body = json.loads(_get(f"http://127.0.0.1:{prom_port}/api/v1/query?{q}"))
            except OSError:
                continue
            result = body.get("data", {}).get("result", [])
            if result:
                break
        assert result, "Prometheus never had a positive llmplan_mbu"
        sample = result[0]
        assert sample["metric"]["model"] == "llama-3.1-8b"
        assert sample["metric"]["job"] == "llmplan"
        assert 0 < float(sample["value"][1]) < 1
    finally:
        for p in (watch, prom):
            p.terminate()
            p.wait(10)


def test_grafana_dashboard_queries_the_exported_gauges():
    """The shipped dashboard is valid JSON and every llmplan_* series it plots is one
    `--serve-metrics` exports, under the labels it sets."""
    import re

    from planner.io.watch import Exporter

    d = json.loads((ROOT / "planner" / "data" / "grafana" / "llmplan-watch.json").read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"\bllmplan_[a-z_]+", e)}
    assert used and used <= set(Exporter.GAUGES)
    assert {"llmplan_mbu", "llmplan_mfu", "llmplan_predicted_tpot_seconds"} <= used
    assert all('model="$model"' in e for e in exprs if "llmplan_" in e)


def test_a_page_that_is_not_metrics_names_the_url(run_cli, tmp_path):
    import http.server
    import threading

    (tmp_path / "metrics").write_text("<html>not metrics</html>\n")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a):
            super().__init__(*a, directory=str(tmp_path))

        def log_message(self, *a):  # the test server's access log is not llmplan's stderr
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}/metrics"
        code, _, err = run_cli("watch", url, "-m", "llama-3.1-8b", "-g", "h100-sxm", "--once",
                               "--interval", "0.1")
    finally:
        srv.shutdown()
    assert code == 2 and url in err and "Prometheus" in err
    assert len(err.strip().splitlines()) == 1


# --- a hostile server: slow, huge, redirecting, escaping, or lying ---

def _serve(respond):
    """A local HTTP server whose every GET is answered by ``respond(handler, n)`` (n: the
    request's number from 1): (base URL, server)."""
    import http.server
    import threading

    count = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            count[0] += 1
            respond(self, count[0])

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_port}", srv


@pytest.fixture
def hostile():
    servers = []

    def start(respond):
        base, srv = _serve(respond)
        servers.append(srv)
        return base
    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def _text(h, body: str, status: int = 200, reason: str | None = None) -> None:
    data = body.encode()
    h.send_response(status, reason)
    h.send_header("Content-Type", "text/plain")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def _drip(h, byte: bytes) -> None:
    """One byte every 0.1 s for a minute (until the client hangs up): each read succeeds."""
    try:
        for _ in range(600):
            h.wfile.write(byte)
            h.wfile.flush()
            time.sleep(0.1)
    except OSError:
        pass


def _trickle(h, n):
    """Headers at once, then the body a byte at a time."""
    h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
    h.wfile.flush()
    _drip(h, b"#")


def _trickle_headers(h, n):
    """The status line itself a byte at a time: the headers never end."""
    _drip(h, b"X")


@pytest.mark.parametrize("respond", [_trickle, _trickle_headers])
def test_timeout_bounds_the_whole_scrape(hostile, run_cli, respond):
    """A server that sends a byte every 0.1 s never trips a per-read timeout of 1 s; the
    whole-scrape deadline stops it after 1 s, in the body or in the headers."""
    url = hostile(respond) + "/metrics"
    t0 = time.monotonic()
    code, _, err = run_cli("watch", url, "-m", "llama-3.1-8b", "-g", "h100-sxm", "--once",
                           "--interval", "0.1", "--timeout", "1")
    assert time.monotonic() - t0 < 3
    assert code == 2 and "within 1 s" in err and url in err
    assert len(err.strip().splitlines()) == 1


def test_a_page_over_the_size_limit_is_refused(hostile):
    from planner.io.watch import MAX_SCRAPE_BYTES, scrape

    def big_unannounced(h, n):  # no Content-Length: read until the limit, then refused
        h.send_response(200)
        h.end_headers()
        try:
            h.wfile.write(b"# " + b"x" * 5000 + b"\n")
        except OSError:
            pass

    def big_announced(h, n):  # a Content-Length over the limit: refused before reading
        h.send_response(200)
        h.send_header("Content-Length", str(MAX_SCRAPE_BYTES + 1))
        h.end_headers()

    with pytest.raises(Exception, match="larger than the .* MiB limit") as e:
        scrape(hostile(big_unannounced) + "/metrics", max_bytes=4096, timeout_s=2)
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(Exception, match="larger than the 16 MiB limit"):
        scrape(hostile(big_announced) + "/metrics", timeout_s=2)
    assert MAX_SCRAPE_BYTES == 16 * 2**20


def test_a_redirect_is_an_error_unless_followed_to_the_same_host(hostile, run_cli, endpoint):
    real, _ = endpoint  # the fake server on another port of 127.0.0.1: the same host

    def redirect(h, n):
        h.send_response(302)
        h.send_header("Location", real if h.path == "/same" else
                      "http://evil.example:8000/metrics")
        h.end_headers()

    base = hostile(redirect)
    args = ("-m", "llama-3.1-8b", "-g", "h100-sxm", "--once", "--interval", "0.1",
            "--timeout", "2")
    code, _, err = run_cli("watch", base + "/same", *args)
    assert code == 2 and "HTTP 302" in err and real in err and "--follow-redirects" in err
    assert len(err.strip().splitlines()) == 1
    code, out, err = run_cli("watch", base + "/same", *args, "--follow-redirects", "--json")
    assert code == 0, err
    assert json.loads(out)["running_requests"] == fm.RUNNING
    code, _, err = run_cli("watch", base + "/other", *args, "--follow-redirects")
    assert code == 2 and "another host, evil.example" in err
    assert len(err.strip().splitlines()) == 1


HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x1b[31mred\x9b\x00\x08\r"


def _no_controls(text: str) -> None:
    import re

    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text), repr(text)


@pytest.mark.parametrize("respond", [
    lambda h, n: _text(h, "not found", 404, "Gone" + HOSTILE),
    lambda h, n: _text(h, f"vllm:num_requests_running{{x=\"{HOSTILE}\" 3\n"),
    lambda h, n: (h.send_response(301), h.send_header("Location", "/m" + HOSTILE),
                  h.end_headers()),
], ids=["reason", "malformed-line", "location"])
def test_server_text_reaches_the_terminal_without_control_characters(hostile, run_cli,
                                                                      respond):
    url = hostile(respond) + "/metrics"
    code, out, err = run_cli("watch", url, "-m", "llama-3.1-8b", "-g", "h100-sxm", "--once",
                             "--interval", "0.1", "--timeout", "2")
    assert code == 2 and url in err and len(err.strip().splitlines()) == 1
    _no_controls(out + err)


def test_clean_removes_escapes_and_controls_but_not_text():
    from planner.io.watch import clean

    assert clean("a\x1b[1;31mb\x1b[0m\tc\nd\x07\x9be\x7f") == "ab\tc\nde"
    assert clean("x\x1b]8;;http://a\x1b\\link\x1b]8;;\x1b\\y") == "xlinky"
    assert clean("\x1b]0;pwned\x07title") == "title"  # an OSC's text goes with its escape
    assert clean("two\nlines\there", one_line=True) == "two lines here"


def _lying_page(running: str, kv: str, waiting: str = "2", gen_step: float = 200.0):
    def respond(h, n):
        _text(h, "# TYPE vllm:num_requests_running gauge\n"
                 f"vllm:num_requests_running {running}\n"
                 f"vllm:num_requests_waiting {waiting}\n"
                 f"vllm:kv_cache_usage_perc {kv}\n"
                 f"vllm:generation_tokens_total {n * gen_step}\n"
                 f"vllm:prompt_tokens_total {n * 10 * gen_step}\n")
    return respond


def test_implausible_counts_are_flagged_not_shown(hostile, run_cli):
    url = hostile(_lying_page("-3", "1.5", waiting="NaN")) + "/metrics"
    args = ("watch", url, "-m", "llama-3.1-8b", "-g", "h100-sxm", "--once", "--interval",
            "0.1", "--timeout", "2")
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    d = json.loads(out)
    bad = d["implausible"]
    assert d["running_requests"] is None and "below zero" in bad["running_requests"]
    assert d["waiting_requests"] is None and "NaN" in bad["waiting_requests"]
    assert d["kv_cache_used_frac"] is None and "above 1" in bad["kv_cache_used_frac"]
    assert d["mbu"] is None and d["predicted_tpot_s"] is None  # no running count to use
    assert d["output_tokens_per_s"] > 0 and "output_tokens_per_s" not in bad
    code, out, err = run_cli(*args)
    assert code == 0, err
    headline = " ".join(out.split("TTFT")[0].split())  # rich may wrap it
    assert "implausible running" in headline and "implausible waiting" in headline
    assert "KV implausible" in headline and "-3" not in headline and "150" not in headline
    assert "why" not in headline and "below zero" in out


def test_an_mbu_above_100_percent_is_flagged(hostile, run_cli):
    # one running request, 10^7 output tokens per scrape: more bytes than an H100 can move
    url = hostile(_lying_page("1", "0.5", gen_step=1e7)) + "/metrics"
    code, out, err = run_cli("watch", url, "-m", "llama-3.1-8b", "-g", "h100-sxm", "--once",
                             "--interval", "0.1", "--timeout", "2", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["mbu"] is None and d["achieved_bandwidth_bytes_per_s"] is None
    assert "above the GPUs' bandwidth peak" in d["implausible"]["mbu"]
    assert d["running_requests"] == 1 and d["kv_cache_used_frac"] == 0.5


def test_parse_then_window_flag_inf_and_negative():
    from planner.io.watch import implausible

    a = parse("vllm:num_requests_running +Inf\nvllm:kv_cache_usage_perc -0.1\n", t_s=0.0)
    assert set(implausible(a)) == {"running", "kv_usage"}
    w = window(a, parse("vllm:num_requests_running 4\nvllm:kv_cache_usage_perc 0.2\n",
                        t_s=1.0))
    assert w.running is None and w.kv_usage is None  # either scrape's lie taints the window
    assert set(w.implausible) == {"running_requests", "kv_cache_used_frac"}


def test_exporter_listens_on_loopback_by_default():
    from planner.io.watch import Exporter

    ex = Exporter(_free_port(), {"model": "m", "gpu": "g"})
    try:
        assert ex.server.server_address[0] == "127.0.0.1"
    finally:
        ex.close()
    ex = Exporter(_free_port(), {"model": "m", "gpu": "g"}, addr="0.0.0.0")
    try:
        assert ex.server.server_address[0] == "0.0.0.0"
    finally:
        ex.close()


def test_bind_is_in_help_and_a_bad_one_is_one_line(run_cli):
    code, out, _ = run_cli("watch", "--help")
    assert code == 0 and "--bind" in out and "0.0.0.0" in out and "--follow-redirects" in out
    code, _, err = run_cli("watch", "http://127.0.0.1:9/metrics", "-m", "llama-3.1-8b", "-g",
                           "h100-sxm", "--once", "--serve-metrics", str(_free_port()),
                           "--bind", "no-such-host.invalid")
    assert code == 2 and "--bind no-such-host.invalid" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run_cli("watch", "http://127.0.0.1:9/metrics", "-m", "llama-3.1-8b", "-g",
                           "h100-sxm", "--once", "--serve-metrics", str(_free_port()),
                           "--bind", "")
    assert code == 2 and "--bind" in err and len(err.strip().splitlines()) == 1


def test_a_malformed_page_is_quoted_short():
    """A metrics page's bad line is the server's text: the error quotes at most its start
    (a 100,000-character label value made a 100 KB error line)."""
    from planner.core.errors import LlmplanError
    from planner.io.watch import parse

    with pytest.raises(LlmplanError, match="not the Prometheus text format") as err:
        parse('vllm:num_requests_running{model_name="' + "x" * 100_000 + '" 1\n')
    assert len(str(err.value)) < 300


def test_a_model_name_the_server_does_not_serve_is_named():
    """--model-name that matches none of the server's metrics says which models it serves
    (it had said 'no vLLM or SGLang metric in the scrape' of a page full of them)."""
    from planner.core.errors import LlmplanError
    from planner.io.watch import parse

    text = ('# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{model_name="m"} 3\n')
    with pytest.raises(LlmplanError, match="--model-name 'other': no metric of that model in "
                                           "the scrape; it serves 'm'"):
        parse(text, model_name="other")
    assert parse(text, model_name="m").values == {"running": 3.0}


def test_an_http_clients_failure_is_said_in_words():
    import http.client

    from planner.io.watch import _said

    assert _said(http.client.BadStatusLine("NOT-HTTP")).startswith("the answer is not HTTP")
    assert _said(http.client.IncompleteRead(b"")) == "the answer ended early (0 bytes of it read)"
    assert "closed the connection" in _said(http.client.RemoteDisconnected("x"))
    assert _said(OSError("refused")) is None
