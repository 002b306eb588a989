"""PNG reports with matplotlib (Agg): roofline, throughput vs latency, memory breakdown.

Each chart is drawn from one pandas table, which is also written beside the PNG as CSV, so the
numbers behind every picture are at hand. Imported only when a report is asked for.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from planner.core.estimate import Estimate, Prepared, assemble, resolve_price  # noqa: E402
from planner.core.specs import (  # noqa: E402
    GIB,
)
from planner.io import fmt  # noqa: E402
from planner.layouts.deployment import Deployment, Layout  # noqa: E402
from planner.layouts.figures import LayoutFigures, layout_figures  # noqa: E402

COLORS = plt.get_cmap("tab10").colors


@dataclass(frozen=True)
class Case:
    """One deployment (``planner.layouts.deployment.Deployment``) at one prompt and output
    length: a series of the reports."""

    deployment: Deployment
    prompt_tokens: int
    output_tokens: int

    model = property(lambda self: self.deployment.model)
    hw = property(lambda self: self.deployment.hardware)
    precision = property(lambda self: self.deployment.precision)
    engine = property(lambda self: self.deployment.engine)
    options = property(lambda self: self.deployment.options)
    tp = property(lambda self: self.deployment.layout.tp)
    pp = property(lambda self: self.deployment.layout.pp)
    ep = property(lambda self: self.deployment.layout.ep)

    def at(self, batch) -> Estimate:
        """One TP group's estimate (the roofline's operators)."""
        prep = self.deployment.prepared
        price, _ = resolve_price(self.hw, None)
        return assemble(self.model, self.hw, prep, self.options, tp=self.tp, batch=batch,
                        prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
                        price_usd_per_gpu_hour=price, notes=list(prep.notes))

    @property
    def layered(self) -> bool:
        """Pipeline stages or expert parallelism: figures from ``planner.layouts.figures``."""
        return self.pp > 1 or self.ep > 1

    def layout(self, batch, *, ideal: bool = False) -> LayoutFigures:
        prep = self.deployment.prepared
        if ideal:  # the same deployment on the ideal time model, as assemble builds it
            prep = Prepared(prep.engine.ideal_bound(), prep.precision, prep.reference,
                            prep.reference, prep.notes)
        return layout_figures(self.model, self.hw, prep, self.options, tp=self.tp, pp=self.pp,
                              ep=self.ep, batch=batch, prompt_tokens=self.prompt_tokens,
                              output_tokens=self.output_tokens)

    def max_batch(self) -> int:
        """The largest batch that fits on every GPU of the replica (0: none)."""
        if not self.layered:
            return self.at(1).memory.max_batch
        if not self.layout(1).memory.fits:
            return 0
        lo, hi = 1, 2
        while self.layout(hi).memory.fits:
            lo, hi = hi, hi * 2
            if hi > 1 << 24:
                return lo
        while hi - lo > 1:  # lo fits, hi does not: memory grows with the batch
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.layout(mid).memory.fits else (lo, mid)
        return lo

    @property
    def _layout_words(self) -> tuple[str, str]:
        """(label prefix, file-name prefix)."""
        if self.ep > 1:
            if self.tp > 1:
                return f"TP{self.tp}xEP{self.ep} ", f"tp{self.tp}-ep{self.ep}-"
            return f"EP{self.ep} ", f"ep{self.ep}-"
        if self.pp > 1:
            return f"TP{self.tp}xPP{self.pp} ", f"tp{self.tp}-pp{self.pp}-"
        return (f"{self.tp} x ", f"tp{self.tp}-") if self.tp > 1 else ("", "")

    @property
    def label(self) -> str:
        return f"{self._layout_words[0]}{self.hw.name} {self.precision.weights.value}"

    @property
    def title(self) -> str:
        p = self.precision
        return (f"{self.model.label} on {self._layout_words[0]}{self.hw.display_name}, engine "
                f"{self.engine.name}\nweights {p.weights.value}, KV {p.kv_cache.value}, "
                f"prompt {self.prompt_tokens} / output {self.output_tokens} tokens")

    @property
    def slug(self) -> str:
        return f"{self.model.name}_{self._layout_words[1]}{self.hw.name}_" \
               f"{self.precision.weights.value}"


def batch_ladder(max_batch: int, *, beyond: bool = False) -> list[int]:
    """1, 2, 4, ... up to the largest batch that fits (itself included); with ``beyond``
    one doubling past it, to show where memory runs out."""
    top = max(1, max_batch)
    out, b = [], 1
    while b <= top:
        out.append(b)
        b *= 2
    if max_batch >= 1 and out[-1] != max_batch:
        out.append(max_batch)
    if beyond:
        out.append(out[-1] * 2 if max_batch >= 1 else 2)
    return out


class Labels:
    """Point labels that never overlap one another, the legend or the axes' edge.

    ``add`` records a label; ``place`` (after the scales, limits and legend are final) tries
    the asked offset, then the four sides, then further out with a leader line, measuring
    each text's box with the renderer; a label with no free spot is left out (the chart's
    CSV has every point) and counted."""

    def __init__(self, ax) -> None:
        self.ax = ax
        self.pending: list[tuple] = []

    def add(self, x: float, y: float, text: str, *, color, dx: int = 4, dy: int = 3,
            fontsize: int = 7) -> None:
        self.pending.append((x, y, text, color, dx, dy, fontsize))

    def place(self, avoid: tuple = (), points=(), lines=()) -> int:
        """Draw the labels clear of each other, of the ``avoid`` artists (the legend), of
        the markers at ``points`` (data coordinates; the labelled points are added) and of
        the ``lines`` (each a sequence of (x, y) vertices in data coordinates, the segments
        between them avoided); returns how many found no free spot."""
        from matplotlib.text import Text
        from matplotlib.transforms import Bbox

        renderer = self.ax.figure.canvas.get_renderer()
        frame = self.ax.get_window_extent(renderer)
        taken = [a.get_window_extent(renderer) for a in avoid if a is not None]
        r_px = 4.0 * self.ax.figure.dpi / 100  # a marker of s=30 is about 4 px across at 100 dpi
        xy = [(p[0], p[1]) for p in self.pending] + list(points)
        for px, py in self.ax.transData.transform(np.asarray(xy, dtype=float).reshape(-1, 2)):
            if np.isfinite(px) and np.isfinite(py):
                taken.append(Bbox.from_extents(px - r_px, py - r_px, px + r_px, py + r_px))
        texts = list(taken[:len([a for a in avoid if a is not None])])  # what a leader avoids
        taken += self._line_boxes(lines)
        dropped = 0
        for x, y, text, color, dx, dy, fontsize in self.pending:
            spots = [(dx, dy, "left", False), (5, -3, "left", False), (-5, -3, "right", False),
                     (0, 6, "center", False), (0, -13, "center", False)]
            spots += [(dx, dy + sign * 12 * k, "left", True)
                      for k in (1, 2, 3, 4) for sign in (-1, 1)]
            for ox, oy, ha, leader in spots:
                kw = {"arrowprops": {"arrowstyle": "-", "lw": 0.5, "color": color,
                                     "alpha": 0.6, "shrinkA": 0, "shrinkB": 2}} if leader else {}
                ann = self.ax.annotate(text, (x, y), textcoords="offset points",
                                       xytext=(ox, oy), ha=ha, fontsize=fontsize, color=color,
                                       **kw)
                ann.update_positions(renderer)  # the offset is resolved at draw time
                box = Text.get_window_extent(ann, renderer).expanded(1.04, 1.15)
                inside = (frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0
                          and box.y1 <= frame.y1)
                if inside and not any(box.overlaps(t) for t in taken) and not (
                        leader and self._crosses(ann, box, texts, r_px)):
                    taken.append(box)
                    texts.append(box)
                    break
                ann.remove()
            else:
                dropped += 1
        self.pending = []
        return dropped

    def _crosses(self, ann, box, texts, r_px: float) -> bool:
        """Whether a leader line from the label's box to its point would run through a
        label already placed or the legend (near its own point it may cross markers)."""
        px, py = self.ax.transData.transform(ann.xy)
        # the leader leaves the box's edge nearest the point: the box's centre, clipped to it
        cx, cy = min(max(px, box.x0), box.x1), min(max(py, box.y0), box.y1)
        n = max(2, int(np.hypot(px - cx, py - cy) / 2))
        for t in np.linspace(0, 1, n):
            x, y = cx + (px - cx) * t, cy + (py - cy) * t
            if np.hypot(px - x, py - y) <= 3 * r_px:
                break  # its own marker and those bunched on it
            if any(b.x0 <= x <= b.x1 and b.y0 <= y <= b.y1 for b in texts):
                return True
        return False

    def _line_boxes(self, lines) -> list:
        """Small boxes strung along each line's segments, a few pixels apart, inside the
        axes: what a label must not sit on."""
        from matplotlib.transforms import Bbox

        frame = self.ax.get_window_extent(self.ax.figure.canvas.get_renderer())
        half = 1.0 * self.ax.figure.dpi / 100
        boxes = []
        for line in lines:
            v = self.ax.transData.transform(np.asarray(list(line), dtype=float).reshape(-1, 2))
            for (x0, y0), (x1, y1) in zip(v[:-1], v[1:], strict=True):
                if not np.all(np.isfinite([x0, y0, x1, y1])):
                    continue
                n = max(2, int(np.hypot(x1 - x0, y1 - y0) / 3) + 1)
                for x, y in zip(np.linspace(x0, x1, n), np.linspace(y0, y1, n), strict=True):
                    if frame.x0 <= x <= frame.x1 and frame.y0 <= y <= frame.y1:
                        boxes.append(Bbox.from_extents(x - half, y - half, x + half, y + half))
        return boxes


def plain_log_ticks(ax, axes: str = "xy") -> None:
    """Log axes labelled 5, 10, 20, 50 ... rather than 5 x 10^0; an axis spanning less
    than a decade labels every minor tick (0.3, 0.4, ...), so it never shows one number."""
    def plain(v: float, _=None) -> str:
        return f"{v:,.0f}" if v >= 1 else f"{v:g}"

    def minor_of(axis_lim):
        def minor(v: float, _=None) -> str:
            lo, hi = sorted(axis_lim())
            short = lo > 0 and hi / lo < 10
            return plain(v) if short or f"{v:.0e}"[0] in "25" else ""
        return minor

    for name, axis, lim in (("x", ax.xaxis, ax.get_xlim), ("y", ax.yaxis, ax.get_ylim)):
        if name not in axes:
            continue
        axis.set_major_formatter(matplotlib.ticker.FuncFormatter(plain))
        axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor_of(lim)))


def thin_tick_labels(fig, *, pad_px: float = 3.0) -> None:
    """Blank the tick labels that would touch another: on each axis of ``fig`` (its layout
    final), the major labels first, then the minor ones in order, each kept only when its box
    (measured with the renderer, ``pad_px`` apart) is clear of every label kept so far. A log
    axis spanning under a decade labels every minor tick (``plain_log_ticks``); at 600, 700,
    800 ... the wider numbers run into each other."""
    from matplotlib.text import Text

    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            kept_boxes, kept = [], {"major": set(), "minor": set()}
            drawn = {id(t) for t in axis._update_ticks()}  # the ticks inside the view
            for which, ticks in (("major", axis.get_major_ticks()),
                                 ("minor", axis.get_minor_ticks())):
                for tick in ticks:
                    label = tick.label1
                    if id(tick) not in drawn or not label.get_visible() \
                            or not label.get_text().strip():
                        continue
                    box = Text.get_window_extent(label, r).padded(pad_px / 2)
                    if not any(box.overlaps(k) for k in kept_boxes):
                        kept_boxes.append(box)
                        kept[which].add(round(float(tick.get_loc()), 12))
            for which in ("major", "minor"):
                inner = getattr(axis, f"get_{which}_formatter")()
                getattr(axis, f"set_{which}_formatter")(_Only(inner, kept[which]))


class _Only(matplotlib.ticker.Formatter):
    """A formatter that writes ``inner``'s label at the kept values and nothing elsewhere."""

    def __init__(self, inner, kept: set) -> None:
        self.inner, self.kept = inner, kept

    def set_axis(self, axis) -> None:
        super().set_axis(axis)
        self.inner.set_axis(axis)

    def set_locs(self, locs) -> None:
        super().set_locs(locs)
        self.inner.set_locs(locs)

    def __call__(self, x, pos=None) -> str:
        return self.inner(x, pos) if round(float(x), 12) in self.kept else ""


