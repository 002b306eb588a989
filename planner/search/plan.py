"""`llmplan plan`: the cheapest deployments that meet latency targets at a traffic level.

Searches GPUs x layout (TP, TP x PP pipeline stages, or EP expert-parallel GPUs) x weight and
KV precision x batch with the vectorized sweep, keeps the
configurations that are supported, fit, and meet the TTFT and TPOT targets, and sizes each for
the traffic with static batching: a replica completes ``batch`` requests every ``latency_s``,
so it serves batch / latency requests per second, and the traffic needs
ceil(requests per second / that) replicas of the layout's GPUs each (tp x pp; ep with experts).
Ranked by the cost per million
output tokens at that traffic (GPUs x price per GPU-hour / output tokens per hour), then by
latency. Imports numpy and pandas (through the sweep).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from planner.core.engine import IDEAL, Engine
from planner.core.specs import Calibration, DType, HardwareSpec, ModelSpec, Options, Precision
from planner.layouts.deployment import Deployment, Layout
from planner.search.sweep import Grid, grid_precision, iter_sweep, to_frame


def default_eps(model: ModelSpec, most: int = 16) -> list[int]:
    """Expert-parallel sizes worth searching: 1, and for a MoE model the powers of two up to
    ``most`` that divide its experts."""
    if model.moe is None:
        return [1]
    return [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= most and
            model.moe.num_experts % n == 0]


@dataclass(frozen=True)
class Targets:
    ttft_s: float
    tpot_s: float
    requests_per_s: float


def search(model: ModelSpec, gpus: list[HardwareSpec], *, prompt_tokens: int,
           output_tokens: int, targets: Targets, tps=(1, 2, 4, 8),
           weights=(DType.bf16, DType.fp8, DType.int8, DType.int4),
           kv_cache=(None, DType.fp8), batches=None, options: Options | None = None,
           calibration: Calibration | None = None,
           price_usd_per_gpu_hour: float | None = None, engine: Engine = IDEAL,
           compute: DType | None = None, pps=(1,), eps=(1,),
           quantized_layers: str = "all", auto_dtype: bool = False,
           released: bool = False, map_gpus=None) -> pd.DataFrame:
    """Every configuration searched, with ``meets_targets`` and, for those that do, the
    replicas, GPUs, cost at the traffic and ``rank`` (1 = cheapest). ``compute``: the type
    the matmuls run in (None: from the weights); ``auto_dtype``: the weights were not asked
    for, so the engine's 16-bit fallback applies (``Grid.auto_dtype``); ``released``: the
    weights are the checkpoint's as it ships (``Grid.released``). ``map_gpus(task, n)``:
    runs ``task(i)`` for each of the ``n`` GPUs and returns the results in order (side by
    side in forked workers: ``planner.evidence.workers.forked_map``); each GPU's rows are
    swept on their own, and the sweep's rows are in GPU order, so the frame is the same."""
    batches = batches or [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512,
                          768, 1024]
    grid = Grid(models=[model], gpus=gpus, batches=batches, prompt_tokens=[prompt_tokens],
                output_tokens=[output_tokens], weights=list(weights), kv_cache=list(kv_cache),
                tps=list(tps), pps=list(pps), options=options or Options(), engine=engine,
                compute=compute, quantized_layers=quantized_layers, auto_dtype=auto_dtype,
                released=released)
    grids = [grid]
    for ep in (n for n in eps if n > 1):
        # the experts over ep GPUs, attention TP over each searched tp dividing it (tp 1: data-
        # parallel attention; tp = ep: one TP group), no pipeline stages
        grids.append(replace(grid, tps=[t for t in tps if ep % t == 0], pps=[1], eps=[ep]))
    chunks = []
    for g in grids:
        if map_gpus is None or len(gpus) < 2:
            chunks += iter_sweep(g, calibration=calibration,
                                 price_usd_per_gpu_hour=price_usd_per_gpu_hour)
            continue
        # the sweep is ordered by model (one here), then GPU: each GPU's rows apart, in order
        for part in map_gpus(lambda i, g=g: list(iter_sweep(
                replace(g, gpus=[gpus[i]]), calibration=calibration,
                price_usd_per_gpu_hour=price_usd_per_gpu_hour)), len(gpus)):
            chunks += part
    df = to_frame(chunks)
    # kv "None" means the weights' 16-bit type; an explicit bf16 would duplicate those rows
    df = df.drop_duplicates(subset=["gpu", "tp", "pp", "ep", "weights", "kv_cache", "batch"])
    df = df.reset_index(drop=True)
    for col in ("ttft_s", "tpot_s", "latency_s", "price_usd_per_gpu_hour",
                "total_memory_bytes", "usable_memory_bytes"):
        if col not in df:  # no supported row filled it (a T4 asked for bf16 matmuls)
            df[col] = np.nan

    def num(col: str) -> pd.Series:
        return pd.to_numeric(df[col], errors="coerce")

    ok = df["supported"].astype(bool) & df["fits"].astype(bool)
    ttft, tpot, latency = num("ttft_s"), num("tpot_s"), num("latency_s")
    price = num("price_usd_per_gpu_hour")
    df["meets_latency"] = ok & (ttft <= targets.ttft_s) & (tpot <= targets.tpot_s)
    df["priced"] = price.notna()
    df["meets_targets"] = df["meets_latency"] & df["priced"]
    per_replica = df["batch"] / latency
    df["requests_per_s_per_replica"] = per_replica
    replicas = np.ceil(targets.requests_per_s / per_replica)
    df["replicas"] = replicas.where(df["meets_targets"])
    df["total_gpus"] = (replicas * df["num_gpus"]).where(df["meets_targets"])
    df["usd_per_hour"] = (df["total_gpus"] * price).where(df["meets_targets"])
    tokens_per_hour = targets.requests_per_s * output_tokens * 3600
    df["cost_usd_per_million_output_tokens_at_traffic"] = df["usd_per_hour"] / \
        tokens_per_hour * 1e6
    df["memory_headroom_frac"] = 1 - num("total_memory_bytes") / num("usable_memory_bytes")
    feasible = df[df["meets_targets"]].sort_values(
        ["cost_usd_per_million_output_tokens_at_traffic", "latency_s", "total_gpus"])
    df["rank"] = pd.Series(np.arange(1, len(feasible) + 1), index=feasible.index)
    return df.sort_values(["rank"], na_position="last").reset_index(drop=True)


