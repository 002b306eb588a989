"""Published measurements against predictions: the dataset's schema, the predictions, the errors.

The dataset (planner/data/validation/*.yaml, one file per source) holds rows measured and
published by others: the source's URL and date, the engine and its version, how the source
defines each metric, and per row the model, GPU, precision, TP, batch, prompt and output tokens
and the measured figures. Each row is predicted with its engine's profile and the same
workload, and compared metric by metric:

- ``user_tokens_per_s``: output tokens of one sequence / its end-to-end time, prefill included
  (gpt-fast's "tokens/s" at batch 1): predicted output_tokens / latency_s.
- ``tpot_s``: time of one decode step (inter-token latency): predicted tpot_s.
- ``ttft_s``: time to the first token, the prefill of the batch: predicted ttft_s.
- ``throughput_tokens_per_s``: output tokens of the whole batch / the whole run's time,
  prefill included: predicted batch x output_tokens / latency_s (all TP GPUs together);
  ``throughput_tokens_per_s_per_gpu`` the same divided by the GPUs (TensorRT-LLM's tables).
- ``latency_s``: the whole static batch's time, prefill and every decode step: latency_s.

The signed error is predicted / measured - 1 of the metric as published (a positive error on a
tokens/s metric is optimistic, on a time metric pessimistic). A row is *in-sample* for an
engine when one of that profile's parameters names it in ``fitted_on``; every other row is
*held out*, and the two are summarised apart. Pure: files are read by ``planner.io.catalog``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planner.core.arith import no_bool_numbers, quantile
from planner.core.engine import EngineSpec
from planner.core.errors import LlmplanError
from planner.core.estimate import Estimate, estimate
from planner.core.specs import (
    MAX_COUNT,
    Calibration,
    DType,
    HardwareSpec,
    ModelSpec,
    Parallelism,
    Precision,
    Workload,
)

METRICS: tuple[str, ...] = ("user_tokens_per_s", "tpot_s", "ttft_s", "throughput_tokens_per_s",
                            "throughput_tokens_per_s_per_gpu", "latency_s")
# What each metric says about: decode speed, prefill speed, or the two together.
PHASE = {"user_tokens_per_s": "decode", "tpot_s": "decode", "ttft_s": "prefill",
         "throughput_tokens_per_s": "end-to-end", "throughput_tokens_per_s_per_gpu": "end-to-end",
         "latency_s": "end-to-end"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    _no_bools = field_validator("*", mode="before")(no_bool_numbers)


class MeasuredCeilings(_Strict):
    """Ceilings the source measured on its own machine (a power-limited GPU, say): they
    replace the GPU's achievable figures for its rows, as a calibration would."""

    memory_bandwidth_gb_per_s: float = Field(gt=0, le=1_000_000, allow_inf_nan=False)
    matmul_tflops: dict[DType, Annotated[float, Field(gt=0, le=100_000)]] = Field(
        default_factory=dict)
    note: str = Field(min_length=1)


class Source(_Strict):
    id: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    url: str = Field(min_length=1)
    date: str = Field(min_length=1)
    engine: str = Field(min_length=1)  # engines_db name used to predict its rows
    engine_version: str = Field(min_length=1)
    hardware_note: str | None = None
    workload_note: str | None = None
    # how the source defines each metric it reports, in its own words
    metric_definitions: dict[str, str] = Field(min_length=1)
    measured_ceilings: MeasuredCeilings | None = None
    # False: the benchmark runs the model without the engine's scheduler (SGLang's
    # bench_one_batch drives its ModelRunner directly), so no step's host work runs beside
    # the GPU's, whatever the engine's async scheduling
    scheduler: bool = True
    notes: str | None = None


