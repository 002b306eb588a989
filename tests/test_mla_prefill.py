"""Multi-head latent attention is run in two forms: decodes attend in the latent space (scores
over kv_lora + rope = 576 dimensions, values the 512-wide latent), prefills expand the cached
latents back to per-head keys (128 + 64) and values (128) and attend over those (vLLM's and
SGLang's MLA backends, TensorRT-LLM's context phase). DeepSeek-V3 figures by hand."""

from __future__ import annotations

import pytest

from planner.core.estimate import prepare
from planner.core.ops import StepShape, decode_ops, prefill_ops, shape_ops, step_ops
from planner.core.roofline import step_time
from planner.core.specs import DType, Options, Precision
from planner.io import catalog
from planner.serving.cost import StepCoster, idle_coster
from planner.serving.decoding import with_chunks

HEADS = 128


def _attention_flops(ops):
    return next(o for o in ops if o.name == "attention").flops


def test_prefill_attends_in_the_expanded_form():
    m, p = catalog.load_model("deepseek-v3"), Precision()
    P = 4096
    pairs = P * (P + 1) / 2
    got = _attention_flops(prefill_ops(m, p, batch=1, prompt_tokens=P))
    assert got == pytest.approx(2 * HEADS * pairs * (128 + 64 + 128))
    # at TP 8 each GPU attends for 16 heads
    got8 = _attention_flops(prefill_ops(m, p, batch=1, prompt_tokens=P, tp=8))
    assert got8 == pytest.approx(got / 8)


def test_decode_attends_in_the_latent_form():
    m, p = catalog.load_model("deepseek-v3"), Precision()
    C = 1000  # cached tokens before the new one
    got = _attention_flops(decode_ops(m, p, batch=3, context_tokens=C + 1))
    assert got == pytest.approx(3 * 2 * HEADS * (C + 1) * (512 + 64 + 512))
    # a speculative verification adds several tokens a sequence and is still a decode
    ver = _attention_flops(shape_ops(m, p, StepShape.uniform(3, 4, C, prefill=False)))
    assert ver == pytest.approx(3 * 2 * HEADS * (4 * C + 10) * (512 + 64 + 512))


def test_a_chunk_after_cached_context_expands_that_context_too():
    """A 512-token chunk after 2,048 cached tokens: the expanded form over its pairs, and
    kv_b_proj over the 2,048 cached latents (512 -> 128 heads x (128 + 128))."""
    m, p = catalog.load_model("deepseek-v3"), Precision()
    got = _attention_flops(step_ops(m, p, batch=1, new_tokens=512, past_tokens=2048))
    pairs = 512 * 2048 + 512 * 513 / 2
    assert got == pytest.approx(2 * HEADS * pairs * 320 + 2 * 2048 * 512 * HEADS * 256)


def test_other_attention_costs_prefill_and_decode_alike():
    m, p = catalog.load_model("llama-3.1-8b"), Precision()
    a = shape_ops(m, p, StepShape.uniform(2, 300, 100))
    b = shape_ops(m, p, StepShape.uniform(2, 300, 100, prefill=False))
    assert _attention_flops(a) == _attention_flops(b)


@pytest.mark.parametrize("past", [0, 1500])
def test_the_simulators_step_is_the_estimates_for_a_deepseek_prefill(past):
    """The step coster prices a prefill chunk's expanded attention per unit: a step of one
    chunk, and of that chunk beside 20 decodes, costs what the operators say."""
    from types import SimpleNamespace

    m, hw = catalog.load_model("deepseek-v3"), catalog.load_hardware("h200")
    opts, prec = Options(), Precision(weights=DType.fp8)
    # the engine as resolved for the H200 (its by-architecture figures: Hopper's fp8 row tiles)
    prep = prepare(hw, prec, None, opts, catalog.load_engine("vllm"))
    eng = prep.engine
    c = StepCoster(m, hw, prep, opts, tp=8)
    shape = StepShape.uniform(1, 1024, past)
    want = step_time(shape_ops(m, prep.precision, shape, tp=8,
                               lm_head_sharded=eng.lm_head_sharded), prep.ceilings,
                     options=opts, engine=eng, graphed=False, tp=8,
                     fixed_s=eng.prefill_step_overhead_s + eng.per_sequence_overhead_s,
                     serial_s=eng.worker_s(8)).time_s  # the hand-off to 8 workers
    # a lone prefill, as the estimate's: nothing before it to run its host work beside
    got = idle_coster(c).step_time(shape, sequences=1, prefill=True, decodes=False)
    assert got == pytest.approx(want, rel=1e-9)
    # the simulator's mixed step: 20 decodes at 800 cached tokens, and the chunk
    dec = StepShape.uniform(20, 1, 800)
    q = SimpleNamespace(computed=past, target=past + 4096)
    mixed = with_chunks([dec.tokens, dec.attn_pairs, dec.kv_read_tokens, dec.kv_held_tokens,
                         dec.score_elems, dec.logit_rows], None, [(q, 1024)], None)
    assert (mixed.prefill_pairs, mixed.prefill_past_tokens) == (shape.attn_pairs, past)
    ops = shape_ops(m, prep.precision, mixed, tp=8, lm_head_sharded=eng.lm_head_sharded)
    want = step_time(ops, prep.ceilings, options=opts, engine=eng, graphed=False, tp=8,
                     fixed_s=0.0).time_s
    assert c.gpu_s(mixed, prefill=True) == pytest.approx(want, rel=1e-9)
