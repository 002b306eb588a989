"""Compare llmplan's MLA attention block at decode with NVIDIA aiconfigurator's measured one.

    pip download --no-deps aiconfigurator-core==0.12.0 -d /tmp/aic
    python benchmarks/aiconfigurator_mla.py /tmp/aic/aiconfigurator_core-0.12.0-*.whl \\
        --gpu h200 [--engine vllm] [--derive-fixed]

aiconfigurator ships, per GPU system, the latency of vLLM 0.24's and TensorRT-LLM 1.3.0rc20's
whole DeepSeek-V3 MLA attention block at decode, replayed from a CUDA graph (``mla/vllm/0.24.0/``
or ``mla/trtllm/1.3.0rc20/mla_generation_module_perf.parquet``: the fused q_a / kv_a
down-projection, their norms, q_b, rotary, the absorbed W_UK and W_UV batched GEMMs, the
KV-cache write, the MLA attention kernel, o_proj; tensor parallelism emulated by the heads a
GPU holds, 128 / TP; no all-reduce), by batch, cached context, GEMM type (bf16, fp8
block-wise) and KV-cache type. For SGLang it ships its module collector's wide-EP table
(``mla/sglang/0.5.10/wideep_generation_mla_perf.parquet``: the model's self-attention module
run through SGLang's own runtime, the same operators, fp8 block-wise GEMMs and an fp8 KV
cache, on its FlashAttention 3 and FlashInfer MLA backends; the fa3 rows are read, SGLang's
default on Hopper).
This prints theirs beside ours: one layer's ``mla_*``, ``rope_kv_write``, ``attention`` and
``o_proj`` operators of a decode step of DeepSeek-V3 as ``llmplan estimate`` costs them with
the profile named (``--engine``). The ratio is theirs / ours: above 1, ours is too fast.

``--dsa`` compares DeepSeek-V3.2's attention block instead (DeepSeek Sparse Attention: vLLM
0.24's ``sparse_attention/vllm/0.24.0/dsa_generation_module_perf.parquet`` on the H200 and
the B200, its FlashMLA sparse backend, the block above with the lightning indexer's
projections, key cache write, logits and top-k beside it), read as the wheel's own copy of
its config.json (``model_configs/deepseek-ai--DeepSeek-V3.2_config.json``); ours adds the
``indexer_*``, ``dsa_indexer`` and ``attention_sparse`` operators. With ``--derive-fixed``
it prints the indexer path's device time beyond its operators'
(``operator_fixed_us.dsa_indexer``), over batch 1-16 at 4,096 and 16,384 cached tokens (above
the top-k, where the indexer runs), every TP and type, both GPUs. ``--dsa --context`` compares
the block's prefill instead (``dsa_context_module_perf.parquet``: batch 1 and 4, prompts of
1,024-32,768 tokens with nothing cached, ours launched eagerly as a prefill is).

``--derive-fixed`` prints the device time, in microseconds, the block takes beyond its
operators' roofline and kernel costs with which the median ratio is 1 over the rows where
fixed costs set the time (batch 1-16, 1,024-4,096 cached tokens, every TP and type; H100 and
H200 together), for the engine profile named (``--engine``): engines_db's
``operator_fixed_us.mla_kv_up_proj`` (counted on the absorbed W_UK / W_UV batched GEMMs,
whose transposes and copies are most of the block's small kernels). No served or static row
is used; the wheel is not needed by llmplan itself.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.aiconfigurator_moe import _median, leave, wheel_table  # noqa: E402
from benchmarks.gpu_kernels import OneLineParser  # noqa: E402

SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm"}
# DeepSeek Sparse Attention's block: the GPUs whose wheel tables time it for vLLM, its table,
# the model (the wheel's copy of its config.json) and the table's name for it
DSA_SYSTEMS = {"h200": "h200_sxm", "b200": "b200_sxm"}
DSA_PATH = ("aiconfigurator_core/systems/data/{system}/sparse_attention/{backend}/{release}/"
            "dsa_generation_module_perf.parquet")
# the engine family -> the wheel's backend and release timing its block, and the kernel read
# by GPU where it times several (SGLang's: its default on each, FlashAttention 3 over a bf16
# cache on Hopper, TensorRT-LLM's kernel on Blackwell); its rows with the indexer
DSA_TABLES = {"vllm": ("vllm", "0.24.0", {}), "vllm-0.8": ("vllm", "0.24.0", {}),
              "sglang": ("sglang", "0.5.14", {"h200": "sglang_dsa_indexer_fa3",
                                              "b200": "sglang_dsa_indexer_trtllm"})}
DSA_CONFIG = "aiconfigurator_core/model_configs/deepseek-ai--DeepSeek-V3.2_config.json"
DSA_MODEL = "deepseek-ai/DeepSeek-V3.2"
DSA_OPS = ("mla_down_proj", "mla_q_up_proj", "mla_kv_up_proj", "rope_kv_write",
           "attention_sparse", "o_proj", "indexer_q_proj", "indexer_k_proj",
           "indexer_weights_proj", "indexer_k_write", "dsa_indexer")
DSA_CONTEXTS = (1024, 4096, 16384, 65536)
DSA_FIXED_CONTEXTS = (4096, 16384)  # above the top-k of 2,048: the indexer runs
DSA_PROMPTS = (1024, 4096, 8192, 16384, 32768)  # --context: the prefills compared
# llmplan engine family -> the wheel's (backend, release, table) whose measured block stands
# for it. SGLang's is the wide-EP table of its module collector (collector/sglang/
# collect_mla_module.py in ai-dynamo/aiconfigurator: the model's self_attn run through
# SGLang's ModelRunner and ForwardBatch, the fused q_a / kv_a projection to o_proj, DeepSeek-V3
# with fp8 block-scaled GEMMs and an fp8 KV cache, tensor parallelism emulated by the heads
# a GPU holds; its context in `isl`, `step` 0), on the MLA backend SGLang picks by default on
# Hopper from 0.4.6 (FlashAttention 3; model_runner.py); until 2026-12-06 vLLM's block stood
# for it. vllm-0.8: "vLLM 0.24's block stands for it"
TABLES = {"vllm": ("vllm", "0.24.0", "mla_generation_module_perf"),
          "vllm-0.8": ("vllm", "0.24.0", "mla_generation_module_perf"),
          "trtllm": ("trtllm", "1.3.0rc20", "mla_generation_module_perf"),
          "sglang": ("sglang", "0.5.10", "wideep_generation_mla_perf")}
PATH = "aiconfigurator_core/systems/data/{system}/mla/{backend}/{release}/{table}.parquet"
# the kernel a module table is read at where it times several (SGLang's: fa3 and flashinfer)
DEFAULT_KERNEL = {"sglang": "fa3"}
# their GEMM type -> our weights; their KV-cache type -> ours
WEIGHTS = {"bfloat16": "bf16", "fp8_block": "fp8"}
KV = {"bfloat16": "bf16", "fp8": "fp8"}
MLA_OPS = ("mla_down_proj", "mla_q_up_proj", "mla_kv_up_proj", "rope_kv_write", "attention",
           "o_proj")
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXTS = (1024, 4096, 16384)
# where the block's fixed costs set its time: what --derive-fixed matches
FIXED_BATCHES, FIXED_CONTEXTS = (1, 2, 4, 8, 16), (1024, 4096)


def _block_us(dep, ops, *, batch: int, new_tokens: int, past_tokens: int,
              graphed: bool = True) -> float:
    """One layer of the block's operators ``ops`` in a step of ``batch`` sequences, each
    adding ``new_tokens`` after ``past_tokens`` cached ones, in microseconds."""
    from planner.core.ops import step_ops
    from planner.core.roofline import op_time

    total = 0.0
    for op in step_ops(dep.model, dep.precision, batch=batch, new_tokens=new_tokens,
                       past_tokens=past_tokens, tp=dep.tp):
        if op.name in ops:
            t = op_time(op, dep.prepared.ceilings, tp=dep.tp, options=dep.options,
                        engine=dep.engine, graphed=graphed)
            total += t.time_s / op.count
    return total * 1e6


def ours_us(dep, batch: int, context: int, ops=MLA_OPS) -> float:
    """One layer's MLA attention block (its operators ``ops``) of a decode step of ``batch``
    sequences at ``context`` cached tokens each."""
    return _block_us(dep, ops, batch=batch, new_tokens=1, past_tokens=context)


def ours_prefill_us(dep, batch: int, prompt: int, ops=DSA_OPS) -> float:
    """One layer's attention block (its operators ``ops``) of the prefill of ``batch`` prompts
    of ``prompt`` tokens, nothing cached before them, launched eagerly as a prefill is."""
    return _block_us(dep, ops, batch=batch, new_tokens=prompt, past_tokens=0, graphed=False)


def normalized(table, kernel: str | None = None):
    """A module table with its context in ``step`` (the wide-EP tables keep it in ``isl``
    with ``step`` 0, which aiconfigurator's loader adds up: isl + step; the generation
    tables have ``isl`` 1, the new token, and the context in ``step`` already) and, where it
    times several kernels, only ``kernel``'s rows."""
    if "isl" in table.columns:
        step = table["step"].astype(int)
        table = table.assign(step=step.where(step != 0, table["isl"].astype(int)))
    if kernel is not None:
        table = table[table.kernel_source == kernel]
    return table


