"""The pace at which an engine's decode attention reads an fp8 KV cache on each GPU, from NVIDIA
aiconfigurator's measured attention tables, and the figure by GPU architecture it implies.

    pip download --no-deps aiconfigurator-core==0.12.0 -d /tmp/aic
    python benchmarks/aiconfigurator_attention.py /tmp/aic/aiconfigurator_core-0.12.0-*.whl \\
        --engine vllm

aiconfigurator ships, per GPU system and engine release, the latency of the engine's decode
attention (``attention/<engine>/<release>/generation_attention_perf.parquet``: one new token
for each of ``batch_size`` sequences over ``step`` cached tokens, by query and KV heads, head
dimension and the cache's type, bf16 or fp8) timed on that GPU. Where the cache is far larger
than any L2 (its 16-bit form 256 MiB or more), the cache's bytes over the latency is the rate
the kernel reads it at. This prints, for each GPU and type, that rate (the median over the
shapes, with the type's default kernel: the one the table times most) and its share of the
GPU's achievable copy bandwidth in hardware_db; and, by architecture, the median fp8 rate of
its GPUs where their fp8 kernels reach under 0.9 of the share their 16-bit ones do: the engine
profile's ``fp8_kv_attention_gb_per_s``. With a 16-bit cache it also prints, shape by shape,
each GPU's share against the H100's, the median by GPU: the profile's
``attention_bandwidth_arch_frac`` (the H100 is the reference, as for the GEMMs' factor in
aiconfigurator_gemm.py). From the prefill tables (``context_attention_perf.parquet``) it prints
each GPU's fp8-cache time over its 16-bit-cache time, the median over the shapes both hold
(each type with its default kernel), and by architecture the median of its GPUs' 16-bit / fp8
time: the profile's ``fp8_kv_attention_compute_frac``. ``--derive-fixed`` prints, by
architecture, the device time a decode attention call takes beyond what the profile's
operators cost it, where that fixed part sets the time (``FIXED_BATCHES`` sequences over
``FIXED_STEPS`` cached tokens, a 16-bit cache): the profile's ``attention_fixed_us``.
``--fixed-cells`` checks that figure over a wider grid on the H100's table (1-64 sequences over
1,023-16,383 cached tokens): the median theirs / ours of each cell without it and with it, so
that a time that only moves the median, where the cells want a rate instead, shows. Nothing
is fitted to a validation row; the wheel is not needed by llmplan.
"""

from __future__ import annotations

import math
import statistics
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.aiconfigurator_gemm import arch_factor as _arch_factor  # noqa: E402
from benchmarks.aiconfigurator_moe import RELEASES, SYSTEMS, leave, wheel_table  # noqa: E402
from benchmarks.gpu_kernels import OneLineParser  # noqa: E402

# a cache at least this large in 16 bits: well above the L2 of each of these GPUs
MIN_CACHE_BYTES = 256 * 2**20
PACED_BELOW = 0.9  # an fp8 share under this much of the 16-bit share: the kernel sets the pace
BYTES = {"bfloat16": 2, "fp8": 1}


REFERENCE = "h100-sxm"
SHAPE = ["batch_size", "step", "num_heads", "num_key_value_heads", "head_dim"]


def _kernel_rows(table, dtype: str):
    """The table's full-attention rows of cache type ``dtype`` timed by that type's default
    kernel (the one with the most rows of it); None where it has none."""
    t = table
    if "window_size" in t.columns:
        t = t[t.window_size == 0]
    t = t[t.kv_cache_dtype == dtype]
    if t.empty:
        return None
    return t[t.kernel_source == t.kernel_source.value_counts().index[0]]


def _cache_rows(table, dtype: str):
    """``_kernel_rows`` of a decode table whose 16-bit cache is at least MIN_CACHE_BYTES; None
    where it has none."""
    t = _kernel_rows(table, dtype)
    if t is None:
        return None
    elems = t.batch_size * (t.step + 1) * t.num_key_value_heads * t.head_dim * 2
    t = t[elems * 2 >= MIN_CACHE_BYTES]
    return None if t.empty else t


