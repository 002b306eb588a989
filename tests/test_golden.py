"""Numbers derived by hand and from published figures (source beside each)."""

from __future__ import annotations

import pytest

from planner.core.estimate import estimate
from planner.core.memory import (
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    weight_bytes,
    weight_bytes_breakdown,
)
from planner.core.ops import (
    count_params,
    decode_ops,
    expected_distinct_experts,
    flops_per_token_2n,
    param_breakdown,
    prefill_ops,
    total_flops,
)
from planner.core.roofline import mbu
from planner.core.specs import (
    DType,
    HardwareSpec,
    ModelSpec,
    Options,
    Parallelism,
    Precision,
    Workload,
)

BF16 = Precision()


def test_kv_bytes_background_notes_example(model):
    # guide-to-llm-inference-part1: 2 (k and v) x 5120 (hidden) x 20 (layers) x 2 (FP16) = 400 KB
    base = model("llama-2-13b")
    m = base.model_copy(update={"num_layers": 20})
    assert kv_cache_bytes_per_token(m, BF16) == 2 * 5120 * 20 * 2 == 409_600


@pytest.mark.parametrize("name,expected", [
    ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2),      # 131,072 B: GQA, 8 KV heads of 128
    ("llama-2-7b", 2 * 32 * 32 * 128 * 2),       # 524,288 B: MHA
    ("llama-3.1-70b", 2 * 80 * 8 * 128 * 2),     # 327,680 B
    ("gemma-2-9b", 2 * 42 * 8 * 256 * 2),        # explicit head_dim 256
    ("deepseek-v3", 61 * (512 + 64) * 2),        # MLA: layers x (kv_lora + rope) x bytes
])
def test_kv_bytes_per_token(model, name, expected):
    assert kv_cache_bytes_per_token(model(name), BF16) == expected


def test_kv_fp8_halves_and_batch_context_scale(model):
    m = model("llama-3.1-8b")
    fp8 = Precision(kv_cache=DType.fp8)
    assert kv_cache_bytes_per_token(m, fp8) == 65_536
    assert kv_cache_bytes(m, BF16, batch=16, seq_len=2304) == 16 * 2304 * 131_072


def test_weight_bytes_per_precision(model):
    m = model("llama-3.1-8b")
    n = count_params(m)
    assert weight_bytes(m, BF16) == 2 * n
    bd = param_breakdown(m)
    half = bd["embed/tokens"] + bd["lm_head"] + bd["norms/layers"] + bd["norms/final"]
    linear = n - half
    # fp8: linear layers 1 B/param, embeddings, head and norms stay 16-bit
    assert weight_bytes(m, Precision(weights=DType.fp8)) == linear * 1 + half * 2
    # int4, group 128, fp16 scales: 0.5 + 2/128 = 0.515625 B/param on the linear layers
    assert weight_bytes(m, Precision(weights=DType.int4)) == linear * 0.515625 + half * 2
    # int8, group 64: 1 + 2/64
    assert weight_bytes(m, Precision(weights=DType.int8, group_size=64)) == \
        linear * (1 + 2 / 64) + half * 2


def test_int4_computes_in_bf16_and_fp8_in_fp8():
    assert Precision(weights=DType.int4).compute_dtype == DType.bf16
    assert Precision(weights=DType.int8).compute_dtype == DType.bf16
    assert Precision(weights=DType.fp8).compute_dtype == DType.fp8
    assert Precision(weights=DType.fp16).compute_dtype == DType.fp16


@pytest.mark.parametrize("gpu_name,expected", [
    # background notes: optimal_batch = peak_flops x bytes_per_param / (2 x bandwidth), 16-bit
    ("h100-sxm", 989.4e12 * 2 / (2 * 3.35e12)),      # = 295.3
    ("a100-sxm-40gb", 312e12 * 2 / (2 * 1.555e12)),  # = 200.6
    ("a100-sxm-80gb", 312e12 * 2 / (2 * 2.039e12)),  # = 153.0
])
def test_optimal_batch_from_notes(gpu, model, gpu_name, expected):
    e = estimate(model("llama-3.1-8b"), gpu(gpu_name))
    assert e.optimal_batch == pytest.approx(expected)
    assert round(expected) in (295, 201, 153)


def test_usable_optimum_capped_by_memory(model, gpu):
    e = estimate(model("llama-3.1-70b"), gpu("h100-sxm"),
                 workload=Workload(batch=1, prompt_tokens=4096, output_tokens=512))
    assert e.memory.max_batch == 0  # 141 GB of bf16 weights do not fit in 80 GB
    assert e.usable_optimal_batch == 0


def test_mbu_background_notes_example():
    # inference-optimization notes: 7B params in 16-bit (14 GB) at TPOT 14 ms move 1 TB/s;
    # on a 2 TB/s GPU that is an MBU of 50%
    assert mbu(14e9, 0.014, 2e12) == pytest.approx(0.5)


