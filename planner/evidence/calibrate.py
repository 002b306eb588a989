"""Fit an engine profile to measured serving runs: `llmplan calibrate`.

The free parameters are those a serving stack changes most and a measurement can see: the
fixed cost of a decode step (``step_overhead_us``: scheduling, sampling, what CUDA graphs do
not hide), the bandwidth efficiency of the decode GEMMs (``gemm_bandwidth_frac``, or its factor
on the runs' GPU architecture where the profile has one), the share of
its kernel's compute rate each matmul attains in a served step, plain or quantized
(``served_compute_frac``: prefill, and decode at large batches) and, with TP, the all-reduce
latency
(``allreduce_latency_us``). Each run is predicted by the simulator (``planner.evidence.compare``)
and its residuals are log(predicted / measured) of the mean TTFT, the mean TPOT (or ITL) and
the output throughput it reports; the loss is the same soft-L1 as ``planner.evidence.fit``
and the search the same bounded coordinate descent in log space.

Each parameter is searched within a physical range (``RANGES``, each with its reason); a fit that
ends at a range's edge is refused (``ProfileFit.refused``) and ``llmplan calibrate`` writes
nothing. A parameter the runs cannot identify is left at the base engine's value and named:
one whose change by a quarter moves no residual by more than half a percent (a prefill
efficiency when every prompt is short, an all-reduce latency at TP 1). Errors are reported
in-sample (fitted on every run) and leave-one-out (each run predicted by a fit on the others),
so a user sees how well the fit carries to a run it did not see. Pure: no I/O (with ``jobs``
> 1 the leave-one-out fits run in forked processes, each as it would run here).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.core.engine import EngineSpec
from planner.core.estimate import prepare
from planner.evidence.compare import mean_tpot_s, simulate_run
from planner.evidence.fit import (
    ARCH_GEMM_PARAM,
    bounds_of,
    descend,
    get_param,
    round_sig3,
    set_params,
    soft_l1,
)
from planner.evidence.runs import ServedRun
from planner.evidence.workers import forked
from planner.layouts.deployment import Deployment
from planner.serving import run as serving
from planner.serving.cost import CostCache

DEFAULT_PARAMS = ("step_overhead_us", "gemm_bandwidth_frac", "served_compute_frac",
                  "allreduce_latency_us")
# measured figure -> the simulator's key for it
FIT_METRICS = {"mean_ttft_s": "mean_ttft_ms", "mean_tpot_s": "mean_tpot_ms",
               "output_throughput": "output_throughput"}
_FIT_ITL = any("_itl_" in v for v in FIT_METRICS.values())  # else the summary skips them
FIT_MAX_REQUESTS = 200  # each run is simulated on at most this many requests while fitting
# Physical ranges of the fitted parameters, each with its reason. The search stays inside them,
# and a value that ends at an edge (within EDGE) is refused: it would be standing in for
# something the model lacks (three vLLM runs once "fitted" a GEMM bandwidth fraction of 0.44
# with a 22 us step: a pair that fits those points and nothing else).
RANGES: dict[str, tuple[float, float, str]] = {
    "step_overhead_us": (20.0, 15000.0, "a step's exposed host work is at least tens of "
                         "microseconds; above 15 ms it is no serving engine with CUDA graphs"),
    "gemm_bandwidth_frac": (0.6, 1.0, "a decode GEMM streams its weights as a copy does: "
                            "cuBLAS, CUTLASS and Marlin reach 60-100% of copy bandwidth"),
    "served_compute_frac": (0.3, 1.0, "a served step's matmuls attain at most their kernels' "
                            "own rate, and at least 30% of it (below, the step would be spent "
                            "mostly outside its GEMMs)"),
    "allreduce_latency_us": (2.0, 500.0, "an all-reduce over NVLink or PCIe costs microseconds "
                             "to a few hundred"),
}
EDGE = 0.02


def range_of(name: str, ranges: dict | None = None) -> tuple[float, float]:
    r = (ranges or RANGES).get(name)
    return (r[0], r[1]) if r else bounds_of(name)


def at_edge(name: str, v: float, ranges: dict | None = None) -> str | None:
    """Why a fitted ``v`` is refused, or None."""
    ranges = ranges or RANGES
    if name not in ranges:
        return None
    lo, hi, why = ranges[name]
    if v <= lo * (1 + EDGE) or v >= hi * (1 - EDGE):
        return f"{name} = {v:g} ends at the edge of its physical range {lo:g}-{hi:g} ({why})"
    return None
IDENTIFY_STEP = 1.25  # a parameter moved by this factor ...
IDENTIFY_MIN = 0.005  # ... must move some residual by more than this (log) to be fitted


@dataclass(frozen=True)
class MetricError:
    run: str
    metric: str
    measured: float
    before: float | None  # predicted with the base engine
    in_sample: float | None  # predicted with the engine fitted on every run
    held_out: float | None  # predicted with the engine fitted on the other runs

    @staticmethod
    def err(pred: float | None, meas: float) -> float | None:
        return None if pred is None else pred / meas - 1


@dataclass(frozen=True)
class ProfileFit:
    """An engine profile fitted to served runs: the fitted parameters, those the runs could
    not identify, and the in-sample and leave-one-out errors of each run."""

    engine: EngineSpec
    values: dict[str, float]
    fitted: tuple[str, ...]
    unidentified: dict[str, str]  # parameter -> why it stayed at the base value
    errors: tuple[MetricError, ...]
    runs: tuple[str, ...]
    refused: tuple[str, ...] = ()  # why the fit is not physical (a value at a range's edge)


def run_id(run: ServedRun) -> str:
    return f"{run.source.rsplit('/', 1)[-1]}#{run.label}"


def _measured(run: ServedRun) -> dict[str, float]:
    m = run.metrics
    out = {}
    ttft = m.get("mean_ttft_s") or m.get("median_ttft_s")
    tpot = mean_tpot_s(run)
    if ttft:
        out["mean_ttft_s"] = ttft
    if tpot:
        out["mean_tpot_s"] = tpot
    if m.get("output_throughput"):
        out["output_throughput"] = m["output_throughput"]
    return out


class _Predictor:
    """Predictions of the runs for an engine spec, cached by parameter values and run, and
    simulated only for the runs asked about (a leave-one-out fit never simulates the run it
    leaves out). One step coster per parameter values serves every run, and the costers of
    all the values tried share their operators, and their timed sums where only host costs
    differ (``planner.serving.cost.CostCache``)."""

    def __init__(self, base: Deployment, spec: EngineSpec, runs: list[ServedRun],
                 progress: Callable[[str], None] | None = None):
        self.base, self.spec, self.runs = base, spec, runs
        # told of each run simulated, with what the fit is doing (``stage``)
        self.progress = progress or (lambda detail: None)
        self.stage = "fitting"
        self._cache: dict[tuple[tuple, int], dict[str, float]] = {}
        self._costs = CostCache()
        # the last values' deployment and step coster
        self._setup: tuple[tuple, Deployment, object] | None = None

    def setup(self, values: dict[str, float]) -> Deployment:
        spec = set_params(self.spec, values) if values else self.spec
        b = self.base
        prep = prepare(b.hardware, b.precision, None, b.options, spec.model())
        return replace(b, prepared=prep)

    def predict_run(self, values: dict[str, float], i: int) -> dict[str, float]:
        key = tuple(sorted(values.items()))
        got = self._cache.get((key, i))
        if got is None:
            if self._setup is None or self._setup[0] != key:
                dep = self.setup(values)
                self._setup = (key, dep, serving.coster(dep, self._costs))
            _, dep, coster = self._setup
            run = self.runs[i]
            short = run if run.num_prompts <= FIT_MAX_REQUESTS else replace(
                run, num_prompts=FIT_MAX_REQUESTS)
            sim, _ = simulate_run(short, dep, step_coster=coster, itl=_FIT_ITL)
            self.progress(self.stage)
            got = {k: sim[v] / (1e3 if v.endswith("_ms") else 1.0)
                   for k, v in FIT_METRICS.items()
                   if sim.get(v) is not None and math.isfinite(sim[v])}
            self._cache[(key, i)] = got
        return got

    def predict(self, values: dict[str, float]) -> list[dict[str, float]]:
        return [self.predict_run(values, i) for i in range(len(self.runs))]

    def residuals(self, values: dict[str, float], idx: list[int]) -> list[float]:
        out = []
        for i in idx:
            pred = self.predict_run(values, i)
            for k, v in _measured(self.runs[i]).items():
                p = pred.get(k)
                if p:
                    out.append(math.log(p / v))
        return out


def _identifiable(pred: _Predictor, values: dict[str, float], idx: list[int],
                  ranges: dict | None = None) -> dict[str, str]:
    """Parameters whose change moves no residual: name -> why."""
    base = pred.residuals(values, idx)
    out = {}
    for p, v in values.items():
        lo, hi = range_of(p, ranges)
        moved = 0.0
        for f in (IDENTIFY_STEP, 1 / IDENTIFY_STEP):
            w = min(max(v * f, lo), hi)
            if w == v:
                continue
            r = pred.residuals({**values, p: w}, idx)
            if len(r) == len(base):
                moved = max(moved, max((abs(a - b) for a, b in zip(r, base, strict=True)),
                                       default=0.0))
        if moved <= IDENTIFY_MIN:
            out[p] = (f"a {IDENTIFY_STEP:g}x change moves no measured figure by more than "
                      f"{IDENTIFY_MIN:.1%}")
    return out


def _fit(pred: _Predictor, values: dict[str, float], idx: list[int], *,
         sweeps: int, tol: float, ranges: dict | None = None) -> dict[str, float]:
    def cost(vals: dict[str, float]) -> float:
        return sum(soft_l1(r) for r in pred.residuals(vals, idx))

    got, _ = descend(cost, values, cost(values), sweeps=sweeps, tol=tol,
                     bounds=lambda p: range_of(p, ranges))
    return {p: round_sig3(v) for p, v in got.items()}


def _on_this_architecture(params: tuple[str, ...], spec: EngineSpec,
                          architecture: str | None) -> tuple[tuple[str, ...], dict]:
    """``params`` as runs on a GPU of ``architecture`` fit them, and their ranges. Where the
    profile scales its 16-bit GEMMs' bandwidth share on that architecture
    (``gemm_bandwidth_arch_frac``), the runs set the share there, the profile's
    ``gemm_bandwidth_frac`` times that factor: the factor is fitted, the base share (what
    the profile's other architectures stand on) kept, and the physical range is the share's,
    0.6-1 of the copy bandwidth on this GPU, not the parameter's."""
    arch = (architecture or "").lower()
    f = spec.gemm_bandwidth_arch_frac
    if "gemm_bandwidth_frac" not in params or f is None or arch not in f.value:
        return params, RANGES
    name = ARCH_GEMM_PARAM + arch
    g = spec.gemm_bandwidth_frac.value
    lo, hi, why = RANGES["gemm_bandwidth_frac"]
    ranges = {**RANGES, name: (lo / g, hi / g, f"times gemm_bandwidth_frac {g:g}, the share of "
                                               f"copy bandwidth on {arch} GPUs: {why}")}
    return tuple(name if p == "gemm_bandwidth_frac" else p for p in params), ranges


def calibrate(runs: list[ServedRun], base: Deployment, spec: EngineSpec, *, name: str,
              date: str, params: tuple[str, ...] = DEFAULT_PARAMS, sweeps: int = 8,
              tol: float = 5e-3, leave_one_out: bool = True, jobs: int = 1,
              progress: Callable[[str], None] | None = None) -> ProfileFit:
    """Fit ``params`` of ``spec`` to ``runs`` measured on ``base``'s deployment;
    ``progress(stage)`` is called after each run simulated (the CLI's progress bar). ``jobs``
    > 1: the leave-one-out fits run in that many forked workers beside the whole fit (the
    same figures; ``planner.evidence.workers``)."""
    runs = [r for r in runs if r.batch is None and _measured(r)]
    if not runs:
        raise ValueError("no serving run with a TTFT, TPOT or throughput to fit")
    if base.tp == 1:
        params = tuple(p for p in params if p != "allreduce_latency_us")
    params, ranges = _on_this_architecture(params, spec, base.hardware.architecture)
    pred = _Predictor(base, spec, runs, progress)
    idx = list(range(len(runs)))
    start = {p: min(max(get_param(spec, p), range_of(p, ranges)[0]), range_of(p, ranges)[1])
             for p in params}
    unidentified = _identifiable(pred, start, idx, ranges)
    if base.tp == 1 and "allreduce_latency_us" in DEFAULT_PARAMS:
        unidentified["allreduce_latency_us"] = "every run is at TP 1: no all-reduce"
    free = {p: v for p, v in start.items() if p not in unidentified}
    loo = leave_one_out and len(runs) > 1 and bool(free)

    def without(i: int) -> dict[str, float]:
        # each fit without a run starts where the whole fit started, not from its answer: on
        # the flat valleys these losses have, a search started from values fitted with the run
        # stays near them, and the run would be predicted by its own fit
        others = [j for j in idx if j != i]
        return pred.predict_run(_fit(pred, free, others, sweeps=sweeps, tol=tol,
                                     ranges=ranges), i)

    def in_worker(i: int) -> tuple[dict[str, float], int]:
        # a forked worker: its simulations are counted and reported by the parent
        simulated = []
        pred.progress = simulated.append
        return without(i), len(simulated)

    held: dict[int, dict[str, float]] = {}
    with forked(in_worker, idx if loo else [], jobs) as results:
        values = _fit(pred, free, idx, sweeps=sweeps, tol=tol, ranges=ranges) if free else {}
        if results is not None:
            pred.stage = f"leaving out each of {len(idx)} runs"
            for i, (got, simulated) in zip(idx, results(), strict=True):
                held[i] = got
                for _ in range(simulated):
                    pred.progress(pred.stage)
        elif loo:
            for i in idx:
                pred.stage = f"leaving out run {i + 1} of {len(idx)}"
                held[i] = without(i)
    before = pred.predict({})
    after = pred.predict(values)
    errors = []
    for i, run in enumerate(runs):
        for k, v in _measured(run).items():
            errors.append(MetricError(run_id(run), k, v, MetricError.err(before[i].get(k), v),
                                      MetricError.err(after[i].get(k), v),
                                      MetricError.err(held[i].get(k), v) if i in held
                                      else None))
    ids = tuple(run_id(r) for r in runs)
    fitted = spec
    if values:
        data = set_params(spec, values, fitted_on=ids).model_dump()
        for p in values:
            arch = p[len(ARCH_GEMM_PARAM):] if p.startswith(ARCH_GEMM_PARAM) else None
            node = data["gemm_bandwidth_arch_frac" if arch else p]
            # one architecture's figure is fitted; the others stay the base profile's
            kept = (f"; the other architectures' as in {spec.name} ("
                    f"{spec.gemm_bandwidth_arch_frac.source})" if arch else "")
            node.update(source="llmplan calibrate", date=date, estimated=False,
                        note=f"fitted by llmplan calibrate to the runs in fitted_on"
                             f"{f' ({arch})' if arch else ''} (base {spec.name}: "
                             f"{get_param(spec, p):g}){kept}")
        fitted = EngineSpec.model_validate(data)
    fitted = fitted.model_copy(update={
        "name": name, "date": date,
        "display_name": f"{spec.display_name} (calibrated)",
        "engine_version": f"{spec.engine_version}; calibrated by llmplan on {len(runs)} "
                          f"run(s) of {base.model.name} on {base.tp} x {base.hardware.name}",
        "source": f"llmplan calibrate: {', '.join(sorted({r.source for r in runs}))}"})
    # a value the search drove to an edge (one left where the base profile had it is not)
    refused = tuple(r for p, v in values.items()
                    if abs(v / start[p] - 1) > 0.01 and (r := at_edge(p, v, ranges)))
    return ProfileFit(fitted, values, tuple(values), unidentified, tuple(errors), ids, refused)


__all__ = ["ProfileFit", "MetricError", "calibrate", "run_id"]
