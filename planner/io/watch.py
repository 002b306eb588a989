"""A running server's Prometheus metrics, against the GPU's ceilings and llmplan's prediction.

Two scrapes of the server's ``/metrics`` endpoint (the text exposition format, parsed with
prometheus-client's parser) make a window: counters and histograms are differenced over it,
gauges read at its end. Metric names are those of vLLM (vllm/v1/metrics/loggers.py) and SGLang
(python/sglang/srt/metrics/collector.py), including names that changed between releases:

    figure               vLLM                                    SGLang
    running requests     vllm:num_requests_running               sglang:num_running_reqs
    waiting requests     vllm:num_requests_waiting               sglang:num_queue_reqs
    KV cache used (0-1)  vllm:kv_cache_usage_perc                sglang:token_usage
                         (vllm:gpu_cache_usage_perc to 0.10)
    prompt tokens        vllm:prompt_tokens_total                sglang:prompt_tokens_total
    output tokens        vllm:generation_tokens_total            sglang:generation_tokens_total
    TTFT histogram       vllm:time_to_first_token_seconds        sglang:time_to_first_token_seconds
    TPOT histogram       vllm:request_time_per_output_token_     sglang:inter_token_latency_seconds
                         seconds (0.12+), else                   (sglang:time_per_output_token_
                         vllm:inter_token_latency_seconds        seconds before)
                         (0.11+) or vllm:time_per_output_
                         token_seconds (before)
    end-to-end           vllm:e2e_request_latency_seconds        sglang:e2e_request_latency_seconds
    finished requests    vllm:request_success_total              sglang:num_requests_total

Derived, for the window: output and prompt tokens/s; mean and quantiles (interpolated within
buckets, as PromQL's histogram_quantile) of TTFT and TPOT; the bytes a decode step moves (the
weights, and the KV cache the server reports holding: its used fraction of the capacity llmplan
computes for this deployment) times the decode steps per second (output tokens/s over running
requests), as a fraction of the datasheet bandwidth (MBU); the FLOPs of the prompt and output
tokens per second over the dense peak (MFU); and llmplan's TPOT at the running concurrency.
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from planner.core.errors import LlmplanError

NAMES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
    "generation_tokens": ("vllm:generation_tokens_total", "sglang:generation_tokens_total"),
    "requests": ("vllm:request_success_total", "sglang:num_requests_total"),
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    # per-request TPOT where the server has it (vLLM 0.12+), else the per-step figure under
    # its current name (vLLM 0.11+, SGLang) or its older one
    "tpot": ("vllm:request_time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
             "vllm:time_per_output_token_seconds", "sglang:inter_token_latency_seconds",
             "sglang:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
}
HISTOGRAMS = ("ttft", "tpot", "e2e")
MAX_SCRAPE_BYTES = 50 * 1024 * 1024


@dataclass
class Histogram:
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative
    sum: float = 0.0
    count: float = 0.0

    def minus(self, old: Histogram) -> Histogram:
        return Histogram({le: c - old.buckets.get(le, 0.0) for le, c in self.buckets.items()},
                         self.sum - old.sum, self.count - old.count)

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """PromQL's histogram_quantile: linear within the bucket holding the rank; the
        highest finite bound when the rank falls in +Inf."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        prev_le, prev_c = 0.0, 0.0
        for le in sorted(self.buckets):
            c = self.buckets[le]
            if c >= rank:
                if math.isinf(le):
                    return prev_le
                if c == prev_c:
                    return le
                return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
            prev_le, prev_c = le, c
        return prev_le


@dataclass
class Snapshot:
    t_s: float
    server: str  # vllm or sglang
    values: dict[str, float]
    histograms: dict[str, Histogram]
    names: dict[str, str]  # figure -> the metric name found