SCREEN_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 192, 256]


def screen(model: ModelSpec, gpus: list[HardwareSpec], *, targets: Targets, **kw) -> pd.DataFrame:
    """The static sweep continuous sizing screens candidates with (no TTFT target: a single
    request's TTFT is held to it after), at ``SCREEN_BATCHES``; shared by the aggregated and
    the disaggregated searches (``planner.search.disagg``), so the sweep runs once."""
    return search(model, gpus, targets=Targets(math.inf, targets.tpot_s, targets.requests_per_s),
                  batches=SCREEN_BATCHES, **kw)


def pareto_front(feasible: pd.DataFrame) -> pd.DataFrame:
    """Configurations no other beats on both cost at the traffic and latency."""
    f = feasible.sort_values(["latency_s", "cost_usd_per_million_output_tokens_at_traffic"])
    best = np.inf
    keep = []
    for idx, cost in zip(f.index, f["cost_usd_per_million_output_tokens_at_traffic"],
                         strict=True):
        if cost < best:
            keep.append(idx)
            best = cost
    return f.loc[keep]


# --------------------------------------------------------------------------- continuous sizing


@dataclass(frozen=True)
class SimSettings:
    """How each candidate replica is simulated when sizing with continuous batching."""

    percentile: int = 90  # the TTFT / TPOT percentile that must meet the targets
    num_requests: int = 200
    range_ratio: float = 0.0
    seed: int = 0
    # 1 sizes at the prediction. ``plan --size-at high`` sizes so that a server as slow as the
    # slowest 10% of held-out measurements still meets the targets: each step of the replica
    # simulated takes ``step_factor`` times its predicted time (the high end of the served
    # TPOT band), so its queue grows as a slower server's does, steeply near saturation; and
    # the TTFT and TPOT of that simulation are multiplied by these before they are held to the
    # targets (the part of the bands' high ends that slower steps do not already account for)
    ttft_factor: float = 1.0
    tpot_factor: float = 1.0
    step_factor: float = 1.0
    # vLLM's --performance-mode the replicas run under (``Engine.in_mode``); None: not given
    performance_mode: str | None = None

    @property
    def sizes_at_prediction(self) -> bool:
        return self.ttft_factor == self.tpot_factor == self.step_factor == 1.0


# A replica is sized on its steady state, not on a benchmark's ramp-up: the requests measured
# arrive once the run has filled (one request lifetime at the targets after the start) and
# before its arrivals end (one lifetime before the last), over a window of at least
# STEADY_LIFETIMES lifetimes holding at least ``num_requests`` of them; the run simulates every
# request from the start. Sized on the first 200 requests of a stream whose requests live 4 s
# at 33 requests a second, a replica's p90 TPOT had been 14 ms where its steady state gives 20
# (the requests of the ramp-up see a half-full batch).
STEADY_LIFETIMES = 2.0
MAX_SIZING_REQUESTS = 5_000
# The lifetime at the targets bounds how long a request that meets them lives; under loose
# targets (a batch job's 60 s TTFT) the replica's requests live far less, and a window of
# two target lifetimes simulated thousands of requests for every count tried (up to
# MAX_SIZING_REQUESTS; 2,220 at 5 requests a second, 111 s a lifetime). Where the run's first
# requests were simulated on their own and the replica is loaded lightly (``CountRuns``), its
# lifetime is at most this many times their p99 end-to-end latency: those requests see a
# server still filling, so the margin covers a steady state that lives longer. A replica more
# than 10% over its capacity fails the window's keep-up rule
# (``planner.serving.metrics.keeps_up``) whatever its length; a smaller overload shows only as
# TTFT growing through the window, which a shorter window sees less of (docs/plan.md puts a
# figure on it); and near capacity a shorter window's noisier count can pass a replica the
# targets' window fails (``CAPPED_LOAD_FRAC``).
OBSERVED_LIFETIMES = 4.0


