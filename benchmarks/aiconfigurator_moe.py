"""Compare llmplan's MoE layer cost with NVIDIA aiconfigurator's measured MoE kernel tables.

    pip download --no-deps aiconfigurator-core==0.12.0 -d /tmp/aic
    python benchmarks/aiconfigurator_moe.py /tmp/aic/aiconfigurator_core-0.12.0-*.whl \\
        --gpu h100-sxm --engine vllm

aiconfigurator ships, per GPU system and engine release, the latency of the engine's fused MoE
layer timed on that GPU (``moe/<engine>/<release>/moe_perf.parquet``: routing, the experts'
grouped GEMMs and activation, the combine; not the router's gate GEMM) across token counts,
model shapes, tensor-parallel sizes and weight types. For each MoE model of models_db whose
shape the table holds (balanced routing, no expert parallelism), this prints theirs beside
ours: one layer's ``moe_router`` and ``experts_*`` operators as ``llmplan estimate`` costs
them for that many tokens (one new token per sequence), with the engine's own profile. The
ratio is theirs / ours: above 1, ours is too fast. Nothing is fitted; the wheel is not
needed by llmplan itself.

``--shapes table`` compares every MoE shape the table times instead (each priced as our
Qwen3-30B-A3B with the table's dimensions). ``--derive-experts-compute`` prints the factor on
the routed experts' compute efficiency with which the median ratio at 2,048-8,192 tokens is 1
(engines_db experts_compute_frac, or experts_fp8_compute_frac with ``--fp8``);
``--derive-experts-k-half``, for each depth of a grid, that factor over every shape and the
spread it leaves, and the depth chosen (engines_db experts_k_half; with ``--fp8``,
experts_fp8_k_half). ``--derive-mxfp4-fixed`` prints the device time per MoE layer by which
the MXFP4 (gpt-oss) rows at one token exceed ours priced without any: the median of
theirs - ours (engines_db mxfp4_moe_fixed_us). ``--spread`` prints how far the profile as it
stands is from the rows those derive over: the median ratio by model and the mean |log ratio|.
"""

from __future__ import annotations

import io
import os
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_kernels import OneLineParser  # noqa: E402

SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "a100-sxm-80gb": "a100_sxm",
           "l40s": "l40s", "b200": "b200_sxm"}
# llmplan engine family -> the newest release the wheel times MoE layers of, per system
RELEASES = {"vllm": {"h100_sxm": "0.24.0", "h200_sxm": "0.24.0", "a100_sxm": "0.14.0",
                     "l40s": "0.24.0", "b200_sxm": "0.24.0"},
            "sglang": {"h100_sxm": "0.5.14", "h200_sxm": "0.5.14", "a100_sxm": "0.5.10",
                       "l40s": "0.5.14", "b200_sxm": "0.5.14"},
            "trtllm": {"h100_sxm": "1.3.0rc20", "h200_sxm": "1.3.0rc20", "a100_sxm": "1.0.0",
                       "l40s": "1.3.0rc20", "b200_sxm": "1.3.0rc20"}}
# model -> (llmplan weights, aiconfigurator moe_dtype)
MODELS = {"gpt-oss-120b": ("mxfp4", "w4a16_mxfp4"), "gpt-oss-20b": ("mxfp4", "w4a16_mxfp4"),
          "qwen3-235b-a22b": ("bf16", "bfloat16"), "qwen3-30b-a3b": ("bf16", "bfloat16"),
          "deepseek-v3": ("fp8", "fp8_block"), "mixtral-8x7b": ("bf16", "bfloat16")}