def test_measured_tpot_gives_mbu_with_kv(model, gpu):
    m, h = model("llama-2-7b"), gpu("a100-sxm-80gb")
    e = estimate(m, h, workload=Workload(batch=1, prompt_tokens=1, output_tokens=2),
                 measured_tpot_s=0.014)
    moved = e.decode.weight_and_kv_bytes
    # weights minus the embedding table (only one row is read) plus ~1.5 tokens of KV
    assert moved == pytest.approx(2 * (count_params(m) - 32000 * 4096), rel=1e-3)
    assert e.measured.achieved_bandwidth_bytes_per_s == pytest.approx(moved / 0.014)
    assert e.measured.mbu == pytest.approx(moved / 0.014 / 2.039e12)
    # at batch 64 and 4k context the KV read is counted too: more bytes, higher MBU
    e2 = estimate(m, h, workload=Workload(batch=64, prompt_tokens=4000, output_tokens=2),
                  measured_tpot_s=0.014)
    kv_read = 64 * 4001 * kv_cache_bytes_per_token(m, BF16)
    assert e2.decode.weight_and_kv_bytes == pytest.approx(moved + kv_read, rel=2e-3)


def test_tiny_decode_step_by_hand(model):
    # tiny-llama-test: h 256, 4 layers, 8 heads of 32, 2 KV heads, MLP 704, vocab 2048
    m = model("tiny-llama-test")
    ops = decode_ops(m, BF16, batch=1, context_tokens=100)
    linear = 4 * (163_840 + 540_672) + 524_288          # decoder linears + lm_head
    norms = 4 * 2 * 256 + 256
    kv_per_token_layer = 2 * 64 * 2                      # K and V, 64 wide, 2 bytes
    weight_kv = 2 * linear + 2 * norms + 100 * kv_per_token_layer * 4 + 1 * kv_per_token_layer * 4
    assert sum((o.weight_bytes + o.kv_bytes) * o.count for o in ops) == weight_kv == 6_792_704
    # FLOPs: 2 per weight, attention 2 x heads x keys x (qk + v dims) per layer, norms 8h,
    # SwiGLU 4 x 704 per layer
    flops = 2 * linear + 4 * 2 * 8 * 100 * 64 + 9 * 8 * 256 + 4 * 4 * 704
    assert total_flops(ops) == flops == 7_123_968


def test_causal_prefill_attention_flops(model):
    m = model("tiny-llama-test")
    ops = prefill_ops(m, BF16, batch=2, prompt_tokens=128)
    attn = next(o for o in ops if o.name == "attention")
    # 2 sequences x 8 heads x (128 x 129 / 2 keys) x 2 x (32 + 32)
    assert attn.flops == 2 * 8 * (128 * 129 / 2) * 2 * 64 == 16_908_288


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b", "deepseek-v3", "gpt2",
                                  "gemma-2-9b", "qwen2.5-7b"])
def test_matmul_flops_match_2n_shortcut(model, name):
    # independent cross-check (nanoGPT's sizing notebook, PaLM appendix B): the matmuls of one
    # decoded token cost 2 x (active params - embedding lookup); norms and biases are < 0.1%
    m = model(name)
    ops = decode_ops(m, BF16, batch=1, context_tokens=1)
    matmul = sum(o.flops * o.count for o in ops if o.kind == "matmul")
    if m.moe:  # one token reaches exactly k experts
        assert expected_distinct_experts(m.moe.num_experts, m.moe.experts_per_token, 1) == \
            pytest.approx(m.moe.experts_per_token)
    assert matmul == pytest.approx(flops_per_token_2n(m), rel=1e-3)


def test_moe_weights_read_grow_with_batch(model):
    m = model("mixtral-8x7b")
    def expert_bytes(b):
        return sum(o.weight_bytes * o.count for o in decode_ops(m, BF16, batch=b,
                   context_tokens=10) if o.name.startswith("experts_"))
    one_expert = 3 * 4096 * 14336 * 2 * 32
    assert expert_bytes(1) == pytest.approx(2 * one_expert)      # top-2
    assert expert_bytes(256) == pytest.approx(8 * one_expert, rel=1e-6)  # all 8 reached


def test_tp_splits_weights_and_times_allreduce(model, gpu):
    m, h = model("llama-3.1-70b"), gpu("h100-sxm")
    w1 = weight_bytes(m, BF16, tp=1)
    w4 = weight_bytes(m, BF16, tp=4)
    norms = weight_bytes_breakdown(m, BF16)["norms/layers"] + 8192 * 2
    assert w4 == pytest.approx((w1 - norms) / 4 + norms)
    e = estimate(m, h, parallelism=Parallelism(tp=4),
                 workload=Workload(batch=1, prompt_tokens=100, output_tokens=2))
    # ring all-reduce of 1 x 8192 x 2 bytes: 2 (4-1)/4 x 16384 / 450e9 + 5 us, 2 per layer
    per_call = 2 * 3 / 4 * 16384 / 450e9 + 2e-6
    assert e.decode.comm_s == pytest.approx(160 * per_call)