def steady_lifetime_s(target_life_s: float, p99_ms: float | None) -> float:
    """The request lifetime a replica's steady-state window is sized on: the targets' (a
    bound on a request that meets them), or ``OBSERVED_LIFETIMES`` x ``p99_ms``, the p99
    end-to-end latency of the run's first requests (their summary's ``p99_e2el_ms``; None or
    nan: not known), where that is shorter."""
    if not p99_ms or not math.isfinite(p99_ms):
        return target_life_s
    return min(target_life_s, OBSERVED_LIFETIMES * p99_ms / 1e3)


def request_lifetime_s(targets: Targets, output_tokens: int) -> float:
    """The longest a request meeting the targets lives: its TTFT and every later token at
    the targets."""
    return targets.ttft_s + targets.tpot_s * max(0, output_tokens - 1)


def sizing_requests(rate: float, lifetime_s: float, settings: SimSettings, *,
                    cap: int = MAX_SIZING_REQUESTS) -> tuple[int, tuple[float, float] | None]:
    """(requests to simulate, the arrival window in seconds whose requests are measured) for
    one replica at ``rate`` requests a second; at most ``cap``, the margins shrunk to a
    quarter of the run each where that cap is met. No window (every request measured) for an
    infinite rate, where every request arrives at once."""
    if not (math.isfinite(rate) and rate > 0):
        return settings.num_requests, None
    window = max(settings.num_requests / rate, STEADY_LIFETIMES * lifetime_s)
    n = math.ceil(rate * (window + 2 * lifetime_s))
    if n <= cap:
        return n, (lifetime_s, lifetime_s + window)
    span = cap / rate
    edge = min(lifetime_s, span / 4)
    return cap, (edge, span - edge)


def cut_in_order(bounds: list[float], size, top: int, *,
                 cost=lambda r: r["usd_per_hour"], started=None, prefetch=None) -> list:
    """A search over candidates sorted by a lower bound on their cost (``bounds``): each is
    sized (``size(i)``: a result, or None where it cannot be), and the search stops at the
    first candidate whose bound is above the ``top``-th cost found before it, since none
    after it can make the list. The results in candidate order (Nones left out).
    ``prefetch(bounds, size, top, cost, started)``: index -> result for candidates sized
    beforehand (``planner.evidence.workers.prefetched``: side by side in forked workers), a
    superset of those this cut reaches or a part of them; the rest are sized here, so the
    results are the same with or without it. ``started(i)``: as candidate i is sized
    (progress)."""
    known = prefetch(bounds, size, top, cost, started) if prefetch is not None else {}
    out, costs = [], []
    for i in range(len(bounds)):
        if len(costs) >= top and bounds[i] > sorted(costs)[top - 1]:
            break
        if i not in known:
            if started is not None:
                started(i)
            known[i] = size(i)
        if known[i] is not None:
            out.append(known[i])
            costs.append(cost(known[i]))
    return out


def steady_fields(s: dict) -> dict:
    """A plan row's record of the run it shows: the requests simulated and the arrival window
    of those measured (``simulate -n N --measure-window FROM,TO`` at the row's rate gives its
    figures), None where every request was measured."""
    return {"simulated_requests": s["arrived"],
            "measured_from_s": s.get("measured_from_s"),
            "measured_to_s": s.get("measured_to_s")}


def sizing_coster(coster, settings: SimSettings):
    """The step coster a replica is sized with: ``coster``, its steps slowed by the settings'
    ``step_factor`` where that is not 1 (``planner.serving.steps.SlowedCoster``)."""
    from planner.serving.steps import SlowedCoster

    return coster if settings.step_factor == 1.0 else SlowedCoster(coster, settings.step_factor)


def sized_at_fields(s: dict, st: SimSettings, name: str) -> dict:
    """A plan row's record of what it was sized at: the factors, and where steps were
    slowed, the TTFT and TPOT it was held to the targets with (``*_high``)."""
    out = {"sized_at_ttft_factor": st.ttft_factor, "sized_at_tpot_factor": st.tpot_factor,
           "sized_at_step_factor": st.step_factor}
    if st.sizes_at_prediction:
        return out
    high = s.get("sized_at", s)
    ttft, tpot = high.get(f"{name}_ttft_ms"), high.get(f"{name}_tpot_ms")
    out[f"{name}_ttft_s_high"] = None if ttft is None else ttft / 1e3 * st.ttft_factor
    out[f"{name}_tpot_s_high"] = None if tpot is None else tpot / 1e3 * st.tpot_factor
    return out


def percentile_name(p: int) -> str:
    """How a run's summary and plan's columns name the ``p``-th percentile: "median" for
    50, "p90" for 90."""
    return "median" if p == 50 else f"p{p}"


