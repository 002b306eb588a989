"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): a lightning indexer scores every cached
token for each query token in fp8, and the attention proper reads the ``index_topk`` tokens it
ranks highest. Checked against figures derived by hand from the official configs (copies in
tests/fixtures/hf/, README.md there) and the checkpoints' tensor headers; the cache layouts
from vLLM's sparse MLA backend (656 bytes a token in fp8) and indexer cache (132 bytes)."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.errors import SpecError, UsageError
from planner.core.estimate import estimate, prepare
from planner.core.memory import kv_cache_bytes_per_token, weight_bytes_breakdown
from planner.core.ops import (
    StepShape,
    count_params,
    decode_ops,
    prefill_ops,
    shape_ops,
    window_pairs,
)
from planner.core.roofline import step_time
from planner.core.specs import Options, Parallelism, Precision, Workload
from planner.io.catalog import load_engine, load_hardware, load_model, model_from_hf_config
from planner.layouts.deployment import Deployment, Layout
from planner.layouts.pipeline import stage_ops
from planner.serving.cost import StepCoster, idle_coster

HF = Path(__file__).parent / "fixtures" / "hf"
FP8 = Precision(weights="fp8")
V32 = str(HF / "deepseek-v3.2.json")


def _cfg(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


def _v32():
    return load_model(str(HF / "deepseek-v3.2.json"))


def _dense(m):
    """The same model without its indexer: DeepSeek-V3's dense MLA."""
    mla = m.mla.model_copy(update={"index_topk": None, "index_n_heads": None,
                                   "index_head_dim": None})
    return m.model_copy(update={"mla": mla, "architecture": "deepseek_v3"})


def test_deepseek_v32_is_read_with_its_indexer():
    m = load_model(str(HF / "deepseek-v3.2.json"))
    assert m.architecture == "deepseek_v32" and m.mla.sparse
    assert (m.mla.index_topk, m.mla.index_n_heads, m.mla.index_head_dim) == (2048, 64, 128)
    assert m.sparse_topk == m.attention_window == 2048 and m.sliding_window is None
    assert m.mtp_layers == 1 and m.quantization.weights.value == "fp8"
    # DeepSeek-V3's model with the indexer besides
    assert m.moe == load_model("deepseek-v3").moe


def test_the_indexer_adds_its_weights_to_deepseek_v3s():
    # a layer's indexer, from DeepSeek's reference inference/model.py and the checkpoint's
    # tensor shapes: wq_b [8192, 1536], wk [128, 7168], weights_proj [64, 7168], k_norm's
    # weight and bias [128] each
    per_layer = 8192 * 1536 + 128 * 7168 + 64 * 7168 + 2 * 128
    assert per_layer == 13_959_424
    v32, v3 = _v32(), load_model("deepseek-v3")
    assert count_params(v32) - count_params(v3) == 61 * per_layer
    # the checkpoints' headers: V3.2 685,396,921,376 elements, R1 (V3's architecture)
    # 684,531,386,000; the difference is 62 layers' indexers (the MTP layer's too) with
    # their fp8 block scales (wq_b 64 x 12, wk 1 x 56)
    assert 685_396_921_376 - 684_531_386_000 == 62 * (per_layer + 64 * 12 + 56)


def _glm5_params() -> int:
    """GLM-5's config.json term by term: MLA (64 heads, q rank 2048, nope 192, rope 64,
    v 256) with a 32-head indexer in each of 78 layers, 3 dense layers of 12,288, then 75 MoE
    layers of 256 routed experts (2,048 wide) and one shared, an untied vocabulary of 154,880."""
    h, heads, q_a, kv_a, nope, rope, v = 6144, 64, 2048, 512, 192, 64, 256
    attention = (h * q_a + q_a + q_a * heads * (nope + rope) + h * (kv_a + rope) + kv_a
                 + kv_a * heads * (nope + v) + heads * v * h)
    indexer = q_a * 32 * 128 + h * 128 + 2 * 128 + h * 32
    moe = 256 * 3 * h * 2048 + 3 * h * 2048 + 256 * h + 256
    return (2 * 154880 * h + 78 * (attention + indexer + 2 * h) + 3 * 3 * h * 12288
            + 75 * moe + h)


def test_glm5_counts_its_checkpoint():
    m = model_from_hf_config(_cfg("glm-5"), "glm-5.json")
    assert m.architecture == "glm_moe_dsa" and m.mla.index_n_heads == 32
    assert m.head_dim == 192 + 64  # the MLA's q/k head, not config.json's head_dim: 64
    assert count_params(m) == _glm5_params()
    # GLM-5.1's checkpoint (its config.json differs from GLM-5's in transformers_version
    # alone): 753,864,139,008 elements, all bf16, with its MTP layer (one more decoder layer of
    # the same shape, eh_proj 6,144 x 12,288 and three norms); GLM-5's README: "744B"
    h = 6144
    moe_layer = 256 * 3 * h * 2048 + 3 * h * 2048 + 256 * h + 256
    # a layer's attention, indexer and two norms: what the 78 layers hold beside the MLPs
    attention_and_norms = (_glm5_params() - 2 * 154880 * h - 3 * 3 * h * 12288 - h
                           - 75 * moe_layer) // 78
    mtp_layer = attention_and_norms + moe_layer + h * 2 * h + 3 * h
    assert count_params(m) + mtp_layer == 753_864_139_008
    assert count_params(m) == pytest.approx(744e9, rel=1e-3)


@pytest.mark.parametrize("cfg,field", [
    ({"index_topk": None}, "index_topk"), ({"index_n_heads": 0}, "index_n_heads"),
    ({"index_head_dim": "128"}, "index_head_dim"), ({"index_topk": 1.5}, "index_topk")])
def test_a_bad_indexer_field_names_itself(cfg, field):
    base = _cfg("deepseek-v3.2")
    with pytest.raises(SpecError, match=field):
        model_from_hf_config({**base, **cfg}, "v32.json")


def test_an_indexer_needs_all_three_sizes():
    m = _v32()
    with pytest.raises(ValueError, match="index_head_dim missing"):
        m.mla.model_validate({**m.mla.model_dump(), "index_head_dim": None})


def test_the_cache_holds_the_latent_and_the_index_key():
    m = _v32()
    # 16-bit: the latent and rope key (512 + 64) x 2 bytes, and the index key: 128 fp8 values
    # and one fp32 scale (vLLM's DeepseekV32IndexerCache: head_dim 128 + 128 // 128 x 4)
    assert kv_cache_bytes_per_token(m, Precision(kv_cache="bf16")) == 61 * (1152 + 132)
    # fp8: FlashMLA's sparse layout, 512 fp8 + 4 fp32 scales + 64 bf16 rope = 656 bytes
    assert kv_cache_bytes_per_token(m, Precision(kv_cache="fp8")) == 61 * (656 + 132)
    # every TP rank holds the whole latent and index key
    assert kv_cache_bytes_per_token(m, Precision(kv_cache="bf16"), tp=8) == 61 * 1284
    # dense MLA is unchanged: 576 elements
    assert kv_cache_bytes_per_token(load_model("deepseek-v3"), Precision(kv_cache="fp8")) == \
        61 * 576


def test_the_indexer_is_whole_on_every_rank():
    m = _v32()
    one, eight = (weight_bytes_breakdown(m, FP8, tp=t) for t in (1, 8))
    for k in ("indexer_wq_b", "indexer_wk", "indexer_k_norm", "indexer_weights_proj"):
        assert one[f"attention/{k}"] == eight[f"attention/{k}"] > 0
    # wq_b and wk in fp8 as the checkpoint stores them, weights_proj in 16 bits
    assert one["attention/indexer_wq_b"] == 61 * 8192 * 1536
    assert one["attention/indexer_weights_proj"] == 61 * 64 * 7168 * 2


@pytest.mark.parametrize("ctx", [100, 2048, 2049, 30000])
def test_decode_reads_the_top_k_and_the_indexer_reads_everything(ctx):
    m, tp, batch = _v32(), 8, 3
    ops = {o.name: o for o in decode_ops(m, Precision(weights="fp8", kv_cache="bf16"),
                                         batch=batch, context_tokens=ctx, tp=tp)}
    assert "attention" not in ops and ops["attention_sparse"].count == 61
    read = min(ctx, 2048)
    att = ops["attention_sparse"]
    assert att.kv_bytes == batch * read * 1152
    # the latent form: 16 heads a GPU, scores over 576 dims, values of 512
    assert att.flops == 2 * 16 * batch * read * (576 + 512)
    idx = ops["dsa_indexer"]
    assert idx.kv_bytes == batch * ctx * 132
    assert idx.flops == 2 * 64 * (128 + 1) * batch * ctx
    assert idx.dtype.value == "fp8" and idx.count == 61
    # its logits, fp32, written and read back: 8 bytes a pair, beside the fp8 queries and
    # their fp32 weights
    assert idx.act_bytes == batch * 64 * (128 + 4) + 8 * batch * ctx


@pytest.mark.parametrize("prompt", [1000, 2048, 9000])
def test_a_prefill_attends_to_the_top_k_of_each_token(prompt):
    m = _v32()
    ops = {o.name: o for o in prefill_ops(m, FP8, batch=1, prompt_tokens=prompt, tp=8)}
    pairs = window_pairs(prompt, 2048)  # token p attends to min(p, 2048) tokens
    assert ops["attention_sparse"].flops == pytest.approx(2 * 16 * pairs * (576 + 512))
    assert ops["dsa_indexer"].flops == pytest.approx(
        2 * 64 * 129 * prompt * (prompt + 1) / 2)


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 64), new=st.integers(1, 4000), past=st.integers(0, 200_000))
def test_sparse_attention_never_reads_or_computes_more_than_dense(batch, new, past):
    m = _v32()
    shape = StepShape.uniform(batch, new, past, m.attention_window, prefill=False)
    sparse = {o.name: o for o in shape_ops(m, FP8, shape, tp=8)}["attention_sparse"]
    dense = {o.name: o for o in shape_ops(_dense(m), FP8, StepShape.uniform(
        batch, new, past, prefill=False), tp=8)}["attention"]
    assert sparse.kv_bytes <= dense.kv_bytes * (1 + 1e-12)
    assert sparse.flops <= dense.flops * (1 + 1e-12)
    if past + new <= 2048:  # every token is in the top-k: the same work
        assert sparse.flops == pytest.approx(dense.flops)
        assert sparse.kv_bytes == pytest.approx(dense.kv_bytes)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("batch,ctx", [(1, 100), (16, 6000), (4, 90000)])
