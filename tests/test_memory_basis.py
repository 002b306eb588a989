"""The engine's memory fraction on its own basis (planner/core/memory.py ``kv_budget_bytes``):
vLLM's gpu_memory_utilization of total memory, SGLang's mem_fraction_static of the memory left
once the CUDA context is up (weights and KV pool only), TensorRT-LLM's free_gpu_memory_fraction
of what weights and activations leave. Every figure below is worked by hand."""

from __future__ import annotations

import pytest

from planner.core.memory import kv_budget_bytes, usable_bytes
from planner.io import catalog

GIB = 2**30
# Llama-3.1-8B: 8,030,261,248 parameters (Meta's model card), 16-bit
W = 8_030_261_248 * 2
KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, 2 bytes
C, R = 80 * GIB, 1 * GIB  # an H100 SXM's 80 GiB; the 1 GiB reserve
# activations of a full step of 8,192 tokens: (2 x 4096 + 3 x 14336) x 2 bytes a token
STEP_ACT = 8192 * (2 * 4096 + 3 * 14336) * 2
LOGITS = 128_256 * 4  # fp32 logits of one sequence


@pytest.mark.parametrize("basis, frac, expected_gib", [
    ("total", 0.9, 0.9 * 80 - 15 - 2 - 1),  # 54
    ("static", 0.84, 0.84 * (80 - 1) - 15),  # 51.36: activations outside the fraction
    ("free", 0.9, 0.9 * (80 - 15 - 2 - 1)),  # 55.8
    ("measured", 1.0, 80 - 1 - 15 - 2 - 1),  # 61: less the margin, CUDA's 1 GiB by default
])
def test_kv_budget_by_basis(basis, frac, expected_gib):
    got = kv_budget_bytes(80 * GIB, weights_bytes=15 * GIB, activation_bytes=2 * GIB,
                          reserve_bytes=GIB, frac=frac, basis=basis)
    assert got == pytest.approx(expected_gib * GIB, rel=1e-12)
    use = usable_bytes(80 * GIB, weights_bytes=15 * GIB, activation_bytes=2 * GIB,
                       reserve_bytes=GIB, frac=frac, basis=basis)
    assert use == pytest.approx((15 + 2 + 1 + expected_gib) * GIB, rel=1e-12)


def test_sglang_static_fraction_is_capped_by_the_gpu():
    """A fraction so high that activations would not fit beside weights and pool: the pool
    is what the GPU leaves, not f (C - R) - W."""
    got = kv_budget_bytes(80 * GIB, weights_bytes=15 * GIB, activation_bytes=10 * GIB,
                          reserve_bytes=GIB, frac=0.99, basis="static")
    assert got == pytest.approx((80 - 15 - 10 - 1) * GIB)


def _capacity(run_json, engine: str, *extra: str) -> dict:
    return run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", engine, *extra)