# the fp8 lanes, priced by us as fp8 weights and arithmetic alike, each over the models whose
# published fp8 checkpoints take it: block-scaled (128 x 128 weight blocks: DeepSeek-V3's and
# Qwen's own -FP8 releases; the tables' fp8_block), and one scale per tensor (NVIDIA
# ModelOpt's FP8 checkpoints, which TensorRT-LLM serves, and Mixtral's FP8 releases; the
# tables' fp8). The tables time Mixtral's shape in the block lane too (vLLM 0.24 on the H100:
# 0.54 alone; with it the lane's median goes 0.43 -> 0.51, H200 0.41 -> 0.44), but no
# block-scaled Mixtral checkpoint is published, so it is left out of that lane
FP8_LANES = {"block": {"qwen3-235b-a22b": ("fp8", "fp8_block"),
                       "qwen3-30b-a3b": ("fp8", "fp8_block"), "deepseek-v3": ("fp8", "fp8_block")},
             "tensor": {"qwen3-235b-a22b": ("fp8", "fp8"), "qwen3-30b-a3b": ("fp8", "fp8"),
                        "mixtral-8x7b": ("fp8", "fp8")}}
TOKENS = (1, 8, 32, 128, 512, 2048, 8192)


def wheel_table(whl: zipfile.ZipFile, path: str):
    """One of the wheel's parquet tables, read in one thread. The other aiconfigurator_*.py
    scripts read theirs here too, and leave through ``leave``."""
    import pandas as pd

    return pd.read_parquet(io.BytesIO(whl.read(path)), use_threads=False)


def leave(main) -> None:
    """``sys.exit(main())`` without the interpreter's teardown. Once a parquet table has been
    read, Arrow's native threads can abort the process as it exits (SIGABRT, "terminate called
    without an active exception", apache/arrow#34314), after its output is complete: a refusal
    that printed its one line and returned 2 then left with -6 (seen under a loaded test run,
    2026-12-07, though the table is read in one thread). The streams are flushed first."""
    from benchmarks.fuzz import _exit_code  # the status sys.exit(value) leaves with

    try:
        code = _exit_code(main())
    except SystemExit as stop:  # argparse's refusals
        code = _exit_code(stop.code)
    except KeyboardInterrupt:
        print(f"{Path(sys.argv[0]).name}: interrupted", file=sys.stderr)
        code = 130
    except BaseException:  # what the interpreter prints for an uncaught exception
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone (``| head``), a closed stream
            code = code or 120  # as the interpreter leaves when its final flush fails
    os._exit(code)


def ours_ms(dep, tokens: int) -> float:
    """One MoE layer of ``dep`` for ``tokens`` sequences of one new token each."""
    from planner.core.ops import step_ops
    from planner.core.roofline import op_time

    ops = step_ops(dep.model, dep.precision, batch=tokens, new_tokens=1, past_tokens=0,
                   tp=dep.tp)
    total = 0.0
    for op in ops:
        if op.name == "moe_router" or op.name.startswith("experts_"):
            t = op_time(op, dep.prepared.ceilings, tp=dep.tp, options=dep.options,
                        engine=dep.engine)
            total += t.time_s / op.count
    return total * 1e3


# the shape every table shape is priced in (--shapes table): its attention does not enter
# the MoE layer, and its heads allow every TP up to 8
TEMPLATE = "qwen3-30b-a3b"
# the table's type of each lane's routed experts where every shape it times is priced
TABLE_LANES = {None: ("bf16", "bfloat16"), "block": ("fp8", "fp8_block"),
               "tensor": ("fp8", "fp8")}


