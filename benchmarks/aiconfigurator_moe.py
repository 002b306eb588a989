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
"""

from __future__ import annotations

import io
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
    """One of the wheel's parquet tables, read in one thread: pyarrow's pool could abort the
    exit right after a refusal. The other aiconfigurator_*.py scripts read theirs here too."""
    import pandas as pd

    return pd.read_parquet(io.BytesIO(whl.read(path)), use_threads=False)


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


def derive_experts_compute(table, family: str, gpu: str, distribution: str = "balanced",
                           weights: str = "bf16", fp8_lane: str = "block") -> tuple[float, int]:
    """The factor on the routed experts' compute efficiency (``experts_compute_frac`` for
    this GPU's architecture; ``experts_fp8_compute_frac`` with ``weights`` fp8) with which
    the median ratio theirs / ours over the MoE models' rows at COMPUTE_TOKENS (the 16-bit
    models', or an fp8 lane's: FP8_LANES[fp8_lane]) is 1, by bisection to 0.005; and how many
    rows it rests on.
    The profile's own factor for the architecture is replaced, not compounded. The tables time
    the kernel alone, so the profile's served_compute_frac (what its served steps attain of
    every matmul's rate, beside everything else a step does) is left out: the factor is the
    kernel's, and the profile's served share multiplies it as it multiplies every matmul."""
    from planner.core.engine import ArchFracs
    from planner.io import catalog

    spec = catalog.load_engine_spec(family)
    arch = catalog.load_hardware(gpu).architecture
    field = "experts_fp8_compute_frac" if weights == "fp8" else "experts_compute_frac"
    lanes = FP8_LANES[fp8_lane] if weights == "fp8" else MODELS
    chosen = {n for n, (w, _) in lanes.items() if w == weights}

    def ratio(f: float) -> tuple[float, int]:
        old = getattr(spec, field)
        fr = ArchFracs(source="benchmarks/aiconfigurator_moe.py",
                       value={**(old.value if old else {}), arch: f})
        rs = [r[6] for r in rows(table, family, gpu, distribution=distribution,
                                 spec=spec.model_copy(update={field: fr,
                                                              "served_compute_frac": None}),
                                 tokens=COMPUTE_TOKENS, models=chosen, lanes=lanes)]
        return _median(rs), len(rs)

    if not ratio(1.0)[1]:
        return float("nan"), 0  # the table times none of these models' rows
    lo, hi = 0.05, 2.0
    while hi - lo > 0.005:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ratio(mid)[0] < 1.0 else (lo, mid)
    f = round(0.5 * (lo + hi), 2)
    return f, ratio(f)[1]


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
                         "--derive-experts-compute, experts_fp8_compute_frac")
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
    if a.derive_experts_compute:
        weights = "fp8" if a.fp8 else "bf16"
        f, n = derive_experts_compute(table, a.engine, a.gpu, a.distribution, weights,
                                      a.fp8 or "block")
        if not n:
            print(f"aiconfigurator_moe.py: {path} times no {weights} row of these models at "
                  f"{', '.join(map(str, COMPUTE_TOKENS))} tokens", file=sys.stderr)
            return 2
        field, what = (("experts_fp8_compute_frac", f"fp8 ({a.fp8} lane)") if a.fp8
                       else ("experts_compute_frac", "16-bit"))
        print(f"# {a.gpu}, {a.engine} {release} ({path}), {a.distribution} routing")
        print(f"{field}: {f:.2f} (median ratio 1 over {n} rows of the {what} "
              f"models at {', '.join(map(str, COMPUTE_TOKENS))} tokens)")
        return 0
    print(f"# {a.gpu}, {a.engine} {release} ({path}), {a.distribution} routing; ms per MoE "
          "layer, ratio = theirs / ours")
    print(f"{'model':<16} {'tp':>2} {'tokens':>6} {'theirs':>8} {'ours':>8} {'ratio':>6}  kernel")
    for name, tp, kernel, n, theirs, ours, ratio in rows(
            table, a.engine, a.gpu, a.ours_weights, a.distribution,
            lanes=FP8_LANES[a.fp8] if a.fp8 else None):
        print(f"{name:<16} {tp:>2} {n:>6} {theirs:>8.4f} {ours:>8.4f} {ratio:>6.2f}  {kernel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