def parse(text: str, *, model_name: str | None = None, t_s: float = 0.0) -> Snapshot:
    """The figures in one scrape, summed over label sets (one model's when ``model_name``
    is given: the ``model_name`` label vLLM and SGLang both set)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {n: fig for fig, names in NAMES.items() for n in names}
    by_name: dict[str, float] = {}  # plain series, summed over label sets
    hist_by_name: dict[str, Histogram] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as err:
        raise LlmplanError(f"not the Prometheus text format: {err}") from None
    for fam in families:
        for s in fam.samples:
            if model_name is not None and s.labels.get("model_name", model_name) != model_name:
                continue
            name, v = s.name, float(s.value)
            for suffix in ("_bucket", "_sum", "_count"):
                base = name[: -len(suffix)] if name.endswith(suffix) else None
                if base is not None and wanted.get(base) in HISTOGRAMS:
                    h = hist_by_name.setdefault(base, Histogram())
                    if suffix == "_bucket":
                        le = float(s.labels.get("le", "inf"))
                        h.buckets[le] = h.buckets.get(le, 0.0) + v
                    elif suffix == "_sum":
                        h.sum += v
                    else:
                        h.count += v
                    break
            else:
                if name in wanted and wanted[name] not in HISTOGRAMS:
                    by_name[name] = by_name.get(name, 0.0) + v
    # each figure from the first of its names the server exposes (NAMES order: the current
    # name before the older ones)
    values: dict[str, float] = {}
    hists: dict[str, Histogram] = {}
    found: dict[str, str] = {}
    for fig, names in NAMES.items():
        pool = hist_by_name if fig in HISTOGRAMS else by_name
        name = next((n for n in names if n in pool), None)
        if name is None:
            continue
        found[fig] = name
        if fig in HISTOGRAMS:
            hists[fig] = pool[name]
        else:
            values[fig] = pool[name]
    if not found:
        raise LlmplanError("no vLLM or SGLang metric in the scrape (expected names such as "
                           "vllm:num_requests_running or sglang:num_running_reqs)")
    server = "sglang" if any(n.startswith("sglang:") for n in found.values()) else "vllm"
    return Snapshot(t_s, server, values, hists, found)


def scrape(url: str, *, timeout_s: float = 5.0) -> str:
    """The text of one scrape of ``url`` (its /metrics page)."""
    if not url.startswith(("http://", "https://")):
        raise LlmplanError(f"{url}: expected an http:// or https:// URL of a /metrics page")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 (http only)
            body = r.read(MAX_SCRAPE_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise LlmplanError(f"{url}: cannot scrape: {reason}") from None
    if len(body) > MAX_SCRAPE_BYTES:
        raise LlmplanError(f"{url}: the page is larger than {MAX_SCRAPE_BYTES // 2**20} MiB")
    return body.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Window:
    """Two snapshots' difference: what the server did between them."""

    seconds: float
    server: str
    running: float
    waiting: float
    kv_usage: float | None
    output_tokens_per_s: float
    prompt_tokens_per_s: float
    requests_per_s: float | None
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    ttft: Histogram | None
    tpot: Histogram | None

    def figures(self) -> dict:
        def h(x: Histogram | None, q: float | None) -> float | None:
            if x is None:
                return None
            return x.mean() if q is None else x.quantile(q)

        return {
            "window_s": self.seconds, "server": self.server,
            "running_requests": self.running, "waiting_requests": self.waiting,
            "kv_cache_used_frac": self.kv_usage,
            "output_tokens_per_s": self.output_tokens_per_s,
            "prompt_tokens_per_s": self.prompt_tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "mean_prompt_tokens": self.mean_prompt_tokens,
            "mean_output_tokens": self.mean_output_tokens,
            "mean_ttft_s": h(self.ttft, None), "p50_ttft_s": h(self.ttft, 0.5),
            "p99_ttft_s": h(self.ttft, 0.99),
            "mean_tpot_s": h(self.tpot, None), "p50_tpot_s": h(self.tpot, 0.5),
            "p99_tpot_s": h(self.tpot, 0.99),
        }


def window(old: Snapshot, new: Snapshot) -> Window:
    dt = new.t_s - old.t_s
    if dt <= 0:
        raise LlmplanError("two scrapes at the same instant: no window")

    def delta(k: str) -> float | None:
        if k not in new.values or k not in old.values:
            return None
        d = new.values[k] - old.values[k]
        return d if d >= 0 else new.values[k]  # a counter reset (server restart)

    gen, prompt, reqs = delta("generation_tokens"), delta("prompt_tokens"), delta("requests")
    hist = {k: (new.histograms[k].minus(old.histograms[k])
                if k in new.histograms and k in old.histograms else None) for k in HISTOGRAMS}
    done = reqs if reqs else (hist["e2e"].count if hist["e2e"] else None)
    return Window(
        dt, new.server, new.values.get("running", 0.0), new.values.get("waiting", 0.0),
        new.values.get("kv_usage"), (gen or 0.0) / dt, (prompt or 0.0) / dt,
        done / dt if done is not None else None,
        prompt / done if done and prompt is not None else None,
        gen / done if done and gen is not None else None, hist["ttft"], hist["tpot"])