def _rates(rows, dtype: str) -> dict[tuple, float]:
    """{shape: the cache's bytes/s} over ``rows`` (``_cache_rows``'; None: none)."""
    out = {}
    if rows is None:
        return out
    for (b, s, h, kv, d), g in rows.groupby(SHAPE):
        out[(int(b), int(s), int(h), int(kv), int(d))] = (
            b * (s + 1) * kv * d * 2 * BYTES[dtype] / (float(g.latency.median()) * 1e-3))
    return out


def shape_rates(table, dtype: str = "bfloat16") -> dict[tuple, float]:
    """{shape: the cache's bytes/s} for the table's rows of ``dtype`` (``_cache_rows``)."""
    return _rates(_cache_rows(table, dtype), dtype)


def arch_factor(shares: dict[tuple, float], reference: dict[tuple, float]
                ) -> tuple[float, float, float, int]:
    """(median, p10, p90, shapes) of the per-shape ratio shares / reference over the shapes
    both hold (aiconfigurator_gemm.py's, for attention shapes)."""
    return _arch_factor(shares, reference, what="16-bit attention")


CONTEXT_SHAPE = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "step"]


def prefill_fp8_ratio(table) -> tuple[float, int] | None:
    """(median fp8-cache time / 16-bit-cache time, shapes) over the prefill table's full
    attention shapes both types hold, each with its default kernel; None where it times only
    one type."""
    times = {}
    for dtype in BYTES:
        rows = _kernel_rows(table, dtype)
        if rows is None:
            return None
        times[dtype] = rows.groupby(CONTEXT_SHAPE).latency.median()
    r = (times["fp8"] / times["bfloat16"]).dropna()
    return (float(r.median()), len(r)) if len(r) else None


def cache_rates(table) -> dict[str, tuple[str, float, int]]:
    """{cache type: (kernel, median bytes/s, shapes)} over the table's full-attention decode
    shapes whose 16-bit cache is at least MIN_CACHE_BYTES, each type with its default kernel
    (the one with the most rows of it). The cache holds K and V of ``step`` + 1 tokens a
    sequence (the latency is in ms)."""
    out = {}
    for dtype in BYTES:
        rows = _cache_rows(table, dtype)
        if rows is None:
            continue
        rates = _rates(rows, dtype)
        out[dtype] = (str(rows.kernel_source.iloc[0]), statistics.median(rates.values()),
                      len(rates))
    return out


def arch_paces(per_gpu: dict[str, tuple[str, dict, float]]) -> dict[str, float]:
    """{architecture: the median pace in bytes/s of its GPUs whose fp8 share is under
    PACED_BELOW of their 16-bit share} from {gpu: (architecture, cache_rates, the profile's
    own 16-bit cache rate there in bytes/s)}; an architecture none of whose GPUs is paced so is
    left out. A GPU's pace is in the profile's terms: its 16-bit rate times the measured fp8
    rate over the measured 16-bit one, so that an fp8 cache stands to a 16-bit one as the
    table has it whatever the profile's 16-bit share is."""
    paced: dict[str, list[float]] = {}
    for arch, rates, ours in per_gpu.values():
        if "fp8" in rates and "bfloat16" in rates and \
                rates["fp8"][1] < PACED_BELOW * rates["bfloat16"][1]:
            paced.setdefault(arch, []).append(ours * rates["fp8"][1] / rates["bfloat16"][1])
    return {a: statistics.median(v) for a, v in sorted(paced.items())}


# where a decode attention call's fixed work sets its time: a few sequences of 1,023 and 4,095
# tokens (the table's step: aiconfigurator's vLLM collector times sequences of that length,
# the new token included), what --derive-fixed matches
FIXED_BATCHES, FIXED_STEPS = (1, 2, 4, 8, 16), (1023, 4095)


def ours_us(dep, batch: int, step: int) -> float:
    """What the profile prices one layer's share of the table's timing at: the attention
    operator of a decode step of ``batch`` sequences of ``step`` tokens (``step`` - 1 cached
    and the new one), and the KV-cache write the backend's forward does first
    (``rope_kv_write`` less its rotary kernel, which the model runs before the attention
    layer). In microseconds."""
    from planner.core.ops import step_ops
    from planner.core.roofline import op_time

    c, e = dep.prepared.ceilings, dep.engine
    total = 0.0
    for op in step_ops(dep.model, dep.precision, batch=batch, new_tokens=1,
                       past_tokens=step - 1, tp=1):
        if op.name in ("attention", "rope_kv_write"):
            t = op_time(op, c, tp=1, options=dep.options, engine=e).time_s / op.count
            if op.name == "rope_kv_write":
                t -= c.kernel_cost_s(op.kind, e)
            total += t
    return total * 1e6