def test_vllm_kv_capacity_by_hand(run_json):
    """vLLM 0.34's measured sizing: 80 GiB - a margin of max(1 GiB, 0.75 A) - weights - a full
    step's activations A (1,024 sequences of 8 tokens: 8,192 tokens and 1,024 rows of logits,
    1.27 GiB, so the 1 GiB floor is the margin) - 1 GiB, in 64-token blocks (0.34 and later);
    vllm@0.33: 0.92 x 80 GiB (0.20-0.33) less the same, in 16-token blocks; vllm@0.19: 0.9 of
    it."""
    act = STEP_ACT + 1024 * LOGITS
    assert act == 1_364_197_376 and 0.75 * act < GIB
    tokens = int((C - GIB - W - act - R) // KV_PER_TOKEN) // 64 * 64
    assert tokens == 505_984
    assert int((0.92 * C - W - act - R) // KV_PER_TOKEN) // 16 * 16 == 461_792
    assert int((0.9 * C - W - act - R) // KV_PER_TOKEN) // 16 * 16 == 448_688
    assert _capacity(run_json, "vllm@0.19")["kv_concurrency"]["kv_capacity_tokens"] == 448_688
    assert _capacity(run_json, "vllm@0.33")["kv_concurrency"]["kv_capacity_tokens"] == 461_792
    assert _capacity(run_json, "vllm")["kv_concurrency"]["kv_capacity_tokens"] == tokens


def test_sglang_kv_capacity_by_hand(run_json):
    """SGLang's default on an 80 GiB GPU: (80 - 13.125 GiB reserved) / 80 = 0.836 (rounded as
    ServerArgs rounds it); then 0.836 x (80 GiB - 1 GiB) - weights, one-token pages: no
    activations inside the fraction."""
    tokens = int((0.836 * (C - R) - W) // KV_PER_TOKEN)
    assert tokens == 418_500
    d = _capacity(run_json, "sglang")
    assert d["kv_concurrency"]["kv_capacity_tokens"] == tokens
    assert d["memory_utilization_frac"] == 0.836 and d["memory_utilization_basis"] == "static"


@pytest.mark.parametrize("gpu, frac", [
    ("h200", 0.907),  # (141 - 13.125) / 141
    ("l40s", 0.861),  # (48 - 6.6875) / 48: chunk 4096 and 32 graphs below 60 GiB
    ("l4", 0.847),  # (24 - 3.671875) / 24
])
def test_sglang_default_fraction_follows_the_gpus_memory(gpu, frac, run_json):
    d = run_json("estimate", "-m", "llama-3.1-8b", "-g", gpu, "-e", "sglang")
    assert d["memory_utilization_frac"] == frac


def test_trtllm_kv_capacity_by_hand(run_json):
    """0.9 x (80 GiB - weights - a full step's activations (2,048 sequences: 8,192 tokens,
    2,048 rows of logits) - 1 GiB), in 32-token blocks."""
    act = STEP_ACT + 2048 * LOGITS
    tokens = int((0.9 * (C - W - act - R)) // KV_PER_TOKEN) // 32 * 32
    assert tokens == 459_168
    assert _capacity(run_json, "trtllm")["kv_concurrency"]["kv_capacity_tokens"] == tokens


def test_memory_utilization_is_on_the_engines_basis(run_json):
    """--memory-utilization 0.5 under TensorRT-LLM is half of what weights, activations and
    reserve leave, not half of the GPU."""
    act = STEP_ACT + 2048 * LOGITS
    tokens = int((0.5 * (C - W - act - R)) // KV_PER_TOKEN) // 32 * 32
    d = _capacity(run_json, "trtllm", "--memory-utilization", "0.5")
    assert d["kv_concurrency"]["kv_capacity_tokens"] == tokens
    assert d["memory_utilization_frac"] == 0.5


@pytest.mark.parametrize("engine, batch", [
    # vLLM 0.34: B x (kv + logits) + the full chunk's activations <= C - W - R less the
    # margin, max(1 GiB, 0.75 A) of its profiling step (8,192 tokens over 1,024 sequences,
    # A 1.27 GiB): the 1 GiB floor
    ("vllm", (C - GIB - W - R - STEP_ACT) // (1280 * KV_PER_TOKEN + LOGITS)),
    # 0.20-0.33: <= 0.92 C - W - R (0.9 before 0.20)
    ("vllm@0.33", (0.92 * C - W - R - STEP_ACT) // (1280 * KV_PER_TOKEN + LOGITS)),
    ("vllm@0.19", (0.9 * C - W - R - STEP_ACT) // (1280 * KV_PER_TOKEN + LOGITS)),
    # SGLang: B x kv <= 0.84 (C - R) - W binds first
    ("sglang", (0.836 * (C - R) - W) // (1280 * KV_PER_TOKEN)),
    # TensorRT-LLM: B x kv <= 0.9 (C - W - R - activations - B x logits)
    ("trtllm", (C - W - R - STEP_ACT) // (1280 * KV_PER_TOKEN / 0.9 + LOGITS)),
])
def test_largest_batch_by_basis(engine, batch, run_json):
    """1,024 + 256 tokens a sequence; the 8,192-token prefill chunk is full at these sizes."""
    assert _capacity(run_json, engine)["max_batch"] == int(batch)


def test_every_profile_states_its_memory_fraction_with_a_source():
    for name in catalog.engine_names():
        spec = catalog.load_engine_spec(name)
        assert spec.memory_fraction is not None, name
        assert spec.memory_fraction.source
    assert catalog.load_engine("vllm").memory_basis == "measured"
    assert catalog.load_engine("vllm@0.33").memory_basis == "total"
    assert catalog.load_engine("sglang").memory_basis == "static"
    trt = catalog.load_engine("trtllm")
    assert (trt.memory_basis, trt.memory_utilization_frac) == ("free", 0.9)