def table_rows(table, family: str, gpu: str, distribution: str = "balanced", spec=None,
               tokens=TOKENS, lane: str | None = None):
    """As ``rows``, for every MoE shape the table times in ``lane``'s type (16-bit, or an fp8
    lane: TABLE_LANES), not only models_db's models: each priced as TEMPLATE with the
    table's hidden size, expert width, experts and experts per token. The model column is
    the shape: hidden x expert width / experts top-k."""
    from dataclasses import replace

    from planner.cli.compare import served_setup
    from planner.core.specs import DType
    from planner.io import catalog

    spec = spec if spec is not None else catalog.load_engine_spec(family)
    weights, moe_dtype = TABLE_LANES[lane]
    base = catalog.load_model(TEMPLATE)
    table = table[(table.distribution == distribution) & (table.moe_ep_size == 1)
                  & (table.moe_dtype == moe_dtype) & (table.moe_tp_size <= 8)
                  & table.num_tokens.isin(tokens)]
    deps = {}
    for (h, inter, n_e, k, tp), g in table.groupby(
            ["hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size"]):
        m = base.model_copy(update={"hidden_size": int(h), "moe": base.moe.model_copy(update={
            "num_experts": int(n_e), "experts_per_token": int(k),
            "expert_intermediate_size": int(inter)})})
        if tp not in deps:
            deps[tp] = served_setup(TEMPLATE, gpu, spec, int(tp), DType(weights), None)
        dep = replace(deps[tp], model=m)
        for kernel, gk in g.groupby("kernel_source"):
            for n, hit in gk.groupby("num_tokens"):
                theirs = float(hit.latency.median())
                ours = ours_ms(dep, int(n))
                yield (f"{h}x{inter}/{n_e}top{k}", int(tp), kernel, int(n), theirs, ours,
                       theirs / ours)


