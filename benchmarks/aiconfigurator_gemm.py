"""The share of the copy bandwidth an engine's decode GEMMs reach on each GPU, from NVIDIA
aiconfigurator's measured GEMM tables, and the factor by GPU architecture it implies.

    pip download --no-deps aiconfigurator-core==0.12.0 -d /tmp/aic
    python benchmarks/aiconfigurator_gemm.py /tmp/aic/aiconfigurator_core-0.12.0-*.whl \\
        --engine vllm

aiconfigurator ships, per GPU system and engine release, the latency of the engine's 16-bit
GEMM (``gemm/<engine>/<release>/gemm_perf.parquet``: M x N x K, the kernel the engine calls)
timed on that GPU. A decode GEMM (M, the tokens of a step, of 16 or fewer) streams its N x K
weights once; where they are far larger than the GPU's L2 cache, so that the table's repeated
timings cannot find them there, its bytes over its latency is the bandwidth the kernel reaches.
This prints, for each GPU, that rate as a share of the GPU's achievable copy bandwidth in
hardware_db (the ceiling llmplan's decode GEMMs are priced against), and the median over the
shapes both tables hold of its ratio to the H100's share: the engine profile's
``gemm_bandwidth_arch_frac``. The H100 is the reference because the profiles' own
``gemm_bandwidth_frac`` is what served runs on Hopper confirm (docs/engines.md); the factor
carries to another architecture how much less of its copy ceiling the same engine's GEMM
reaches there. Nothing is fitted to a validation row; the wheel is not needed by llmplan.

``--derive-fp8-compute`` reads the same tables' W8A8 fp8 GEMMs (``gemm_dtype`` fp8: vLLM's
CUTLASS scaled-mm, per-tensor weight scales) at prefill sizes, M of 1,024 or more, where the
arithmetic sets the time, and N, K of 4,096 or more (a 7-8B model's projections and up). For
each GPU with fp8 tensor cores it prints the compute efficiency of the profile's fp8 path
(``quantized.fp8.compute_frac``) with which the median ratio theirs / ours over those fp8 rows
equals the same median over the 16-bit rows: the fp8 path then stands to its kernel as the
16-bit GEMMs stand to theirs, whatever that is.

``--derive-fp8-decode`` reads the same tables' W8A8 fp8 GEMMs (``gemm_dtype`` fp8, one weight
scale per tensor) at decode sizes, M of 16 or fewer, beside the 16-bit GEMM of each shape, for
shapes whose 16-bit weights are 16 MiB or more. An fp8 decode GEMM costs its weights' streaming
and its fixed costs: the kernels the engine launches beside it (the input's quantization,
``fp8_quant_kernels``) and its own. Shape by shape it takes (theirs / ours in fp8) / (theirs /
ours in 16 bits), 1 where our fp8 GEMM stands to our 16-bit one as theirs does, whatever the
16-bit rate is. For each count of extra kernels from 0 to 6 it finds the fp8 path's bandwidth
efficiency (``quantized.fp8.bandwidth_frac``) that makes the median of that ratio 1 over the
shapes of 256 MiB or more (the streaming), and prints the spread left over every shape (the
small ones show the fixed costs); the count with the least spread on the H100 is the one the
other GPUs are then shown at.

``--fp8-row-tiles`` reads the same W8A8 fp8 rows on the Hopper GPUs (N, K of 4,096 or more) at
every M the tables time above 16. It prints, first, the table's own time at the first M past
each bound of the profile's ``fp8_gemm_row_tiles`` (and the first multiples of its last
configuration's rows) against the time at the bound (a step up
where the kernel's dispatch changes configuration, for the model-independent evidence), then
theirs / ours by range of M with the profile's row tiles and without them (the engine's
16-row tile): the tiles should bring each range's median towards the others'.
"""

from __future__ import annotations

import math
import statistics
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.aiconfigurator_moe import RELEASES, SYSTEMS, leave, wheel_table  # noqa: E402
from benchmarks.gpu_kernels import OneLineParser  # noqa: E402

REFERENCE = "h100-sxm"
MAX_M = 16  # a decode step's tokens: GEMV-like shapes whose weights set the time
# weights at least this large: well above the L2 cache of each of these GPUs (the L40S's, 96 MB,
# the largest of them on one die), so that no timing reads them from L2
MIN_WEIGHT_BYTES = 256 * 2**20