def percentile_key(name: str, p: int) -> str:
    """The summary key of a run's ``p``-th percentile of ``name`` ("ttft", "tpot"), in ms
    (p 50: the median)."""
    return f"{percentile_name(p)}_{name}_ms"


def percentile_s(summary: dict, name: str, p: int) -> float | None:
    """That percentile in seconds, None where the run has none."""
    v = summary.get(percentile_key(name, p))
    return None if v is None else v / 1e3


def _percentile_ok(summary: dict, targets: Targets, settings: SimSettings) -> bool:
    from planner.serving.metrics import keeps_up

    p = settings.percentile
    ttft, tpot = summary[percentile_key("ttft", p)], summary[percentile_key("tpot", p)]
    # a replica whose queue grows through the window measured has no steady state: its
    # latencies there are the window's length (``keeps_up``; None: no window)
    return (summary["completed"] > 0 and not summary.get("failed") and ttft is not None
            and keeps_up(summary) is not False
            and ttft * settings.ttft_factor <= targets.ttft_s * 1e3
            and (tpot is None or tpot * settings.tpot_factor <= targets.tpot_s * 1e3))


# The lifetime cap (``steady_lifetime_s``) shortens a replica's window, so the window holds
# fewer arrivals, whose count is noisier, and less time for a queue to grow: near its capacity
# a replica can pass a short window and fail the targets' (Llama-3.1-8B on an H100 at 25
# requests a second, 60 s TTFT and 200 ms TPOT, 1,024 in and 256 out: its capped window
# finished requests at 0.904 of the 24.0 a second that arrived in it and passed, where the
# targets' window holds its 21.7 a second against 25 and fails it; 4 replicas for 100 requests
# a second, not 5). So the cap is taken only for a replica loaded to at most this share of the
# analytic bound on its rate (sustained rates come out at 60-90% of that bound:
# ``fewest_passing``), and a count it passes is sized again over the targets' window where its
# run filled nonetheless (``filled``).
CAPPED_LOAD_FRAC = 0.5
# ... and only where the early run holds this many requests at least (``--sim-requests``):
# the p99 of a few requests is their longest, and a window sized on it can hold a handful of
# arrivals, whose keep-up share is chance (``--sim-requests 1`` had sized a disaggregated
# pair for Llama-3.1-8B at 5 requests a second as 19 prefill instances and 1 decode)
CAPPED_MIN_REQUESTS = 100
FILLED_KV_FRAC = 0.9  # a KV pool this reserved at its peak had filled


def light(rate: float, rate_bound: float) -> bool:
    """Whether a replica (or an instance) at ``rate`` is loaded to at most
    ``CAPPED_LOAD_FRAC`` of the analytic bound on its rate: lightly enough for its window to
    be sized on the lifetime its first requests show."""
    return rate <= CAPPED_LOAD_FRAC * rate_bound


def filled_at(preemptions: int, kv_reserved_peak_frac: float, max_running: int,
              max_num_seqs: int | None) -> bool:
    """Whether a server filled at some point: a request preempted for room, its KV pool at
    ``FILLED_KV_FRAC`` reserved or more at its peak, or its batch at ``max_num_seqs`` (its
    capacity, not its traffic, set its pace there)."""
    return bool(preemptions) or kv_reserved_peak_frac >= FILLED_KV_FRAC \
        or (max_num_seqs is not None and max_running >= max_num_seqs)


def filled(s: dict, max_num_seqs: int | None) -> bool:
    """``filled_at`` for a run's summary."""
    return filled_at(s.get("preemptions"), s.get("kv_cache_reserved_frac_peak") or 0,
                     s.get("max_running_requests") or 0, max_num_seqs)


