"""Error bands: how far a prediction has been from measurements before, as a range around it.

Every held-out comparison of ``llmplan validate`` (a published static-batch row, or a published
served run replayed through the simulator) gives a ratio measured / predicted. Grouped by the
engine profile that predicted it, the phase (prefill, decode, end-to-end; served TTFT, TPOT,
throughput) and the regime (batch 1 or batched; a served stream the simulated server keeps up
with, or one that saturates it), the 10th and 90th percentiles of those ratios make a band: a new
prediction P of that kind is given as P x [q10, q90], with the number of held-out figures and
sources the band rests on. In-sample rows (those a parameter was fitted on) never enter a band.
Each source counts as one in a band's percentiles, its figures sharing its weight
(``planner.core.arith.hazen_quantile``): a source's figures share its GPUs, client and way
of measuring and err together, and a user's deployment is a new source, so a band has to span
how sources differ, not how the largest source's runs do.

Where a group has fewer than ``MIN_FIGURES`` figures or fewer than ``MIN_SOURCES`` sources, the
band widens to the engine's figures of that phase in every regime, then to every engine's of
that phase and regime, then to every engine's of that phase; the ``basis`` says which, so a
user can tell a band measured on their case from one borrowed from others.

Each band also lists the GPU classes (architectures: ampere, hopper, ...) its figures were
measured on; a prediction for a GPU of another class says so, and says when the engine has no
held-out figure on that class at all, since a band measured on other GPUs is a weaker promise.

``coverage`` checks the bands honestly: each held-out figure of a source is tested against the
band built WITHOUT that source (leave one source out), so a band is never scored on the rows it
was made from. Pure: the table is written and read by the callers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from planner.core.arith import hazen_quantile
from planner.core.errors import UsageError

MIN_FIGURES = 5
# Three sources at least: a source's figures share its GPUs, client, engine build and way of
# measuring, so they err together, and most of a prediction's error is that shared part. A
# band has to span how sources differ, and two cannot show it: with one of them left out (as
# ``coverage`` does, and as a user's own deployment is) the band is one source's spread. With
# two, leave-one-source-out coverage of SGLang's bands was 60%; with three 75%, every other
# engine's unchanged or within a point (docs/validation.md#bands).
MIN_SOURCES = 3
LOW_Q, HIGH_Q = 0.1, 0.9



@dataclass(frozen=True)
class Figure:
    """One held-out comparison: who predicted it, of what kind, and measured / predicted."""

    engine: str
    phase: str
    regime: str
    source: str
    ratio: float  # measured / predicted
    gpu_class: str = ""  # the measured GPU's architecture (hopper, ampere, ...); "" unknown
    model_kind: str = ""  # "MoE" or "dense"; "" unknown


@dataclass(frozen=True)
class Band:
    engine: str  # the engine the figures came from, or "all"
    phase: str
    regime: str  # or "all"
    low_ratio: float  # 10th percentile of measured / predicted
    median_ratio: float
    high_ratio: float  # 90th percentile
    n: int
    sources: int
    gpu_classes: tuple[str, ...] = ()  # the GPU classes its figures were measured on
    model_kind: str = ""  # "MoE" or "dense": only that kind of model's figures; "": every kind

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["gpu_classes"] = list(self.gpu_classes)
        if not self.model_kind:
            del d["model_kind"]
        return d

    def measured_on(self, gpu_class: str | None) -> bool | None:
        """Whether any of its figures came from a GPU of this class; None where that is not
        known (no class given, or a table written before classes were kept)."""
        if not gpu_class or not self.gpu_classes:
            return None
        return gpu_class in self.gpu_classes


@dataclass(frozen=True)
class Applied:
    """A band put around one predicted value."""

    value: float
    low: float
    high: float
    n: int
    sources: int
    basis: str  # which figures: "vllm, served TPOT, unsaturated" or a wider fallback
    borrowed: bool  # True when not the engine's own figures in this regime
    gpu_class: str = ""  # the predicted GPU's class, where the caller gave it
    # True / False: whether the band's figures include that class; None: not known
    gpu_class_measured: bool | None = None

    def as_dict(self) -> dict:
        return {"low": self.low, "high": self.high, "n": self.n, "sources": self.sources,
                "basis": self.basis, "borrowed": self.borrowed, "gpu_class": self.gpu_class,
                "gpu_class_measured": self.gpu_class_measured}


def static_regime(batch) -> str:
    return "batch-1" if batch == 1 else "batched"


def served_regime(request_rate: float, simulated_request_throughput: float | None,
                  max_running: float | None = None, max_num_seqs: int | None = None) -> str:
    """``saturated``: every request sent at once, a simulated server that does not keep up
    with the offered rate (it completes under 90% of it), or one that fills its batch."""
    if math.isinf(request_rate):
        return "saturated"
    if max_running is not None and max_num_seqs and max_running >= max_num_seqs:
        return "saturated"
    if (math.isfinite(request_rate) and simulated_request_throughput is not None
            and simulated_request_throughput < 0.9 * request_rate):
        return "saturated"
    return "unsaturated"


# static metrics that are rates (higher is faster): their ratio is taken as predicted /
# measured, the time ratio, so one band covers a phase's times and rates alike
_STATIC_RATES = ("user_tokens_per_s", "throughput_tokens_per_s",
                 "throughput_tokens_per_s_per_gpu")


def figures_of(static: list, served: list, gpu_class=None, model_kind=None) -> list[Figure]:
    """The held-out figures of ``llmplan validate``'s comparisons: static rows
    (``planner.evidence.validate.Comparison``) and served runs
    (``planner.evidence.served.ServedComparison``); in-sample ones are left out.
    ``gpu_class``: a GPU's name to its class (architecture); ``model_kind``: a model's name to
    "MoE" or "dense"; without them the class and kind are unknown."""
    # here, not at the top: estimate, simulate and plan read bands without the dataset's
    # schema (about 20 ms of every start)
    from planner.evidence.validate import PHASE

    cls = gpu_class or (lambda _name: "")
    kind = model_kind or (lambda _name: "")
    out = []
    for c in static:
        if c.in_sample or not (c.measured > 0 and c.predicted > 0):
            continue
        ratio = c.predicted / c.measured if c.metric in _STATIC_RATES else \
            c.measured / c.predicted
        out.append(Figure(c.engine, PHASE[c.metric], static_regime(c.batch), c.source,
                          ratio, cls(c.gpu), kind(c.model)))
    for c in served:
        if c.in_sample or not (c.measured > 0 and c.predicted > 0):
            continue
        out.append(Figure(c.engine, c.phase, c.regime, c.source, c.measured / c.predicted,
                          cls(c.gpu), kind(c.model)))
    return out


def build(figures: list[Figure]) -> list[Band]:
    """A band for every (engine, phase, regime) with figures, and the fallbacks
    (engine, phase, all), (all, phase, regime) and (all, phase, all); and, where the figures
    say what kind of model they are of, (engine, phase, regime) and (all, phase, regime) of
    that kind alone (MoE runs err apart from dense ones: ``kind_note`` says how; ``pick``
    does not choose them). In each, a source's figures share one weight."""
    groups: dict[tuple[str, str, str, str], list[Figure]] = {}
    for f in figures:
        if not (f.ratio > 0 and math.isfinite(f.ratio)):
            continue
        keys = [(f.engine, f.phase, f.regime, ""), (f.engine, f.phase, "all", ""),
                ("all", f.phase, f.regime, ""), ("all", f.phase, "all", "")]
        if f.model_kind:
            keys += [(f.engine, f.phase, f.regime, f.model_kind),
                     ("all", f.phase, f.regime, f.model_kind)]
        for key in keys:
            groups.setdefault(key, []).append(f)
    out = []
    for (eng, phase, regime, kind), fs in sorted(groups.items()):
        per_source: dict[str, int] = {}
        for f in fs:
            per_source[f.source] = per_source.get(f.source, 0) + 1
        r, w = [f.ratio for f in fs], [1.0 / per_source[f.source] for f in fs]
        out.append(Band(eng, phase, regime, hazen_quantile(r, w, LOW_Q),
                        hazen_quantile(r, w, 0.5), hazen_quantile(r, w, HIGH_Q), len(fs),
                        len(per_source), tuple(sorted({f.gpu_class for f in fs if f.gpu_class})),
                        kind))
    return out