def test_the_simulators_step_is_the_estimates(engine, batch, ctx):
    m, hw, opts = _v32(), load_hardware("h200"), Options()
    prep = prepare(hw, FP8, None, opts, load_engine(engine))
    e = prep.engine
    c = StepCoster(m, hw, prep, opts, tp=8)
    dec = step_time(decode_ops(m, prep.precision, batch=batch, context_tokens=ctx, tp=8,
                               lm_head_sharded=e.lm_head_sharded), prep.ceilings, tp=8,
                    options=opts, engine=e, graphed=e.cuda_graphs,
                    fixed_s=e.step_overhead_s + e.per_sequence_overhead_s * batch).time_s
    got = c.step_time(StepShape.uniform(batch, 1, ctx - 1, m.attention_window),
                      sequences=batch, prefill=False)
    assert got == pytest.approx(dec + e.worker_s(8), rel=1e-9)
    pre = step_time(prefill_ops(m, prep.precision, batch=1, prompt_tokens=ctx, tp=8,
                                lm_head_sharded=e.lm_head_sharded), prep.ceilings, tp=8,
                    options=opts, engine=e, graphed=False,
                    fixed_s=e.prefill_step_overhead_s + e.per_sequence_overhead_s).time_s
    got = idle_coster(c).step_time(StepShape.uniform(1, ctx, 0, m.attention_window),
                                   sequences=1, prefill=True, decodes=False)
    assert got == pytest.approx(pre + e.worker_s(8), rel=1e-9)