def test_hardware_without_rate_is_an_error(model, gpu):
    from planner.core.errors import UsageError
    with pytest.raises(UsageError, match="no bf16"):
        estimate(model("gpt2"), gpu("t4"))
    assert estimate(model("gpt2"), gpu("t4"), precision=Precision(weights=DType.fp16,
                                                                  kv_cache=DType.fp16)).tpot_s > 0


def test_latency_and_throughput_definitions(model, gpu):
    e = estimate(model("llama-3.1-8b"), gpu("h100-sxm"),
                 workload=Workload(batch=8, prompt_tokens=1000, output_tokens=100))
    assert e.latency_s == pytest.approx(e.ttft_s + 99 * e.tpot_s)
    assert e.throughput_tokens_per_s == pytest.approx(8 / e.tpot_s)
    assert e.cost_usd_per_million_output_tokens == pytest.approx(
        6.88 / 3600 / (800 / e.latency_s) * 1e6)  # hardware_db: AWS p5.48xlarge / 8


def test_memory_bound_decode_is_weight_read_time(model, gpu):
    # batch 1, short context: TPOT ~ weights / bandwidth (16.06 GB / 3.35 TB/s = 4.79 ms)
    e = estimate(model("llama-3.1-8b"), gpu("h100-sxm"),
                 workload=Workload(batch=1, prompt_tokens=1, output_tokens=2))
    assert e.tpot_s == pytest.approx((16.06e9 - 2 * 128256 * 4096) / 3.35e12, rel=0.01)
    assert e.bound == "memory"


def test_naive_attention_adds_quadratic_activations(model, gpu):
    m, h = model("llama-3.1-8b"), gpu("h100-sxm")
    w = Workload(batch=1, prompt_tokens=8192, output_tokens=1)
    flash = estimate(m, h, workload=w).memory.activation_bytes
    naive = estimate(m, h, workload=w, options=Options(attention="naive")).memory.activation_bytes
    # scores and probabilities of one layer: 2 x 32 heads x 8192^2 x 2 bytes = 8 GiB
    assert naive - flash == 2 * 32 * 8192 * 8192 * 2


def test_specs_are_validated():
    from pydantic import ValidationError
    with pytest.raises(ValidationError):
        Workload(batch=-1)
    with pytest.raises(ValidationError):
        Precision(kv_cache=DType.int4)
    with pytest.raises(ValidationError):
        ModelSpec(name="x", architecture="llama", source="s", vocab_size=10, hidden_size=64,
                  num_layers=1, num_attention_heads=6, num_kv_heads=4, intermediate_size=10,
                  max_position_embeddings=10)
    with pytest.raises(ValidationError):
        HardwareSpec(name="x", display_name="x", vendor="x", source="s", memory_gib=0,
                     memory_bandwidth_gb_per_s=1, peak_tflops={"bf16": 1},
                     interconnect={"kind": "pcie", "bandwidth_gb_per_s": 1})


def test_max_batch_with_chunked_prefill_by_hand(model, gpu):
    # Llama-3.1-8B on an H100 SXM, prompt 2048 + output 256, 90% of 80 GiB usable, 1 GiB reserve
    e = estimate(model("llama-3.1-8b"), gpu("h100-sxm"),
                 workload=Workload(batch=1, prompt_tokens=2048, output_tokens=256))
    free = 0.9 * 80 * 2**30 - 2 * 8_030_261_248 - 2**30
    per_token = (2 * 4096 + 3 * 14336) * 2          # residual + normed + gate/up/product, bf16
    per_seq = 2304 * 131_072 + 128_256 * 4          # KV + fp32 logits of the last token
    assert e.memory.max_batch == int((free - 8192 * per_token) // per_seq) == 196
    # without chunking the whole batch's prefill activations count: fewer sequences fit
    whole = estimate(model("llama-3.1-8b"), gpu("h100-sxm"),
                     workload=Workload(batch=1, prompt_tokens=2048, output_tokens=256),
                     options=Options(prefill_chunk_tokens=None))
    assert whole.memory.max_batch == int(free // (per_seq + 2048 * per_token)) == 117
    # activations stop growing once batch x prompt fills the chunk
    a = [estimate(model("llama-3.1-8b"), gpu("h100-sxm"),
                  workload=Workload(batch=b, prompt_tokens=2048, output_tokens=1))
         .memory.activation_bytes for b in (4, 8, 16)]
    assert a[1] - a[0] == pytest.approx(4 * 128_256 * 4)  # only the logits grow