def _save(fig, df: pd.DataFrame, out_dir: Path, name: str) -> tuple[Path, Path]:
    """The chart as PNG (its touching tick labels thinned) and its data as CSV."""
    out_dir.mkdir(parents=True, exist_ok=True)
    thin_tick_labels(fig)
    png, csv = out_dir / f"{name}.png", out_dir / f"{name}.csv"
    fig.savefig(png, dpi=130, bbox_inches="tight")
    plt.close(fig)
    df.to_csv(csv, index=False)
    return png, csv


# --------------------------------------------------------------------------- 1. roofline


def roofline_table(case: Case, batch: int, measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """Points of the roofline chart: each operator of decode and prefill at ``batch``, the
    whole decode step over the batch ladder, the optimal batch, and measured points."""
    rows = []
    e = case.at(batch)
    cmp_dtype = e.precision.compute_dtype
    for phase, step in (("decode", e.decode), ("prefill", e.prefill)):
        for t in step.ops:
            op = t.op
            if op.kind == "allreduce" or op.flops <= 0 or op.bytes <= 0:
                continue
            rows.append({"series": f"{phase} operators (batch {batch})", "label": op.name,
                         "batch": batch, "intensity_flops_per_byte": op.flops / op.bytes,
                         "attainable_flops_per_s": op.flops * op.count / t.time_s,
                         "time_s": t.time_s, "bound": t.bound})
    ladder = batch_ladder(e.memory.max_batch)
    for b in ladder:
        eb = case.at(b)
        rows.append({"series": "decode step", "label": f"B={b}", "batch": b,
                     "intensity_flops_per_byte": eb.decode.flops / eb.decode.bytes,
                     "attainable_flops_per_s": eb.decode.flops / eb.tpot_s,
                     "time_s": eb.tpot_s, "bound": eb.bound})
    opt = max(1, int(round(e.optimal_batch)))
    eo = case.at(opt)
    rows.append({"series": "optimal batch", "label": f"optimal B={opt}", "batch": opt,
                 "intensity_flops_per_byte": eo.decode.flops / eo.decode.bytes,
                 "attainable_flops_per_s": eo.decode.flops / eo.tpot_s, "time_s": eo.tpot_s,
                 "bound": eo.bound, "fits": bool(eo.memory.fits)})
    df = pd.DataFrame(rows)
    df["peak_flops_per_s"] = e.peak_flops_per_s
    df["bandwidth_bytes_per_s"] = e.ref.bandwidth_bytes_per_s
    df["compute_dtype"] = cmp_dtype.value
    df["ceilings_source"] = e.ref.source
    df["engine"] = e.engine.name
    df["engine_peak_flops_per_s"] = e.ceilings.peak(cmp_dtype)
    df["engine_bandwidth_bytes_per_s"] = e.ceilings.bandwidth_bytes_per_s
    df["engine_ceilings_source"] = e.ceilings.source
    if measured is not None and len(measured):
        df = pd.concat([df, measured.assign(series="measured")], ignore_index=True)
    return df


def _spread(sub: pd.DataFrame, *, dx_dec: float = 0.12, dy_dec: float = 0.15) -> list:
    """The rows worth a label: the first, then each at least ``dx_dec`` / ``dy_dec`` decades
    from every one labelled so far (a batch ladder bunches where the KV reads dominate)."""
    kept: list = []
    for r in sub.itertuples():
        lx, ly = np.log10(r.intensity_flops_per_byte), np.log10(r.attainable_flops_per_s)
        if all(abs(lx - np.log10(k.intensity_flops_per_byte)) >= dx_dec
               or abs(ly - np.log10(k.attainable_flops_per_s)) >= dy_dec for k in kept):
            kept.append(r)
    return kept


def roofline_ylim(df: pd.DataFrame, peak: float, measured_ceilings: dict | None
                  ) -> tuple[float, float]:
    """Five decades under the peak, or down to the lowest point drawn (a CPU's measured
    steps sit decades below a GPU's roof) and the measured roof at the left edge."""
    lowest = min(peak / 1e5, float(df["attainable_flops_per_s"].dropna().min()) / 2)
    if measured_ceilings:
        lowest = min(lowest, measured_ceilings["bandwidth_bytes_per_s"] * 0.1 / 2)
    return lowest, peak * 3


def plot_roofline(case: Case, df: pd.DataFrame, out_dir: Path,
                  measured_ceilings: dict | None = None) -> tuple[Path, Path]:
    peak = float(df["peak_flops_per_s"].iloc[0])
    bw = float(df["bandwidth_bytes_per_s"].iloc[0])
    ridge = peak / bw
    fig, ax = plt.subplots(figsize=(10, 6.5))
    x = np.logspace(-1, 5, 400)
    ax.plot(x, np.minimum(peak, bw * x), color="black", lw=2,
            label=f"roofline ({df['ceilings_source'].iloc[0]}): "
                  f"{peak / 1e12:,.0f} TFLOP/s {df['compute_dtype'].iloc[0]}, "
                  f"{bw / 1e12:.2f} TB/s")
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ridge_note = ax.annotate(f"ridge point {ridge:,.0f} FLOP/B", (ridge, peak * 1.5),
                textcoords="offset points", xytext=(4, 0), ha="left", fontsize=8,
                color="grey")  # above the roof, where no point can be
    ceilings = [list(zip(x, np.minimum(peak, bw * x), strict=True))]  # lines labels avoid
    engine = str(df["engine"].iloc[0]) if "engine" in df else "ideal"
    if engine != "ideal":
        ep = float(df["engine_peak_flops_per_s"].iloc[0])
        eb = float(df["engine_bandwidth_bytes_per_s"].iloc[0])
        ceilings.append(list(zip(x, np.minimum(ep, eb * x), strict=True)))
        ax.plot(x, np.minimum(ep, eb * x), color="tab:blue", lw=1.2, ls="--",
                label=f"{df['engine_ceilings_source'].iloc[0]} ceilings ({engine}'s points "
                      f"sit below them): {ep / 1e12:,.0f} TFLOP/s, {eb / 1e12:.2f} TB/s")
    if measured_ceilings:
        mp, mb = measured_ceilings["flops_per_s"], measured_ceilings["bandwidth_bytes_per_s"]
        ceilings.append(list(zip(x, np.minimum(mp, mb * x), strict=True)))
        ax.plot(x, np.minimum(mp, mb * x), color="tab:red", lw=1.2, ls="--",
                label=f"measured ceilings: {fmt.si(mp, 'FLOP/s')}, {fmt.si(mb, 'B/s')}")
    labels = Labels(ax)
    for x_, y_, text, color in operator_labels(df):  # placed first: the ladder's give way
        labels.add(x_, y_, text, color=color, dx=6, dy=-10)
    lines = ceilings
    for series, sub in df.groupby("series", sort=False):
        if series.startswith(("decode operators", "prefill operators")):
            marker, color = OPERATOR_STYLES[series.split()[0]]
            ax.scatter(sub["intensity_flops_per_byte"], sub["attainable_flops_per_s"],
                       marker=marker, color=color, s=28, alpha=0.8, label=series, zorder=3)
        elif series == "decode step":
            ax.plot(sub["intensity_flops_per_byte"], sub["attainable_flops_per_s"], "-^",
                    color=COLORS[2], ms=6, lw=1.2, label="decode step, batch 1 to max that fits",
                    zorder=4)
            lines.append(list(zip(sub["intensity_flops_per_byte"],
                                  sub["attainable_flops_per_s"], strict=True)))
            for r in _spread(sub):
                labels.add(r.intensity_flops_per_byte, r.attainable_flops_per_s, r.label,
                           color=COLORS[2], dx=-28, dy=6)
        elif series == "optimal batch":
            r = sub.iloc[0]
            fits = "" if r.get("fits", True) else ", does not fit"
            ax.scatter([r.intensity_flops_per_byte], [r.attainable_flops_per_s], marker="*",
                       s=220, color="gold", edgecolor="black", zorder=5,
                       label=f"{r.label}: peak x bytes/param / (2 x bandwidth)"
                             + (" x params / active" if case.model.moe is not None else "")
                             + f"; its KV reads keep it left of the ridge{fits}")
        elif series == "measured":
            dev = sub["device"].iloc[0] if "device" in sub else None
            ax.scatter(sub["intensity_flops_per_byte"], sub["attainable_flops_per_s"],
                       marker="x", color="tab:red", s=40, zorder=6,
                       label=f"measured decode steps{f' on {dev}' if dev else ''}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.1, 1e5)
    ax.set_ylim(*roofline_ylim(df, peak, measured_ceilings))
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title(case.title + ("\n(the operators of one TP group; the other charts are the "
                               "layout's)" if case.layered else ""), fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    fig.canvas.draw()  # the ridge note's offset resolved, to be measured and avoided
    labels.place(avoid=(ax.legend(fontsize=7, loc="lower right"), ridge_note),
                 points=zip(df["intensity_flops_per_byte"], df["attainable_flops_per_s"],
                            strict=True), lines=lines)
    return _save(fig, df, out_dir, f"{case.slug}_roofline")


OPERATOR_STYLES = {"decode": ("o", COLORS[0]), "prefill": ("s", COLORS[1])}
# the operators worth a name on the roofline (norms and activations sit bunched near 1 FLOP/B)
NAMED_OPERATORS = ("qkv_proj", "attention", "mlp_gate_up_proj", "lm_head",
                   "experts_gate_up_proj", "mla_q_up_proj", "o_proj", "mlp_down_proj",
                   "mlp_up_proj")


def operator_labels(df: pd.DataFrame, *, within_dec: float = 0.06
                    ) -> list[tuple[float, float, str, tuple]]:
    """(x, y, text, color) of the roofline's operator labels: the named operators of both
    phases, those that sit on one spot (within ``within_dec`` decades on both axes) under one
    label naming each once. A decode step's weight-bound matmuls all run at about the batch
    in FLOP/B, and prefill's lm_head (the last token's logits only) is decode's own point:
    a label each would stack five names, lm_head twice, on one marker."""
    ops = df[df["series"].str.startswith(("decode operators", "prefill operators"))
             & df["label"].isin(NAMED_OPERATORS)]
    groups: list[dict] = []
    for r in ops.itertuples():
        lx, ly = np.log10(r.intensity_flops_per_byte), np.log10(r.attainable_flops_per_s)
        phase = r.series.split()[0]
        for g in groups:  # near any point of a group (a chain of near points is one spot)
            if any(abs(gx - lx) < within_dec and abs(gy - ly) < within_dec
                   for gx, gy in g["at"]):
                break
        else:
            g = {"at": [], "x": r.intensity_flops_per_byte, "y": r.attainable_flops_per_s,
                 "names": [], "phases": set()}
            groups.append(g)
        g["at"].append((lx, ly))
        if r.label not in g["names"]:
            g["names"].append(r.label)
        g["phases"].add(phase)
    out = []
    for g in groups:
        names = g["names"]
        text = "\n".join(", ".join(names[i:i + 2]) for i in range(0, len(names), 2))
        if len(g["phases"]) > 1:
            text += "\n(decode and prefill)"
        phase = "decode" if "decode" in g["phases"] else "prefill"
        out.append((g["x"], g["y"], text, OPERATOR_STYLES[phase][1]))
    return out


# --------------------------------------------------------------------------- 2. throughput


def throughput_table(cases: list[Case]) -> pd.DataFrame:
    rows = []
    for case in cases:
        mb = case.max_batch()
        for b in batch_ladder(mb):
            if case.layered:  # no memory / compute split of a whole layout's step
                e, i, bound = case.layout(b), case.layout(b, ideal=True), "layout"
            else:
                e = case.at(b)
                i, bound = e.bound_estimate, e.bound
            rows.append({"case": case.label, "gpu": case.hw.name, "engine": case.engine.name,
                         "weights": case.precision.weights.value, "tp": case.tp,
                         "pp": case.pp, "ep": case.ep, "batch": b,
                         "tpot_s": e.tpot_s, "throughput_tokens_per_s": e.throughput_tokens_per_s,
                         "ttft_s": e.ttft_s, "bound": bound, "fits": e.memory.fits,
                         "max_batch": mb, "ideal_tpot_s": i.tpot_s,
                         "ideal_throughput_tokens_per_s": i.throughput_tokens_per_s})
    return pd.DataFrame(rows)


def plot_throughput(cases: list[Case], df: pd.DataFrame, out_dir: Path) -> tuple[Path, Path]:
    fig, ax = plt.subplots(figsize=(10, 6.5))
    labels = Labels(ax)
    for i, (label, sub) in enumerate(df.groupby("case", sort=False)):
        color = COLORS[i % len(COLORS)]
        x, y = sub["tpot_s"] * 1e3, sub["throughput_tokens_per_s"]
        last = sub.iloc[-1]
        ax.plot(x, y, "-", color=color, lw=1.3,
                label=f"{label}: memory limit at batch {last.batch}")
        if (sub["engine"] != "ideal").all():
            ax.plot(sub["ideal_tpot_s"] * 1e3, sub["ideal_throughput_tokens_per_s"], ":",
                    color=color, lw=1.1, label=f"{label}: ideal roofline (the bound)")
        mem, cmp = sub["bound"] == "memory", sub["bound"] == "compute"
        ax.scatter(x[mem], y[mem], color=color, s=30, zorder=3)
        ax.scatter(x[cmp], y[cmp], facecolor="white", edgecolor=color, s=34, zorder=3)
        lay = ~(mem | cmp)
        ax.scatter(x[lay], y[lay], marker="D", color=color, s=26, zorder=3)
        ax.scatter([last.tpot_s * 1e3], [last.throughput_tokens_per_s], marker="s", s=70,
                   facecolor="none", edgecolor=color, lw=1.5, zorder=4)
        for r in sub.itertuples():
            labels.add(r.tpot_s * 1e3, r.throughput_tokens_per_s, str(r.batch), color=color,
                       dx=4, dy=-10)
    if (df["bound"] == "memory").any():
        ax.scatter([], [], color="grey", s=30, label="memory-bound (filled)")
    if (df["bound"] == "compute").any():
        ax.scatter([], [], facecolor="white", edgecolor="grey", s=34,
                   label="compute-bound (hollow)")
    if (df["bound"] == "layout").any():
        ax.scatter([], [], marker="D", color="grey", s=26,
                   label="pipeline / expert-parallel step (bound not split)")
    ax.scatter([], [], marker="s", s=70, facecolor="none", edgecolor="grey",
               label="largest batch that fits")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax)
    ax.set_xlabel("time per output token, TPOT (ms)")
    ax.set_ylabel("decode throughput (tokens/s, all sequences)")
    c0 = cases[0]
    ax.set_title(f"{c0.model.label}: throughput vs latency as the batch grows "
                 f"(labels: batch), engine {c0.engine.name}\nprompt {c0.prompt_tokens} / "
                 f"output {c0.output_tokens} tokens, KV {c0.precision.kv_cache.value}",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    # below the axes: no corner is free of curves (bounds cross the upper left, slow
    # configurations reach the lower right)
    labels.place(avoid=(ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1),
                                  ncol=2, frameon=False),),
                 points=zip(df["tpot_s"] * 1e3, df["throughput_tokens_per_s"], strict=True))
    tag = "_".join(sorted({c.precision.weights.value for c in cases}))
    return _save(fig, df, out_dir, f"{c0.model.name}_throughput_latency_{tag}")


# --------------------------------------------------------------------------- 3. memory


def _layout_memory(case: Case, batch: int):
    """The fullest GPU's memory parts under a pipeline or expert-parallel layout."""
    from types import SimpleNamespace

    prep = case.deployment.prepared
    kw = dict(batch=batch, prompt_tokens=case.prompt_tokens, output_tokens=case.output_tokens)
    o = case.options
    if case.ep > 1:
        from planner.layouts.expert import expert_parallel

        r = expert_parallel(case.model, case.hw, prep, o, ep=case.ep, tp=case.tp, **kw)
        w, kv, total, usable = r.weights_bytes, r.kv_cache_bytes, r.total_bytes, r.usable_bytes
    else:
        from planner.layouts.pipeline import pipeline

        r = pipeline(case.model, case.hw, prep, o, tp=case.tp, pp=case.pp, **kw)
        s = max(r.stages, key=lambda st: st.total_bytes)
        w, kv, total, usable = s.weights_bytes, s.kv_cache_bytes, s.total_bytes, s.usable_bytes
    cap = case.hw.memory_bytes
    return SimpleNamespace(weights_bytes=w, kv_cache_bytes=kv,
                           activation_bytes=total - w - kv - o.reserve_bytes,
                           reserve_bytes=o.reserve_bytes, total_bytes=total, capacity_bytes=cap,
                           usable_bytes=usable, fits=total <= usable)


def memory_table(case: Case) -> pd.DataFrame:
    mb = case.max_batch()
    rows = []
    for b in batch_ladder(mb, beyond=True):
        m = _layout_memory(case, b) if case.layered else case.at(b).memory
        rows.append({"batch": b, "weights_bytes": m.weights_bytes,
                     "kv_cache_bytes": m.kv_cache_bytes, "activation_bytes": m.activation_bytes,
                     "reserve_bytes": m.reserve_bytes, "total_bytes": m.total_bytes,
                     "capacity_bytes": m.capacity_bytes, "usable_bytes": m.usable_bytes,
                     "fits": m.fits})
    return pd.DataFrame(rows)


def plot_memory(case: Case, df: pd.DataFrame, out_dir: Path) -> tuple[Path, Path]:
    fig, ax = plt.subplots(figsize=(10, 6))
    x = np.arange(len(df))
    bottom = np.zeros(len(df))
    for (col, label), color in zip((("weights_bytes", "weights"), ("kv_cache_bytes", "KV cache"),
                                    ("activation_bytes", "activations (prefill peak)"),
                                    ("reserve_bytes", "reserve")),
                                   (COLORS[0], COLORS[1], COLORS[2], COLORS[7]), strict=True):
        v = df[col].to_numpy() / GIB
        ax.bar(x, v, bottom=bottom, color=color, label=label, width=0.7)
        bottom += v
    cap, usable = df["capacity_bytes"].iloc[0] / GIB, df["usable_bytes"].iloc[0] / GIB
    ax.axhline(cap, color="black", lw=1.5, label=f"capacity {cap:,.0f} GiB")
    ax.axhline(usable, color="black", lw=1, ls="--", label=f"usable {usable:,.1f} GiB")
    for i, r in enumerate(df.itertuples()):
        if not r.fits:
            ax.annotate("does not fit", (i, r.total_bytes / GIB), textcoords="offset points",
                        xytext=(0, 4), ha="center", fontsize=8, color="tab:red")
    ax.set_xticks(x, [str(b) for b in df["batch"]])
    ax.set_xlabel("batch (concurrent sequences" + (f", over the {case.ep} GPUs)" if case.ep > 1
                                                   else ")"))
    ax.set_ylabel("memory per GPU (GiB)")
    ax.set_title(case.title + (" - memory of the fullest GPU" if case.layered else
                               " - memory per GPU"), fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, df, out_dir, f"{case.slug}_memory")


def write_reports(cases: list[Case], out_dir: Path, *, batch: int,
                  measured: pd.DataFrame | None = None,
                  measured_ceilings: dict | None = None,
                  serving_requests: int = 0) -> list[Path]:
    """The charts: roofline and memory for each case (each GPU and precision), throughput for
    all together, and with ``serving_requests`` the simulated serving curve for all."""
    paths = []
    # a case that holds no batch at all (``Case.max_batch`` 0) gets its memory chart only
    fit = [c for c in cases if c.max_batch() >= 1]
    for case in fit:  # each GPU and precision asked for its own roofline and memory
        paths += plot_roofline(case, roofline_table(case, batch, measured), out_dir,
                               measured_ceilings)
    if fit:
        paths += plot_throughput(fit, throughput_table(fit), out_dir)
    for case in cases:
        paths += plot_memory(case, memory_table(case), out_dir)
    if serving_requests and fit:
        paths += plot_serving(fit, serving_table(fit, serving_requests), out_dir)
    return list(paths)


# --------------------------------------------------------------------------- 4. serving


SERVING_LOAD = (0.1, 0.25, 0.4, 0.55, 0.7, 0.8, 0.9, 1.0, 1.1)


def serving_table(cases: list[Case], num_requests: int) -> pd.DataFrame:
    """Each case served by one replica under Poisson traffic (continuous batching, paged KV),
    at fractions of the rate it sustains when every request arrives at once."""
    from planner.serving import run as serving
    from planner.serving.metrics import summary
    from planner.serving.traffic import synthetic

    rows = []
    for case in cases:
        coster = serving.coster(case.deployment)

        def run(rate: float, c=case, k=coster) -> dict:
            reqs = synthetic(num_requests, prompt_tokens=c.prompt_tokens,
                             output_tokens=c.output_tokens, request_rate=rate, seed=0)
            return summary(serving.run(c.deployment, reqs, step_coster=k))

        saturated = run(float("inf"))["request_throughput"]
        for frac in SERVING_LOAD:
            s = run(saturated * frac)
            rows.append({"case": case.label, "gpu": case.hw.name, "engine": case.engine.name,
                         "weights": case.precision.weights.value, "tp": case.tp,
                         "pp": case.pp, "ep": case.ep, "request_rate": saturated * frac,
                         "load_frac": frac,
                         **{k: s[k] for k in (
                             "request_throughput", "output_throughput", "median_ttft_ms",
                             "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms",
                             "mean_running_requests", "max_running_requests", "preemptions")}})
    return pd.DataFrame(rows)


def plot_serving(cases: list[Case], df: pd.DataFrame, out_dir: Path) -> tuple[Path, Path]:
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2))
    for i, (label, sub) in enumerate(df.groupby("case", sort=False)):
        color = COLORS[i % len(COLORS)]
        x = sub["request_rate"]
        axes[0].plot(x, sub["request_throughput"], "-o", color=color, ms=4, label=label)
        for ax, key in ((axes[1], "ttft"), (axes[2], "tpot")):
            ax.plot(x, sub[f"median_{key}_ms"], "-o", color=color, ms=4, label=f"{label} p50")
            ax.plot(x, sub[f"p90_{key}_ms"], "--", color=color, lw=1, label=f"{label} p90")
    lim = float(df["request_rate"].max()) * 1.05
    axes[0].plot([0, lim], [0, lim], ":", color="grey", lw=1, label="served = offered")
    axes[0].set_ylabel("requests served per second")
    axes[1].set_ylabel("TTFT (ms)")
    axes[2].set_ylabel("TPOT (ms)")
    axes[1].set_yscale("log")
    plain_log_ticks(axes[1])
    for ax in axes:
        ax.set_xlabel("request rate offered (req/s, Poisson)")
        ax.grid(True, which="both", alpha=0.25)
        # under the axes, where it covers no curve
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2,
                  frameon=False)
    c0 = cases[0]
    fig.suptitle(f"{c0.model.label}: one replica under load, continuous batching, paged KV, "
                 f"engine {c0.engine.name} (simulated); prompt {c0.prompt_tokens} / output "
                 f"{c0.output_tokens} tokens", fontsize=10, y=1.03)
    fig.tight_layout()
    tag = "_".join(sorted({c.precision.weights.value for c in cases}))
    return _save(fig, df, out_dir, f"{c0.model.name}_serving_{tag}")