def test_long_contexts_decode_faster_than_dense_mla():
    # at 1,024 tokens the indexer is extra work; at 128k attention reads 2,048 of them
    m, hw = _v32(), load_hardware("h200")
    eng = load_engine("vllm")

    def tpot(model, ctx):
        return estimate(model, hw, precision=FP8, parallelism=Parallelism(tp=8),
                        workload=Workload(batch=8, prompt_tokens=ctx, output_tokens=2),
                        engine=eng).tpot_s
    assert tpot(m, 1024) > tpot(_dense(m), 1024)
    assert tpot(m, 131072) < 0.7 * tpot(_dense(m), 131072)


def test_pipeline_stages_split_the_sparse_layers():
    m = _v32()
    ops = decode_ops(m, FP8, batch=2, context_tokens=5000, tp=8)
    first = {o.name: o.count for o in stage_ops(ops, m, 0, 30, True, False)}
    second = {o.name: o.count for o in stage_ops(ops, m, 30, 61, False, True)}
    for name in ("attention_sparse", "dsa_indexer", "indexer_q_proj", "indexer_k_write"):
        assert first[name] + second[name] == 61 and first[name] == 30


@pytest.mark.parametrize("gpu", ["a100-sxm-80gb", "l40s"])
def test_a_gpu_without_its_kernels_is_refused(run_cli, gpu):
    # the L40S has fp8 tensor cores, but no sparse MLA kernel runs on Ada
    code, _, err = run_cli("estimate", "--model", V32, "--gpu", gpu, "--tp", "8")
    assert code == 2 and "Hopper and Blackwell" in err and gpu in err
    assert "Traceback" not in err and "\n" not in err.strip()