class Row(_Strict):
    id: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    model: str
    gpu: str
    engine: str | None = None  # overrides the source's engine for this row
    weights: DType = DType.bf16
    kv_cache: DType | None = None
    group_size: int = Field(128, gt=0, le=1_000_000)
    tp: int = Field(1, gt=0, le=100_000)
    batch: int = Field(gt=0, le=MAX_COUNT)
    prompt_tokens: int = Field(gt=0, le=MAX_COUNT)
    output_tokens: int = Field(gt=0, le=MAX_COUNT)
    # A measurement beyond these is a typo: 1e8 tokens/s is ~1,000x the fastest published
    # single-node figure, a day is longer than any benchmark run.
    user_tokens_per_s: float | None = Field(None, gt=0, le=1e8, allow_inf_nan=False)
    tpot_s: float | None = Field(None, gt=0, le=86_400, allow_inf_nan=False)
    ttft_s: float | None = Field(None, gt=0, le=86_400, allow_inf_nan=False)
    throughput_tokens_per_s: float | None = Field(None, gt=0, le=1e8, allow_inf_nan=False)
    throughput_tokens_per_s_per_gpu: float | None = Field(None, gt=0, le=1e8,
                                                          allow_inf_nan=False)
    latency_s: float | None = Field(None, gt=0, le=86_400, allow_inf_nan=False)
    note: str | None = None

    @model_validator(mode="after")
    def _some_metric(self) -> Row:
        if all(getattr(self, m) is None for m in METRICS):
            raise ValueError(f"row {self.id}: no measured metric ({', '.join(METRICS)})")
        return self


class Dataset(_Strict):
    source: Source
    rows: list[Row] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Dataset:
        seen: set[str] = set()
        for r in self.rows:
            if r.id in seen:
                raise ValueError(f"rows: duplicate id {r.id}")
            seen.add(r.id)
        return self


class Errors:
    """The signed errors of a prediction (``predicted``, ``ideal``) against ``measured``: a
    base of the comparison dataclasses, which hold those fields and ``in_sample``."""

    @property
    def split_label(self) -> str:
        return "in-sample" if self.in_sample else "held-out"

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    @property
    def ideal_error(self) -> float:
        return self.ideal / self.measured - 1

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(error=self.error, ideal_error=self.ideal_error, split=self.split_label)
        return d


@dataclass(frozen=True)
class Comparison(Errors):
    source: str
    row: str
    engine: str
    metric: str
    model: str
    gpu: str
    weights: str
    tp: int
    batch: int
    prompt_tokens: int
    output_tokens: int
    measured: float
    predicted: float
    ideal: float
    in_sample: bool

    @property
    def key(self) -> str:
        return f"{self.source}:{self.row}"


def metric_of(e: Estimate, metric: str) -> float:
    if metric == "user_tokens_per_s":
        return e.output_tokens / e.latency_s
    if metric == "tpot_s":
        return e.tpot_s
    if metric == "ttft_s":
        return e.ttft_s
    if metric == "latency_s":
        return e.latency_s
    if metric == "throughput_tokens_per_s_per_gpu":
        return e.batch * e.output_tokens / e.latency_s / e.tp
    return e.batch * e.output_tokens / e.latency_s


def quantized_layers_of(weights, model: ModelSpec) -> str:
    """The layers a published row's or run's quantized ``weights`` cover: gpt-oss, the only
    model released in MXFP4, ships its routed experts in MXFP4 and the rest (attention, the
    router, embeddings, the LM head) in 16-bit, which no engine re-quantizes, so an mxfp4
    measurement of a model with routed experts is of its experts alone
    (``--quantized-layers experts``); every layer otherwise (a dense model has no experts to
    hold them)."""
    mxfp4 = getattr(weights, "value", weights) == "mxfp4"
    return "experts" if mxfp4 and model.moe is not None else "all"


def engine_of(ds: Dataset, spec: EngineSpec):
    """The engine that predicts ``ds``'s rows: ``spec``'s, without async scheduling where the
    source ran the model without the engine's scheduler (``Source.scheduler``)."""
    e = spec.model()
    return e if ds.source.scheduler or not e.async_scheduling else \
        replace(e, async_scheduling=False)