def derive(w: Window, setup) -> dict:
    """The window's figures, its MBU and MFU on ``setup``'s deployment and llmplan's TPOT at
    its concurrency (``setup``: a ``planner.layouts.deployment.Deployment``)."""
    from planner.core.estimate import estimate
    from planner.core.memory import kv_cache_bytes_per_token, kv_capacity_tokens, weight_bytes
    from planner.core.ops import decode_ops, prefill_ops, total_flops
    from planner.core.specs import Parallelism, Workload

    m, hw, p, e = setup.model, setup.hardware, setup.precision, setup.engine
    out = w.figures()
    prompt = max(1, round(w.mean_prompt_tokens or 512))
    gen = max(1, round(w.mean_output_tokens or 128))
    n = w.running
    out.update(mbu=None, mfu=None, achieved_bandwidth_bytes_per_s=None,
               predicted_tpot_s=None, kv_cache_held_bytes=None)
    if n >= 1:
        est = estimate(m, hw, precision=p, options=setup.options,
                       workload=Workload(batch=max(1, round(n)), prompt_tokens=prompt,
                                         output_tokens=gen),
                       parallelism=Parallelism(tp=setup.tp), engine=e)
        out["predicted_tpot_s"] = est.tpot_s
        out["predicted_output_tokens_per_s"] = max(1, round(n)) / est.tpot_s
        # KV the server holds: its used fraction of the capacity llmplan computes (per GPU
        # under TP, times the GPUs), else each running sequence at its mean context
        per_token = kv_cache_bytes_per_token(m, p, tp=setup.tp)
        if w.kv_usage is not None:
            cap = kv_capacity_tokens(m, hw, p, tp=setup.tp, options=setup.options,
                                     lm_head_sharded=e.lm_head_sharded, engine=e)
            kv = w.kv_usage * cap * per_token * setup.tp
        else:
            kv = n * (prompt + gen / 2) * per_token * setup.tp
        out["kv_cache_held_bytes"] = kv
        if w.output_tokens_per_s > 0:
            steps_per_s = w.output_tokens_per_s / n
            step_bytes = weight_bytes(m, p, tp=setup.tp,
                                      lm_head_sharded=e.lm_head_sharded) * setup.tp + kv
            bw = step_bytes * steps_per_s
            out["achieved_bandwidth_bytes_per_s"] = bw
            out["mbu"] = bw / (hw.memory_bandwidth_bytes_per_s * setup.tp)
    ctx = prompt + gen // 2
    per_prompt_token = total_flops(prefill_ops(m, p, batch=1, prompt_tokens=prompt)) / prompt
    per_out_token = total_flops(decode_ops(m, p, batch=1, context_tokens=ctx))
    flops_s = w.prompt_tokens_per_s * per_prompt_token + w.output_tokens_per_s * per_out_token
    out["achieved_flops_per_s"] = flops_s
    out["mfu"] = flops_s / (hw.peak_flops_per_s(p.compute_dtype) * setup.tp)
    return out


class Exporter:
    """``--serve-metrics``: the derived figures as Prometheus gauges on their own port."""

    GAUGES = {
        "llmplan_mbu": ("mbu", "Model bandwidth utilization of the watched server (0-1)"),
        "llmplan_mfu": ("mfu", "Model FLOPs utilization of the watched server (0-1)"),
        "llmplan_achieved_bandwidth_bytes_per_second": (
            "achieved_bandwidth_bytes_per_s", "Bytes per second the decode steps move"),
        "llmplan_achieved_flops_per_second": ("achieved_flops_per_s",
                                              "FLOPs per second of the served tokens"),
        "llmplan_predicted_tpot_seconds": ("predicted_tpot_s",
                                           "llmplan's TPOT at the running concurrency"),
        "llmplan_observed_tpot_seconds": ("mean_tpot_s", "Mean TPOT over the last window"),
        "llmplan_observed_ttft_seconds": ("mean_ttft_s", "Mean TTFT over the last window"),
        "llmplan_output_tokens_per_second": ("output_tokens_per_s",
                                             "Output tokens per second over the last window"),
        "llmplan_running_requests": ("running_requests", "Requests running"),
        "llmplan_waiting_requests": ("waiting_requests", "Requests waiting"),
    }

    def __init__(self, port: int, labels: dict[str, str], *, addr: str = "0.0.0.0"):
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        self.labels = labels
        self.gauges = {name: Gauge(name, doc, list(labels), registry=self.registry)
                       for name, (_, doc) in self.GAUGES.items()}
        try:
            got = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as err:
            raise LlmplanError(f"--serve-metrics {port}: cannot listen: {err.strerror}") from None
        self.server = got[0] if isinstance(got, tuple) else None

    def update(self, figures: dict) -> None:
        for name, (key, _) in self.GAUGES.items():
            v = figures.get(key)
            g = self.gauges[name].labels(**self.labels)
            g.set(math.nan if v is None else float(v))

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def now_s() -> float:
    return time.monotonic()
