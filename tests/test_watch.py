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
    kv = fm.KV_USAGE * kv_capacity_tokens(m, hw, p, options=opts) * \
        kv_cache_bytes_per_token(m, p)
    step_bytes = weight_bytes(m, p) + kv
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