def test_a_gpu_without_fp8_is_refused_by_the_library():
    a100 = load_hardware("a100-sxm-80gb")
    with pytest.raises(UsageError, match="an ampere GPU"):
        Deployment.build(_v32(), a100, engine=load_engine("vllm"),
                         layout=Layout(8, 1, 1))
    with pytest.raises(UsageError, match="sparse attention"):
        StepCoster(_v32(), load_hardware("a100-sxm-80gb"),
                   prepare(load_hardware("a100-sxm-80gb"), Precision(), None, Options(),
                           load_engine("vllm")), Options(), tp=8)


def test_simulate_serves_it(run_json):
    d = run_json("simulate", "--model", V32, "--gpu", "h200", "--tp", "8",
                 "--num-prompts", "40", "--request-rate", "2", "--input-len", "20000",
                 "--output-len", "100")
    assert d["completed"] == 40
    e = run_json("estimate", "--model", V32, "--gpu", "h200", "--tp", "8")
    assert any("sparse attention" in n for n in e["notes"])


def test_sglang_replays_no_prefill_graph_for_it():
    # SGLang's _handle_piecewise_cuda_graph turns its prefill graphs off for DeepSeek-V3.2,
    # not for DeepSeek-V3 (engines_db/sglang.yaml): the estimate and the simulator alike
    from planner.core.estimate import _prefill_graph_counts
    from planner.serving.run import scheduler

    hw, o = load_hardware("h200"), Options()
    prep = prepare(hw, FP8, None, o, load_engine("sglang"))
    v3, v32 = load_model("deepseek-v3"), _v32()
    assert _prefill_graph_counts(v3, prep.engine, o, "fp8") is not None
    assert _prefill_graph_counts(v32, prep.engine, o, "fp8") is None
    graphs = {m.name: scheduler(Deployment.build(m, hw, engine=load_engine("sglang"),
                                                 precision=FP8, layout=Layout(8, 1, 1))
                                ).prefill_graphs for m in (v3, v32)}
    assert graphs["deepseek-v3"] is not None and graphs["deepseek-v3.2"] is None


@pytest.mark.parametrize("gpu,tp,ratio", [("h200", 8, 4.0), ("b200", 8, 8.0), ("h200", 2, 1.0),
                                          ("b200", 1, 1.0), ("mi300x", 8, 1.0)])