def decode_shares(table, ceiling_gb_per_s: float, max_m: int = MAX_M,
                  min_weight_bytes: float = MIN_WEIGHT_BYTES) -> dict[tuple, float]:
    """{(m, n, k): achieved bytes/s / the ceiling} for the table's 16-bit decode GEMMs whose
    weights are at least ``min_weight_bytes``; the bytes are the activations read, the weights
    read and the output written, 2 each (the table's latency is in ms)."""
    t = table[(table.gemm_dtype == "bfloat16") & (table.m <= max_m)
              & (table.n * table.k * 2 >= min_weight_bytes)]
    out = {}
    for (m, n, k), g in t.groupby(["m", "n", "k"]):
        latency_s = float(g.latency.median()) * 1e-3
        moved = 2.0 * (m * k + n * k + m * n)
        out[(int(m), int(n), int(k))] = moved / latency_s / (ceiling_gb_per_s * 1e9)
    return out


def arch_factor(shares: dict[tuple, float], reference: dict[tuple, float],
                what: str = "decode GEMM") -> tuple[float, float, float, int]:
    """(median, p10, p90, shapes) of the per-shape ratio shares / reference over the shapes
    both hold (``what``: the kind of shape, for the error)."""
    common = sorted(set(shares) & set(reference))
    if not common:
        raise ValueError(f"no {what} shape is timed on both GPUs")
    r = sorted(shares[s] / reference[s] for s in common)
    q = statistics.quantiles(r, n=10, method="inclusive") if len(r) > 1 else [r[0]] * 9
    return statistics.median(r), q[0], q[-1], len(r)


# a prefill's GEMMs: the arithmetic sets their time (the tables time M up to 32,768)
MIN_COMPUTE_M = 1024
MIN_NK = 4096  # a model's projections: N and K of 4,096 or more (7-8B models and up)
FP8_GPUS = ("h100-sxm", "h200", "l40s", "b200")  # fp8 tensor cores (not the A100)


def ours_gemm_s(m: int, n: int, k: int, weights: str, dep, blocks: bool = False) -> float:
    """One [m, k] x [k, n] GEMM of ``weights`` (bf16 or fp8; ``blocks``: fp8 weights scaled
    per block) as llmplan costs it under the deployment's engine (``dep``: ``served_setup``'s),
    with the kernels it launches."""
    from planner.core.ops import Op
    from planner.core.roofline import op_time
    from planner.core.specs import DType

    w = DType(weights)
    op = Op("mlp_down_proj", "matmul", 1, flops=2.0 * m * n * k,
            weight_bytes=float(n * k) * (1 if w == DType.fp8 else 2),
            act_bytes=2.0 * m * (n + k), dtype=w, weight_dtype=w, m_rows=m, k_dim=k,
            fp8_blocks=blocks and w == DType.fp8)
    return op_time(op, dep.prepared.ceilings, tp=1, options=dep.options,
                   engine=dep.engine).time_s


def compute_ratios(table, gpu: str, spec, weights: str,
                   min_m: int = MIN_COMPUTE_M) -> list[float]:
    """theirs / ours for each of the table's GEMM shapes of ``weights`` (bf16 or fp8) with
    M >= ``min_m`` and N, K >= MIN_NK, under the profile ``spec``."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType

    dtype = "bfloat16" if weights == "bf16" else weights
    dep = served_setup("qwen3-8b", gpu, spec, 1, DType(weights), None)
    t = table[(table.gemm_dtype == dtype) & (table.m >= min_m) & (table.n >= MIN_NK)
              & (table.k >= MIN_NK)]
    out = []
    for (m, n, k), g in t.groupby(["m", "n", "k"]):
        out.append(float(g.latency.median()) * 1e-3 / ours_gemm_s(int(m), int(n), int(k),
                                                                   weights, dep))
    return out


def derive_fp8_compute(table, gpu: str, spec) -> tuple[float, float, float, int]:
    """(fp8 compute_frac, the 16-bit rows' median theirs / ours, the fp8 rows' at that
    fraction, fp8 rows) for ``gpu``'s table: the fraction with which the two medians agree,
    by bisection to 0.005, replacing the profile's own."""
    both = compute_ratios(table, gpu, spec, "bf16"), compute_ratios(table, gpu, spec, "fp8")
    if not all(both):
        raise ValueError(f"no {'16-bit' if not both[0] else 'fp8'} GEMM with M >= "
                         f"{MIN_COMPUTE_M:,} and N, K >= {MIN_NK:,}")
    target = statistics.median(both[0])
    f = fraction_matching(lambda x: statistics.median(
        compute_ratios(table, gpu, with_fp8_frac(spec, "compute_frac", x), "fp8")), target)
    rs = compute_ratios(table, gpu, with_fp8_frac(spec, "compute_frac", f), "fp8")
    return f, target, statistics.median(rs), len(rs)