def _enough(b: Band | None) -> bool:
    return b is not None and b.n >= MIN_FIGURES and b.sources >= MIN_SOURCES


def pick(bands: list[Band], engine: str, phase: str, regime: str) -> Band | None:
    """The narrowest band with enough evidence for a prediction of this kind, or None when
    no band of the phase exists at all. The bands of one kind of model alone are not picked:
    chosen first for MoE models they cover fewer held-out figures, left out a source at a time
    (SGLang's 71% -> 51% on 2026-12-04); ``kind_note`` says how that kind has erred."""
    table = {(b.engine, b.phase, b.regime, b.model_kind): b for b in bands}
    chain = [(engine, phase, regime, ""), (engine, phase, "all", ""),
             ("all", phase, regime, ""), ("all", phase, "all", "")]
    for key in chain:
        if _enough(table.get(key)):
            return table[key]
    for key in reversed(chain):  # nothing has enough: the widest there is, marked as thin
        if key in table:
            return table[key]
    return None


def kind_note(bands: list[Band], engine: str, phase: str, regime: str,
              model_kind: str) -> str:
    """How predictions for this kind of model ("MoE", "dense") have erred on their own, where
    that differs from the band's: the kind's band of the engine, else of every engine, in
    this regime (at least the evidence a band needs), when its median is more than 10% off
    the band's. "" otherwise."""
    if not model_kind:
        return ""
    b = pick(bands, engine, phase, regime)
    table = {(x.engine, x.phase, x.regime, x.model_kind): x for x in bands}
    for key in ((engine, phase, regime, model_kind), ("all", phase, regime, model_kind)):
        k = table.get(key)
        if _enough(k) and b is not None and abs(k.median_ratio / b.median_ratio - 1) > 0.1:
            who = "all engines" if k.engine == "all" else k.engine
            return (f"{model_kind} models alone ({who}): measured / predicted median "
                    f"x{k.median_ratio:.2f}, p10-p90 x{k.low_ratio:.2f}-{k.high_ratio:.2f} "
                    f"({k.n} figures from {k.sources} sources)")
    return ""


