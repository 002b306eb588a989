"""A simulated run's figures, keyed as vLLM's `bench serve` result file keys them.

vLLM (vllm/benchmarks/serve.py, the result saved by `--save-result`) reports `completed`,
`duration` (s), `total_input_tokens`, `total_output_tokens`, `request_throughput` (req/s),
`request_goodput`, `output_throughput` and `total_token_throughput` (tok/s), and for TTFT, TPOT,
ITL and E2EL the `mean_`, `median_`, `std_` and `p99_` (its default --metric-percentiles) of
each in milliseconds: TPOT per request is (e2e latency - TTFT) / (output tokens - 1), over the
requests with more than one output token; ITL is every gap between consecutive tokens of a
request. The same keys here make a simulated run and a measured one comparable key by key;
p90 is added for each, and llmplan's own figures carry their unit in the name. Requests the
engine refused (``RequestResult.failed``) are counted in ``failed``, the first one's reason in
``failed_reason``, and left out of every other figure, as `bench serve` leaves out failed
requests.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from itertools import accumulate

from planner.core.arith import quantile
from planner.serving.records import RequestRecords
from planner.serving.sim import SimResult


def _stats(values: Sequence[float], name: str) -> dict[str, float | None]:
    if not values:
        return {f"{k}_{name}_ms": None for k in ("mean", "median", "std", "p90", "p99")}
    ms = [v * 1e3 for v in values]
    mean = sum(ms) / len(ms)
    std = math.sqrt(sum([(v - mean) ** 2 for v in ms]) / len(ms))
    ms.sort()  # once: each quantile below then finds it sorted
    return {f"mean_{name}_ms": mean, f"median_{name}_ms": quantile(ms, 0.5),
            f"std_{name}_ms": std, f"p90_{name}_ms": quantile(ms, 0.9),
            f"p99_{name}_ms": quantile(ms, 0.99)}


def weighted_quantile(pairs: list[tuple[float, int]], q: float) -> float:
    """The q-quantile of values repeated by their weights (the lower value at that rank)."""
    return _weighted_quantiles(sorted(pairs), (q,))[0]


def _weighted_quantiles(ordered: list[tuple[float, int]], qs: tuple[float, ...]
                        ) -> list[float]:
    """``weighted_quantile`` at each of ``qs`` over pairs ``ordered`` by value: the first
    value whose weight so far exceeds the rank, found by bisection over the running weight
    (summed once for all of them); nan where the weights sum to nothing."""
    seen = list(accumulate([w for _, w in ordered]))
    total = seen[-1] if seen else 0
    if not total:
        return [math.nan] * len(qs)
    out = []
    for q in qs:
        i = bisect.bisect_right(seen, q * (total - 1))
        out.append(ordered[i][0] if i < len(ordered) else ordered[-1][0])
    return out


def _itl_stats(pairs: list[tuple[float, int]]) -> dict[str, float | None]:
    total = sum([w for _, w in pairs])
    if not total:
        return _stats([], "itl")
    mean = sum([v * w for v, w in pairs]) / total
    var = sum([w * (v - mean) ** 2 for v, w in pairs]) / total
    median, p90, p99 = (v * 1e3 for v in _weighted_quantiles(sorted(pairs), (0.5, 0.9, 0.99)))
    return {"mean_itl_ms": mean * 1e3, "median_itl_ms": median,
            "std_itl_ms": math.sqrt(var) * 1e3, "p90_itl_ms": p90, "p99_itl_ms": p99}


def summary(res: SimResult, *, ttft_slo_s: float | None = None,
            tpot_slo_s: float | None = None, itl: bool = True,
            window: tuple[float, float] | None = None) -> dict:
    """The run's figures; ``itl=False`` leaves out the ITL statistics (a sort of every step's
    gap), for a caller that reads none of them (a fit simulating hundreds of times).
    ``window``: the TTFT, TPOT and end-to-end statistics are of the requests arriving in
    [start, end) seconds only (``plan`` sizes a replica on its steady state: the run's
    ramp-up and drain left out), counted in ``measured_requests``; the run's totals are of
    every request."""
    rec = res.requests if isinstance(res.requests, RequestRecords) else \
        RequestRecords.of(res.requests)
    arrival, first, finish = (rec.column(c) for c in ("arrival_s", "first_token_s", "finish_s"))
    prompt, output = rec.column("prompt_tokens"), rec.column("output_tokens")
    # the served requests (finish_s not nan: ``f == f``), in the order given: TTFT, TPOT (for
    # more than one output token), end-to-end latency and output tokens, as RequestResult
    # defines them; a list of floats each (no tuple per request for the collector to track)
    if window is None:
        a_, f1_, f_, o_ = arrival, first, finish, output
    else:
        t0, t1 = window
        keep = [i for i, a in enumerate(arrival) if t0 <= a < t1]
        a_, f1_, f_, o_ = ([col[i] for i in keep] for col in (arrival, first, finish, output))
    ttfts = [f1 - a for a, f1, f in zip(a_, f1_, f_, strict=True) if f == f]
    tpots = [(f - f1) / (o - 1) for f1, f, o in zip(f1_, f_, o_, strict=True)
             if f == f and o > 1]
    e2els = [f - a for a, f in zip(a_, f_, strict=True) if f == f]
    dur = res.duration_s or math.nan
    inp = sum([p for p, f in zip(prompt, finish, strict=True) if f == f])
    out = sum([o for o, f in zip(output, finish, strict=True) if f == f])
    served = sum([1 for f in finish if f == f])
    d: dict = {
        "completed": served,
        "duration": dur,
        "total_input_tokens": inp,
        "total_output_tokens": out,
        "request_throughput": served / dur,
        "output_throughput": out / dur,
        "total_token_throughput": (inp + out) / dur,
        **_stats(ttfts, "ttft"),
        **_stats(tpots, "tpot"),
        **(_itl_stats(res.itl) if itl else {}),
        **_stats(e2els, "e2el"),
    }
    if ttft_slo_s is not None or tpot_slo_s is not None:
        good = sum(1 for a, f1, f, o in zip(arrival, first, finish, output, strict=True)
                   if f == f and (ttft_slo_s is None or f1 - a <= ttft_slo_s)
                   and (tpot_slo_s is None or o <= 1 or (f - f1) / (o - 1) <= tpot_slo_s))
        d["request_goodput"] = good / dur
    cap = res.kv_capacity_tokens
    d.update({
        "max_running_requests": res.max_running,
        "mean_running_requests": res.running_integral / dur,
        "kv_capacity_tokens": cap,
        "kv_cache_used_frac_mean": res.kv_held_integral / dur / cap,
        "kv_cache_used_frac_peak": res.peak_kv_held_tokens / cap,
        "kv_cache_reserved_frac_mean": res.kv_reserved_integral / dur / cap,
        "kv_cache_reserved_frac_peak": res.peak_kv_reserved_tokens / cap,
        "preemptions": res.preemptions,
        "steps": res.steps,
        "arrived": res.arrived,
        "in_flight": res.in_flight,
        "failed": res.failed,
        # vLLM's prefix cache hit rate: prompt tokens found cached over those queried
        "prefix_cache_hit_rate": None if not res.prefix_query_tokens else
        res.prefix_hit_tokens / res.prefix_query_tokens,
        "failed_reason": rec.first_failure(),
        # the API server (planner.serving.frontend): mean seconds a request waited for it
        # before the engine saw it, and the share of the run its streaming set the pace
        "mean_api_server_wait_s": res.api_server_wait_s / served if served else
        math.nan,
        "api_server_stream_bound_frac": res.api_server_stream_s / dur,
    })
    if window is not None:
        t0, t1 = window
        span = t1 - t0
        # over the window itself: requests arriving in it, and those finishing in it with
        # their output tokens. A replica that keeps up finishes what arrives (its steady
        # state's throughput is the offered load); one that does not finishes at its
        # capacity, and its queue grows through the window
        done = [(f, o) for f, o in zip(finish, output, strict=True) if t0 <= f < t1]
        d.update({"measured_requests": len(ttfts), "measured_from_s": t0,
                  "measured_to_s": t1, "measured_arrival_rate": len(a_) / span,
                  "measured_request_throughput": len(done) / span})
        # the output tokens a second of the steady state: what arrived in the window, every
        # token served, where the replica keeps up (what finishes in a window differs from
        # that by the requests in flight at its two ends, ~10% for a slow one); what
        # finished in it, its capacity, where it does not
        arrived_out = sum([o for o, f in zip(o_, f_, strict=True) if f == f])
        d["measured_output_throughput"] = (arrived_out if keeps_up(d) else
                                           sum([o for _, o in done])) / span
    return d


# A replica keeps up with its traffic over a window when it finishes requests at this share of
# the rate they arrive at, at least: the rule ``planner.evidence.bands.served_regime`` holds a
# whole run to. In a steady state the two differ by the requests in flight at the window's two
# ends (up to 6% apart for Llama-3.1-8B on an H100 at 40 requests a second over a 6 s window);
# one that falls short of that grows its queue through the window, so its latencies there say
# how long the window was more than what the replica does (at 56 requests a second, 45-49 of
# them finished: a p90 end-to-end latency of 9 s over 10-30 s, 34 s over 300-330 s).
KEEPS_UP_FRAC = 0.9


def keeps_up(summary: dict) -> bool | None:
    """Whether a windowed run's replica finished requests as fast as they arrived in its
    window (``KEEPS_UP_FRAC``); None where the run has no window."""
    rate = summary.get("measured_arrival_rate")
    if rate is None:
        return None
    return summary["measured_request_throughput"] >= KEEPS_UP_FRAC * rate