# --------------------------------------------------------------------------- measurements


def _finite_positive(*values) -> None:
    """The figures a chart divides and plots: finite numbers above zero (a value of 400
    digits or Infinity would reach the axes)."""
    import math

    for v in values:
        if isinstance(v, bool) or not (math.isfinite(float(v)) and v > 0):
            raise ValueError(f"{v!r} is not a finite positive number")


def load_measured(path: Path, *, noisy_only_ok: bool = False) -> list[dict]:
    """The clean records (status ok) of a `llmplan measure` JSONL file (a torn last line is
    skipped). A file with none is an error, unless ``noisy_only_ok`` and it holds points
    recorded as noisy (timed on a busy machine): then none are returned."""
    import json

    from planner.core.errors import SpecError
    from planner.io import boundary

    text = boundary.read_text(path, what="measurement file", max_bytes=boundary.RESULT_BYTES)
    boundary.check_json_depth(text, str(path))
    recs = []
    text_lines = text.splitlines()
    for i, line in enumerate(text_lines, 1):
        try:
            rec = boundary.loads_json(line, f"{path}:{i}", checked=True)
        except (json.JSONDecodeError, RecursionError, ValueError):
            if i != len(text_lines):  # only the last line may be torn by a crash
                raise SpecError(f"{path}: line {i}: not JSON") from None
            continue
        if not isinstance(rec, dict):
            raise SpecError(f"{path}: line {i}: not a JSON object")
        if rec.get("status") == "ok":
            try:  # what the charts read
                for key in ("config", "env", "measured", "prediction"):
                    rec[key].items()
                rec["measured"]["tpot_s"]["median_s"] + rec["measured"]["ttft_s"]
                cal = rec["prediction"]["calibrated"]
                cal["tpot_s"] + cal["ttft_s"] + cal["decode_flops"] / cal["decode_weight_kv_bytes"]
                rec["config"]["batch"] + rec["config"]["context"]
                rec["config"]["weights"].upper()
                _finite_positive(rec["measured"]["tpot_s"]["median_s"],
                                 rec["measured"]["ttft_s"], cal["tpot_s"], cal["ttft_s"],
                                 cal["decode_flops"], cal["decode_weight_kv_bytes"])
            except (KeyError, TypeError, AttributeError, ZeroDivisionError, ValueError,
                    OverflowError) as err:
                raise SpecError(f"{path}: line {i}: not a `llmplan measure` record "
                                f"({type(err).__name__}: {err})") from None
        recs.append(rec)
    ok = [r for r in recs if r.get("status") == "ok"]
    if not ok and not (noisy_only_ok and any(r.get("status") == "noisy" for r in recs)):
        raise SpecError(f"{path}: no measured points (status ok) in {len(recs)} records")
    return ok


