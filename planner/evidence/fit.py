"""Fit an engine profile's free parameters to measurements, by robust least squares on log error.

The residual of a measured figure is r = log(predicted / measured): a relative error, symmetric
in over- and under-prediction, so a TTFT of seconds and a TPOT of milliseconds weigh alike. The
loss is the pseudo-Huber (soft-L1) of r with a scale of 10%, delta^2 (sqrt(1 + (r/delta)^2) - 1):
quadratic for small errors, linear for large ones, so a few rows the model cannot explain (a
kernel the profile does not describe) do not drag every parameter to compensate for them.
Each parameter is searched in log space within its bounds (fractions in [0.3, 1], costs in
microseconds in [0.01, 20000]) by cyclic coordinate descent with a golden-section line
search, each sweep ended by a line search along the sweep's net move (Powell's), which follows
a valley that runs across the axes: a handful of smooth parameters, so no gradient or solver
library is needed.

Pure: the caller supplies the rows (validation datasets), the models, GPUs and the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.core.engine import Engine, EngineSpec
from planner.evidence.validate import Dataset, compare

# A fitted efficiency below 0.3 or a fixed cost above 20 ms would be compensating for something
# the model lacks, not measuring the engine: the bounds keep a fit physical, and a value at a
# bound is reported as such.
FRACTION_BOUNDS = (0.3, 1.0)
MICROSECOND_BOUNDS = (0.01, 20000.0)


# Parameters a profile may leave out, with the value that stands for them (the time model's
# own default): a fit starts there and writes the parameter in (served_compute_frac: a matmul
# attains its kernel's own rate).
OPTIONAL_DEFAULTS = {"served_compute_frac": Engine.served_compute_frac,
                     "worker_step_overhead_us": Engine.worker_step_overhead_s * 1e6}


# ``gemm_bandwidth_arch_frac.<architecture>``: one architecture's factor on the 16-bit GEMMs'
# bandwidth share, fitted where runs on a GPU of that architecture set it (1 where unnamed)
ARCH_GEMM_PARAM = "gemm_bandwidth_arch_frac."


def get_param(spec: EngineSpec, name: str) -> float:
    if name.startswith(ARCH_GEMM_PARAM):
        f = spec.gemm_bandwidth_arch_frac
        return 1.0 if f is None else f.value.get(name[len(ARCH_GEMM_PARAM):], 1.0)
    if name in OPTIONAL_DEFAULTS and getattr(spec, name) is None:
        return OPTIONAL_DEFAULTS[name]
    return _param(spec, name).value


def _param(spec: EngineSpec, name: str):
    parts = name.split(".")
    if parts[0] == "quantized" and len(parts) == 3:
        return getattr(spec.quantized[parts[1]], parts[2])
    if len(parts) != 1 or name not in spec.parameters():
        raise KeyError(f"no fittable parameter '{name}' in engine {spec.name}")
    return getattr(spec, name)


def set_params(spec: EngineSpec, values: dict[str, float],
               fitted_on: tuple[str, ...] | None = None) -> EngineSpec:
    """A copy of ``spec`` with new parameter values (and, when given, their fitted rows)."""
    data = spec.model_dump()
    for name, v in values.items():
        if name.startswith(ARCH_GEMM_PARAM):
            node = data.get("gemm_bandwidth_arch_frac") or {
                "source": "llmplan calibrate", "value": {}}
            node["value"] = {**node["value"], name[len(ARCH_GEMM_PARAM):]: v}
            data["gemm_bandwidth_arch_frac"] = node
            if fitted_on is not None:
                node["fitted_on"] = list(fitted_on)
            continue
        parts = name.split(".")
        if data.get(name, 0) is None and name in OPTIONAL_DEFAULTS:
            data[name] = {"source": "definition: the kernels' own rate",
                          "note": "absent from the base profile; stands at its default, 1"}
        node = data["quantized"][parts[1]][parts[2]] if parts[0] == "quantized" else data[name]
        node["value"] = v
        if fitted_on is not None:
            node["fitted_on"] = list(fitted_on)
    return EngineSpec.model_validate(data)


def bounds_of(name: str) -> tuple[float, float]:
    return FRACTION_BOUNDS if name.endswith("_frac") else MICROSECOND_BOUNDS


@dataclass(frozen=True)
class FitResult:
    engine: EngineSpec
    values: dict[str, float]
    before_rms_log_error: float
    after_rms_log_error: float
    rows: tuple[str, ...]
    n: int


HUBER_DELTA = 0.1


def soft_l1(r: float) -> float:
    return HUBER_DELTA ** 2 * (math.sqrt(1 + (r / HUBER_DELTA) ** 2) - 1)


def _objective(spec: EngineSpec, datasets: list[Dataset], models, gpus,
               loss=soft_l1) -> tuple[float, int]:
    total, n = 0.0, 0
    for ds in datasets:
        # each source's rows as ``validate`` predicts them: the profile as their release
        # starts (``EngineSpec.as_released``: TensorRT-LLM's TensorRT engines before 1.0)
        s = spec.as_released(ds.source.engine_version)
        for c in compare(ds, models=models, gpus=gpus, engines={spec.name: s}):
            total += loss(math.log(c.predicted / c.measured))
            n += 1
    return total, n


def rms_log_error(spec: EngineSpec, datasets: list[Dataset], models, gpus) -> float:
    total, n = _objective(spec, datasets, models, gpus, loss=lambda r: r * r)
    return math.sqrt(total / max(n, 1))


def fit(spec: EngineSpec, params: list[str], datasets: list[Dataset], *, models, gpus,
        sweeps: int = 40, tol: float = 1e-4) -> FitResult:
    """Fit ``params`` of ``spec`` to every row of ``datasets`` (already filtered to the fit
    rows, each predicted with ``spec`` whatever engine its source names)."""
    datasets = [ds.model_copy(update={
        "source": ds.source.model_copy(update={"engine": spec.name}),
        "rows": [r.model_copy(update={"engine": None}) for r in ds.rows]}) for ds in datasets]
    rows = tuple(f"{ds.source.id}:{r.id}" for ds in datasets for r in ds.rows)
    values = {p: get_param(spec, p) for p in params}
    before, n = _objective(spec, datasets, models, gpus)
    rms_before = rms_log_error(spec, datasets, models, gpus)

    def cost(vals: dict[str, float]) -> float:
        return _objective(set_params(spec, vals), datasets, models, gpus)[0]

    values, _ = descend(cost, values, before, sweeps=sweeps, tol=tol)
    values = {p: round_sig3(v) for p, v in values.items()}
    fitted = set_params(spec, values, fitted_on=rows)
    return FitResult(fitted, values, rms_before, rms_log_error(fitted, datasets, models, gpus),
                     rows, n)


def descend(cost, values: dict[str, float], best: float, *, sweeps: int = 40,
            tol: float = 1e-4, bounds=bounds_of) -> tuple[dict[str, float], float]:
    """Cyclic coordinate descent of ``cost(values)`` over the named parameters, each by a
    golden-section search of its log within ``bounds(name)``, each sweep that moved more than
    one of them ended by a search along its net move (``_along``); (values, cost) at the end.
    A parameter whose line was searched with every other value as it is now is not searched
    again: the same line, the same answer (the last sweep, which only confirms, skips one).
    A starting value outside its bounds (0: a cost not yet stated) starts at the nearer one,
    and ``best`` is then that start's cost, not the caller's."""
    inside = {p: min(max(v, bounds(p)[0]), bounds(p)[1]) for p, v in values.items()}
    if inside != values:
        best = cost(inside)
    values = inside
    searched: dict[str, dict[str, float]] = {}  # parameter -> the others when last searched
    for _ in range(sweeps):
        start, at_start = best, dict(values)
        for p in values:
            others = {q: v for q, v in values.items() if q != p}
            if searched.get(p) == others:
                continue
            searched[p] = others
            lo, hi = bounds(p)

            def f(logv: float, p: str = p, values: dict[str, float] = values) -> float:
                return cost({**values, p: math.exp(logv)})

            x = _golden(f, math.log(lo), math.log(hi), tol)
            fx = f(x)
            if fx < best:
                values[p], best = math.exp(x), fx
        moved = {p: math.log(values[p] / at_start[p]) for p in values}
        if sum(abs(m) > 1e-12 for m in moved.values()) > 1:
            # the sweep's net move, searched as a line of its own (Powell's): a valley that
            # runs across the axes is followed along it, where searches along each axis alone
            # stall in it, each a step short
            values, best = _along(cost, values, best, at_start, moved, bounds, tol)
        if start - best < 1e-9:
            break
    return values, best


def _along(cost, values: dict[str, float], best: float, at: dict[str, float],
           move: dict[str, float], bounds, tol: float) -> tuple[dict[str, float], float]:
    """The best of ``values`` and the points ``at`` x exp(t x ``move``) (logs), t from 0 to
    where the first parameter meets its bound (a move made of small zigzag steps may be a
    small part of the way along the valley), t found to the precision that puts each log
    within ``tol``, as the searches along the axes do."""
    reach = min((math.log((bounds(p)[1] if m > 0 else bounds(p)[0]) / at[p]) / m
                 for p, m in move.items() if m), default=0.0)

    def point(t: float) -> dict[str, float]:
        return {p: at[p] * math.exp(t * move[p]) for p in at}

    if reach <= 0:
        return values, best
    t = _golden(lambda t: cost(point(t)), 0.0, reach, tol / max(map(abs, move.values())))
    ft = cost(point(t))
    return (point(t), ft) if ft < best else (values, best)


def _golden(f, a: float, b: float, tol: float) -> float:
    """Minimum of a unimodal ``f`` on [a, b] by golden-section search."""
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        # the new point is costed only if the search goes on: its cost decides nothing else
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            if b - a > tol:
                fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            if b - a > tol:
                fd = f(d)
    return (a + b) / 2


def round_sig3(v: float) -> float:
    """Three significant digits: a fitted value claims no more precision than that."""
    if v == 0:
        return 0.0
    return round(v, 2 - int(math.floor(math.log10(abs(v)))))