def served_band_factors(bands, engine_name: str) -> tuple[dict, dict]:
    """A replica's sizing factors (``planner.search.plan.SimSettings``) at the high end of the
    engine's served TPOT and TTFT bands (``bands``: this table as loaded) in the regime a
    replica is sized for (one that keeps up with its share of the traffic): the TPOT band's
    high end slows every simulated step (``step_factor``), so a replica near saturation
    queues as a slower server would; TTFT is held at the TTFT band's high end at least
    (``ttft_factor``: the part of it the slower steps leave). Also each band used, by
    phase. A ``UsageError`` where the table has no such band."""
    used, high = {}, {}
    for phase in ("served TPOT", "served TTFT"):
        b = pick(bands, engine_name, phase, "unsaturated")
        if b is None:
            raise UsageError(f"no error band for {phase} in the bands table")
        used[phase], high[phase] = b, max(1.0, b.high_ratio)
    step = high["served TPOT"]
    return ({"step_factor": step, "tpot_factor": 1.0,
             "ttft_factor": max(1.0, high["served TTFT"] / step)}, used)


def engine_gpu_classes(bands: list[Band], engine: str) -> set[str]:
    """Every GPU class the engine's own held-out figures were measured on, in any phase."""
    return {c for b in bands if b.engine == engine for c in b.gpu_classes}


def apply(bands: list[Band], value: float, engine: str, phase: str, regime: str, *,
          inverse: bool = False, gpu_class: str = "", model_kind: str = "") -> Applied | None:
    """``value`` with its band. ``inverse``: the value is a rate (tokens/s) whose band comes
    from a time's (1 / TPOT): low and high swap and invert. ``gpu_class``: the predicted
    GPU's architecture; where the band's figures hold none of that class (or the engine was
    never measured on it at all) the basis says so."""
    b = pick(bands, engine, phase, regime)
    if b is None or not math.isfinite(value):
        return None
    lo, hi = (value / b.high_ratio, value / b.low_ratio) if inverse else \
        (value * b.low_ratio, value * b.high_ratio)
    borrowed = (b.engine, b.regime) != (engine, regime)
    who = f"{b.engine} engines" if b.engine == "all" else b.engine
    regime_txt = "every regime" if b.regime == "all" else b.regime
    basis = f"{who}, {b.phase}, {regime_txt}: {b.n} held-out figures from " \
            f"{b.sources} source{'s' if b.sources != 1 else ''}"
    if not _enough(b):
        basis += " (too few to trust)"
    elif borrowed:
        basis += f" (none enough for {engine}, {regime})"
    if b.regime == "all" and regime != "all":  # say how few of them are of this regime
        own = next((x for x in bands if (x.engine, x.phase, x.regime, x.model_kind)
                    == (b.engine, phase, regime, "")), None)
        basis += f"; {regime}: {own.n if own else 0} of them" + (
            f", from {own.sources} source{'s' if own.sources != 1 else ''}" if own else "")
    if b.low_ratio > 1:
        basis += "; 9 in 10 measured slower than predicted: the band lies above it"
    elif b.high_ratio < 1:
        basis += "; 9 in 10 measured faster than predicted: the band lies below it"
    # a rate's band is its time's inverted: the kind's figures, times, would read backwards
    note = "" if inverse else kind_note(bands, engine, phase, regime, model_kind)
    if note:
        basis += f"; {note}"
    measured = b.measured_on(gpu_class)
    if measured is not None:
        if not any(gpu_class in x.gpu_classes for x in bands):
            basis += f"; no engine has a held-out figure on {gpu_class} GPUs"
        elif gpu_class not in engine_gpu_classes(bands, engine):
            basis += f"; {engine} has no held-out figure on {gpu_class} GPUs"
        elif not measured:
            basis += f"; none of these on {gpu_class} GPUs"
    return Applied(value, lo, hi, b.n, b.sources, basis, borrowed, gpu_class, measured)