def rows(table, gpu: str, spec, batches=BATCHES, contexts=CONTEXTS, model="deepseek-v3",
         ops=MLA_OPS, prefill: bool = False):
    """(tp, weights, kv, batch, context, kernel, theirs us, ours us, theirs / ours), ours
    with the engine profile ``spec`` for ``model`` (a name or a config.json) and its
    block's operators ``ops``. ``prefill``: a context table's rows with nothing cached
    (``step`` 0), ``contexts`` read as its prompts (``isl``), beside ours_prefill_us."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType
    from planner.io import catalog

    column = "isl" if prefill else "step"
    table = table.astype({"num_heads": int, "batch_size": int, "step": int, column: int})
    if prefill:
        table = table[table.step == 0]
    ours_of = ours_prefill_us if prefill else ours_us
    heads = catalog.load_model(model).num_attention_heads
    for (gemm, kv), sub in table.groupby(["gemm_type", "kv_cache_dtype"]):
        if gemm not in WEIGHTS or kv not in KV:
            continue
        for tp in (1, 2, 4, 8):
            at = sub[sub.num_heads == heads // tp]
            if at.empty:
                continue
            # fp8_block: the checkpoint as it ships (fp8 in 128 x 128 blocks, the
            # engine's block-scaled GEMMs); --weights fp8 would be one scale per tensor
            dep = served_setup(model, gpu, spec, tp,
                               None if gemm == "fp8_block" else DType(WEIGHTS[gemm]),
                               DType(KV[kv]))
            assert dep.precision.weights == DType(WEIGHTS[gemm])
            for b in batches:
                for ctx in contexts:
                    hit = at[(at.batch_size == b) & (at[column] == ctx)]
                    if hit.empty:
                        continue
                    theirs = float(hit.latency.median()) * 1e3
                    ours = ours_of(dep, b, ctx, ops)
                    yield (tp, WEIGHTS[gemm], KV[kv], b, ctx, hit.kernel_source.iloc[0],
                           theirs, ours, theirs / ours)


def derive_fixed(tables: dict, family: str, op: str = "mla_kv_up_proj",
                 contexts=FIXED_CONTEXTS, **block) -> tuple[float, int]:
    """The device time, in microseconds, an MLA layer's attention block takes beyond its
    operators' (``operator_fixed_us``'s ``op``: ``mla_kv_up_proj``, or the sparse block's
    ``dsa_indexer``) with which the median ratio theirs / ours over the FIXED_BATCHES rows at
    ``contexts`` of every table is 1, by bisection to 0.5 us; and how many rows it rests on.
    ``block``: ``rows``' model and operators."""
    from planner.core.engine import OperatorFixed
    from planner.io import catalog

    spec = catalog.load_engine_spec(family)
    old = spec.operator_fixed_us

    def ratio(us: float) -> tuple[float, int]:
        node = OperatorFixed(source="benchmarks/aiconfigurator_mla.py",
                             value={**(old.value if old else {}), op: us})
        s = spec.model_copy(update={"operator_fixed_us": node})
        rs = [r[-1] for gpu, table in tables.items()
              for r in rows(table, gpu, s, FIXED_BATCHES, contexts, **block)]
        return _median(rs), len(rs)

    lo, hi = 0.0, 500.0
    while hi - lo > 0.5:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ratio(mid)[0] > 1.0 else (lo, mid)
    us = round(0.5 * (lo + hi))
    return us, ratio(us)[1]


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", help="the aiconfigurator-core 0.12.0 wheel")
    ap.add_argument("--gpu", choices=sorted(SYSTEMS), action="append",
                    help="H100 SXM or H200 (default: both)")
    ap.add_argument("--engine", choices=sorted(TABLES), default="vllm",
                    help="the profile whose block is ours, and the wheel's table to compare "
                         "with (sglang: its module collector's wide-EP table, FlashAttention 3)")
    ap.add_argument("--derive-fixed", action="store_true",
                    help="print the device time beyond its operators' with which our block "
                         "matches theirs where fixed costs set the time (engines_db "
                         "operator_fixed_us.mla_kv_up_proj)")
    ap.add_argument("--dsa", action="store_true",
                    help="DeepSeek-V3.2's sparse-attention block (vLLM 0.24's table, H200 and "
                         "B200) in place of DeepSeek-V3's MLA block")
    ap.add_argument("--context", action="store_true",
                    help="with --dsa: the block's prefill (the wheel's context table) in place "
                         "of its decode")
    a = ap.parse_args(argv)
    from planner.io import catalog

    if a.dsa:
        return _dsa(a)
    backend, release, name = TABLES[a.engine]
    tables, path = {}, a.wheel
    try:
        with zipfile.ZipFile(a.wheel) as whl:  # opened once for every GPU's table
            for gpu in a.gpu or sorted(SYSTEMS):
                path = PATH.format(system=SYSTEMS[gpu], backend=backend, release=release,
                                   table=name)
                tables[gpu] = normalized(wheel_table(whl, path),
                                         DEFAULT_KERNEL.get(a.engine))
    except (OSError, zipfile.BadZipFile, KeyError) as err:
        print(f"aiconfigurator_mla.py: {a.wheel}: cannot read {path}: {err}", file=sys.stderr)
        return 2
    if a.derive_fixed:
        us, n = derive_fixed(tables, a.engine)
        _print_derived(a.engine, f"{backend} {release}'s MLA", tables, "mla_kv_up_proj", us, n,
                       FIXED_CONTEXTS)
        return 0
    spec = catalog.load_engine_spec(a.engine)
    _print_rows(f"DeepSeek-V3's MLA attention block at decode, one layer, us: {backend} "
                f"{release} (theirs) against the {a.engine} profile (ours)", "context",
                {gpu: rows(table, gpu, spec) for gpu, table in tables.items()})
    return 0