def compare(ds: Dataset, *, models: dict[str, ModelSpec], gpus: dict[str, HardwareSpec],
            engines: dict[str, EngineSpec]) -> list[Comparison]:
    """Predict every row of ``ds`` with its engine and compare each measured metric."""
    out: list[Comparison] = []
    for r in ds.rows:
        name = r.engine or ds.source.engine
        spec = engines[name]
        m = models[r.model]
        if not m.quantized_at_load(r.weights):
            # the model's own checkpoint stores these weights (DeepSeek-V3's fp8 in 128 x 128
            # blocks, gpt-oss's MXFP4 experts): measured as it ships
            prec = m.quantization.precision(r.kv_cache, group_size=r.group_size)
        else:
            prec = Precision.of(r.weights, r.kv_cache, r.group_size,
                                quantized_layers=quantized_layers_of(r.weights, m))
        mc = ds.source.measured_ceilings
        cal = None if mc is None else Calibration(
            device=r.gpu, memory_bandwidth_gb_per_s=mc.memory_bandwidth_gb_per_s,
            matmul_tflops=mc.matmul_tflops)
        try:
            e = estimate(models[r.model], gpus[r.gpu], precision=prec, calibration=cal,
                         workload=Workload(batch=r.batch, prompt_tokens=r.prompt_tokens,
                                           output_tokens=r.output_tokens),
                         parallelism=Parallelism(tp=r.tp), engine=engine_of(ds, spec))
        except LlmplanError as err:
            raise LlmplanError(f"validation row {ds.source.id}:{r.id}: {err}") from None
        fitted = f"{ds.source.id}:{r.id}" in spec.fitted_rows()
        for metric in METRICS:
            measured = getattr(r, metric)
            if measured is None:
                continue
            out.append(Comparison(ds.source.id, r.id, name, metric, r.model, r.gpu,
                                  r.weights.value, r.tp, r.batch, r.prompt_tokens,
                                  r.output_tokens, measured, metric_of(e, metric),
                                  metric_of(e.bound_estimate, metric), fitted))
    return out


@dataclass(frozen=True)
class Summary:
    group: str  # "source / engine / phase / split"
    source: str
    engine: str
    phase: str
    split: str
    n: int
    median_abs_error: float
    p90_abs_error: float
    median_error: float
    ideal_median_abs_error: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def summarize(rows: list, *, by_source: bool = True, phase_of=None) -> list[Summary]:
    """Median and 90th-percentile absolute error per (source, engine, phase, split); with
    ``by_source`` False, over all sources together (source "all"). ``phase_of``: a row's phase
    (default: its metric's, ``PHASE``)."""
    groups: dict[tuple, list] = {}
    for c in rows:
        src = c.source if by_source else "all"
        eng = c.engine if by_source else "all"
        phase = phase_of(c) if phase_of else PHASE[c.metric]
        groups.setdefault((src, eng, phase, c.split_label), []).append(c)
    out = []
    for (src, eng, phase, split), cs in sorted(groups.items()):
        errs = [abs(c.error) for c in cs]
        out.append(Summary(f"{src} / {eng} / {phase} / {split}", src, eng, phase, split,
                           len(cs), quantile(errs, 0.5), quantile(errs, 0.9),
                           quantile([c.error for c in cs], 0.5),
                           quantile([abs(c.ideal_error) for c in cs], 0.5)))
    return out


def by_model_kind(served: list, kind_of) -> list[Summary]:
    """The held-out served figures' error per kind of model (``kind_of(model name)``, such as
    "dense" or "MoE") and phase, every source and engine together: where the remaining error
    lies. In-sample figures are left out."""
    groups: dict[tuple[str, str], list] = {}
    for c in served:
        if not c.in_sample:
            groups.setdefault((kind_of(c.model), c.phase), []).append(c)
    out = []
    for (kind, phase), cs in sorted(groups.items()):
        errs = [abs(c.error) for c in cs]
        out.append(Summary(f"{kind} / all / {phase} / held-out", kind, "all", phase,
                           "held-out", len(cs), quantile(errs, 0.5), quantile(errs, 0.9),
                           quantile([c.error for c in cs], 0.5),
                           quantile([abs(c.ideal_error) for c in cs], 0.5)))
    return out