def fixed_rows(table, gpu: str, engine):
    """(theirs us, ours us) for each of the decode table's full-attention shapes of a 16-bit
    cache (its default kernel) at ``FIXED_BATCHES`` x ``FIXED_STEPS``, ours with ``engine``
    (an ``EngineSpec``) for a model of the shape's heads, KV heads and head size, without the
    profile's own attention_fixed_us."""
    return [(t, o) for _, _, t, o in cell_rows(table, gpu, engine, FIXED_BATCHES, FIXED_STEPS)]


def cell_rows(table, gpu: str, engine, batches, steps):
    """(batch, step, theirs us, ours us) for each of those shapes at ``batches`` x ``steps``
    (``fixed_rows``'s, each row with its cell)."""
    from planner.io import catalog
    from planner.layouts.deployment import Deployment

    rows = _kernel_rows(table, "bfloat16")
    if rows is None:
        return []
    rows = rows[rows.batch_size.isin(batches) & rows.step.isin(steps)]
    spec = engine.model_copy(update={"attention_fixed_us": None})
    hw, base = catalog.load_hardware(gpu), catalog.load_model("llama-3.1-8b")
    out, deps = [], {}
    for (b, st, h, kv, d), g in rows.groupby(SHAPE):
        key = (int(h), int(kv), int(d))
        if key not in deps:
            m = base.model_copy(update={"num_attention_heads": key[0], "num_kv_heads": key[1],
                                        "head_dim": key[2], "hidden_size": key[0] * key[2]})
            deps[key] = Deployment.build(m, hw, engine=spec.model())
        out.append((int(b), int(st), float(g.latency.median()) * 1e3,
                    ours_us(deps[key], int(b), int(st))))
    return out


def derive_fixed(pairs: list[tuple[float, float]]) -> float:
    """The microseconds X with which the median of theirs / (ours + X) over ``pairs`` is 1
    (to 0.05 us; 0 where ours is already the slower); a ValueError where not even 1 ms
    brings it down to 1."""
    def median_ratio(x: float) -> float:
        return statistics.median(t / (o + x) for t, o in pairs)

    lo, hi = 0.0, 1000.0
    if median_ratio(lo) <= 1.0:
        return 0.0
    if median_ratio(hi) > 1.0:
        raise ValueError("no fixed time up to 1 ms makes theirs / ours 1")
    while hi - lo > 0.05:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if median_ratio(mid) > 1.0 else (lo, mid)
    return 0.5 * (lo + hi)