FRAC_BOUNDS = (0.05, 1.0)  # the fp8 path's efficiencies searched


def fraction_matching(median_at, target: float) -> float:
    """The efficiency in FRAC_BOUNDS at which ``median_at`` (theirs / ours, rising with the
    efficiency: a faster ours) equals ``target``, by bisection to 0.005, rounded to 0.01; a
    bound where it never does (``at_bound`` tells)."""
    lo, hi = FRAC_BOUNDS
    while hi - lo > 0.005:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if median_at(mid) < target else (lo, mid)
    return round(0.5 * (lo + hi), 2)


def at_bound(frac: float) -> bool:
    """The bisection of ``fraction_matching`` ended at an end of FRAC_BOUNDS: no efficiency
    in them matches."""
    return frac <= FRAC_BOUNDS[0] + 0.005 or frac >= FRAC_BOUNDS[1] - 0.005


def with_fp8_frac(spec, field: str, value: float):
    """``spec`` with its fp8 path's ``field`` (compute_frac, bandwidth_frac) replaced."""
    q = spec.quantized["fp8"]
    node = getattr(q, field).model_copy(update={"value": value})
    return spec.model_copy(update={"quantized": {
        **spec.quantized, "fp8": q.model_copy(update={field: node})}})


# decode shapes whose fixed costs show: 16-bit weights of 16 MiB or more (a 7-8B model's
# attention projections and up); the bandwidth alone is read above MIN_WEIGHT_BYTES
MIN_FIXED_WEIGHT_BYTES = 16 * 2**20
MAX_FP8_KERNELS = 6  # the extra kernels tried beside each fp8 GEMM


# the table's type of each fp8 lane: one weight scale per tensor, or per 128 x 128 block
FP8_LANES = {"tensor": "fp8", "block": "fp8_block"}


def decode_pairs(table, min_weight_bytes: float = MIN_FIXED_WEIGHT_BYTES,
                 lane: str = "tensor") -> dict[tuple, tuple[float, float]]:
    """{(m, n, k): (16-bit latency s, fp8 latency s)} for the table's decode GEMMs (M <=
    MAX_M) timed in 16 bits and in the fp8 ``lane`` (FP8_LANES), with 16-bit weights of at
    least ``min_weight_bytes``."""
    f8 = FP8_LANES[lane]
    t = table[(table.m <= MAX_M) & (table.n * table.k * 2 >= min_weight_bytes)]
    lat = {}
    for (dtype, m, n, k), g in t.groupby(["gemm_dtype", "m", "n", "k"]):
        lat[(dtype, int(m), int(n), int(k))] = float(g.latency.median()) * 1e-3
    return {key[1:]: (v, lat[(f8, *key[1:])]) for key, v in lat.items()
            if key[0] == "bfloat16" and (f8, *key[1:]) in lat}


def with_fp8_decode(spec, bandwidth_frac: float, kernels: float, lane: str = "tensor"):
    """``spec`` with its fp8 path's bandwidth efficiency and the kernels beside each W8A8
    GEMM of the ``lane`` replaced (``fp8_quant_kernels``: its value, or its ``block``)."""
    from planner.core.engine import Fp8Kernels

    n = spec.fp8_quant_kernels or Fp8Kernels(value=0.0,
                                             source="benchmarks/aiconfigurator_gemm.py")
    n = n.model_copy(update={"block" if lane == "block" else "value": kernels})
    return with_fp8_frac(spec, "bandwidth_frac", bandwidth_frac).model_copy(
        update={"fp8_quant_kernels": n})