class CountRuns:
    """One replica's simulations at each count n of replicas (or one disaggregated side's at
    n instances), cached by count, as ``plan`` sizes them.

    - ``early(n)``: the run's first ``num_requests`` requests alone, the server filling. A
      count that misses a target there, less loaded than it will be, misses it in its steady
      state too, and a short run finds that out; where the whole run is hardly longer (at
      most twice as many requests), the whole run.
    - ``steady(n)``: the whole run, measured over its steady-state window; where one of n
      is ``light`` (``rate`` / n against ``rate_bound``, the analytic bound on one's rate),
      sized on the lifetime the early run shows where that is shorter than the targets'
      (``steady_lifetime_s``).
    - ``settled(n)``: ``steady(n)``, or the whole run over the targets' window where the
      steady run's window was capped and its replica ``filled`` nonetheless. The count found
      passes it too, or the next count that does is taken.

    ``stream(n, p99_ms)``: n's requests (the share of the rate one of n takes) and the
    window measured, the lifetime capped by ``p99_ms`` (None: not capped); a stream's first
    requests are a shorter stream's (``planner.serving.traffic.synthetic`` draws each
    request in turn). ``simulate(requests, window)``: a run's summary."""

    def __init__(self, stream, simulate, num_requests: int, *, rate: float,
                 rate_bound: float = math.inf, max_num_seqs: int | None = None):
        self.stream, self.simulate, self.num_requests = stream, simulate, num_requests
        self.rate, self.rate_bound, self.max_num_seqs = rate, rate_bound, max_num_seqs
        self.early_runs: dict[int, dict] = {}  # n -> its early run, where simulated alone
        self.whole: set[int] = set()  # counts whose whole run is their early run
        self.steady_runs: dict[int, dict] = {}
        self.settled_runs: dict[int, dict] = {}

    def early_p99_ms(self, n: int) -> float | None:
        """The p99 end-to-end latency that caps n's window: its early run's, where that was
        simulated alone, holds ``CAPPED_MIN_REQUESTS`` at least, and one of n is ``light``."""
        e = self.early_runs.get(n)
        return None if e is None or self.num_requests < CAPPED_MIN_REQUESTS or \
            not light(self.rate / n, self.rate_bound) else e.get("p99_e2el_ms")

    def observed_p99_ms(self, n: int) -> float | None:
        """The p99 end-to-end latency n's first requests showed: its early run's, or its
        whole run's where that is its early run; None where neither was simulated, or the
        early run holds fewer than ``CAPPED_MIN_REQUESTS``."""
        e = self.early_runs.get(n) or (self.steady_runs.get(n) if n in self.whole else None)
        return None if e is None or self.num_requests < CAPPED_MIN_REQUESTS else \
            e.get("p99_e2el_ms")

    def steady(self, n: int) -> dict:
        if n not in self.steady_runs:
            self.steady_runs[n] = self.simulate(*self.stream(n, self.early_p99_ms(n)))
        return self.steady_runs[n]

    def early(self, n: int) -> dict:
        if n not in self.early_runs and n not in self.whole:
            reqs, _ = self.stream(n, None)
            if len(reqs) <= 2 * self.num_requests:
                self.whole.add(n)
            else:
                self.early_runs[n] = self.simulate(reqs[:self.num_requests], None)
        return self.steady(n) if n in self.whole else self.early_runs[n]

    def settled_stream(self, n: int) -> tuple[list, tuple[float, float] | None]:
        """n's requests and window as ``settled(n)`` simulates them."""
        p99_ms = self.early_p99_ms(n)
        if p99_ms is not None and filled(self.steady(n), self.max_num_seqs):
            p99_ms = None
        return self.stream(n, p99_ms)

    def settled(self, n: int) -> dict:
        if n not in self.settled_runs:
            reqs, window = self.settled_stream(n)
            capped, capped_window = self.stream(n, self.early_p99_ms(n))
            self.settled_runs[n] = self.steady(n) if (len(reqs), window) == \
                (len(capped), capped_window) else self.simulate(reqs, window)
        return self.settled_runs[n]

    def fewest(self, ok, floor: int, max_factor: int = 64) -> int:
        """The fewest counts from ``floor`` whose early run and then steady state pass
        ``ok(summary)`` (``fewest_passing``), and then the first from it whose settled run
        does; 0 where none up to ``max_factor`` x ``floor`` does."""
        n = fewest_passing(lambda k: ok(self.early(k)) and ok(self.steady(k)), floor,
                           max_factor)
        while n and not ok(self.settled(n)):
            n = n + 1 if n < max_factor * floor else 0
        return n


def replicas_needed(dep: Deployment, *, prompt_tokens: int, output_tokens: int,
                    targets: Targets, settings: SimSettings, upper_rate: float,
                    max_factor: int = 64, speculation=None,
                    cache=None) -> tuple[int, dict | None]:
    """The fewest replicas that serve ``targets.requests_per_s`` with the
    ``settings.percentile`` TTFT and TPOT within the targets: each replica simulated with
    Poisson traffic at its share of the rate (its steps slowed by ``settings.step_factor``).
    Starts from the analytic bound (no fewer replicas can do) and searches upward, doubling
    then bisecting: a few simulations per configuration, each count's early run first
    (``CountRuns``). (0, None) when even ``max_factor`` times the bound cannot. The summary
    is of the predicted replica at that count; sized at slower steps, it carries the figures
    it was sized at under ``"sized_at"``. ``speculation``: what
    ``planner.serving.run.speculation_serving`` returns, or None. ``cache``: a
    ``planner.serving.cost.CostCache`` the search's candidates share (a step's operators
    depend on the model, precision and TP, not on the GPU)."""
    from planner.serving import run
    from planner.serving.metrics import summary
    from planner.serving.traffic import synthetic

    coster, cfg = run.coster(dep, cache), run.scheduler(dep, mode=settings.performance_mode)
    sizing = sizing_coster(coster, settings)
    life = request_lifetime_s(targets, output_tokens)

    def stream(n: int, p99_ms: float | None) -> tuple[list, tuple[float, float] | None]:
        rate = targets.requests_per_s / n
        count, window = sizing_requests(rate, steady_lifetime_s(life, p99_ms), settings)
        return synthetic(count, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                         range_ratio=settings.range_ratio, request_rate=rate,
                         seed=settings.seed), window

    def simulated(reqs: list, window, c=sizing) -> dict:
        return summary(run.run(dep, reqs, cfg, step_coster=c, speculation=speculation),
                       itl=False, window=window)

    runs = CountRuns(stream, simulated, settings.num_requests,
                     rate=targets.requests_per_s, rate_bound=upper_rate,
                     max_num_seqs=cfg.max_num_seqs)
    floor = max(1, math.ceil(targets.requests_per_s / upper_rate))  # fewer cannot serve it
    n = runs.fewest(lambda s: _percentile_ok(s, targets, settings), floor, max_factor)
    if not n:
        return 0, None
    if sizing is coster:
        return n, runs.settled(n)
    return n, {**simulated(*runs.settled_stream(n), coster), "sized_at": runs.settled(n)}


