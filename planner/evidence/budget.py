"""Capacity budgets: deployments with limits on what the planner predicts for them.

A budget lists deployments (model, GPU, TP and optionally PP stages or EP GPUs, precisions,
workload) and limits, written with
units where that helps (``50ms``, ``2s``, ``80%``, ``$0.50``, ``1.5k``). ``check`` predicts
each deployment and compares: a limit holds or fails, and by how much. Pure: the YAML is read
by ``planner.io.catalog``; models and GPUs are resolved by the caller.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planner.core.arith import no_bool_numbers
from planner.core.engine import PERFORMANCE_MODES
from planner.core.specs import MAX_COUNT, DType, Workload

_TIME = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9}


def parse_quantity(value: Any, kind: Literal["time", "frac", "usd", "number"]) -> float:
    """'50ms' -> 0.05, '80%' -> 0.8, '$0.50' -> 0.5, '1.5k' -> 1500; numbers pass through.
    NaN and infinity are no limit: a ValueError."""
    try:
        v = _parse(value, kind)
    except (ValueError, OverflowError):
        raise ValueError(_not_a(value, kind)) from None
    if not math.isfinite(v):
        raise ValueError(f"'{value}' is not a finite {kind}")
    return v


def _parse(value: Any, kind: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a {kind}, got {value}")
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip().replace(",", "").replace("_", "")
    if kind == "time":
        m = re.fullmatch(r"([0-9.eE+-]+)\s*(us|µs|ms|s|min|m|h)?", text)
        if m:
            return float(m.group(1)) * _TIME[m.group(2) or "s"]
    elif kind == "frac":
        m = re.fullmatch(r"([0-9.eE+-]+)\s*(%)?", text)
        if m:
            return float(m.group(1)) / (100 if m.group(2) else 1)
    elif kind == "usd":
        m = re.fullmatch(r"\$?\s*([0-9.eE+-]+)", text)
        if m:
            return float(m.group(1))
    else:
        m = re.fullmatch(r"([0-9.eE+-]+)\s*([kMG])?", text)
        if m:
            return float(m.group(1)) * _SCALE.get(m.group(2) or "", 1.0)
    raise ValueError(_not_a(value, kind))


def _not_a(value: Any, kind: str) -> str:
    examples = {"time": "50ms, 2s, 300us", "frac": "80%, 0.8", "usd": "$0.50, 0.5",
                "number": "1500, 1.5k"}[kind]
    return f"'{value}' is not a {kind} (examples: {examples})"


# name -> (kind, "max" | "min", the Estimate figure it limits, how it reads)
LIMITS: dict[str, tuple[str, str, str, str]] = {
    "memory_frac": ("frac", "max", "memory_used_frac", "memory used / capacity"),
    # a static batch: every prompt of `batch` prefilled together before the first token
    "ttft_s": ("time", "max", "ttft_s", "batch TTFT (all prompts at once)"),
    "tpot_s": ("time", "max", "tpot_s", "TPOT"),
    "latency_s": ("time", "max", "latency_s", "end-to-end latency"),
    "throughput_tokens_per_s": ("number", "min", "throughput_tokens_per_s",
                                "decode throughput"),
    "cost_usd_per_million_tokens": ("usd", "max", "cost_usd_per_million_output_tokens",
                                    "cost per 1M output tokens"),
    "mbu_min": ("frac", "min", "mbu", "MBU"),
}


# served limits, held on a simulated replica under the deployment's ``traffic``: name ->
# (kind, "max" | "min", the run summary's figure, how it reads); the times at the traffic's
# percentile, the throughput the deployment's (every replica's) output tokens a second
SERVED_LIMITS: dict[str, tuple[str, str, str, str]] = {
    "served_ttft_s": ("time", "max", "ttft", "served TTFT"),
    "served_tpot_s": ("time", "max", "tpot", "served TPOT"),
    "served_latency_s": ("time", "max", "e2el", "served end-to-end latency"),
    "served_output_tokens_per_s": ("number", "min", "output_throughput",
                                   "served output throughput"),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    _no_bools = field_validator("*", mode="before")(no_bool_numbers)


_W = Workload.model_fields  # the workload every command defaults to, declared once there


class BudgetWorkload(_Strict):
    """A deployment's workload; what it leaves out is every command's default workload
    (``planner.core.specs.Workload``: 1 sequence, 1024 prompt and 256 output tokens)."""

    batch: int | None = Field(None, gt=0, le=MAX_COUNT)
    concurrent_sequences: int | None = Field(None, gt=0, le=MAX_COUNT)  # a synonym of batch
    prompt_tokens: int = Field(_W["prompt_tokens"].default, gt=0, le=MAX_COUNT)
    output_tokens: int = Field(_W["output_tokens"].default, gt=0, le=MAX_COUNT)

    @model_validator(mode="after")
    def _one(self) -> BudgetWorkload:
        if self.batch is not None and self.concurrent_sequences is not None:
            raise ValueError("give one of batch or concurrent_sequences, not both")
        return self

    @property
    def sequences(self) -> int:
        return self.batch or self.concurrent_sequences or _W["batch"].default


class BudgetTraffic(_Strict):
    """The traffic a deployment's served limits are held at: Poisson arrivals at
    ``request_rate`` split evenly over ``replicas`` replicas of the deployment, each
    simulated with the workload's prompt and output tokens (``dataset_name``'s lengths:
    uniform within ``range_ratio``, or a published distribution scaled to those means where
    the workload states them, else at its own), continuous
    batching with the engine's defaults; the times at the ``percentile``-th percentile (50:
    the median). ``measure``: ``steady`` (the default) holds the times of at least
    ``num_requests`` requests arriving once the replica has filled and before the stream
    ends, as ``plan`` sizes a replica (``planner.search.plan.sizing_requests``, on the
    limits' request lifetime, which ``plan`` caps for a lightly loaded replica whose first
    requests live far less); ``all`` holds those of a run of ``num_requests`` from an empty
    server, ramp-up included."""

    request_rate: float = Field(gt=0, le=1e9)  # requests a second, all replicas together
    replicas: int = Field(1, gt=0, le=MAX_COUNT)
    # lengths as vLLM's bench serve draws them: random (the workload's, within
    # range_ratio), sharegpt (ShareGPT's lengths, at the workload's means where it states
    # them, else their own) or sonnet; or
    # sglang-random, as SGLang's bench_serving (from range_ratio of them up to them)
    dataset_name: str = Field("random", min_length=1, max_length=64)
    num_requests: int = Field(500, ge=10, le=100_000)
    percentile: Literal[50, 90, 99] = 90
    range_ratio: float = Field(0.0, ge=0, lt=1)
    seed: int = Field(0, ge=0, lt=2**63)
    measure: Literal["steady", "all"] = "steady"


class Limits(_Strict):
    memory_frac: float | None = None
    fits: bool | None = None  # must fit (true) at the workload's concurrency
    fits_at: int | None = Field(None, gt=0, le=MAX_COUNT)  # must fit at this many sequences
    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_s: float | None = None
    throughput_tokens_per_s: float | None = None
    cost_usd_per_million_tokens: float | None = None
    mbu_min: float | None = None
    served_ttft_s: float | None = None
    served_tpot_s: float | None = None
    served_latency_s: float | None = None
    served_output_tokens_per_s: float | None = None

    @field_validator(*LIMITS, *SERVED_LIMITS, mode="before")
    @classmethod
    def _units(cls, v: Any, info) -> Any:
        if v is None:
            return v
        kind = (LIMITS.get(info.field_name) or SERVED_LIMITS[info.field_name])[0]
        parsed = parse_quantity(v, kind)  # type: ignore[arg-type]
        if parsed <= 0:
            raise ValueError(f"must be positive, got {v}")
        return parsed


class Deployment(_Strict):
    name: str | None = None
    model: str
    gpu: str
    tp: int = Field(1, gt=0, le=100_000)
    pp: int = Field(1, gt=0, le=1024)  # pipeline stages, each of tp GPUs
    ep: int = Field(1, gt=0, le=100_000)  # expert-parallel GPUs (MoE; a multiple of tp)
    engine: str | None = None  # engines_db name or YAML path (default: check's --engine)
    weights: DType = DType.bf16
    kv_cache: DType | None = None
    compute: DType | None = None  # what the matmuls run in (fp16 on a T4 or V100)
    # experts: a MoE's routed experts only; mlp: every MLP, attention in the 16-bit type
    quantized_layers: Literal["all", "experts", "mlp"] = "all"
    workload: BudgetWorkload = BudgetWorkload()  # every command's default workload
    allow_longer_context: bool = False  # prompt + output beyond the model's context
    limits: Limits
    price_per_hour: float | None = Field(None, gt=0)
    # the price set its cost is on (a planner/data/prices name or a file; default: check's
    # --prices, else the default set)
    prices: str | None = None
    # hold the limits at the prediction, or at the slow end of its error band (the high end
    # of a time, the low end of a rate); default: check's --at, else predicted
    at: Literal["predicted", "high"] | None = None
    # the traffic the served_* limits are held at (``BudgetTraffic``); needed by them only
    traffic: BudgetTraffic | None = None
    # vLLM's --performance-mode the served replica runs under (vLLM 0.17 and later); None:
    # not given
    performance_mode: Literal[PERFORMANCE_MODES] | None = None  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _served(self) -> Deployment:
        served = [n for n in SERVED_LIMITS if getattr(self.limits, n) is not None]
        if served and self.traffic is None:
            raise ValueError(f"{served[0]}: a served limit needs the deployment's traffic: "
                             "(request_rate:, and replicas:, num_requests:, percentile: "
                             "as wanted)")
        if self.traffic is not None and not served:
            raise ValueError("traffic: no served limit (served_ttft_s, served_tpot_s, "
                             "served_latency_s, served_output_tokens_per_s) is held at it")
        if self.performance_mode is not None and self.traffic is None:
            raise ValueError("performance_mode: it sets the served replica's scheduler; give "
                             "the deployment a traffic: and served limits")
        return self

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        layout = (f"TP{self.tp}xEP{self.ep} " if self.tp > 1 else f"EP{self.ep} ") \
            if self.ep > 1 else \
            f"{self.tp}x{self.pp}x" if self.pp > 1 else f"{self.tp}x"
        experts = f" {self.quantized_layers}" if self.quantized_layers != "all" else ""
        return f"{self.model} on {layout}{self.gpu} {self.weights.value}{experts}"


class Budget(_Strict):
    deployments: list[Deployment] = Field(min_length=1)


@dataclass(frozen=True)
class Result:
    deployment: str
    limit: str
    what: str
    predicted: float | bool | None
    bound: float | bool
    direction: str  # "max", "min" or "eq"
    passed: bool
    margin_frac: float | None  # how far inside (+) or outside (-) the limit, relative
    # "predicted", or "high": ``predicted`` is the slow end of the figure's error band, and
    # ``prediction`` the prediction itself, ``band`` the evidence the band rests on
    at: str = "predicted"
    prediction: float | None = None
    band: str | None = None
    # a served limit's simulated run: ``measure``, ``simulated_requests``,
    # ``measured_requests`` and the arrival window measured (``measured_from_s``,
    # ``measured_to_s``; None where every request was)
    run: dict | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


# the limits an error band moves, each as (the band's figure, how): a time's high end, a
# rate's low end, a cost per token as the rate falls, an MBU as the step time grows
BAND_OF = {"ttft_s": ("ttft_s", "same"), "tpot_s": ("tpot_s", "same"),
           "latency_s": ("latency_s", "same"),
           "throughput_tokens_per_s": ("throughput_tokens_per_s", "same"),
           "cost_usd_per_million_tokens": ("throughput_tokens_per_s", "inverse"),
           "mbu_min": ("tpot_s", "inverse")}


def slow_end(name: str, value: float, direction: str, bands: dict) -> tuple[float, str] | None:
    """The limit ``name``'s figure at the slow end of its error band (``bands``: the figure
    name -> ``planner.evidence.bands.Applied``), with the band's evidence; None where no band
    moves it."""
    if name not in BAND_OF or BAND_OF[name][0] not in bands:
        return None
    a = bands[BAND_OF[name][0]]
    if not (a.value > 0):
        return None
    how = BAND_OF[name][1]
    if how == "same":  # the end that is worse for this limit
        return (a.high if direction == "max" else a.low), a.basis
    # inversely proportional to the banded figure: a slower rate costs more per token, a
    # longer step uses less of the bandwidth
    worse = a.low if name.startswith("cost") else a.high
    return value * a.value / worse, a.basis


def served_what(name: str, traffic: BudgetTraffic) -> str:
    """How a served limit reads in the table: its figure, percentile and traffic."""
    what = SERVED_LIMITS[name][3]
    if SERVED_LIMITS[name][0] == "time":
        what = f"{'median' if traffic.percentile == 50 else f'p{traffic.percentile}'} {what}"
    each = f", {traffic.replicas} replicas" if traffic.replicas > 1 else ""
    return f"{what}, {traffic.request_rate:g} req/s{each}"


def evaluate_served(dep: Deployment, figures: dict[str, float | None],
                    high: tuple[dict[str, float | None], str] | None = None,
                    run: dict | None = None) -> list[Result]:
    """Hold a deployment's served limits: ``figures`` (limit name -> the simulated value:
    seconds, or output tokens a second over every replica; None where the run gave none),
    and where it is held at the slow end of the served error bands, ``high``: the same
    figures of a replica slowed to that end, and the evidence they rest on. ``run``: the
    simulated run they were measured on, kept with each result."""
    out: list[Result] = []
    for name, (_, direction, _, _) in SERVED_LIMITS.items():
        bound = getattr(dep.limits, name)
        if bound is None:
            continue
        what = served_what(name, dep.traffic)
        value = figures.get(name)
        at, prediction, basis, held = "predicted", None, None, figures
        if high is not None and value is not None:
            at, prediction, value, basis = "high", value, high[0].get(name), high[1]
            held = high[0]
        r = replace(_held(dep.label, name, what, value, bound, direction, at, prediction,
                          basis), run=run)
        if SERVED_LIMITS[name][0] == "time" and held.get("_keeps_up") is False:
            # a queue that grows through the window: its latencies there are the window's
            # length, not the replica's, so no time limit holds
            arriving, finished = held["_rates"]
            r = replace(r, passed=False, margin_frac=None,
                        what=f"{what}; does not keep up: finishes "
                        f"{finished:.3g} of {arriving:.3g} req/s arriving")
        out.append(r)
    return out


def _held(label: str, name: str, what: str, value: float | None, bound: float, direction: str,
          at: str = "predicted", prediction: float | None = None,
          basis: str | None = None) -> Result:
    """A limit held: ``value`` against ``bound`` in ``direction`` ("max" or "min"), with how
    far inside or outside; a figure with no value (no price, no MBU, no token after the
    first) fails, with nothing to measure by."""
    if value is None:
        return Result(label, name, what, None, bound, direction, False, None, at, prediction,
                      basis)
    if direction == "max":
        ok, margin = value <= bound, (bound - value) / bound
    else:
        ok, margin = value >= bound, (value - bound) / bound
    return Result(label, name, what, float(value), bound, direction, bool(ok), margin, at,
                  prediction, basis)


def evaluate(dep: Deployment, est, fits_at_est=None, bands: dict | None = None) -> list[Result]:
    """Compare one deployment's estimate with its limits (``fits_at_est``: the estimate at
    ``limits.fits_at`` sequences, when that limit is set). ``bands``: the estimate's error
    bands (figure name -> ``Applied``) where the deployment is held at their slow end
    (``at: high``); a limit no band moves is held at the prediction."""
    out: list[Result] = []
    lim = dep.limits
    if lim.fits is not None:
        ok = bool(est.memory.fits) == lim.fits
        out.append(Result(dep.label, "fits", f"fits at {dep.workload.sequences} sequences",
                          bool(est.memory.fits), lim.fits, "eq", ok, None))
    elif not est.memory.fits:
        # a latency, throughput or cost limit rates a deployment that must load: one that
        # does not fit has none of those figures, so it fails even where no fits: is set
        out.append(Result(dep.label, "fits", f"fits at {dep.workload.sequences} sequences "
                          "(implied by its other limits)", False, True, "eq", False, None))
    if lim.fits_at is not None:
        ok = bool(fits_at_est.memory.fits)
        out.append(Result(dep.label, "fits_at", f"fits at {lim.fits_at} sequences",
                          ok, True, "eq", ok,
                          1 - fits_at_est.memory.total_bytes / fits_at_est.memory.usable_bytes))
    for name, (_, direction, attr, what) in LIMITS.items():
        bound = getattr(lim, name)
        if bound is None:
            continue
        value = getattr(est, attr) if attr != "memory_used_frac" else est.memory.used_frac
        at, prediction, basis = "predicted", None, None
        slow = slow_end(name, float(value), direction, bands) \
            if bands is not None and value is not None else None
        if slow is not None:
            at, prediction, (value, basis) = "high", float(value), slow
        # no value: no price for this GPU, no MBU for a pipeline
        out.append(_held(dep.label, name, what, value, bound, direction, at, prediction, basis))
    return out