def bf16_decode_ratios(pairs: dict, gpu: str, spec) -> dict[tuple, float]:
    """{shape: theirs / ours in 16 bits} under ``spec`` (what the fp8 path's fields leave
    alone)."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType

    bf = served_setup("qwen3-8b", gpu, spec, 1, DType.bf16, None)
    return {(m, n, k): t16 / ours_gemm_s(m, n, k, "bf16", bf)
            for (m, n, k), (t16, _) in pairs.items()}


def fp8_decode_ratios(pairs: dict, gpu: str, spec, lane: str = "tensor",
                      bf16: dict | None = None) -> dict[tuple, float]:
    """{shape: (theirs / ours in fp8) / (theirs / ours in 16 bits)} under ``spec``, ours in
    the fp8 ``lane``: 1 where our fp8 GEMM stands to our 16-bit one as theirs do, whatever
    the 16-bit rate is. ``bf16``: the 16-bit ratios (``bf16_decode_ratios``), when known."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType

    bf16 = bf16 if bf16 is not None else bf16_decode_ratios(pairs, gpu, spec)
    f8 = served_setup("qwen3-8b", gpu, spec, 1, DType.fp8, None)
    blocks = lane == "block"
    return {(m, n, k): t8 / ours_gemm_s(m, n, k, "fp8", f8, blocks) / bf16[(m, n, k)]
            for (m, n, k), (_, t8) in pairs.items()}


def derive_fp8_decode(table, gpu: str, spec, kernels: int | None = None,
                      lane: str = "tensor") -> list[tuple[int, float, float, float, int]]:
    """[(extra kernels, fp8 bandwidth_frac, mean |log ratio|, its median over the shapes
    above MIN_WEIGHT_BYTES, shapes)] for each count of kernels beside an fp8 GEMM of the
    ``lane`` from 0 to MAX_FP8_KERNELS (or ``kernels`` alone): the fraction, by bisection to
    0.005, with which the median paired ratio (``fp8_decode_ratios``) over the large shapes
    is 1, where the weights' streaming sets the time, and the spread it leaves over every
    decode shape, where the small ones show the fixed costs."""
    pairs = decode_pairs(table, lane=lane)
    if not pairs:
        raise ValueError(f"no GEMM with M <= {MAX_M} and 16-bit weights of "
                         f"{MIN_FIXED_WEIGHT_BYTES / 2**20:g} MiB or more timed in 16 bits "
                         f"and {FP8_LANES[lane]}")
    large = {s for s in pairs if s[1] * s[2] * 2 >= MIN_WEIGHT_BYTES}
    if not large:
        raise ValueError(f"no decode GEMM with 16-bit weights of "
                         f"{MIN_WEIGHT_BYTES / 2**20:g} MiB or more timed in both types")
    bf16 = bf16_decode_ratios(pairs, gpu, spec)

    def ratios(f: float, q: int) -> dict[tuple, float]:
        return fp8_decode_ratios(pairs, gpu, with_fp8_decode(spec, f, q, lane), lane, bf16)

    def large_median(f: float, q: int) -> float:
        r = ratios(f, q)
        return statistics.median(r[s] for s in large)

    out = []
    for q in ([kernels] if kernels is not None else range(MAX_FP8_KERNELS + 1)):
        f = fraction_matching(lambda x, q=q: large_median(x, q), 1.0)
        r = ratios(f, q)
        spread = statistics.fmean(abs(math.log(v)) for v in r.values())
        out.append((q, f, spread, statistics.median(r[s] for s in large), len(r)))
    return out


HOPPER_GPUS = ("h100-sxm", "h200")  # the architecture the row tiles are stated for
ROW_RANGES = ((17, 64), (65, 128), (129, 256), (257, 512), (513, 4096))  # M, by range