def fewest_passing(ok, floor: int, max_factor: int = 64) -> int:
    """The fewest counts n >= ``floor`` with ``ok(n)``, for an ``ok`` that holds from some
    count on (more replicas never serve worse): ``floor`` first, then widening, then
    bisecting; 0 when none up to ``max_factor`` x ``floor`` does."""
    if ok(floor):
        return floor
    # sustained rates come out at 60-90% of the bound: try 1/0.75 of the floor first
    lo, hi = floor, max(floor + 1, math.ceil(floor / 0.75))
    step = hi - lo
    while not ok(hi):  # widen until a count works
        lo, step = hi, step * 2
        hi = lo + step
        if hi > max_factor * floor:
            return 0
    while hi - lo > 1:  # lo fails, hi works
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _speculative_tpots(dep: Deployment, speculations, ctx: float, batches: list) -> dict:
    """Each speculation the deployment can run -> {batch: its TPOT with it}, by the
    estimate's cost of the verify and draft steps (``speculation_tpot``)."""
    from planner.core.errors import UsageError
    from planner.layouts.speculation import check_draft, speculation_tpot

    out = {}
    for cfg in speculations:
        try:
            check_draft(dep.model, cfg, dep.tp)
        except UsageError:
            continue  # a draft that cannot split over this TP
        out[cfg] = {b: speculation_tpot(dep.model, dep.prepared, dep.options, tp=dep.tp,
                                        cfg=cfg, batch=b, ctx=ctx).tpot_s for b in batches}
    return out


def _speculation_fields(spec, sized: dict, usd_per_hour_each: float, tried: list) -> dict:
    """A plan row's speculation: the method kept (None: none), its k, rate and its source,
    the cost without it and the cheapest with it (None where that way cannot meet the
    targets) and the methods tried."""
    base = sized.get(None)
    with_spec = [n for c, (n, _) in sized.items() if c is not None]
    return {"speculative": spec.method if spec else None,
            "num_speculative_tokens": spec.k if spec else None,
            "acceptance_rate": spec.acceptance if spec else None,
            "acceptance_source": spec.acceptance_source if spec else None,
            "baseline_usd_per_hour": base[0] * usd_per_hour_each if base else None,
            # the cheapest way with speculation (None: none met the targets)
            "speculative_usd_per_hour": min(with_spec) * usd_per_hour_each if with_spec
            else None,
            "speculation_tried": tried}