def main(argv=None) -> int:
    from planner.io import catalog

    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", help="the aiconfigurator-core 0.12.0 wheel")
    ap.add_argument("--engine", choices=sorted(RELEASES), default="vllm")
    ap.add_argument("--derive-fixed", action="store_true",
                    help="print, by architecture, the device time a decode attention call "
                         "takes beyond what the profile's operators cost it (engines_db "
                         "attention_fixed_us)")
    ap.add_argument("--fixed-cells", action="store_true",
                    help="print, on the H100's table, the median theirs / ours by batch and "
                         "cached tokens over a wider grid than --derive-fixed reads, without "
                         "the profile's attention_fixed_us and with it")
    a = ap.parse_args(argv)
    tables, prefill, gpu = {}, {}, ""
    try:
        with zipfile.ZipFile(a.wheel) as whl:  # opened once for every GPU's table
            for gpu, system in SYSTEMS.items():
                release = RELEASES[a.engine][system]
                folder = f"aiconfigurator_core/systems/data/{system}/attention/{a.engine}/{release}"
                tables[gpu] = (wheel_table(whl, f"{folder}/generation_attention_perf.parquet"),
                               release)
                if f"{folder}/context_attention_perf.parquet" in whl.namelist():
                    prefill[gpu] = wheel_table(whl, f"{folder}/context_attention_perf.parquet")
    except (OSError, zipfile.BadZipFile, KeyError) as err:
        what = f"the {gpu} table" if gpu else "it"  # the wheel itself may be what fails
        print(f"aiconfigurator_attention.py: {a.wheel}: cannot read {what}: {err}",
              file=sys.stderr)
        return 2
    if a.derive_fixed:
        return print_fixed(tables, a.engine)
    if a.fixed_cells:
        return print_cells(tables[REFERENCE][0], a.engine)
    per_gpu = {}
    print(f"# {a.engine}: decode attention over a cache of {MIN_CACHE_BYTES / 2**20:g} MiB or "
          "more in 16 bits; rate = the cache's bytes / latency (median over the shapes); "
          "share = of hardware_db's achievable copy bandwidth")
    print(f"{'gpu':<14} {'arch':<10} {'release':<8} {'cache':<8} {'kernel':<30} "
          f"{'shapes':>6} {'GB/s':>7} {'share':>6}")
    engine = catalog.load_engine(a.engine)
    ceilings = {}
    for gpu, (table, release) in tables.items():
        hw = catalog.load_hardware(gpu)
        ceiling = ceilings[gpu] = hw.achievable.memory_bandwidth_gb_per_s.value * 1e9
        rates = cache_rates(table)
        e = engine.for_gpu(hw.memory_bytes, hw.name, hw.architecture)
        ours = ceiling * e.attention_bandwidth_frac * e.attention_bandwidth_arch_frac
        per_gpu[gpu] = (hw.architecture, rates, ours)
        for dtype, (kernel, rate, n) in rates.items():
            print(f"{gpu:<14} {hw.architecture:<10} {release:<8} {dtype:<8} {kernel:<30} "
                  f"{n:>6} {rate / 1e9:>7.0f} {rate / ceiling:>6.3f}")
    ref = {k: v / ceilings[REFERENCE] for k, v in shape_rates(tables[REFERENCE][0]).items()}
    print(f"16-bit cache, share against the {REFERENCE}'s shape by shape "
          "(attention_bandwidth_arch_frac):")
    for gpu, (arch, _rates, _ours) in per_gpu.items():
        mine = {k: v / ceilings[gpu] for k, v in shape_rates(tables[gpu][0]).items()}
        try:
            f, lo, hi, n = arch_factor(mine, ref)
        except ValueError as err:
            print(f"aiconfigurator_attention.py: {gpu}: {err}", file=sys.stderr)
            return 2
        print(f"  {gpu:<14} {arch:<10} {f:.3f} (p10-p90 {lo:.3f}-{hi:.3f}, {n} shapes)")
    print("prefill attention, fp8 cache / 16-bit cache time (fp8_kv_attention_compute_frac: "
          "the architecture's median 16-bit / fp8):")
    by_arch: dict[str, list[float]] = {}
    for gpu, table in prefill.items():
        got = prefill_fp8_ratio(table)
        if got is None:
            continue
        ratio, n = got
        by_arch.setdefault(per_gpu[gpu][0], []).append(1.0 / ratio)
        print(f"  {gpu:<14} {per_gpu[gpu][0]:<10} {ratio:.3f} ({n} shapes)")
    print("  " + ", ".join(f"{k}: {statistics.median(v):.2f}" for k, v in sorted(by_arch.items())))
    paces = arch_paces(per_gpu)
    print(f"fp8_kv_attention_gb_per_s (architectures whose fp8 kernel reaches under "
          f"{PACED_BELOW:g} of the 16-bit share; the {a.engine} profile's 16-bit rate there "
          "times the measured fp8 rate over the 16-bit one, the architecture's median): "
          + (", ".join(f"{k}: {v / 1e9:.0f}" for k, v in paces.items()) or "none"))
    return 0


# a replay of the table's graph holds one call: where its latency is under twice the table's
# least (a call at the smallest cache), the host replaying graph after graph may set the
# pace rather than the call; the figure over the rows above that, printed beside, checks that
# what is derived is the call's own time
ABOVE_FLOOR = 2.0


