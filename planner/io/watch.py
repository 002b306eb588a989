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
import re
import time
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


def _number(value, what: str) -> float:
    """A sample's value or bucket bound as a float: an integer beyond a float's range (the
    parser keeps 400 digits as an int) is an infinity, which ``implausible`` flags; text that
    is no number is the page's error, in one line."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):
        raise LlmplanError(f"not the Prometheus text format: {clean(what, one_line=True)}: "
                           f"{clean(str(value)[:40], one_line=True)!r} is not a number") \
            from None


def parse(text: str, *, model_name: str | None = None, t_s: float = 0.0) -> Snapshot:
    """The figures in one scrape, summed over label sets (one model's when ``model_name``
    is given: the ``model_name`` label vLLM and SGLang both set)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {n: fig for fig, names in NAMES.items() for n in names}
    by_name: dict[str, float] = {}  # plain series, summed over label sets
    hist_by_name: dict[str, Histogram] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError, OverflowError) as err:
        raise LlmplanError("not the Prometheus text format: "  # a server's text, cut short
                           f"{clean(str(err)[:200], one_line=True)}") from None
    wanted_all = set(wanted) | {n + x for n in wanted for x in ("_bucket", "_sum", "_count")}
    others: set[str] = set()  # the model names the server's own metrics carry, left out
    for fam in families:
        for s in fam.samples:
            if model_name is not None and s.labels.get("model_name", model_name) != model_name:
                if s.name in wanted_all:
                    others.add(str(s.labels.get("model_name"))[:60])
                continue
            name, v = s.name, _number(s.value, s.name)
            for suffix in ("_bucket", "_sum", "_count"):
                base = name[: -len(suffix)] if name.endswith(suffix) else None
                if base is not None and wanted.get(base) in HISTOGRAMS:
                    h = hist_by_name.setdefault(base, Histogram())
                    if suffix == "_bucket":
                        le = _number(s.labels.get("le", "inf"), f"{name} le label")
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
    if not found and others:  # the metrics are there, for other models
        shown = ", ".join(repr(clean(o, one_line=True)) for o in sorted(others)[:5])
        raise LlmplanError(f"--model-name {clean(model_name or '', one_line=True)[:60]!r}: "
                           f"no metric of that model in the scrape; it serves {shown}")
    if not found:
        raise LlmplanError("no vLLM or SGLang metric in the scrape (expected names such as "
                           "vllm:num_requests_running or sglang:num_running_reqs)")
    server = "sglang" if any(n.startswith("sglang:") for n in found.values()) else "vllm"
    return Snapshot(t_s, server, values, hists, found)


def _said(err: BaseException) -> str | None:
    """An HTTP client's failure in words (its own text is a class's: "NOT-HTTP",
    "IncompleteRead(0 bytes read)"); None where its own reason reads well."""
    import http.client

    if isinstance(err, http.client.RemoteDisconnected):
        return "the server closed the connection without an answer"
    if isinstance(err, http.client.BadStatusLine):
        return f"the answer is not HTTP (its first line: {str(err)[:40]!r})"
    if isinstance(err, http.client.IncompleteRead):
        return f"the answer ended early ({len(err.partial):,} bytes of it read)"
    if isinstance(err, http.client.HTTPException):
        return f"not a well-formed HTTP answer ({type(err).__name__})"
    return None


MAX_SCRAPE_BYTES = 16 * 2**20  # a vLLM or SGLang page is some 100 kB; a larger one is not metrics
MAX_REDIRECTS = 5

# what a server's text may not bring to the terminal: ANSI escape sequences (CSI, OSC, and the
# two-character ones), then any other C0 control but tab and newline, DEL, and the C1 controls
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: object, *, one_line: bool = False) -> str:
    """``text`` from the server with its escape sequences and control characters removed
    (with ``one_line``, newlines and tabs become spaces too)."""
    s = _CONTROL.sub("", _ANSI.sub("", str(text)))
    return " ".join(s.split()) if one_line else s