def search_continuous(model: ModelSpec, gpus: list[HardwareSpec], *, prompt_tokens: int,
                      output_tokens: int, targets: Targets, tps=(1, 2, 4, 8),
                      weights=(DType.bf16, DType.fp8, DType.int8, DType.int4),
                      kv_cache=(None, DType.fp8), options: Options | None = None,
                      calibration: Calibration | None = None,
                      price_usd_per_gpu_hour: float | None = None, engine: Engine = IDEAL,
                      settings: SimSettings | None = None, top: int = 10,
                      compute: DType | None = None, pps=(1,), eps=(1,),
                      quantized_layers: str = "all", speculations=(),
                      screened: pd.DataFrame | None = None, advance=None,
                      prefetch=None, auto_dtype: bool = False,
                      released: bool = False) -> pd.DataFrame:
    """The cheapest configurations sized by simulating continuous batching; ``prefetch``:
    configurations sized beforehand, side by side, with the same rows (``cut_in_order``).

    Screened analytically first: a configuration must fit, be priced and meet both targets
    for a single request. Its optimistic rate (each request costing only its share of the
    best batched decode step within the TPOT target, per output token, and its prompt at the
    best batched prefill rate) bounds the rate it can sustain, so its cost at that rate bounds
    its cost from below. Configurations are simulated in order of that
    bound, and the search stops once the bound of the next is above the ``top``-th cost found:
    no configuration left could make the list.

    ``speculations`` (``planner.layouts.speculation.SpeculationConfig``s): each tensor-parallel
    configuration is also sized with each of them, and a row speculates only where that
    lowers its cost at the targets (``speculative`` names the method; ``baseline_usd_per_hour``
    is the cost without, None where it cannot meet them). A configuration whose single request
    meets the TPOT target only with speculation is screened in; each way has its own bound on
    the rate, from its own TPOT by batch, and the search is cut by the best of them."""
    from planner.serving import run
    from planner.serving.cost import CostCache

    o = options or Options()
    st = settings or SimSettings()
    df = screened if screened is not None else screen(
        model, gpus, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
        targets=targets, tps=tps, weights=weights, kv_cache=kv_cache, options=o,
        calibration=calibration, price_usd_per_gpu_hour=price_usd_per_gpu_hour,
        engine=engine, compute=compute, pps=pps, eps=eps, quantized_layers=quantized_layers,
        auto_dtype=auto_dtype, released=released)
    df = df[df["supported"].astype(bool) & df["priced"]]
    keys = ["gpu", "tp", "pp", "ep", "weights", "kv_cache"]
    cols = keys + ["batch", "fits", "ttft_s", "tpot_s", "num_gpus", "price_usd_per_gpu_hour"]
    groups: dict[tuple, list[dict]] = {}  # plain rows: pandas per group costs seconds here
    for r in df[cols].to_dict("records"):
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    gpu_by_name = {h.name: h for h in gpus}

    def deployment(gpu, tp, pp, ep, w, kv) -> Deployment:
        prec_kv = None if kv == Precision.of(w, compute=compute).kv_cache.value else DType(kv)
        return Deployment.build(model, gpu_by_name[gpu], engine=engine, precision=grid_precision(
            model, w, prec_kv, compute=compute, quantized_layers=quantized_layers,
            auto=auto_dtype, released=released),
            layout=Layout(tp, pp, ep), options=o, calibration=calibration)

    ctx = prompt_tokens + output_tokens / 2
    cands = []
    for key, g in groups.items():
        one = next((r for r in g if r["batch"] == 1), None)
        if one is None or not bool(one["fits"]) or not float(one["ttft_s"]) <= targets.ttft_s:
            continue
        fit = [r for r in g if bool(r["fits"])]
        tpots = {None: {r["batch"]: float(r["tpot_s"]) for r in fit}}
        if speculations and key[2] == 1 and key[3] == 1:  # speculation: TP replicas only
            tpots.update(_speculative_tpots(deployment(*key), speculations, ctx,
                                            [r["batch"] for r in fit]))
        # a request costs the replica at least its prompt at the best prefill rate any batch
        # reaches and its share of a batched decode step (within the TPOT target) per token
        prefill_s = min(float(r["ttft_s"]) / (r["batch"] * prompt_tokens) for r in g
                        if r["ttft_s"] == r["ttft_s"]) * prompt_tokens
        bounds = {}  # speculation (None: without) -> requests/s: an upper bound
        for cfg, by_batch in tpots.items():
            ok = {b: t for b, t in by_batch.items() if t <= targets.tpot_s}
            if 1 in ok:  # a single request meets the target
                bounds[cfg] = 1.0 / (min(t / b for b, t in ok.items()) * output_tokens
                                     + prefill_s)
        if not bounds:
            continue
        gpus_each = int(one["num_gpus"])
        price = float(one["price_usd_per_gpu_hour"])
        lb = math.ceil(targets.requests_per_s / max(bounds.values())) * gpus_each * price
        cands.append((lb, key, price, one, gpus_each, bounds))
    cands.sort(key=lambda c: c[0])

    shared = CostCache()  # the candidates' step operators, built once for each shape

    def size(i: int) -> dict | None:
        """Candidate i sized: its plan row, or None where no replica count meets the
        targets."""
        lb, (gpu, tp, pp, ep, w, kv), price, one, gpus_each, bounds = cands[i]
        dep = deployment(gpu, tp, pp, ep, w, kv)
        sched = run.scheduler(dep, mode=st.performance_mode)
        sized = {}  # speculation (None: without) -> (replicas, summary)
        for cfg, bound in bounds.items():
            # the engine as it serves with the method (async scheduling: for_speculation)
            served = dep.for_speculation(None if cfg is None else cfg.method)
            sp = None if cfg is None else run.speculation_serving(served, cfg, sched)
            n, s = replicas_needed(served, prompt_tokens=prompt_tokens,
                                   output_tokens=output_tokens, targets=targets,
                                   settings=st, upper_rate=bound, speculation=sp,
                                   cache=shared)
            if n and s is not None:
                sized[cfg] = (n, s)
        if not sized:
            return None
        # speculation is kept only where it lowers the cost: ties go to decoding without it
        spec = min(sized, key=lambda c: (sized[c][0], c is not None))
        replicas, s = sized[spec]
        rate = targets.requests_per_s / replicas
        usd_per_hour = replicas * gpus_each * price
        p = st.percentile
        name = percentile_name(p)
        return {"gpu": gpu, "tp": int(tp), "pp": int(pp), "ep": int(ep),
                "num_gpus": gpus_each, "weights": w,
                "quantized_layers": quantized_layers, "kv_cache": kv,
                "engine": engine.name, "engine_release": engine.release,
                # the KV cache given outright per GPU, and its token cap (None: not given)
                "kv_cache_memory_bytes": o.kv_cache_memory_bytes,
                "kv_cache_max_tokens": o.kv_cache_max_tokens,
                "scheduler": "continuous", "rate_per_replica": rate, "percentile": p,
                f"{name}_ttft_s": s[f"{name}_ttft_ms"] / 1e3,
                f"{name}_tpot_s": (s[f"{name}_tpot_ms"] or 0) / 1e3,
                **sized_at_fields(s, st, name),
                "latency_s": s[f"{name}_e2el_ms"] / 1e3,
                **steady_fields(s),
                "mean_running_requests": s["mean_running_requests"],
                "max_running_requests": s["max_running_requests"],
                "batch": sched.max_num_seqs, "meets_targets": True,
                "replicas": replicas, "total_gpus": replicas * gpus_each,
                "price_usd_per_gpu_hour": price, "usd_per_hour": usd_per_hour,
                "cost_usd_per_million_output_tokens_at_traffic":
                    usd_per_hour / (targets.requests_per_s * output_tokens * 3600) * 1e6,
                "lower_bound_usd_per_hour": lb, "analytic_rate_bound": bounds[spec],
                "single_request_ttft_s": float(one["ttft_s"]),
                "single_request_tpot_s": float(one["tpot_s"]),
                **_speculation_fields(spec, sized, gpus_each * price,
                                      [c.method for c in bounds if c])}

    def started(i: int) -> None:
        if advance is not None:  # progress: one configuration more being sized
            gpu, tp, pp, ep, w, _ = cands[i][1]
            advance(f"{gpu} {Layout(tp, pp, ep).label} {w}")

    rows = cut_in_order([c[0] for c in cands], size, top, started=started, prefetch=prefetch)
    out = pd.DataFrame(rows)
    if len(out):
        out = out.sort_values(["usd_per_hour", "total_gpus"]).reset_index(drop=True)
        out.insert(0, "rank", np.arange(1, len(out) + 1))
    return out