def measured_roofline_points(records: list[dict]) -> tuple[pd.DataFrame, dict | None]:
    """Measured decode steps as roofline points, and the measured ceilings of the device."""
    rows = []
    for r in records:
        p = r["prediction"]["calibrated"]
        tpot = r["measured"]["tpot_s"]["median_s"]
        c = r["config"]
        rows.append({"label": f"B={c['batch']} ctx={c['context']}", "batch": c["batch"],
                     "context": c["context"], "weights": c["weights"],
                     "intensity_flops_per_byte": p["decode_flops"] / p["decode_weight_kv_bytes"],
                     "attainable_flops_per_s": p["decode_flops"] / tpot, "time_s": tpot})
    dev = records[0]["env"]["device"]
    for row in rows:
        row["device"] = f"{dev.get('name') or dev.get('kind')} ({dev.get('kind')})"
    cal = records[0]["env"].get("calibration") or {}
    dt = records[0]["config"]["weights"]
    dt = "bf16" if dt in ("int8", "int4", "mxfp4") else dt
    ceil = None
    if cal.get("matmul_tflops", {}).get(dt):
        ceil = {"flops_per_s": cal["matmul_tflops"][dt] * 1e12,
                "bandwidth_bytes_per_s": cal["memory_bandwidth_gb_per_s"] * 1e9}
    return pd.DataFrame(rows), ceil