def print_fixed(tables: dict, engine: str) -> int:
    """``--derive-fixed``: each GPU's figure and rows, then each architecture's over its
    GPUs' rows together; beside each, the figure over the rows at ``ABOVE_FLOOR`` times the
    table's least latency or more."""
    from planner.io import catalog

    spec = catalog.load_engine_spec(engine)
    print(f"# {engine}: decode attention's device time beyond the profile's operators "
          f"(attention and the KV-cache write), batch {FIXED_BATCHES[0]}-{FIXED_BATCHES[-1]}, "
          f"sequences of {FIXED_STEPS[0]:,}-{FIXED_STEPS[-1]:,} tokens, a 16-bit cache; "
          "median theirs / ours before, and the fixed us with which it is 1")
    by_arch: dict[str, list] = {}
    above: dict[str, list] = {}

    def beside(p: list) -> str:
        return f"{derive_fixed(p):.1f} on {len(p)}" if p else "none"

    for gpu, (table, release) in tables.items():
        pairs = fixed_rows(table, gpu, spec)
        if not pairs:
            continue
        arch = catalog.load_hardware(gpu).architecture
        floor = float(_kernel_rows(table, "bfloat16").latency.min()) * 1e3
        high = [(t, o) for t, o in pairs if t >= ABOVE_FLOOR * floor]
        by_arch.setdefault(arch, []).extend(pairs)
        above.setdefault(arch, []).extend(high)
        before = statistics.median(t / o for t, o in pairs)
        theirs = statistics.median(t for t, _ in pairs)
        print(f"  {gpu:<14} {arch:<10} {release:<8} {len(pairs):>5} shapes  theirs median "
              f"{theirs:5.1f} us  ratio {before:.2f}  fixed {derive_fixed(pairs):5.1f} us  "
              f"(least {floor:.1f} us; above {ABOVE_FLOOR:g}x it: {beside(high)})")
    print("attention_fixed_us: " + ", ".join(
        f"{arch}: {derive_fixed(p):.1f} ({len(p)} shapes; above the floor "
        f"{beside(above[arch])})" for arch, p in sorted(by_arch.items())))
    return 0


# --fixed-cells: the grid the fixed time is checked over (the H100's tables time these)
CELL_BATCHES, CELL_STEPS = (1, 2, 4, 8, 16, 32, 64), (1023, 4095, 16383)


def print_cells(table, engine: str) -> int:
    """``--fixed-cells``: on the reference GPU's table, for each batch and cached-token count
    of ``CELL_BATCHES`` x ``CELL_STEPS``, the median over the head shapes of theirs / ours
    without the profile's attention_fixed_us and with it; then the mean |log ratio| over every
    row, each way. A fixed time that only shifts the median would leave the cells apart."""
    from planner.io import catalog

    spec = catalog.load_engine_spec(engine)
    hw = catalog.load_hardware(REFERENCE)
    fixed_us = spec.model().for_gpu(hw.memory_bytes, hw.name, hw.architecture) \
        .attention_fixed_s * 1e6
    rows = cell_rows(table, REFERENCE, spec, CELL_BATCHES, CELL_STEPS)
    if not rows:
        print(f"aiconfigurator_attention.py: the {REFERENCE} table holds none of the grid's "
              "rows", file=sys.stderr)
        return 2
    print(f"# {engine} on the {REFERENCE}: decode attention, a 16-bit cache, theirs / ours by "
          f"cell (median over the head shapes), without attention_fixed_us and with its "
          f"{fixed_us:g} us")
    by_cell: dict[tuple, list] = {}
    for b, st, t, o in rows:
        by_cell.setdefault((b, st), []).append((t, o))
    for (b, st), pairs in sorted(by_cell.items()):
        before = statistics.median(t / o for t, o in pairs)
        after = statistics.median(t / (o + fixed_us) for t, o in pairs)
        print(f"  batch {b:>3}  {st:>6,} tokens  {len(pairs):>4} shapes  theirs "
              f"{statistics.median(t for t, _ in pairs):7.1f} us  ratio {before:6.2f} -> "
              f"{after:.2f}")
    logs0 = statistics.mean(abs(math.log(t / o)) for _, _, t, o in rows)
    logs1 = statistics.mean(abs(math.log(t / (o + fixed_us))) for _, _, t, o in rows)
    print(f"mean |log ratio| over {len(rows)} rows: {logs0:.3f} -> {logs1:.3f}")
    return 0


if __name__ == "__main__":
    leave(main)