def test_the_sparse_kernel_computes_its_padded_heads(gpu, tp, ratio):
    # FlashMLA's sparse kernels take 64 or 128 query heads a GPU (vLLM's flashmla_sparse.py
    # pads to them): DeepSeek-V3.2's 16 heads a GPU at TP 8 compute as 64 on Hopper and 128
    # on Blackwell; its 64 at TP 2 and 128 at TP 1 as they are; no such kernel stated for
    # the MI300X. The bytes are the cache's either way.
    from dataclasses import replace

    from planner.core.roofline import op_time
    m, hw, o = _v32(), load_hardware(gpu), Options()
    prep = prepare(hw, FP8, None, o, load_engine("vllm"))
    e = prep.engine
    op = {x.name: x for x in decode_ops(m, prep.precision, batch=32, context_tokens=9000,
                                        tp=tp)}["attention_sparse"]
    assert op.heads == 128 / tp
    padded = op_time(op, prep.ceilings, tp=tp, engine=e)
    plain = op_time(op, prep.ceilings, tp=tp, engine=replace(e, sparse_mla_heads=0.0))
    assert padded.compute_s == pytest.approx(ratio * plain.compute_s)
    assert padded.memory_s == plain.memory_s
    # the simulator prices the same padded kernel
    c = StepCoster(m, hw, prep, o, tp=tp)
    got = c.attention_s(StepShape.uniform(32, 1, 8999, m.attention_window), True)
    want = sum(op_time(x, prep.ceilings, tp=tp, engine=e).time_s
               for x in decode_ops(m, prep.precision, batch=32, context_tokens=9000, tp=tp)
               if x.name in ("attention_sparse", "dsa_indexer"))
    assert got == pytest.approx(want, rel=1e-9)


def test_a_hopper_file_without_an_fp8_rate_is_refused_not_a_traceback():
    h100 = load_hardware("h100-sxm")
    bare = h100.model_copy(update={"peak_tflops": {k: v for k, v in h100.peak_tflops.items()
                                                   if k.value != "fp8"}})
    with pytest.raises(UsageError, match="no fp8 tensor-core rate"):
        estimate(_v32(), bare, precision=Precision(weights="bf16"),
                 parallelism=Parallelism(tp=8), engine=load_engine("vllm"))
    # a GPU file that names no architecture passes on its fp8 rate
    anon = h100.model_copy(update={"architecture": None})
    assert estimate(_v32(), anon, precision=FP8, parallelism=Parallelism(tp=8),
                    engine=load_engine("vllm")).tpot_s > 0


@pytest.mark.parametrize("name, us", [("vllm", 60), ("vllm-0.8", 62), ("sglang", 0)])
def test_each_layer_pays_the_indexer_paths_derived_time(name, us):
    # operator_fixed_us.dsa_indexer, derived from aiconfigurator's timed vLLM 0.24 block
    # (benchmarks/aiconfigurator_mla.py --dsa --derive-fixed): a DeepSeek-V3.2 decode step
    # on 8 H200s takes 61 x that more than without it; DeepSeek-V3's (dense MLA) none of it
    from planner.cli.compare import served_setup
    from planner.core.ops import step_ops
    from planner.core.roofline import op_time
    from planner.core.specs import DType
    from planner.io import catalog

    spec = catalog.load_engine_spec(name)
    fixed = dict(spec.operator_fixed_us.value) if spec.operator_fixed_us else {}
    assert fixed.get("dsa_indexer", 0) == us
    without = spec.model_copy(update={"operator_fixed_us": spec.operator_fixed_us.model_copy(
        update={"value": {k: v for k, v in fixed.items() if k != "dsa_indexer"}})
        if spec.operator_fixed_us else None})

    def step_s(s, model):
        dep = served_setup(model, "h200", s, 8, DType.fp8, None)
        return sum(op_time(op, dep.prepared.ceilings, tp=8, options=dep.options,
                           engine=dep.engine).time_s
                   for op in step_ops(dep.model, dep.precision, batch=1, new_tokens=1,
                                      past_tokens=4096, tp=8))
    assert step_s(spec, V32) - step_s(without, V32) == pytest.approx(61 * us * 1e-6)
    assert step_s(spec, "deepseek-v3") == step_s(without, "deepseek-v3")