def accuracy_table(records: list[dict]) -> pd.DataFrame:
    rows = []
    for r in records:
        c = r["config"]
        for src, p in r["prediction"].items():
            if p is None:
                continue
            for what, meas in (("TPOT", r["measured"]["tpot_s"]["median_s"]),
                               ("TTFT", r["measured"]["ttft_s"])):
                pred = p.get("tpot_s" if what == "TPOT" else "ttft_s")
                if pred is None:  # calibrated_harness_kernels adjusts TPOT only
                    continue
                rows.append({"ceilings": src, "metric": what, "weights": c["weights"],
                             "batch": c["batch"], "context": c["context"],
                             "predicted_s": pred, "measured_s": meas,
                             "error_frac": pred / meas - 1})
    return pd.DataFrame(rows)


def _square_loglog(ax, lo: float, hi: float, quantity: str, title: str, *,
                   legend_size: int, under: bool = False) -> None:
    """A predicted-against-measured panel: both axes log, over the same range; its key in
    the upper left corner, or ``under`` the axes."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    plain_log_ticks(ax)
    ax.set_xlabel(f"measured {quantity}")
    ax.set_ylabel(f"predicted {quantity}")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if under:  # the key under the axes, where it covers no point
        ax.legend(fontsize=legend_size, loc="upper center", bbox_to_anchor=(0.5, -0.13),
                  frameon=False)
    else:
        ax.legend(fontsize=legend_size, loc="upper left")


PREDICTION_LABELS = {"calibrated": "calibrated ceilings", "datasheet": "datasheet ceilings",
                     "calibrated_harness_kernels": "calibrated, with the harness's kernel count"}


def plot_accuracy(records: list[dict], out_dir: Path, name: str) -> tuple[Path, Path]:
    df = accuracy_table(records)
    dev = records[0]["env"]["device"]
    c0 = records[0]["config"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    for ax, metric in zip(axes, ("TPOT", "TTFT"), strict=True):
        sub = df[df.metric == metric]
        lo = min(sub.predicted_s.min(), sub.measured_s.min()) / 1.5 * 1e3
        hi = max(sub.predicted_s.max(), sub.measured_s.max()) * 1.5 * 1e3
        x = np.array([lo, hi])
        ax.plot(x, x, color="black", lw=1, label="prediction = measurement")
        ax.fill_between(x, x / 1.1, x * 1.1, color="grey", alpha=0.15, label="within 10%")
        for i, (src, s2) in enumerate(sub.groupby("ceilings")):
            med = s2.error_frac.abs().median()
            ax.scatter(s2.measured_s * 1e3, s2.predicted_s * 1e3, s=30, color=COLORS[i],
                       zorder=3,
                       label=f"{PREDICTION_LABELS.get(src, src)}: median |error| {med:.1%}")
        _square_loglog(ax, lo, hi, f"{metric} (ms)", metric, legend_size=8)
    layers = f", {c0['layers']} of {c0['model_layers']} layers" \
        if c0["layers"] != c0["model_layers"] else ""
    fig.suptitle(f"{c0['model']}{layers} on {dev.get('name')} ({dev.get('kind')}): "
                 f"predicted vs measured, {len(records)} points", fontsize=10)
    return _save(fig, df, out_dir, name)


MARKERS = "osD^vP*Xh<>"
METRIC_LABELS = {"user_tokens_per_s": "tokens/s per sequence", "tpot_s": "TPOT (s)",
                 "ttft_s": "TTFT (s)", "throughput_tokens_per_s": "output tokens/s (batch)",
                 "throughput_tokens_per_s_per_gpu": "output tokens/s per GPU (batch)",
                 "latency_s": "latency of the batch (s)",
                 # published serving runs replayed through the simulator
                 "mean_ttft_s": "served: mean TTFT (s)", "median_ttft_s": "served: median TTFT (s)",
                 "mean_tpot_s": "served: mean TPOT (s)", "median_tpot_s": "served: median TPOT (s)",
                 "mean_itl_s": "served: mean ITL (s)", "median_itl_s": "served: median ITL (s)",
                 "mean_e2el_s": "served: mean end-to-end latency (s)",
                 "median_e2el_s": "served: median end-to-end latency (s)",
                 "output_throughput": "served: output tokens/s",
                 "request_throughput": "served: requests/s"}
# each panel's title: what a reader calls the figure (the keys above are the CSV's)
METRIC_TITLES = {"user_tokens_per_s": "Tokens per second per sequence", "tpot_s": "TPOT",
                 "ttft_s": "TTFT", "throughput_tokens_per_s": "Output tokens per second",
                 "throughput_tokens_per_s_per_gpu": "Output tokens per second per GPU",
                 "latency_s": "Latency of a static batch",
                 "mean_ttft_s": "Served: mean TTFT", "median_ttft_s": "Served: median TTFT",
                 "mean_tpot_s": "Served: mean TPOT", "median_tpot_s": "Served: median TPOT",
                 "mean_itl_s": "Served: mean ITL", "median_itl_s": "Served: median ITL",
                 "mean_e2el_s": "Served: mean end-to-end latency",
                 "median_e2el_s": "Served: median end-to-end latency",
                 "output_throughput": "Served: output tokens per second",
                 "request_throughput": "Served: requests per second"}


def plot_validation(comps, path: Path) -> None:
    """Predicted against measured for every published row: one panel per metric, log-log,
    the y = x line with +-10% and +-25% bands, one marker per source; held-out rows filled,
    in-sample rows hollow."""
    metrics = [m for m in METRIC_LABELS if any(c.metric == m for c in comps)]
    if not metrics:
        raise ValueError("no comparisons to plot")
    engines_of: dict[str, set] = {}
    for c in comps:
        engines_of.setdefault(c.source, set()).add(c.engine)

    def series(c) -> str:  # a source, split by engine where it measured several
        return c.source if len(engines_of[c.source]) == 1 else f"{c.source} / {c.engine}"

    sources = sorted({series(c) for c in comps})
    entries = max(len({(series(c), c.in_sample) for c in comps if c.metric == m})
                  for m in metrics) + 3  # the longest key: its series and the three bands
    fig, axes = _grid(len(metrics), width=6.0, height=5.6 + 0.14 * entries)
    for ax, metric in zip(axes, metrics, strict=True):
        sub = [c for c in comps if c.metric == metric]
        vals = [v for c in sub for v in (c.measured, c.predicted)]
        lo, hi = min(vals) / 1.6, max(vals) * 1.6
        _bands(ax, lo, hi)
        for i, src in enumerate(sources):
            pts = [c for c in sub if series(c) == src]
            if not pts:
                continue
            color, marker = COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)]
            for held, face in ((True, color), (False, "none")):
                p = [c for c in pts if c.in_sample != held]
                if not p:
                    continue
                med = statistics.median(abs(c.error) for c in p)
                ax.scatter([c.measured for c in p], [c.predicted for c in p], s=34,
                           marker=marker, facecolor=face, edgecolor=color, zorder=3,
                           label=f"{src} ({'held out' if held else 'in-sample'}, n={len(p)}, "
                                 f"median |err| {med:.0%})")
        _square_loglog(ax, lo, hi, METRIC_LABELS[metric], METRIC_TITLES[metric],
                       legend_size=7, under=True)
    rows = len({(c.source, c.row) for c in comps if getattr(c, "row", None)})
    from planner.evidence.served import METRIC_GROUPS

    # one a served run: its throughput, whichever figure of the group it is compared on
    throughput = dict(METRIC_GROUPS)["served throughput"]
    runs = sum(1 for c in comps if c.metric in throughput)
    fig.suptitle(f"llmplan validate: {len(comps):,} comparisons with published measurements "
                 f"({rows:,} static rows, {runs:,} served runs), predicted with each one's "
                 "engine profile", fontsize=10)
    thin_tick_labels(fig)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def plot_simulation(res, path: Path, *, title: str) -> Path:
    """A simulated run over time (running requests, queue, KV reserved and held against the
    capacity) and its TTFT and TPOT distributions; the time series goes to a CSV beside it."""
    samples = pd.DataFrame(res.samples, columns=["t_s", "running", "waiting",
                                                 "kv_reserved_tokens"])
    samples["kv_reserved_frac"] = samples["kv_reserved_tokens"] / res.kv_capacity_tokens
    csv_path = path.with_suffix(".csv")
    samples.to_csv(csv_path, index=False)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (a0, a1), (a2, a3) = axes
    step = max(1, len(samples) // 2000)  # enough points to see, few enough to draw
    s = samples.iloc[::step]
    a0.plot(s["t_s"], s["running"], color=COLORS[0], lw=1, label="running requests")
    a0.plot(s["t_s"], s["waiting"], color=COLORS[1], lw=1, label="waiting (queue)")
    a0.set_xlabel("time (s)")
    a0.set_ylabel("requests")
    a0.legend(fontsize=8, loc="center right")
    a0.grid(True, alpha=0.3)
    a1.plot(s["t_s"], s["kv_reserved_frac"] * 100, color=COLORS[2], lw=1,
            label=f"KV reserved (of {res.kv_capacity_tokens:,} tokens)")
    a1.axhline(100, color="black", lw=1, ls="--", label="capacity")
    a1.set_ylim(0, 110)
    a1.set_xlabel("time (s)")
    a1.set_ylabel("KV cache reserved (%)")
    a1.legend(fontsize=8, loc="lower right")
    a1.grid(True, alpha=0.3)
    done = [r for r in res.requests if not np.isnan(r.finish_s)]
    for ax, values, name in ((a2, [r.ttft_s * 1e3 for r in done], "TTFT"),
                             (a3, [r.tpot_s * 1e3 for r in done if r.output_tokens > 1],
                              "TPOT")):
        v = np.sort(np.asarray(values))
        if len(v):
            ax.plot(v, np.arange(1, len(v) + 1) / len(v) * 100, color=COLORS[3], lw=1.3)
            for q, ls in ((50, ":"), (90, "--"), (99, "-.")):
                x = float(np.percentile(v, q))
                ax.axvline(x, color="grey", ls=ls, lw=1, label=f"p{q} {x:,.1f} ms")
            ax.legend(fontsize=8, loc="lower right")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("requests (%)")
        ax.set_title(f"{name} distribution ({len(v):,} requests)", fontsize=9)
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return csv_path


SERVED_PANELS = (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"), ("itl", "ITL (ms)"),
                 ("e2el", "end-to-end latency (ms)"), ("requests", "requests per second"),
                 ("tokens", "tokens per second"))


def _served_kind(metric: str) -> tuple[str, str, float]:
    """(panel, series, scale) of a compared figure: request_throughput on the requests/s
    panel, output and total token throughput on the tokens/s one (their units differ, so
    never one axis), latencies (``mean_ttft_s``) in ms on their own panel, one series per
    statistic."""
    if "throughput" in metric:
        kind = "requests" if metric.startswith("request") else "tokens"
        return kind, metric.replace("_", " "), 1.0
    stat, kind = metric.split("_")[:2]
    return kind, stat, 1e3


def _grid(n: int, *, width: float, height: float):
    """Up to three panels a row, laid out so that keys under the axes stay clear of the row
    below; panels past ``n`` hidden."""
    ncols = min(3, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows),
                             squeeze=False, layout="constrained")
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _bands(ax, lo: float, hi: float) -> None:
    """The y = x line of a predicted-against-measured panel with its +-10% and +-25% bands."""
    x = np.geomspace(lo, hi, 50)
    ax.fill_between(x, x / 1.25, x * 1.25, color="grey", alpha=0.10, label="within 25%")
    ax.fill_between(x, x / 1.1, x * 1.1, color="grey", alpha=0.22, label="within 10%")
    ax.plot(x, x, color="black", lw=1, label="prediction = measurement")


def plot_served(comps, path: Path, *, title: str) -> None:
    """`llmplan compare --plot`: the simulated figure of each measured run against the
    measurement, log-log, a panel per kind of figure (mean, median and p99 marked apart;
    requests/s and tokens/s on panels of their own), the y = x line with +-10% and +-25%
    bands, each panel's key under it."""
    pts: dict[str, list[tuple[float, float, str]]] = {}
    for c in comps:
        for m in c.rows:
            if m.simulated is None or not m.measured:
                continue
            kind, stat, k = _served_kind(m.metric)
            pts.setdefault(kind, []).append((m.measured * k, m.simulated * k, stat))
    panels = [(k, label) for k, label in SERVED_PANELS if k in pts]
    if not panels:
        raise ValueError("no simulated figure to plot")
    fig, axes = _grid(len(panels), width=5.0, height=6.4)
    for ax, (kind, label) in zip(axes, panels, strict=True):
        p = pts[kind]
        vals = [v for a, b, _ in p for v in (a, b)]
        lo, hi = min(vals) / 1.6, max(vals) * 1.6
        _bands(ax, lo, hi)
        for i, stat in enumerate(sorted({s for _, _, s in p})):
            sub = [(a, b) for a, b, s in p if s == stat]
            med = statistics.median(abs(b / a - 1) for a, b in sub)
            ax.scatter([a for a, _ in sub], [b for _, b in sub], s=34,
                       marker=MARKERS[i % len(MARKERS)], color=COLORS[i % len(COLORS)],
                       zorder=3, label=f"{stat} (n={len(sub)}, median |err| {med:.0%})")
        _square_loglog(ax, lo, hi, label, label[0].upper() + label[1:], legend_size=7,
                       under=True)
    fig.suptitle(title, fontsize=10)
    thin_tick_labels(fig)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def _pareto_line(r: dict, continuous: bool) -> str:
    """One configuration of a plan row, as the plot's key reads it."""
    if r.get("disaggregated") is True:
        from planner.search.disagg import pd_label

        return (f"{pd_label(r)} {r['gpu']} ({int(r['total_gpus'])} GPUs), {r['weights']} "
                f"weights, {r['kv_cache']} KV")
    batch = f"{r['rate_per_replica']:.3g} req/s each" if continuous else f"batch {r['batch']}"
    return (f"{int(r['replicas'])} x {Layout(int(r['tp']), int(r['pp']), int(r['ep'])).label} "
            f"{r['gpu']}, {r['weights']} weights, {r['kv_cache']} KV, {batch}")


