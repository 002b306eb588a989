"""Timing: CUDA graphs and CUDA events on GPU, perf_counter on CPU; medians and spread.

On GPU a step is captured into a CUDA graph once and replayed; each replay is timed by an event
pair, so launch gaps do not count (what a serving engine with graphs sees). Where the working
set is small enough to sit in L2, a buffer twice the L2 size is written between replays (the
write is outside the timed events). On CPU each call is timed with perf_counter.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from planner.core.errors import first_line

# A point whose repeats disagree measured the machine's other work, not the step. On an idle
# machine p90 / median of a timing is 1.04-1.14 on this project's 2-core CPU (the points of
# tests/fixtures/measure/cpu-results.jsonl) and a few per cent under CUDA graphs; on a busy
# CPU one point read 36 (issue 27). Twice the median leaves idle jitter well inside.
NOISY_SPREAD = 2.0
# The decode step is timed twice, seconds apart (before and after the prefill timing); on an
# idle machine the two medians agree within a few per cent. Issue 27's busy CPU gave a step
# 170x slower than seconds earlier; 1.5x is far beyond jitter and well below that.
NOISY_REPEAT = 1.5
# (the defaults of `measure --max-spread` and `--max-drift`)


def timing_spread(t: object) -> float | None:
    """A recorded timing's p90 / median (``Timing.as_dict``); None where it has no spread (a
    single timing, or not a timing)."""
    if not isinstance(t, dict) or not t.get("median_s") or not t.get("p90_s"):
        return None
    return t["p90_s"] / t["median_s"]


def spread_reason(name: str, spread: float, reps: object, limit: float) -> str:
    """What a timing past the spread limit says, in ``measure``'s and the calibration's
    warnings."""
    return f"{name}: p90 is {spread:.1f}x the median over {reps} repeats (limit {limit:g}x)"


def drift(first_s: float | None, again_s: float | None) -> float | None:
    """How far apart one thing's median and its median timed again later are (>= 1); None
    where either is missing."""
    if not first_s or not again_s:
        return None
    return max(first_s, again_s) / min(first_s, again_s)


def load_average() -> float | None:
    """The machine's one-minute load average, where the platform has one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy_hint() -> str:
    """The machine's load beside its cores, and what to do about it: fewer threads, or a quiet
    machine (issue 27: a busy CPU gave decode steps 170x slower than seconds earlier). Said by
    ``measure``'s noisy points and the calibration's noise warning alike."""
    cores = os.cpu_count() or 1
    load = load_average()
    if load is None:  # not on every platform
        return f"{cores} cores; measure on a quiet machine or give fewer --threads"
    return (f"load average {load:.1f} on {cores} cores; measure on a quiet machine or give "
            f"--threads below the idle cores ({max(1, int(cores - load))})")

OOM_MESSAGES = ("out of memory", "cublas_status_alloc_failed", "cuda_error_out_of_memory",
                "failed to allocate", "can't allocate memory")  # the last: torch's CPU allocator


def is_oom(err: BaseException) -> bool:
    """An allocation failure, wherever it surfaced: the allocator, cuBLAS's workspace, or a
    CUDA graph capture (which reports the OOM of a kernel it captured)."""
    import torch

    kinds = tuple(k for k in (getattr(torch, "OutOfMemoryError", None),
                              torch.cuda.OutOfMemoryError, MemoryError) if k is not None)
    seen: BaseException | None = err
    while seen is not None:  # the OOM may be the cause of a capture error
        if isinstance(seen, kinds) or any(m in str(seen).lower() for m in OOM_MESSAGES):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    mean_s: float
    min_s: float
    reps: int
    method: str

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(times: list[float], method: str) -> Timing:
    times = sorted(times)
    if len(times) >= 2:
        q = statistics.quantiles(times, n=10, method="inclusive")
        p10, p90 = q[0], q[-1]
    else:
        p10 = p90 = times[0]
    return Timing(median_s=statistics.median(times), p10_s=p10, p90_s=p90,
                  mean_s=statistics.fmean(times), min_s=times[0], reps=len(times),
                  method=method)


def time_cpu(fn: Callable[[], object], *, budget_s: float = 0.5, min_reps: int = 5,
             max_reps: int = 200, warmup_s: float = 0.05) -> Timing:
    t_end = time.perf_counter() + warmup_s
    fn()
    while time.perf_counter() < t_end:
        fn()
    times: list[float] = []
    t_stop = time.perf_counter() + budget_s
    while len(times) < min_reps or (time.perf_counter() < t_stop and len(times) < max_reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return summarize(times, "perf_counter")


def time_cuda(fn: Callable[[], object], *, budget_s: float = 0.5, min_reps: int = 10,
              max_reps: int = 500, use_graph: bool = True, flush_l2: bool = False) -> Timing:
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as graph capture requires
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    run = fn
    method = "cuda_events"
    if use_graph:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
        except RuntimeError as err:
            # An OOM while capturing is an OOM (the caller skips larger points); anything
            # else (an op that cannot be captured) is timed eagerly, and the method says so.
            del graph
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            if is_oom(err):
                raise
            method = f"cuda_events (graph capture failed: {first_line(err)[:120]})"
        else:
            run = graph.replay
            method = "cuda_graph+events"
        for _ in range(3):
            run()
    flush = None
    if flush_l2:
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        flush = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
        method += "+l2_flush"
    torch.cuda.synchronize()
    times: list[float] = []
    t_stop = time.perf_counter() + budget_s
    while len(times) < min_reps or (time.perf_counter() < t_stop and len(times) < max_reps):
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return summarize(times, method)


def time_fn(fn: Callable[[], object], *, kind: str, budget_s: float = 0.5,
            use_graph: bool = True, flush_l2: bool = False) -> Timing:
    if kind == "cuda":
        return time_cuda(fn, budget_s=budget_s, use_graph=use_graph, flush_l2=flush_l2)
    return time_cpu(fn, budget_s=budget_s)


def buffers_beyond_l2(nbytes: int, l2_bytes: int, *, at_least: int = 4,
                      at_most: int = 512) -> int:
    """How many distinct buffers of ``nbytes`` a chain of kernels cycles through so that
    together they hold at least four L2 caches: each kernel then reads its operand from
    memory, as each layer of a decode step reads its own weights, not from the cache."""
    if nbytes <= 0:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    return max(at_least, min(at_most, -(-4 * l2_bytes // nbytes)))


def l2_bytes(kind: str) -> int:
    """The device's L2 cache (CUDA); on a CPU a nominal 1 MiB (its chains are a smoke test)."""
    if kind == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).L2_cache_size
    return 1 << 20


def time_chain(calls: list[Callable[[], object]], *, kind: str,
               budget_s: float = 0.2) -> Timing:
    """The time per call of ``calls`` run back to back: one CUDA graph of all of them on a
    GPU (replayed, events around it), so the graph's own launch is spread over the chain as
    a step's is over its layers; perf_counter around the eager chain on a CPU. Every figure
    of the Timing is per call."""
    if not calls:
        raise ValueError("time_chain needs at least one call")

    def chain():
        for c in calls:
            c()
    t = time_fn(chain, kind=kind, budget_s=budget_s)
    n = len(calls)
    return Timing(median_s=t.median_s / n, p10_s=t.p10_s / n, p90_s=t.p90_s / n,
                  mean_s=t.mean_s / n, min_s=t.min_s / n, reps=t.reps,
                  method=f"{t.method}, chain of {n}")
