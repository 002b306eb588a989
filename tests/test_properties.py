"""Invariants of the model, checked with hypothesis over models, GPUs and workloads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.estimate import estimate
from planner.core.specs import DType, Options, Parallelism, Precision, Workload
from planner.io import catalog

MODELS = {n: catalog.load_model(n) for n in ("llama-3.1-8b", "mixtral-8x7b", "deepseek-v3",
                                             "gpt2", "gemma-2-9b", "llama-3.1-70b")}
GPUS = {n: catalog.load_hardware(n) for n in ("h100-sxm", "a100-sxm-80gb", "l4", "mi300x",
                                              "b200")}

models = st.sampled_from(sorted(MODELS))
gpus = st.sampled_from(sorted(GPUS))
batches = st.integers(1, 512)
tokens = st.integers(1, 32768)
precisions = st.sampled_from([Precision(), Precision(weights=DType.fp8, kv_cache=DType.fp8),
                              Precision(weights=DType.int4), Precision(weights=DType.int8)])
time_models = st.sampled_from(["roofline", "additive"])


def est(m, g, b, p, o, prec=Precision(), tm="roofline", tp=1):
    return estimate(MODELS[m], GPUS[g], precision=prec, options=Options(time_model=tm),
                    workload=Workload(batch=b, prompt_tokens=p, output_tokens=o),
                    parallelism=Parallelism(tp=tp))


@settings(max_examples=60, deadline=None)
@given(models, gpus, batches, tokens, st.integers(1, 4096), precisions, time_models)
def test_monotone_in_batch(m, g, b, p, o, prec, tm):
    a, c = est(m, g, b, p, o, prec, tm), est(m, g, b + 1, p, o, prec, tm)
    assert c.memory.total_bytes > a.memory.total_bytes
    assert c.tpot_s >= a.tpot_s
    assert c.ttft_s > a.ttft_s
    assert c.throughput_tokens_per_s >= a.throughput_tokens_per_s * (1 - 1e-9) or \
        c.bound == "compute"


@settings(max_examples=60, deadline=None)
@given(models, gpus, batches, tokens, st.integers(1, 4096), precisions, time_models)
def test_monotone_in_context(m, g, b, p, o, prec, tm):
    a, c = est(m, g, b, p, o, prec, tm), est(m, g, b, p + 64, o, prec, tm)
    assert c.memory.total_bytes > a.memory.total_bytes
    assert c.tpot_s > a.tpot_s
    assert c.ttft_s > a.ttft_s
    assert c.memory.max_batch <= a.memory.max_batch


@settings(max_examples=80, deadline=None)
@given(models, gpus, batches, tokens, st.integers(1, 4096), precisions, time_models)
def test_utilisation_bounds(m, g, b, p, o, prec, tm):
    e = est(m, g, b, p, o, prec, tm)
    assert 0 < e.mbu <= 1
    assert 0 < e.mfu <= 1
    assert 0 < e.prefill_mfu <= 1
    assert e.memory.max_batch >= 0
    assert e.latency_s >= e.ttft_s > 0
    assert e.decode_flops_per_token >= e.flops_per_token_2n * 0.99


@settings(max_examples=40, deadline=None)
@given(models, gpus, st.integers(1, 4), st.integers(1, 2048))
def test_memory_bound_step_halves_when_bandwidth_doubles(m, g, b, p):
    model, hw = MODELS[m], GPUS[g]
    fast = hw.model_copy(update={"memory_bandwidth_gb_per_s": 2 * hw.memory_bandwidth_gb_per_s})
    w = Workload(batch=b, prompt_tokens=p, output_tokens=2)
    slow_e, fast_e = estimate(model, hw, workload=w), estimate(model, fast, workload=w)
    # when every decode operator is memory-bound, time scales exactly as 1/bandwidth; an
    # operator that is compute-bound (MLA attention on an A100: ~242 FLOP/B against a ridge
    # of 153) keeps its time, so the step cannot get more than twice faster
    if all(t.bound == "memory" for t in fast_e.decode.ops):
        assert fast_e.tpot_s == pytest.approx(slow_e.tpot_s / 2, rel=1e-9)
    else:
        assert slow_e.tpot_s / 2 < fast_e.tpot_s <= slow_e.tpot_s


def test_dense_small_batch_decode_is_all_memory_bound():
    e = est("llama-3.1-8b", "h100-sxm", 4, 2048, 2)
    assert all(t.bound == "memory" for t in e.decode.ops)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), batches, tokens)
def test_tp_reduces_per_gpu_memory(tp, b, p):
    one = est("llama-3.1-70b", "h100-sxm", b, p, 16)
    many = est("llama-3.1-70b", "h100-sxm", b, p, 16, tp=tp)
    assert many.memory.weights_bytes <= one.memory.weights_bytes
    assert many.memory.kv_cache_bytes <= one.memory.kv_cache_bytes
    if tp > 1:
        assert many.decode.comm_s > 0


@settings(max_examples=40, deadline=None)
@given(models, gpus, tokens, st.integers(1, 2048))
def test_max_batch_is_the_boundary_of_fits(m, g, p, o):
    e = est(m, g, 1, p, o)
    mb = e.memory.max_batch
    if mb >= 1:
        assert est(m, g, mb, p, o).memory.fits
    assert not est(m, g, mb + 1, p, o).memory.fits