def nearest_miss(df: pd.DataFrame, targets: Targets) -> str:
    """Why a search found nothing: what binds (memory, the TPOT or TTFT target for even a
    single request, or the traffic) and the configuration nearest to meeting both targets,
    with how far it is from each. ``df``: ``search``'s rows."""

    def num(col: str) -> pd.Series:
        return pd.to_numeric(df[col], errors="coerce")

    ok = df["supported"].astype(bool) & df["priced"].astype(bool)
    if not ok.any():
        return "no configuration searched is supported and priced"
    fit = ok & df["fits"].astype(bool)
    if not fit.any():
        need = num("total_memory_bytes").where(ok)
        i = (need / num("usable_memory_bytes")).where(ok).idxmin()
        r = df.loc[i]
        return (f"memory binds: nothing fits; the closest, {_label(r)} at batch "
                f"{int(r['batch'])}, needs {r['total_memory_bytes'] / 2**30:,.1f} GiB per GPU "
                f"of {r['usable_memory_bytes'] / 2**30:,.1f} usable")
    ttft, tpot = num("ttft_s"), num("tpot_s")
    over = pd.concat([ttft / targets.ttft_s, tpot / targets.tpot_s], axis=1).max(axis=1)
    i = over.where(fit).idxmin()
    r = df.loc[i]
    one = fit & (df["batch"] == 1)
    binds = []
    if one.any() and tpot.where(one).min() > targets.tpot_s:
        j = tpot.where(one).idxmin()
        binds.append(f"TPOT binds: the fastest single request decodes at "
                     f"{tpot[j] * 1e3:,.1f} ms ({_label(df.loc[j])})")
    if one.any() and ttft.where(one).min() > targets.ttft_s:
        j = ttft.where(one).idxmin()
        binds.append(f"TTFT binds: the fastest single prompt takes {_time(ttft[j])} "
                     f"({_label(df.loc[j])})")
    if not binds:
        binds.append(f"the traffic binds: configurations meet the targets for one request, "
                     f"but none serves {targets.requests_per_s:g} req/s within them")
    return ("; ".join(binds) + f". Nearest: {_label(r)} at batch {int(r['batch'])}, TTFT "
            f"{_time(ttft[i])} ({_rel(ttft[i], targets.ttft_s)}), TPOT {_time(tpot[i])} "
            f"({_rel(tpot[i], targets.tpot_s)})")


def _label(r) -> str:
    return (f"{r['gpu']} {Layout(int(r['tp']), int(r['pp']), int(r['ep'])).label} "
            f"{r['weights']}/{r['kv_cache']}")


def _rel(value: float, target: float) -> str:
    d = value / target - 1
    if d <= 0:
        return "within it"
    return f"{d:.0%} over the target" if d < 1 else f"{value / target:,.1f}x the target"


def _time(t: float) -> str:
    """A time in the unit the targets are read in: ms below a second, s above."""
    return f"{t * 1e3:,.1f} ms" if t < 1 else f"{t:,.2f} s"