def plot_pareto(df: pd.DataFrame, path, *, title: str, top: int = 5) -> None:
    from planner.search.plan import pareto_front

    feas = df[df["meets_targets"]]
    fig, ax = plt.subplots(figsize=(10, 6.5))
    ax.scatter(feas["latency_s"], feas["cost_usd_per_million_output_tokens_at_traffic"],
               s=12, color="lightgrey", label=f"meets the targets ({len(feas)})")
    front = pareto_front(feas)
    ax.plot(front["latency_s"], front["cost_usd_per_million_output_tokens_at_traffic"],
            "-o", color="tab:red", ms=5, lw=1.3, label="Pareto front (cost vs latency)")
    labels = Labels(ax)
    lines = []
    continuous = "scheduler" in feas and len(feas) and feas["scheduler"].iloc[0] == "continuous"
    pct = f"p{int(feas['percentile'].iloc[0])} " if continuous else ""
    shown = set()
    for r in feas.head(top).to_dict("records"):
        cost = r["cost_usd_per_million_output_tokens_at_traffic"]
        ax.scatter([r["latency_s"]], [cost], s=40, facecolor="none", edgecolor="black",
                   zorder=4)
        labels.add(r["latency_s"], cost, f"#{int(r['rank'])}", color="black", dx=5, dy=4,
                   fontsize=8)
        shown.add(int(r["rank"]))
        lines.append(f"#{int(r['rank'])}  {_pareto_line(r, continuous)}: ${cost:,.2f}/1M, "
                     f"{r['latency_s']:.1f} s")
    for r in front.to_dict("records"):  # every point of the front named, the top ones or not
        if "rank" in r and int(r["rank"]) not in shown:
            labels.add(r["latency_s"], r["cost_usd_per_million_output_tokens_at_traffic"],
                       f"#{int(r['rank'])}", color="tab:red", dx=5, dy=4, fontsize=8)
    logs = ""
    for axis, values in (("x", feas["latency_s"]),
                         ("y", feas["cost_usd_per_million_output_tokens_at_traffic"])):
        lo, hi = float(values.min()), float(values.max())
        if lo > 0 and hi / lo > 10:  # log only where the points span more than a decade
            getattr(ax, f"set_{axis}scale")("log")
            logs += axis
    plain_log_ticks(ax, logs)
    ax.set_xlabel(f"{pct}end-to-end latency per request (s{', simulated' if continuous else ''})")
    # The key to the numbered points goes under the axes, where it covers no point.
    ax.text(0.0, -0.12, "cheapest:\n" + "\n".join(lines), transform=ax.transAxes,
            fontsize=7, va="top", family="monospace")
    ax.set_ylabel("cost per 1M output tokens at the traffic (USD)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    labels.place(avoid=(ax.legend(fontsize=8, loc="upper right"),),
                 points=zip(feas["latency_s"],
                            feas["cost_usd_per_million_output_tokens_at_traffic"], strict=True))
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
