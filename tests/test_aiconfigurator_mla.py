"""benchmarks/aiconfigurator_mla.py: llmplan's MLA attention block at decode beside a measured
table's, and the device time derived from it (the wheel itself is not in CI: a table of the
same columns stands in for it; an unreadable wheel: tests/test_aiconfigurator_moe.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import aiconfigurator_mla as aic  # noqa: E402


def _ours_us(spec, tp: int, batch: int, context: int) -> float:
    from planner.cli.compare import served_setup
    from planner.core.specs import DType

    # the checkpoint as it ships: fp8 in 128 x 128 blocks, as the table's fp8_block lane
    dep = served_setup("deepseek-v3", "h200", spec, tp, None, DType.bf16)
    assert dep.precision.weights == DType.fp8 and dep.precision.fp8_blocks
    return aic.ours_us(dep, batch, context)


def _table(latency_us_of) -> pd.DataFrame:
    """Rows as mla_generation_module_perf.parquet has them (milliseconds; heads a GPU holds,
    as strings the way TensorRT-LLM's table stores them), DeepSeek-V3's fp8 block-wise GEMMs
    and bf16 KV cache at TP 1 and 8, and a row of a type ours has no counterpart of."""
    rows = [dict(kernel_source="k", gemm_type="fp8_block", kv_cache_dtype="bfloat16",
                 num_heads=str(128 // tp), batch_size=str(b), step=str(ctx),
                 latency=latency_us_of(tp, b, ctx) / 1e3)
            for tp in (1, 8) for b in aic.FIXED_BATCHES for ctx in aic.FIXED_CONTEXTS]
    rows.append({**rows[0], "gemm_type": "nvfp4", "latency": 99.0})
    return pd.DataFrame(rows)


def test_the_ratio_is_theirs_over_one_block_of_ours():
    from planner.io import catalog

    spec = catalog.load_engine_spec("vllm")
    table = _table(lambda tp, b, ctx: 1.5 * _ours_us(spec, tp, b, ctx))
    got = list(aic.rows(table, "h200", spec, aic.FIXED_BATCHES, aic.FIXED_CONTEXTS))
    assert len(got) == 2 * len(aic.FIXED_BATCHES) * len(aic.FIXED_CONTEXTS)  # nvfp4 left out
    assert {r[1:3] for r in got} == {("fp8", "bf16")}
    assert [r[-1] for r in got] == pytest.approx([1.5] * len(got))


def test_the_derived_time_is_what_a_table_adds_to_ours(monkeypatch):
    """A table that is ours, without the profile's own figure, plus 40 us everywhere derives
    40 us (the bisection's half-microsecond, rounded)."""
    from planner.io import catalog

    base = catalog.load_engine_spec("sglang").model_copy(update={"operator_fixed_us": None})
    tables = {"h200": _table(lambda tp, b, ctx: _ours_us(base, tp, b, ctx) + 40.0)}
    monkeypatch.setattr(catalog, "load_engine_spec", lambda name: base)
    us, n = aic.derive_fixed(tables, "sglang")
    assert (us, n) == (40, 2 * len(aic.FIXED_BATCHES) * len(aic.FIXED_CONTEXTS))


def test_a_wide_ep_table_reads_its_context_from_isl_and_its_default_kernel():
    """SGLang's module table keeps the context in ``isl`` with ``step`` 0 (aiconfigurator's
    loader adds them) and times two kernels; normalized keeps the one named, context in
    ``step``."""
    t = pd.DataFrame([dict(kernel_source=k, isl=str(ctx), step="0", latency=1.0)
                      for k in ("fa3", "flashinfer") for ctx in (1024, 4096)])
    got = aic.normalized(t, "fa3")
    assert set(got.kernel_source) == {"fa3"} and sorted(got.step) == [1024, 4096]
    assert len(aic.normalized(t)) == 4  # no kernel named: every row
    assert aic.TABLES["sglang"] == ("sglang", "0.5.10", "wideep_generation_mla_perf")



def test_the_sparse_blocks_time_is_derived_on_the_indexer(monkeypatch):
    """--dsa: DeepSeek-V3.2's block (its indexer and sparse attention beside the MLA
    operators); a table that is ours without the profile's indexer figure, plus 30 us
    everywhere, derives 30 us on ``dsa_indexer``, over the contexts above the top-k."""
    from planner.cli.compare import served_setup
    from planner.core.engine import OperatorFixed
    from planner.core.specs import DType
    from planner.io import catalog

    model = str(ROOT / "tests" / "fixtures" / "hf" / "deepseek-v3.2.json")
    spec = catalog.load_engine_spec("vllm")
    base = spec.model_copy(update={"operator_fixed_us": OperatorFixed(
        source="x", value={k: v for k, v in spec.operator_fixed_us.value.items()
                           if k != "dsa_indexer"})})

    def ours(tp, b, ctx):
        dep = served_setup(model, "h200", base, tp, None, DType.bf16)
        return aic.ours_us(dep, b, ctx, aic.DSA_OPS)
    rows = [dict(kernel_source="FLASHMLA_SPARSE", gemm_type="fp8_block",
                 kv_cache_dtype="bfloat16", num_heads=128 // tp, batch_size=b, step=ctx,
                 latency=(ours(tp, b, ctx) + 30.0) / 1e3)
            for tp in (1, 8) for b in aic.FIXED_BATCHES for ctx in aic.DSA_FIXED_CONTEXTS]
    monkeypatch.setattr(catalog, "load_engine_spec", lambda name: base)
    us, n = aic.derive_fixed({"h200": pd.DataFrame(rows)}, "vllm", "dsa_indexer",
                             aic.DSA_FIXED_CONTEXTS, model=model, ops=aic.DSA_OPS)
    assert (us, n) == (30, 2 * len(aic.FIXED_BATCHES) * len(aic.DSA_FIXED_CONTEXTS))
    # the block counts the indexer's operators, not dense attention
    assert "dsa_indexer" in aic.DSA_OPS and "attention" not in aic.DSA_OPS


def test_the_sparse_blocks_prefill_is_ours_launched_eagerly():
    """--dsa --context: the context table's rows with nothing cached (step 0) beside our
    block's prefill of that prompt, eager; a row with a prefix cached is left out."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType
    from planner.io import catalog

    model = str(ROOT / "tests" / "fixtures" / "hf" / "deepseek-v3.2.json")
    spec = catalog.load_engine_spec("vllm")
    dep = served_setup(model, "h200", spec, 8, None, DType.bf16)
    want = aic.ours_prefill_us(dep, 4, 8192)
    rows = [dict(kernel_source="FLASHMLA_SPARSE", gemm_type="fp8_block",
                 kv_cache_dtype="bfloat16", num_heads=16, batch_size=4, isl=8192, step=step,
                 latency=2.0 * want / 1e3) for step in (0, 128)]
    got = list(aic.rows(pd.DataFrame(rows), "h200", spec, (1, 4), aic.DSA_PROMPTS, model,
                        aic.DSA_OPS, prefill=True))
    assert len(got) == 1 and got[0][3:5] == (4, 8192)
    assert got[0][-1] == pytest.approx(2.0)
    # the indexer's scoring over the whole prompt is in it, and the padded heads
    assert want > aic.ours_prefill_us(dep, 4, 8192, tuple(o for o in aic.DSA_OPS
                                                         if o != "dsa_indexer"))


def test_dsa_reads_the_engines_own_kernel_from_a_wheel(tmp_path, capsys):
    """--dsa --engine sglang, end to end over a wheel of the same layout: the model from the
    wheel's config.json, SGLang's table read at its default kernel on each GPU and at the
    block with the indexer (not the rows that skip it, nor another model's); a row 1.25x ours
    prints 1.25."""
    import io
    import zipfile

    from planner.cli.compare import served_setup
    from planner.core.specs import DType
    from planner.io import catalog

    cfg = ROOT / "tests" / "fixtures" / "hf" / "deepseek-v3.2.json"
    spec = catalog.load_engine_spec("sglang")
    dep = served_setup(str(cfg), "h200", spec, 8, None, DType.bf16)
    ours = aic.ours_us(dep, 4, 4096, aic.DSA_OPS)
    base = dict(model=aic.DSA_MODEL, op_name="dsa_generation_module",
                kernel_source="sglang_dsa_indexer_fa3", gemm_type="fp8_block",
                kv_cache_dtype="bfloat16", num_heads=16, batch_size=4, step=4096,
                latency=1.25 * ours / 1e3)
    rows = [base, {**base, "kernel_source": "sglang_dsa_indexer_flashmla_kv"},
            {**base, "op_name": "dsa_generation_module_skip_indexer"},
            {**base, "model": "zai-org/GLM-5"}]
    buf = io.BytesIO()
    pd.DataFrame(rows).to_parquet(buf)
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(cfg, aic.DSA_CONFIG)
        z.writestr(aic.DSA_PATH.format(system="h200_sxm", backend="sglang",
                                       release="0.5.14"), buf.getvalue())
    assert aic.main([str(wheel), "--dsa", "--engine", "sglang", "--gpu", "h200"]) == 0
    out = capsys.readouterr().out
    assert "1 rows: median ratio 1.25" in out and "sglang 0.5.14 (theirs)" in out
    # prefill is read for vLLM alone
    assert aic.main([str(wheel), "--dsa", "--engine", "sglang", "--context"]) == 2


def test_a_generation_table_keeps_its_context_in_step():
    """vLLM's and TensorRT-LLM's generation tables hold the new token in ``isl`` (1) and the
    context in ``step``: normalized leaves it there, where adding them had matched no
    context compared (1,025 for 1,024) and left those tables without a row."""
    t = pd.DataFrame([dict(kernel_source="k", isl="1", step=str(ctx), latency=1.0)
                      for ctx in (1024, 4096)])
    assert sorted(aic.normalized(t).step) == [1024, 4096]