def rows(table, family: str, gpu: str, ours_weights: str | None = None,
         distribution: str = "balanced", spec=None, tokens=TOKENS, models=None, lanes=None):
    """(model, tp, kernel, tokens, theirs ms, ours ms, theirs / ours) for each model of
    ``lanes`` (MODELS, or one of FP8_LANES) whose shape the table holds. ``ours_weights``: price
    our layer of the MXFP4 models with their experts stored in this type (bf16: an engine
    that upcasts MXFP4 at load)."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType
    from planner.io import catalog

    spec = spec if spec is not None else catalog.load_engine_spec(family)
    table = table[(table.distribution == distribution) & (table.moe_ep_size == 1)]
    for name, (weights, moe_dtype) in (lanes or MODELS).items():
        if models is not None and name not in models:
            continue
        if weights == "mxfp4" and ours_weights:
            weights = ours_weights
        m = catalog.load_model(name)
        e = m.moe
        sub = table[(table.hidden_size == m.hidden_size)
                    & (table.inter_size == e.expert_intermediate_size)
                    & (table.num_experts == e.num_experts) & (table.topk == e.experts_per_token)
                    & (table.moe_dtype == moe_dtype)]
        for tp in sorted(int(t) for t in sub.moe_tp_size.unique() if t <= 8):
            dep = served_setup(name, gpu, spec, tp, DType(weights), None,
                               quantized_layers="experts" if weights == "mxfp4" else "all")
            at_tp = sub[sub.moe_tp_size == tp]
            for kernel, g in at_tp.groupby("kernel_source"):
                for n in tokens:
                    hit = g[g.num_tokens == n]
                    if hit.empty:
                        continue
                    theirs = float(hit.latency.median())
                    ours = ours_ms(dep, n)
                    yield name, tp, kernel, n, theirs, ours, theirs / ours


# sizes at which a layer's experts see 64 or more tokens each (Qwen3: 8 of 128 a token): what
# the fused MoE kernel's arithmetic costs, the part of a prefill chunk it takes
COMPUTE_TOKENS = (2048, 4096, 8192)


def _median(xs) -> float:
    xs = sorted(xs)
    n = len(xs)
    if not n:
        return float("nan")
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _lane_found(table, family, gpu, distribution, spec, weights, fp8_lane, shapes):
    """The rows (``rows``' or ``table_rows``' tuples) at COMPUTE_TOKENS of the lane
    ``derive_experts_compute`` derives over, priced with ``spec``."""
    if shapes == "table":
        return list(table_rows(table, family, gpu, distribution, spec=spec,
                               tokens=COMPUTE_TOKENS,
                               lane=fp8_lane if weights == "fp8" else None))
    lanes = FP8_LANES[fp8_lane] if weights == "fp8" else MODELS
    chosen = {n for n, (w, _) in lanes.items() if w == weights}
    return list(rows(table, family, gpu, distribution=distribution, spec=spec,
                     tokens=COMPUTE_TOKENS, models=chosen, lanes=lanes))


def derive_experts_compute(table, family: str, gpu: str, distribution: str = "balanced",
                           weights: str = "bf16", fp8_lane: str = "block",
                           shapes: str = "models", spec=None) -> tuple[float, int]:
    """The factor on the routed experts' compute efficiency (``experts_compute_frac`` for
    this GPU's architecture; ``experts_fp8_compute_frac`` with ``weights`` fp8) with which
    the median ratio theirs / ours over the MoE models' rows at COMPUTE_TOKENS (the 16-bit
    models', or an fp8 lane's: FP8_LANES[fp8_lane]; with ``shapes`` "table", every shape the
    table times in that type) is 1, by bisection to 0.005; and how many rows it rests on.
    ``spec``: the profile to price with (default: the engine's own; its experts_k_half
    stands).
    The profile's own factor for the architecture is replaced, not compounded. The tables time
    the kernel alone, so the profile's served_compute_frac (what its served steps attain of
    every matmul's rate, beside everything else a step does) is left out: the factor is the
    kernel's, and the profile's served share multiplies it as it multiplies every matmul."""
    f, n, _ = _derive(table, family, gpu, distribution, weights, fp8_lane, shapes, spec)
    return f, n


def _derive(table, family, gpu, distribution, weights, fp8_lane, shapes, spec):
    from planner.core.engine import ArchFracs
    from planner.io import catalog

    spec = spec if spec is not None else catalog.load_engine_spec(family)
    arch = catalog.load_hardware(gpu).architecture
    field = "experts_fp8_compute_frac" if weights == "fp8" else "experts_compute_frac"

    def ratios(f: float) -> list[float]:
        old = getattr(spec, field)
        fr = ArchFracs(source="benchmarks/aiconfigurator_moe.py",
                       value={**(old.value if old else {}), arch: f})
        return [r[6] for r in _lane_found(
            table, family, gpu, distribution,
            spec.model_copy(update={field: fr, "served_compute_frac": None}),
            weights, fp8_lane, shapes)]

    if not ratios(1.0):
        return float("nan"), 0, []  # the table times none of these rows
    lo, hi = 0.05, 2.0
    while hi - lo > 0.005:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _median(ratios(mid)) < 1.0 else (lo, mid)
    f = round(0.5 * (lo + hi), 2)
    rs = ratios(f)
    return f, len(rs), rs


def spread(table, family: str, gpu: str, distribution: str = "balanced",
           weights: str = "bf16", fp8_lane: str = "block", shapes: str = "models"):
    """The ratios theirs / ours at COMPUTE_TOKENS of the rows ``derive_experts_compute``
    derives over, priced with the profile as it stands less its served share: by model (or
    shape), and |log ratio| over them all."""
    import math

    from planner.io import catalog

    spec = catalog.load_engine_spec(family).model_copy(update={"served_compute_frac": None})
    by: dict[str, list[float]] = {}
    for r in _lane_found(table, family, gpu, distribution, spec, weights, fp8_lane, shapes):
        by.setdefault(r[0], []).append(r[6])
    return by, [abs(math.log(r)) for rs in by.values() for r in rs]


K_HALF_GRID = tuple(range(0, 1601, 100))


def derive_experts_k_half(table, family: str, gpu: str, distribution: str = "balanced",
                          weights: str = "bf16", fp8_lane: str = "block", grid=K_HALF_GRID):
    """For each depth of ``grid`` (``experts_k_half`` for this GPU's architecture; with
    ``weights`` fp8, the fp8 lane's own, ``experts_fp8_k_half``), the lane's
    factor derived over every shape the table times (``derive_experts_compute``, shapes
    "table") and the spread left: (depth, factor, rows, mean |log ratio|, p90 |ratio - 1|,
    share of rows within 0.85-1.15), and the depth chosen: the least mean |log ratio| whose
    factor keeps the kernel at or under the achievable rate (factor x the plain GEMM's
    compute_frac <= 1). None where no depth does."""
    import math

    from planner.core.engine import ArchDepths
    from planner.core.specs import DType
    from planner.io import catalog

    spec = catalog.load_engine_spec(family)
    hw = catalog.load_hardware(gpu)
    eng = spec.model().for_gpu(hw.memory_bytes, hw.name, hw.architecture)
    plain = (eng.quant_fracs(DType.fp8) or (0.0, eng.gemm_compute_frac))[1] \
        if weights == "fp8" else eng.gemm_compute_frac
    out, best = [], None
    field = "experts_fp8_k_half" if weights == "fp8" else "experts_k_half"
    for k in grid:
        depth = None if not k else ArchDepths(source="benchmarks/aiconfigurator_moe.py",
                                              value={hw.architecture: k})
        # no depth for the fp8 lane: neither its own nor the one it would fall back to
        s = spec.model_copy(update={field: depth, **(
            {"experts_k_half": None} if weights == "fp8" and not k else {})})
        f, n, rs = _derive(table, family, gpu, distribution, weights, fp8_lane, "table", s)
        if not n:
            return [], None
        logs = sorted(abs(math.log(r)) for r in rs)
        off = sorted(abs(r - 1) for r in rs)
        row = (k, f, n, sum(logs) / n, off[min(n - 1, int(0.9 * n))],
               sum(0.85 < r < 1.15 for r in rs) / n)
        out.append(row)
        if f * plain <= 1.0 and (best is None or row[3] < best[3]):
            best = row
    return out, best


# one token: a MoE layer's least work (its few routed experts' weights), where what its kernel
# path spends beyond the bytes and arithmetic is most of its time
FIXED_TOKENS = (1,)


def derive_mxfp4_fixed(table, family: str, gpu: str, distribution: str = "balanced",
                       spec=None) -> tuple[float, list]:
    """The device time per MoE layer, in microseconds, that the MXFP4 models' (gpt-oss) rows
    at FIXED_TOKENS take beyond ours priced without any (``mxfp4_moe_fixed_us`` for this GPU's
    architecture): the median of theirs - ours; and each row (model, tp, kernel, tokens,
    theirs ms, ours ms, ratio). NaN where the table times none."""
    from planner.io import catalog

    spec = spec if spec is not None else catalog.load_engine_spec(family)
    spec = spec.model_copy(update={"mxfp4_moe_fixed_us": None})
    chosen = {n for n, (w, _) in MODELS.items() if w == "mxfp4"}
    found = list(rows(table, family, gpu, distribution=distribution, spec=spec,
                      tokens=FIXED_TOKENS, models=chosen))
    return _median([(theirs - ours) * 1e3 for *_, theirs, ours, _r in found]), found


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", help="the aiconfigurator-core 0.12.0 wheel")
    ap.add_argument("--gpu", choices=sorted(SYSTEMS), default="h100-sxm")
    ap.add_argument("--engine", choices=sorted(RELEASES), default="vllm")
    ap.add_argument("--ours-weights", choices=("bf16",), default=None,
                    help="price our layer of the MXFP4 (gpt-oss) models with 16-bit experts, "
                         "as an engine that upcasts MXFP4 at load holds them")
    ap.add_argument("--distribution", default="balanced",
                    help="the table's routing distribution to compare with (balanced; the "
                         "A100 vLLM table has only power_law_1.01 and power_law_1.2, skewed "
                         "routing, where ours is balanced)")
    ap.add_argument("--derive-experts-compute", action="store_true",
                    help="print the factor on the routed experts' compute efficiency with "
                         "which ours matches the 16-bit models' rows at 2,048-8,192 tokens "
                         "(engines_db experts_compute_frac for this GPU's architecture)")
    ap.add_argument("--fp8", choices=sorted(FP8_LANES), nargs="?", const="block", default=None,
                    help="an fp8 lane: block (block-scaled checkpoints, the table's fp8_block; "
                         "the default) or tensor (one scale per tensor, its fp8); with "
                         "--derive-experts-compute, experts_fp8_compute_frac; with "
                         "--derive-experts-k-half, that lane's own depth, "
                         "experts_fp8_k_half")
    ap.add_argument("--shapes", choices=("models", "table"), default="models",
                    help="the rows compared and derived over: models_db's MoE models whose "
                         "shape the table holds (the default), or every MoE shape the table "
                         f"times (priced as {TEMPLATE} with the table's dimensions)")
    ap.add_argument("--derive-experts-k-half", action="store_true",
                    help="print, for each depth of a grid, the lane's factor derived over every "
                         "shape the table times and the spread it leaves, and the depth with "
                         "the least whose factor keeps the kernel at or under the achievable "
                         "rate (engines_db experts_k_half for this GPU's architecture)")
    ap.add_argument("--spread", action="store_true",
                    help="print, at 2,048-8,192 tokens, the median ratio by model (or shape) "
                         "and the mean |log ratio| over every row, with the profile as it "
                         "stands (its served share left out, as the derivations leave it)")
    ap.add_argument("--derive-mxfp4-fixed", action="store_true",
                    help="print the device time per MoE layer by which the MXFP4 (gpt-oss) "
                         "rows at one token exceed ours priced without any: the median of "
                         "theirs - ours (engines_db mxfp4_moe_fixed_us for this GPU's "
                         "architecture)")
    a = ap.parse_args(argv)
    system = SYSTEMS[a.gpu]
    release = RELEASES[a.engine][system]  # every engine's MoE layer is timed on every system
    path = f"aiconfigurator_core/systems/data/{system}/moe/{a.engine}/{release}/moe_perf.parquet"
    try:
        with zipfile.ZipFile(a.wheel) as whl:
            table = wheel_table(whl, path)
    except (OSError, zipfile.BadZipFile, KeyError) as err:
        print(f"aiconfigurator_moe.py: {a.wheel}: cannot read {path}: {err}", file=sys.stderr)
        return 2
    kinds = sorted(set(table.distribution))
    if a.distribution not in kinds:
        print(f"aiconfigurator_moe.py: --distribution: {path} holds no {a.distribution!r} "
              f"routing (it holds {', '.join(kinds)})", file=sys.stderr)
        return 2
    weights = "fp8" if a.fp8 else "bf16"
    if a.derive_experts_k_half:
        grid, best = derive_experts_k_half(table, a.engine, a.gpu, a.distribution, weights,
                                           a.fp8 or "block")
        if not grid:
            print(f"aiconfigurator_moe.py: {path} times no {weights} row at "
                  f"{', '.join(map(str, COMPUTE_TOKENS))} tokens", file=sys.stderr)
            return 2
        field = "experts_fp8_compute_frac" if a.fp8 else "experts_compute_frac"
        print(f"# {a.gpu}, {a.engine} {release} ({path}), {a.distribution} routing, every "
              f"{'fp8 (' + a.fp8 + ' lane)' if a.fp8 else '16-bit'} shape at "
              f"{', '.join(map(str, COMPUTE_TOKENS))} tokens")
        print(f"{'k_half':>6} {field:>24} {'rows':>4} {'mean|log r|':>11} {'p90|r-1|':>8} "
              f"{'in 0.85-1.15':>12}")
        for k, f, n, mlog, p90, inside in grid:
            print(f"{k:>6} {f:>24.2f} {n:>4} {mlog:>11.3f} {p90:>8.3f} {inside:>12.2f}")
        if best is None:
            print("no depth keeps the factor at or under the achievable rate")
        else:
            depth = "experts_fp8_k_half" if a.fp8 else "experts_k_half"
            print(f"{depth}: {best[0]} ({field} {best[1]:.2f}; mean |log ratio| "
                  f"{best[3]:.3f} against {grid[0][3]:.3f} with none)")
        return 0
    if a.spread:
        by, logs = spread(table, a.engine, a.gpu, a.distribution, weights, a.fp8 or "block",
                          a.shapes)
        if not logs:
            print(f"aiconfigurator_moe.py: {path} times no {weights} row of these "
                  f"{a.shapes} at {', '.join(map(str, COMPUTE_TOKENS))} tokens",
                  file=sys.stderr)
            return 2
        print(f"# {a.gpu}, {a.engine} {release} ({path}), {a.distribution} routing, "
              f"{weights} {a.shapes} at {', '.join(map(str, COMPUTE_TOKENS))} tokens, "
              "the profile as it stands")
        for name, rs in by.items():
            print(f"{name:<18} median ratio {_median(rs):.2f} over {len(rs)} rows")
        print(f"mean |log ratio| {sum(logs) / len(logs):.3f} over {len(logs)} rows")
        return 0
    if a.derive_mxfp4_fixed:
        us, found = derive_mxfp4_fixed(table, a.engine, a.gpu, a.distribution)
        if not found:
            print(f"aiconfigurator_moe.py: {path} times no MXFP4 row at "
                  f"{', '.join(map(str, FIXED_TOKENS))} token", file=sys.stderr)
            return 2
        print(f"# {a.gpu}, {a.engine} {release} ({path}), {a.distribution} routing; MXFP4 "
              "rows at one token, ours without mxfp4_moe_fixed_us; us per MoE layer")
        print(f"{'model':<18} {'tp':>2} {'theirs':>8} {'ours':>8} {'theirs - ours':>13}  kernel")
        for name, tp, kernel, _n, theirs, ours, _r in found:
            print(f"{name:<18} {tp:>2} {theirs * 1e3:>8.1f} {ours * 1e3:>8.1f} "
                  f"{(theirs - ours) * 1e3:>13.1f}  {kernel}")
        print(f"mxfp4_moe_fixed_us: {us:.1f} (median of theirs - ours over {len(found)} rows)")
        return 0
    if a.derive_experts_compute:
        f, n = derive_experts_compute(table, a.engine, a.gpu, a.distribution, weights,
                                      a.fp8 or "block", a.shapes)
        if not n:
            print(f"aiconfigurator_moe.py: {path} times no {weights} row of these models at "
                  f"{', '.join(map(str, COMPUTE_TOKENS))} tokens", file=sys.stderr)
            return 2
        field, what = (("experts_fp8_compute_frac", f"fp8 ({a.fp8} lane)") if a.fp8
                       else ("experts_compute_frac", "16-bit"))
        print(f"# {a.gpu}, {a.engine} {release} ({path}), {a.distribution} routing")
        kind = "shapes" if a.shapes == "table" else "models"
        print(f"{field}: {f:.2f} (median ratio 1 over {n} rows of the {what} {kind} at "
              f"{', '.join(map(str, COMPUTE_TOKENS))} tokens)")
        return 0
    print(f"# {a.gpu}, {a.engine} {release} ({path}), {a.distribution} routing; ms per MoE "
          "layer, ratio = theirs / ours")
    print(f"{'model':<18} {'tp':>2} {'tokens':>6} {'theirs':>8} {'ours':>8} {'ratio':>6}  kernel")
    found = (table_rows(table, a.engine, a.gpu, a.distribution, lane=a.fp8)
             if a.shapes == "table" else
             rows(table, a.engine, a.gpu, a.ours_weights, a.distribution,
                  lanes=FP8_LANES[a.fp8] if a.fp8 else None))
    for name, tp, kernel, n, theirs, ours, ratio in found:
        print(f"{name:<18} {tp:>2} {n:>6} {theirs:>8.4f} {ours:>8.4f} {ratio:>6.2f}  {kernel}")
    return 0


if __name__ == "__main__":
    leave(main)