def _print_derived(engine: str, theirs: str, tables: dict, op: str, us: float, n: int,
                   contexts) -> None:
    """``--derive-fixed``'s answer: the profile's ``operator_fixed_us.<op>`` and what it rests
    on (``theirs``: the backend and release's block)."""
    print(f"# {engine} profile against {theirs} generation module, {', '.join(tables)}")
    print(f"operator_fixed_us.{op}: {us:g} (median ratio 1 over {n} rows at batch "
          f"{FIXED_BATCHES[0]}-{FIXED_BATCHES[-1]}, {contexts[0]:,}-{contexts[-1]:,} cached "
          "tokens)")


def _print_rows(title: str, column: str, rows_by_gpu: dict) -> list[float]:
    """Theirs beside ours, a row each (``rows``' tuples by GPU) under ``title``; the ratios."""
    print(f"# {title}; ratio = theirs / ours")
    print(f"{'gpu':<9} {'tp':>2} {'weights':<7} {'kv':<4} {'batch':>5} {column:>7} "
          f"{'theirs':>8} {'ours':>8} {'ratio':>6}  kernel")
    ratios = []
    for gpu, got in rows_by_gpu.items():
        for tp, w, kv, b, ctx, kernel, theirs, ours, ratio in got:
            ratios.append(ratio)
            print(f"{gpu:<9} {tp:>2} {w:<7} {kv:<4} {b:>5} {ctx:>7,} {theirs:>8.1f} "
                  f"{ours:>8.1f} {ratio:>6.2f}  {kernel}")
    return ratios