def edge_steps(table, bounds, dtype: str = "fp8") -> list[tuple[int, int, float, int]]:
    """(bound, the first M past it that the table times, time there / time at the bound,
    shapes) for each ``bound`` both M are timed at: the table's GEMMs of ``gemm_dtype``
    ``dtype`` (fp8: W8A8; bfloat16) with N, K >= MIN_NK, median over the shapes timed at
    both."""
    t = table[(table.gemm_dtype == dtype) & (table.n >= MIN_NK) & (table.k >= MIN_NK)]
    lat = {key: float(g.latency.median()) for key, g in t.groupby(["m", "n", "k"])}
    ms = sorted({m for m, _, _ in lat})
    out = []
    for b in bounds:
        past = [m for m in ms if m > b]
        if b not in ms or not past:
            continue
        r = [lat[(past[0], n, k)] / lat[(m, n, k)] for m, n, k in lat
             if m == b and (past[0], n, k) in lat]
        if r:
            out.append((int(b), int(past[0]), statistics.median(r), len(r)))
    return out


def fp8_ratios_by_range(table, gpu: str, spec) -> dict[tuple[int, int], list[float]]:
    """{(first M, last M): [theirs / ours, ...]} over the table's W8A8 fp8 GEMMs with N, K >=
    MIN_NK and M in each of ROW_RANGES, under the profile ``spec``."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType

    dep = served_setup("qwen3-8b", gpu, spec, 1, DType.fp8, None)
    t = table[(table.gemm_dtype == "fp8") & (table.n >= MIN_NK) & (table.k >= MIN_NK)]
    out: dict[tuple[int, int], list[float]] = {r: [] for r in ROW_RANGES}
    for (m, n, k), g in t.groupby(["m", "n", "k"]):
        for lo, hi in ROW_RANGES:
            if lo <= m <= hi:
                out[(lo, hi)].append(float(g.latency.median()) * 1e-3
                                     / ours_gemm_s(int(m), int(n), int(k), "fp8", dep))
    return out


def print_fp8_row_tiles(tables: dict, engine: str) -> int:
    from planner.io import catalog

    spec = catalog.load_engine_spec(engine)
    tiles = spec.fp8_gemm_row_tiles
    hopper = None if tiles is None else tiles.value.get("hopper")
    if not hopper:
        print(f"aiconfigurator_gemm.py: --fp8-row-tiles: engine {engine} states no Hopper fp8 "
              "row tiles (fp8_gemm_row_tiles)", file=sys.stderr)
        return 2
    plain = spec.model_copy(update={"fp8_gemm_row_tiles": None})
    print(f"# {engine}: W8A8 fp8 GEMMs, N and K >= {MIN_NK:,}; the profile's Hopper row tiles "
          "(M up to: rows at a time): "
          + ", ".join(f"{'more' if b is None else b}: {r}" for b, r in hopper))
    for gpu in HOPPER_GPUS:
        table, release, path = tables[gpu]
        # each bound, and the first multiples of the last configuration's rows
        bounds = ([b for b, _ in hopper if b is not None]
                  + [hopper[-1][1] * i for i in range(1, 5)])
        print(f"{gpu} ({engine} {release}): the table's time one row past each bound / at it")
        for dtype in ("fp8", "bfloat16"):
            steps = edge_steps(table, bounds, dtype)
            if not steps:
                print(f"aiconfigurator_gemm.py: {path}: no {dtype} GEMM timed at a bound and "
                      "past it", file=sys.stderr)
                return 2
            print(f"  {dtype:<9} " + "  ".join(f"t({m})/t({b}) {r:.2f}"
                                               for b, m, r, _ in steps))
        tiled, flat = fp8_ratios_by_range(table, gpu, spec), fp8_ratios_by_range(table, gpu,
                                                                                  plain)
        print(f"  {'M':>10} {'shapes':>6} {'theirs/ours, tiles':>20} {'16-row tile':>12}")
        for lo, hi in ROW_RANGES:
            a, b = tiled[(lo, hi)], flat[(lo, hi)]
            if a:
                print(f"  {f'{lo}-{hi}':>10} {len(a):>6} {statistics.median(a):>20.3f} "
                      f"{statistics.median(b):>12.3f}")
    return 0


def read_table(whl: zipfile.ZipFile, gpu: str, engine: str):
    """(the GPU's GEMM table of the engine's release, the release, its path in the wheel)."""
    system = SYSTEMS[gpu]
    release = RELEASES[engine][system]
    path = f"aiconfigurator_core/systems/data/{system}/gemm/{engine}/{release}/gemm_perf.parquet"
    return wheel_table(whl, path), release, path


def main(argv=None) -> int:
    from planner.io import catalog

    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", help="the aiconfigurator-core 0.12.0 wheel")
    ap.add_argument("--engine", choices=sorted(RELEASES), default="vllm")
    ap.add_argument("--min-weight-mib", type=float, default=MIN_WEIGHT_BYTES / 2**20,
                    help="the smallest weight matrix counted (default: 256 MiB)")
    ap.add_argument("--derive-fp8-compute", action="store_true",
                    help="print, for each GPU with fp8 tensor cores, the fp8 path's compute "
                         "efficiency (engines_db quantized.fp8.compute_frac) with which its "
                         "fp8 GEMMs at M >= 1,024 stand to the table as its 16-bit ones do")
    ap.add_argument("--derive-fp8-decode", nargs="?", const="tensor", choices=FP8_LANES,
                    help="print, for each GPU with fp8 tensor cores and each count of kernels "
                         "beside an fp8 GEMM (engines_db fp8_quant_kernels; with block, its "
                         "block: block-scaled weights, the table's fp8_block), the fp8 path's "
                         "bandwidth efficiency (quantized.fp8.bandwidth_frac) with which its "
                         "fp8 GEMMs at M <= 16 stand to the table as its 16-bit ones do, and "
                         "the spread left; the count with the least on the H100")
    ap.add_argument("--fp8-row-tiles", action="store_true",
                    help="print, on the Hopper GPUs, the fp8 GEMMs' time steps at the bounds "
                         "of the profile's fp8_gemm_row_tiles and theirs / ours by range of M "
                         "with and without those tiles")
    a = ap.parse_args(argv)
    if not a.min_weight_mib > 0:
        print("aiconfigurator_gemm.py: --min-weight-mib: must be above 0", file=sys.stderr)
        return 2
    shares, rows, tables = {}, [], {}
    gpus = [REFERENCE, *(g for g in SYSTEMS if g != REFERENCE)]
    gpu = gpus[0]
    try:
        with zipfile.ZipFile(a.wheel) as whl:  # opened once for every GPU's table
            for gpu in gpus:
                tables[gpu] = read_table(whl, gpu, a.engine)
    except (OSError, zipfile.BadZipFile, KeyError) as err:
        print(f"aiconfigurator_gemm.py: {a.wheel}: cannot read the {gpu} table: {err}",
              file=sys.stderr)
        return 2
    if a.derive_fp8_compute:
        return print_fp8_compute(tables, a.engine)
    if a.derive_fp8_decode:
        return print_fp8_decode(tables, a.engine, a.derive_fp8_decode)
    if a.fp8_row_tiles:
        return print_fp8_row_tiles(tables, a.engine)
    for gpu in gpus:
        table, release, path = tables[gpu]
        hw = catalog.load_hardware(gpu)
        ceiling = hw.achievable.memory_bandwidth_gb_per_s.value
        shares[gpu] = decode_shares(table, ceiling, min_weight_bytes=a.min_weight_mib * 2**20)
        if not shares[gpu]:
            print(f"aiconfigurator_gemm.py: {path}: no 16-bit GEMM with M <= {MAX_M} and "
                  f"weights of {a.min_weight_mib:g} MiB or more", file=sys.stderr)
            return 2
        rows.append((gpu, hw.architecture, release, ceiling))
    print(f"# {a.engine}: 16-bit GEMMs with M <= {MAX_M} and weights >= "
          f"{a.min_weight_mib:g} MiB; share = bytes / latency / hardware_db's achievable copy "
          f"bandwidth; factor = share / the {REFERENCE}'s, shape by shape")
    print(f"{'gpu':<14} {'arch':<10} {'release':<8} {'ceiling GB/s':>12} {'shapes':>6} "
          f"{'share':>6} {'factor':>6} {'p10-p90':>11}")
    for gpu, arch, release, ceiling in rows:
        s = shares[gpu]
        f, lo, hi, n = arch_factor(s, shares[REFERENCE])
        print(f"{gpu:<14} {arch:<10} {release:<8} {ceiling:>12.0f} {len(s):>6} "
              f"{statistics.median(s.values()):>6.3f} {f:>6.3f} {lo:>5.3f}-{hi:<5.3f}"
              + ("" if n == len(s) else f"  ({n} shapes in common)"))
    return 0


def print_fp8_compute(tables: dict, engine: str) -> int:
    from planner.io import catalog

    spec = catalog.load_engine_spec(engine)
    if spec.quantized is None or "fp8" not in spec.quantized:
        print(f"aiconfigurator_gemm.py: --derive-fp8-compute: engine {engine} has no fp8 "
              "path (quantized.fp8)", file=sys.stderr)
        return 2
    print(f"# {engine}: fp8 (W8A8) against 16-bit GEMMs at M >= {MIN_COMPUTE_M:,}, N and K "
          f">= {MIN_NK:,}; ratio = theirs / ours; the fp8 compute_frac with which the medians "
          "agree "
          f"(the profile's: {spec.quantized['fp8'].compute_frac.value:g})")
    print(f"{'gpu':<10} {'release':<8} {'rows':>5} {'bf16 ratio':>10} {'fp8 ratio':>9} "
          f"{'fp8 compute_frac':>16}")
    fracs = []
    for gpu in FP8_GPUS:
        table, release, path = tables[gpu]
        try:
            f, target, got, n = derive_fp8_compute(table, gpu, spec)
        except ValueError as err:
            print(f"aiconfigurator_gemm.py: {path}: {err}", file=sys.stderr)
            return 2
        fracs.append(f)
        print(f"{gpu:<10} {release:<8} {n:>5} {target:>10.3f} {got:>9.3f} {f:>16.2f}")
    print(f"median over the {len(fracs)} GPUs: {statistics.median(fracs):.3f}")
    return 0


def print_fp8_decode(tables: dict, engine: str, lane: str = "tensor") -> int:
    from planner.io import catalog

    spec = catalog.load_engine_spec(engine)
    if spec.quantized is None or "fp8" not in spec.quantized:
        print(f"aiconfigurator_gemm.py: --derive-fp8-decode: engine {engine} has no fp8 "
              "path (quantized.fp8)", file=sys.stderr)
        return 2
    q = spec.fp8_quant_kernels
    now = 0.0 if q is None else q.block if lane == "block" and q.block is not None else q.value
    print(f"# {engine}: W8A8 fp8 ({FP8_LANES[lane]}) against 16-bit decode GEMMs (M <= {MAX_M}, "
          f"16-bit weights >= "
          f"{MIN_FIXED_WEIGHT_BYTES / 2**20:g} MiB), shape by shape: ratio = (theirs / ours "
          f"in fp8) / (theirs / ours in 16 bits); bandwidth_frac makes its median 1 over the "
          f"shapes of {MIN_WEIGHT_BYTES / 2**20:g} MiB or more (the profile's: "
          f"{spec.quantized['fp8'].bandwidth_frac.value:g}, fp8_quant_kernels"
          f"{'.block' if lane == 'block' else ''} {now:g})")
    print(f"{'gpu':<10} {'release':<9} {'kernels':>7} {'bandwidth_frac':>14} "
          f"{'mean |log ratio|':>16} {'median, large':>13} {'shapes':>6}")
    chosen = None
    for gpu in FP8_GPUS:
        table, release, path = tables[gpu]
        try:
            rows = derive_fp8_decode(table, gpu, spec, chosen, lane)
        except ValueError as err:
            if chosen is None:  # the reference GPU's table must hold the lane
                print(f"aiconfigurator_gemm.py: {path}: {err}", file=sys.stderr)
                return 2
            print(f"{gpu:<10} {release:<9} (not timed: {err})")
            continue
        best = min(rows, key=lambda r: r[2])
        for q, f, spread, med, n in rows:
            print(f"{gpu:<10} {release:<9} {q:>7} {f:>14.2f} {spread:>16.3f} {med:>13.3f} "
                  f"{n:>6}" + ("  <- least" if (q, f) == best[:2] and len(rows) > 1 else "")
                  + ("  (bandwidth_frac at its bound: the median is not 1)" if at_bound(f)
                     else ""))
        if chosen is None:  # the reference's count; the other GPUs give its fraction there
            chosen = best[0]
    return 0


if __name__ == "__main__":
    leave(main)