def scrape(url: str, *, timeout_s: float = 5.0, max_bytes: int = MAX_SCRAPE_BYTES,
           follow_redirects: bool = False) -> str:
    """The text of one scrape of ``url`` (its /metrics page). ``timeout_s`` bounds the whole
    scrape (name lookup, connect, every read, every redirect), not each read: a server that
    sends a byte a second still times out. A page over ``max_bytes`` is refused; a redirect
    is an error unless ``follow_redirects``, and then followed to the same host only."""
    from urllib.parse import urljoin, urlsplit

    deadline_s = time.monotonic() + timeout_s
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(current)
        try:
            parts.port  # noqa: B018 (raises on a port out of range)
        except ValueError:
            raise LlmplanError(f"{clean(current, one_line=True)}: the port is not a number "
                               "in 0..65535") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LlmplanError(f"{clean(current, one_line=True)}: expected an http:// or "
                               "https:// URL of a /metrics page")
        status, reason, location, body = _get(parts, deadline_s=deadline_s,
                                              timeout_s=timeout_s, max_bytes=max_bytes, url=url)
        if 300 <= status < 400 and location is not None:
            target = urljoin(current, clean(location, one_line=True))
            if not follow_redirects:
                raise LlmplanError(f"{url}: the server redirects (HTTP {status}) to {target}; "
                                   "give --follow-redirects to follow it (same host only)")
            new_host = urlsplit(target).hostname
            if (new_host or "").lower() != (urlsplit(url).hostname or "").lower():
                raise LlmplanError(f"{url}: refused a redirect to another host, {new_host} "
                                   f"({target})")
            current = target
            continue
        if not 200 <= status < 300:
            raise LlmplanError(f"{url}: cannot scrape: HTTP {status} "
                               f"{clean(reason, one_line=True)}".rstrip())
        return body.decode("utf-8", errors="replace")
    raise LlmplanError(f"{url}: more than {MAX_REDIRECTS} redirects")