@dataclass(frozen=True)
class Coverage:
    engine: str
    phase: str
    n: int  # held-out figures that had a band from other sources
    inside: int

    @property
    def frac(self) -> float:
        return self.inside / self.n if self.n else math.nan


def coverage(figures: list[Figure]) -> list[Coverage]:
    """For each held-out figure, is measured / predicted inside the band built from every
    OTHER source's figures? Counted per (engine, phase), and per engine over all phases."""
    sources = sorted({f.source for f in figures})
    tally: dict[tuple[str, str], list[int]] = {}
    for s in sources:
        others = build([f for f in figures if f.source != s])
        for f in (f for f in figures if f.source == s):
            b = pick(others, f.engine, f.phase, f.regime)
            if b is None:
                continue
            hit = int(b.low_ratio <= f.ratio <= b.high_ratio)
            for key in ((f.engine, f.phase), (f.engine, "all")):
                t = tally.setdefault(key, [0, 0])
                t[0] += 1
                t[1] += hit
    return [Coverage(e, p, n, k) for (e, p), (n, k) in sorted(tally.items())]


def to_table(bands: list[Band]) -> list[dict]:
    return [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in b.as_dict().items()}
            for b in bands]


def from_table(rows: list[dict], where: str) -> list[Band]:
    out = []
    for i, r in enumerate(rows):
        try:
            classes = r.get("gpu_classes", [])
            if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
                raise ValueError("gpu_classes: expected a list of names")
            kind = r.get("model_kind", "")
            if kind not in ("", "MoE", "dense"):
                raise ValueError(f"model_kind: expected MoE or dense, got {kind!r:.20}")
            b = Band(str(r["engine"]), str(r["phase"]), str(r["regime"]),
                     float(r["low_ratio"]), float(r["median_ratio"]), float(r["high_ratio"]),
                     int(r["n"]), int(r["sources"]), tuple(classes), kind)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{where}: bands[{i}]: {e}") from None
        if not (0 < b.low_ratio <= b.median_ratio <= b.high_ratio < math.inf) or b.n < 1:
            raise ValueError(f"{where}: bands[{i}]: ratios must satisfy 0 < low <= median <= "
                             "high and n >= 1")
        out.append(b)
    return out


def widen_near_capacity(applied: dict[str, Applied], nominal: dict, slowed: dict,
                        step_factor: float) -> tuple[dict[str, Applied], list[str]]:
    """The served bands of a stream the simulated server keeps up with, widened where a
    server whose every step is ``step_factor`` times slower (the TPOT band's high end) does
    not: near its capacity, a small per-step error is a large latency error. ``nominal`` and
    ``slowed``: summaries (``planner.serving.metrics.summary``) of the same requests on the
    predicted server and on the slower one. A TTFT's high end becomes at least its value
    times the slower server's TTFT / the predicted one's, times what the TTFT band's high end
    has beyond the step factor (the request path's share, not slowed); a TPOT's, at least the
    slower server's TPOT ratio; the output throughput's low end, at most its ratio. Returns
    the bands and the names widened."""
    out, widened = dict(applied), []
    for name, a in applied.items():
        stat = name.removesuffix("_ms")
        base, slow = nominal.get(name), slowed.get(name)
        if stat == "output_throughput" or not (base and slow and math.isfinite(slow)):
            continue
        ratio = slow / base
        beyond = ""
        if stat.endswith("ttft") and a.value > 0:
            part = max(1.0, (a.high / a.value) / step_factor)
            ratio *= part
            if part > 1:  # the request path's share of the band, which slower steps leave
                beyond = f", times the TTFT band's x{part:.2f} beyond its steps: x{ratio:.2f}"
        high = a.value * ratio
        if high > a.high:
            out[name] = replace(a, high=high, basis=a.basis + f"; high end widened near "
                                f"capacity: a server with steps x{step_factor:.2f} slower "
                                f"gives x{slow / base:.2f}{beyond}")
            widened.append(name)
    a = applied.get("output_throughput")
    base, slow = nominal.get("output_throughput"), slowed.get("output_throughput")
    if a is not None and base and slow and math.isfinite(slow) and a.value * slow / base < a.low:
        out["output_throughput"] = replace(
            a, low=a.value * slow / base, basis=a.basis + f"; low end widened near capacity: "
            f"a server with steps x{step_factor:.2f} slower gives x{slow / base:.2f}")
        widened.append("output_throughput")
    return out, widened
