"""What an engine holds beyond the checkpoint: vLLM's MXFP4 experts padded to its Marlin
layout (engines_db ``mxfp4_expert_padding``). Figures worked by hand from the model's config
and vLLM's source, and held against the resident weights vLLM itself logged."""

from __future__ import annotations

import pytest

from planner.core.memory import activation_bytes, weight_bytes, weight_bytes_breakdown
from planner.core.ops import decode_ops
from planner.core.specs import DType, Precision
from planner.io import catalog
from planner.layouts.deployment import Deployment, Layout

GIB = 2**30


def _deployment(engine: str, gpu: str = "h100-sxm", tp: int = 1,
                weights: str = "mxfp4") -> Deployment:
    return Deployment.build(catalog.load_model("gpt-oss-120b"), catalog.load_hardware(gpu),
                            engine=catalog.load_engine(engine),
                            precision=Precision.of(weights, quantized_layers="experts"),
                            layout=Layout(tp=tp))


@pytest.mark.parametrize("tp, factor", [
    (1, 3072 * 2944 / (2880 * 2880)),  # hidden 2,880 -> 3,072, intermediate 2,880 -> 2,944
    (2, 3072 * 1536 / (2880 * 1440)),  # each rank's 1,440 -> 1,536
    (4, 3072 * 768 / (2880 * 720)),  # 720 -> 768
])
def test_marlin_padding_factor_by_hand(tp, factor):
    m = catalog.load_model("gpt-oss-120b")
    p = Precision.of("mxfp4", quantized_layers="experts").model_copy(
        update={"expert_pad": (256, 128)})
    assert p.expert_pad_factor(m, tp) == pytest.approx(factor, rel=1e-12)
    assert Precision.of("mxfp4").expert_pad_factor(m, tp) == 1.0  # no padding stated
    # a dense model has no experts to pad
    assert p.expert_pad_factor(catalog.load_model("llama-3.1-8b"), tp) == 1.0


def test_vllm_holds_gpt_oss_120b_as_it_logged():
    """vLLM on an H100 with the Marlin MXFP4 path logged 'Model loading took 65.9651 GiB'
    (vllm-project/vllm#23278); the padded experts plus the 16-bit rest come within 0.5%.
    Without the padding it is the checkpoint's 60.8 GiB, as SGLang's profile holds it."""
    d = _deployment("vllm-0.8")
    assert d.precision.expert_pad == (256, 128)
    held = weight_bytes(d.model, d.precision, lm_head_sharded=d.engine.lm_head_sharded)
    assert held / GIB == pytest.approx(65.9651, rel=0.005)
    s = _deployment("sglang")
    assert s.precision.expert_pad is None
    plain = weight_bytes(s.model, s.precision)
    bd = weight_bytes_breakdown(d.model, d.precision)
    bd_plain = weight_bytes_breakdown(s.model, s.precision)
    # only the routed experts' weights grow, by the factor; everything else is the same
    assert bd["moe/routed_experts"] / bd_plain["moe/routed_experts"] == pytest.approx(
        3072 * 2944 / (2880 * 2880), rel=1e-12)
    assert {k: v for k, v in bd.items() if k != "moe/routed_experts"} == \
        {k: v for k, v in bd_plain.items() if k != "moe/routed_experts"}
    assert plain / GIB == pytest.approx(60.8, abs=0.1)


def test_padding_applies_to_mxfp4_only():
    d = _deployment("vllm-0.8", weights="bf16")
    assert d.precision.weights is DType.bf16 and d.precision.expert_pad is None


def test_padded_experts_are_read_and_multiplied_padded():
    """A decode step's routed-expert matmuls read (and multiply) the padded weights; the
    attention and the router do not change."""
    d, s = _deployment("vllm-0.8", tp=2), _deployment("sglang", tp=2)
    f = 3072 * 1536 / (2880 * 1440)
    pad = {o.name: o for o in decode_ops(d.model, d.precision, batch=64, context_tokens=512,
                                         tp=2)}
    plain = {o.name: o for o in decode_ops(s.model, s.precision, batch=64, context_tokens=512,
                                           tp=2)}
    for name in ("experts_gate_up_proj", "experts_down_proj"):
        assert pad[name].weight_bytes == pytest.approx(plain[name].weight_bytes * f, rel=1e-12)
        assert pad[name].flops == pytest.approx(plain[name].flops * f, rel=1e-12)
    for name in ("qkv_proj", "moe_router", "attention"):
        assert pad[name].weight_bytes == plain[name].weight_bytes
        assert pad[name].flops == plain[name].flops


def test_padding_shrinks_vllms_kv_cache_by_hand(run_json):
    """gpt-oss-120b on one H100 under vLLM 0.10: 0.9 x 80 GiB less the padded weights, a full
    step's activations (8,192 tokens, 1,024 rows of fp32 logits) and the 1 GiB reserve, over
    72 KiB a token (36 layers x 8 KV heads x 64 x 2 x 2 bytes), in 16-token blocks."""
    d = _deployment("vllm-0.8")
    m, p = d.model, d.precision
    w = weight_bytes(m, p)
    act = activation_bytes(m, p, batch=1024, prompt_tokens=8, chunk_tokens=8192)
    per_token = 36 * 8 * 64 * 2 * 2
    tokens = int((0.9 * 80 * GIB - w - act - GIB) // per_token) // 16 * 16
    got = run_json("estimate", "-m", "gpt-oss-120b", "-g", "h100-sxm", "-e", "vllm@0.10.2",
                   "--weights", "mxfp4", "--quantized-layers", "experts")
    assert got["kv_concurrency"]["kv_capacity_tokens"] == tokens
    assert 50_000 < tokens < 60_000  # 128,880 with the checkpoint's 60.8 GiB