def _get(parts, *, deadline_s: float, timeout_s: float, max_bytes: int, url: str):
    """(status, reason, Location, body) of one GET, on a worker thread that the caller waits
    on until ``deadline_s`` and then cuts off by shutting its socket (a name lookup that
    hangs is left to finish on the daemon thread)."""
    import http.client
    import socket
    import threading

    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    remaining_s = deadline_s - time.monotonic()
    conn = kind(parts.hostname, parts.port, timeout=max(remaining_s, 1e-3))
    result: dict = {}

    def fetch() -> None:
        try:
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            conn.request("GET", path, headers={"Accept": "text/plain", "User-Agent": "llmplan"})
            r = conn.getresponse()
            length = r.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                result["too_big"] = True
                return
            chunks, got = [], 0
            while got <= max_bytes:
                chunk = r.read(min(65536, max_bytes + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            result["too_big"] = got > max_bytes
            result["answer"] = (r.status, r.reason, r.getheader("Location"), b"".join(chunks))
        except (OSError, http.client.HTTPException, ValueError) as err:
            result["error"] = err
        finally:
            conn.close()

    worker = threading.Thread(target=fetch, daemon=True, name="llmplan-scrape")
    worker.start()
    worker.join(max(deadline_s - time.monotonic(), 0.0))
    if worker.is_alive():
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        raise LlmplanError(f"{url}: cannot scrape: no complete answer within {timeout_s:g} s "
                           "(the limit covers the connect and every read)")
    if result.get("too_big"):
        raise LlmplanError(f"{url}: the page is larger than the {max_bytes / 2**20:g} MiB "
                           "limit on a scrape")
    if "error" in result:
        err = result["error"]
        reason = _said(err) or getattr(err, "reason", None) or getattr(err, "strerror", None) \
            or err
        raise LlmplanError(f"{url}: cannot scrape: {clean(reason, one_line=True)}")
    return result["answer"]


# the output figures a metric feeds: where the metric cannot be true, these are left out
FEEDS = {
    "running": ("running_requests",), "waiting": ("waiting_requests",),
    "kv_usage": ("kv_cache_used_frac",),
    "generation_tokens": ("output_tokens_per_s", "mean_output_tokens"),
    "prompt_tokens": ("prompt_tokens_per_s", "mean_prompt_tokens"),
    "requests": ("requests_per_s",),
    "ttft": ("mean_ttft_s", "p50_ttft_s", "p99_ttft_s"),
    "tpot": ("mean_tpot_s", "p50_tpot_s", "p99_tpot_s"),
    "e2e": ("requests_per_s",),
}


def implausible(snap: Snapshot) -> dict[str, str]:
    """figure -> why its metric in ``snap`` cannot be true: a value that is not a finite
    number, a request count or counter below zero, a KV cache used beyond 0..1."""
    why: dict[str, str] = {}
    for fig, v in snap.values.items():
        name = snap.names[fig]
        if not math.isfinite(v):
            why[fig] = f"{name} is {'NaN' if math.isnan(v) else v}: not a finite number"
        elif v < 0:
            why[fig] = f"{name} = {v:g}: a count below zero"
        elif fig == "kv_usage" and v > 1:
            why[fig] = f"{name} = {v:g}: above 1, more than the whole KV cache"
    for fig, h in snap.histograms.items():
        bad = [x for x in (h.sum, h.count, *h.buckets.values()) if not math.isfinite(x)]
        if bad or h.count < 0:
            why[fig] = f"{snap.names[fig]} has {bad[0] if bad else 'a negative count'}"
    return why


@dataclass(frozen=True)
class Window:
    """Two snapshots' difference: what the server did between them. A figure the server
    reported but that cannot be true is None, and ``implausible`` says why (by output key)."""

    seconds: float
    server: str
    running: float | None
    waiting: float | None
    kv_usage: float | None
    output_tokens_per_s: float | None
    prompt_tokens_per_s: float | None
    requests_per_s: float | None
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    ttft: Histogram | None
    tpot: Histogram | None
    implausible: dict[str, str] = field(default_factory=dict)

    def figures(self) -> dict:
        def h(x: Histogram | None, q: float | None) -> float | None:
            if x is None:
                return None
            return x.mean() if q is None else x.quantile(q)

        out = {
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
        for key in self.implausible:
            out[key] = None
        out["implausible"] = dict(self.implausible)
        return out


def window(old: Snapshot, new: Snapshot) -> Window:
    dt = new.t_s - old.t_s
    if dt <= 0:
        raise LlmplanError("two scrapes at the same instant: no window")
    # a metric that cannot be true in either scrape is left out of the window
    why = {**implausible(old), **implausible(new)}
    values = {k: v for k, v in new.values.items() if k not in why}
    old_values = {k: v for k, v in old.values.items() if k not in why}

    def delta(k: str) -> float | None:
        if k not in values or k not in old_values:
            return None
        d = values[k] - old_values[k]
        return d if d >= 0 else values[k]  # a counter reset (server restart)

    gen, prompt, reqs = delta("generation_tokens"), delta("prompt_tokens"), delta("requests")
    hist = {k: (new.histograms[k].minus(old.histograms[k])
                if k in new.histograms and k in old.histograms and k not in why else None)
            for k in HISTOGRAMS}
    done = reqs if reqs else (hist["e2e"].count if hist["e2e"] else None)
    by_key = {key: reason for fig, reason in why.items() for key in FEEDS[fig]}

    def rate(x: float | None, fig: str) -> float | None:
        return None if fig in why else (x or 0.0) / dt

    return Window(
        dt, new.server,
        None if "running" in why else values.get("running", 0.0),
        None if "waiting" in why else values.get("waiting", 0.0),
        values.get("kv_usage"), rate(gen, "generation_tokens"), rate(prompt, "prompt_tokens"),
        done / dt if done is not None else None,
        prompt / done if done and prompt is not None else None,
        gen / done if done and gen is not None else None, hist["ttft"], hist["tpot"], by_key)


def derive(w: Window, setup) -> dict:
    """The window's figures, its MBU and MFU on ``setup``'s deployment and llmplan's TPOT at
    its concurrency (``setup``: a ``planner.layouts.deployment.Deployment``)."""
    from planner.core.estimate import estimate
    from planner.core.memory import kv_cache_bytes_per_token, kv_capacity_tokens
    from planner.core.ops import decode_ops, prefill_ops, total_flops
    from planner.core.specs import Parallelism, Workload

    m, hw, p, e = setup.model, setup.hardware, setup.precision, setup.engine
    out = w.figures()
    prompt = max(1, round(w.mean_prompt_tokens or 512))
    gen = max(1, round(w.mean_output_tokens or 128))
    n = w.running
    out.update(mbu=None, mfu=None, achieved_bandwidth_bytes_per_s=None,
               predicted_tpot_s=None, kv_cache_held_bytes=None)
    if n is not None and n >= 1:
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
        if w.output_tokens_per_s is not None and w.output_tokens_per_s > 0:
            steps_per_s = w.output_tokens_per_s / n
            # the weights a step of n sequences reads (a MoE model's routed experts only as
            # many as n tokens pick, the embedding's n rows: estimate's MBU), every GPU's
            step_bytes = sum(t.op.weight_bytes * t.op.count for t in est.decode.ops) \
                * setup.tp + kv
            bw = step_bytes * steps_per_s
            peak = hw.memory_bandwidth_bytes_per_s * setup.tp
            _above_peak(out, "mbu", "achieved_bandwidth_bytes_per_s", bw, peak,
                        "bandwidth", "B/s", hint="a wrong --gpu or --tp, or several tokens "
                        "counted to a step, as speculative decoding does")
    if w.prompt_tokens_per_s is None or w.output_tokens_per_s is None:
        out["achieved_flops_per_s"] = None
        return out
    ctx = prompt + gen // 2
    per_prompt_token = total_flops(prefill_ops(m, p, batch=1, prompt_tokens=prompt)) / prompt
    per_out_token = total_flops(decode_ops(m, p, batch=1, context_tokens=ctx))
    flops_s = w.prompt_tokens_per_s * per_prompt_token + w.output_tokens_per_s * per_out_token
    peak = hw.peak_flops_per_s(p.compute_dtype) * setup.tp
    _above_peak(out, "mfu", "achieved_flops_per_s", flops_s, peak, "dense compute", "FLOP/s",
                hint="a wrong --gpu or --tp")
    return out


def _above_peak(out: dict, frac_key: str, rate_key: str, achieved: float, peak: float,
                what: str, unit: str, hint: str) -> None:
    """``out[frac_key] = achieved / peak``, or, where that is above 1 (no GPU beats its
    datasheet peak), both left out and the reason, with ``hint``, under
    ``out["implausible"]``."""
    frac = achieved / peak
    if frac <= 1:
        out[frac_key], out[rate_key] = frac, achieved
        return
    out[frac_key], out[rate_key] = None, None
    out["implausible"][frac_key] = (
        f"{frac_key.upper()} {frac:.0%}: {achieved:.3g} {unit} is above the GPUs' "
        f"{what} peak of {peak:.3g} {unit} ({hint})")


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

    def __init__(self, port: int, labels: dict[str, str], *, addr: str = "127.0.0.1"):
        """Listens on ``addr`` (this machine only by default; ``0.0.0.0`` or ``::`` for every
        interface) at ``port``."""
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        self.labels = labels
        self.gauges = {name: Gauge(name, doc, list(labels), registry=self.registry)
                       for name, (_, doc) in self.GAUGES.items()}
        try:
            got = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as err:
            raise LlmplanError(f"--serve-metrics {port} --bind {addr}: cannot listen: "
                               f"{err.strerror or err}") from None
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