def _dsa(a) -> int:
    """``--dsa``: DeepSeek-V3.2's block against vLLM 0.24's on the H200 and the B200."""
    import tempfile

    from planner.io import catalog

    if a.context and a.derive_fixed:
        print("aiconfigurator_mla.py: --derive-fixed derives from the decode table: not with "
              "--context", file=sys.stderr)
        return 2
    if a.engine not in DSA_TABLES or (a.engine == "sglang" and a.context):
        print("aiconfigurator_mla.py: --dsa: the wheel's sparse-attention blocks read here are "
              "vLLM's (--engine vllm or vllm-0.8) and SGLang's at decode (--engine sglang)",
              file=sys.stderr)
        return 2
    backend, release, kernels = DSA_TABLES[a.engine]
    gpus = [g for g in (a.gpu or sorted(DSA_SYSTEMS))]
    if any(g not in DSA_SYSTEMS for g in gpus):
        print(f"aiconfigurator_mla.py: --dsa: the wheel times it on {', '.join(DSA_SYSTEMS)}",
              file=sys.stderr)
        return 2
    tables, path = {}, a.wheel
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with zipfile.ZipFile(a.wheel) as whl:
                path = DSA_CONFIG
                model = str(Path(tmp) / "DeepSeek-V3.2.json")
                Path(model).write_bytes(whl.read(DSA_CONFIG))
                for gpu in gpus:
                    path = DSA_PATH.format(system=DSA_SYSTEMS[gpu], backend=backend,
                                           release=release)
                    if a.context:
                        path = path.replace("dsa_generation_module", "dsa_context_module")
                    t = wheel_table(whl, path)
                    t = t[t.model == DSA_MODEL]
                    if "op_name" in t.columns:  # SGLang's also times the block without it
                        t = t[t.op_name.isin(["dsa_generation_module", "dsa_context_module"])]
                    tables[gpu] = t[t.kernel_source == kernels[gpu]] if kernels else t
        except (OSError, zipfile.BadZipFile, KeyError) as err:
            print(f"aiconfigurator_mla.py: {a.wheel}: cannot read {path}: {err}",
                  file=sys.stderr)
            return 2
        block = {"model": model, "ops": DSA_OPS}
        if a.derive_fixed:
            us, n = derive_fixed(tables, a.engine, "dsa_indexer", DSA_FIXED_CONTEXTS, **block)
            _print_derived(a.engine, f"{backend} {release}'s DSA", tables, "dsa_indexer", us,
                           n, DSA_FIXED_CONTEXTS)
            return 0
        spec = catalog.load_engine_spec(a.engine)
        phase, col = ("prefill", "prompt") if a.context else ("decode", "context")
        ratios = _print_rows(
            f"DeepSeek-V3.2's sparse-attention block at {phase}, one layer, us: {backend} "
            f"{release} (theirs) against the {a.engine} profile (ours)", col,
            {gpu: rows(table, gpu, spec, (1, 4), DSA_PROMPTS, **block, prefill=True)
             if a.context else rows(table, gpu, spec, (1, 4, 16, 64, 256), DSA_CONTEXTS,
                                    **block) for gpu, table in tables.items()})
        inside = sum(0.85 <= r <= 1.15 for r in ratios)
        print(f"# {len(ratios)} rows: median ratio {_median(ratios):.2f}, {inside} within "
              "0.85-1.15")
    return 0


if __name__ == "__main__":
    leave(main)