# The accuracy targets the project holds itself to (issue 24), each on held-out figures only:
# (label, what it is computed over, statistic, limit).
# "Current engines": vLLM's V1 engine (0.8 and later: the vllm-0.8 and vllm profiles), SGLang
# and TensorRT-LLM; not vLLM's V0 line (vllm-v0), gpt-fast or HF eager.
CURRENT_ENGINES = ("vllm", "vllm-0.8", "sglang", "trtllm")
TARGETS: tuple[tuple[str, str, str, float], ...] = (
    ("served TPOT, median", "served TPOT", "median", 0.10),
    ("served TTFT, median", "served TTFT", "median", 0.20),
    ("served throughput, median", "served throughput", "median", 0.10),
    ("served TPOT, p90", "served TPOT", "p90", 0.30),
    ("served TTFT, p90", "served TTFT", "p90", 0.30),
    ("served throughput, p90", "served throughput", "p90", 0.30),
    ("served TPOT, mean per run", "served TPOT", "mean", 0.08),
    ("served TTFT, mean per run", "served TTFT", "mean", 0.15),
    ("served E2E, mean per run", "served E2E", "mean", 0.08),
    ("batch-1 decode, current engines, median", "batch-1 decode", "median", 0.08),
)


@dataclass(frozen=True)
class TargetResult:
    label: str
    n: int
    value: float  # nan when no held-out figure covers it
    limit: float

    @property
    def met(self) -> bool:
        return self.n > 0 and self.value <= self.limit


@dataclass(frozen=True)
class EngineServed:
    """One engine profile's held-out served runs: per phase (served TPOT, TTFT, E2E,
    throughput) the count, the median and the mean |error| (the mean per run: one figure
    per run and phase)."""
    engine: str
    runs: int
    phases: dict  # phase -> (n, median |error|, mean |error|)

    def as_dict(self) -> dict:
        return {"engine": self.engine, "runs": self.runs,
                "phases": {p: {"n": n, "median": med, "mean": mean}
                           for p, (n, med, mean) in self.phases.items()}}


SERVED_PHASES = ("served TPOT", "served TTFT", "served E2E", "served throughput")


def served_by_engine(served: list) -> list[EngineServed]:
    """The served targets' figures for each engine profile apart, held out only: what the
    all-engine targets mix (the current vLLM line's runs beside SGLang's and older lines')."""
    groups: dict[str, list] = {}
    for c in served:
        if not c.in_sample:
            groups.setdefault(c.engine, []).append(c)
    order = {e: i for i, e in enumerate(CURRENT_ENGINES)}
    out = []
    for engine in sorted(groups, key=lambda e: (order.get(e, len(order)), e)):
        cs = groups[engine]
        phases = {}
        for phase in SERVED_PHASES:
            errs = [abs(c.error) for c in cs if c.phase == phase]
            if errs:
                phases[phase] = (len(errs), quantile(errs, 0.5), sum(errs) / len(errs))
        out.append(EngineServed(engine, len({(c.source, c.run) for c in cs}), phases))
    return out


def targets(static: list, served: list) -> list[TargetResult]:
    """Each target's held-out figure: |error| of the served runs by phase (every engine), and
    of the static batch-1 decode rows of the current engines' profiles."""
    out = []
    for label, what, stat, limit in TARGETS:
        if what == "batch-1 decode":
            errs = [abs(c.error) for c in static if not c.in_sample and c.batch == 1
                    and PHASE[c.metric] == "decode" and c.engine in CURRENT_ENGINES]
        else:
            errs = [abs(c.error) for c in served if not c.in_sample and c.phase == what]
        if not errs:
            out.append(TargetResult(label, 0, float("nan"), limit))
            continue
        v = sum(errs) / len(errs) if stat == "mean" else \
            quantile(errs, 0.5 if stat == "median" else 0.9)
        out.append(TargetResult(label, len(errs), v, limit))
    return out
