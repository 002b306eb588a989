"""Sliding-window attention: KV memory, attention work, the simulator's step cost, HF import."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.estimate import estimate, prepare
from planner.core.memory import kv_cache_bytes, kv_capacity_tokens, kv_concurrency, sliding_share
from planner.core.ops import StepShape, decode_ops, prefill_ops, window_pairs
from planner.core.roofline import step_time
from planner.core.specs import Options, Parallelism, Precision, Workload
from planner.io import catalog
from planner.serving.cost import StepCoster, idle_coster

BF16 = Precision()


def test_gemma2_kv_at_8192_with_the_window():
    # Gemma-2-9B (config.json: 42 layers, 8 KV heads of 256, sliding_window 4096 on the even
    # layers): one token of one layer is 2 x 8 x 256 x 2 B = 8,192 B. At 8,192 tokens the 21
    # global layers hold 8,192 tokens and the 21 local ones 4,096:
    # 21 x (8,192 + 4,096) x 8,192 = 2,113,929,216 B (1.97 GiB), not 2,818,572,288 (2.63 GiB).
    m = catalog.load_model("gemma-2-9b")
    assert m.num_sliding_layers == 21 and m.layer_is_sliding[:3] == (True, False, True)
    assert kv_cache_bytes(m, BF16, batch=1, seq_len=8192) == 2_113_929_216
    assert kv_cache_bytes(m, BF16, batch=1, seq_len=4096) == 42 * 4096 * 8192  # below it


def test_mistral_kv_is_capped_at_its_window():
    # Mistral-7B v0.1: 32 layers x 2 x 8 x 128 x 2 B = 131,072 B per token, every layer
    # sliding over 4,096 tokens: a sequence never holds more than 4,096 x 131,072 = 512 MiB.
    m = catalog.load_model("mistral-7b")
    cap = 4096 * 131_072
    assert kv_cache_bytes(m, BF16, batch=1, seq_len=4096) == cap == 536_870_912
    assert kv_cache_bytes(m, BF16, batch=3, seq_len=30_000) == 3 * cap
    assert kv_cache_bytes(m, BF16, batch=1, seq_len=1000) == 1000 * 131_072


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 3000), w=st.integers(1, 500))
def test_window_pairs_is_the_sum_it_names(n, w):
    assert window_pairs(n, w) == sum(min(p, w) for p in range(1, n + 1))


@settings(max_examples=200, deadline=None)
@given(b=st.integers(1, 8), new=st.integers(1, 300), past=st.integers(0, 3000),
       w=st.integers(1, 4000))
def test_windowed_shape_matches_a_per_token_count(b, new, past, w):
    s = StepShape.uniform(b, new, past, window=w)
    loc = s.local
    # token at position p (1-based) sees min(p, w) keys
    assert loc.attn_pairs == b * sum(min(p, w) for p in range(past + 1, past + new + 1))
    assert loc.kv_read_tokens == b * min(past + new, w + new - 1)
    assert loc.kv_held_tokens == b * min(past, w)
    assert loc.attn_pairs <= s.attn_pairs and loc.kv_read_tokens <= s.kv_read_tokens
    if w >= past + new:  # a window longer than the sequence changes nothing
        assert (loc.attn_pairs, loc.kv_read_tokens, loc.kv_held_tokens) == (
            s.attn_pairs, s.kv_read_tokens, s.kv_held_tokens)


def test_a_window_longer_than_the_context_changes_nothing():
    m = catalog.load_model("gemma-2-9b")
    nowin = m.model_copy(update={"sliding_window": None, "sliding_window_pattern": None})
    hw = catalog.load_hardware("h100-sxm")
    for p, o in ((1000, 200), (3000, 1000)):
        a = estimate(m, hw, workload=Workload(batch=4, prompt_tokens=p, output_tokens=o))
        b = estimate(nowin, hw, workload=Workload(batch=4, prompt_tokens=p, output_tokens=o))
        assert a.tpot_s == pytest.approx(b.tpot_s, rel=1e-12)
        assert a.ttft_s == pytest.approx(b.ttft_s, rel=1e-12)
        assert a.memory.kv_cache_bytes == b.memory.kv_cache_bytes


def test_decode_beyond_the_window_costs_no_more():
    # every layer of Mistral-7B v0.1 slides: a decode step at 30,000 tokens reads the same
    # 4,096 cached tokens per layer as one at 8,000
    m, hw = catalog.load_model("mistral-7b"), catalog.load_hardware("h100-sxm")
    a = estimate(m, hw, workload=Workload(batch=8, prompt_tokens=8000, output_tokens=2))
    b = estimate(m, hw, workload=Workload(batch=8, prompt_tokens=30000, output_tokens=2))
    assert b.tpot_s == pytest.approx(a.tpot_s, rel=1e-12)
    ops = {o.name: o for o in decode_ops(m, BF16, batch=1, context_tokens=30000)}
    assert "attention" not in ops and ops["attention_local"].count == 32
    assert ops["attention_local"].kv_bytes == 4096 * 2 * 8 * 128 * 2
    # prefill of a long prompt: attention work grows linearly past the window, not squared
    pre = {o.name: o for o in prefill_ops(m, BF16, batch=1, prompt_tokens=20000)}
    assert pre["attention_local"].flops == pytest.approx(
        2 * 32 * window_pairs(20000, 4096) * (128 + 128))


@pytest.mark.parametrize("engine", ["vllm", "hf-eager"])
@pytest.mark.parametrize("batch,ctx", [(1, 100), (16, 6000), (4, 9000)])
def test_simulator_step_is_the_estimates_with_windows(engine, batch, ctx):
    m, hw = catalog.load_model("gemma-2-9b"), catalog.load_hardware("h100-sxm")
    opts = Options()
    prep = prepare(hw, BF16, None, opts, catalog.load_engine(engine))
    eng = prep.engine  # resolved for the GPU, as the coster's
    c = StepCoster(m, hw, prep, opts)
    dec = step_time(decode_ops(m, BF16, batch=batch, context_tokens=ctx,
                               lm_head_sharded=eng.lm_head_sharded), prep.ceilings,
                    options=opts, engine=eng, graphed=eng.cuda_graphs,
                    fixed_s=eng.step_overhead_s + eng.per_sequence_overhead_s * batch).time_s
    got = c.step_time(StepShape.uniform(batch, 1, ctx - 1, window=m.sliding_window),
                      sequences=batch, prefill=False)
    assert got == pytest.approx(dec, rel=1e-9)
    pre = step_time(prefill_ops(m, BF16, batch=1, prompt_tokens=ctx,
                                lm_head_sharded=eng.lm_head_sharded), prep.ceilings,
                    options=opts, engine=eng, graphed=False,
                    fixed_s=eng.prefill_step_overhead_s + eng.per_sequence_overhead_s).time_s
    # a lone prefill, as the estimate's: nothing before it to run its host work beside
    got = idle_coster(c).step_time(StepShape.uniform(1, ctx, 0, window=m.sliding_window),
                             sequences=1, prefill=True, decodes=False)
    assert got == pytest.approx(pre, rel=1e-9)


def test_concurrency_counts_the_windowed_blocks():
    m, hw = catalog.load_model("gemma-2-9b"), catalog.load_hardware("h100-sxm")
    assert sliding_share(m) == (0.5, 4096)
    cap = kv_capacity_tokens(m, hw, BF16)
    kc = kv_concurrency(cap, prompt_tokens=8000, output_tokens=192, sliding=sliding_share(m))
    # half the layers hold 8,192 tokens, half the window's 4,096 plus the block being written
    assert kc.paged == cap // (0.5 * 8192 + 0.5 * (4096 + 16))
    assert kc.paged > kv_concurrency(cap, prompt_tokens=8000, output_tokens=192).paged


def _hf(tmp_path, cfg: dict) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


BASE = {"vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 12,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
        "max_position_embeddings": 32768, "head_dim": 64}


@pytest.mark.parametrize("extra,window,pattern", [
    ({"model_type": "gemma2", "sliding_window": 4096}, 4096, ("sliding", "full")),
    ({"model_type": "gemma3_text", "sliding_window": 1024, "sliding_window_pattern": 6}, 1024,
     ("sliding",) * 5 + ("full",)),
    ({"model_type": "gpt_oss", "sliding_window": 128, "num_local_experts": 4,
      "num_experts_per_tok": 2, "attention_bias": True,
      "layer_types": ["sliding_attention", "full_attention"] * 6}, 128, ("sliding", "full")),
    ({"model_type": "mistral", "sliding_window": 4096}, 4096, None),
    ({"model_type": "mistral", "sliding_window": None}, None, None),
    ({"model_type": "qwen3", "sliding_window": 4096, "use_sliding_window": False}, None, None),
    ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": True,
      "max_window_layers": 8}, 4096, ("full",) * 8 + ("sliding",) * 4),
])
def test_hf_import_reads_the_window_as_engines_do(tmp_path, extra, window, pattern):
    m = catalog.load_model(_hf(tmp_path, {**BASE, **extra}))
    assert m.sliding_window == window
    assert m.sliding_window_pattern == pattern


def test_hf_import_of_new_model_types(tmp_path):
    q = catalog.load_model(_hf(tmp_path, {**BASE, "model_type": "qwen3_moe", "num_experts": 8,
                                          "num_experts_per_tok": 2,
                                          "moe_intermediate_size": 128}))
    assert q.qk_norm and q.moe.num_experts == 8 and q.moe.first_dense_layers == 0
    assert not q.attention_bias
    g = catalog.load_model(_hf(tmp_path, {**BASE, "model_type": "gpt_oss",
                                          "num_local_experts": 4, "num_experts_per_tok": 2,
                                          "attention_bias": True, "sliding_window": 128}))
    assert g.attention_sinks and g.moe.expert_bias and g.moe.router_bias
    assert g.attention_bias and g.attention_out_bias
    mm = catalog.load_model(_hf(tmp_path, {"model_type": "gemma3", "_name_or_path": "gemma-3-x",
                                           "text_config": {**BASE, "sliding_window": 512}}))
    assert mm.name == "gemma-3-x" and mm.qk_norm and mm.norms_per_layer == 4
    assert mm.sliding_window == 512


def test_bad_layer_types_is_one_line(run_cli, tmp_path):
    path = _hf(tmp_path, {**BASE, "model_type": "gpt_oss", "sliding_window": 128,
                          "num_local_experts": 4, "num_experts_per_tok": 2,
                          "layer_types": ["sliding_attention"] * 3})
    code, out, err = run_cli("estimate", "-m", path, "-g", "h100-sxm")
    assert code == 2 and "layer_types" in err and len(err.strip().splitlines()) == 1


def test_tp_and_windows_together():
    m, hw = catalog.load_model("gemma-2-9b"), catalog.load_hardware("h100-sxm")
    one = estimate(m, hw, workload=Workload(batch=2, prompt_tokens=8000, output_tokens=192))
    two = estimate(m, hw, workload=Workload(batch=2, prompt_tokens=8000, output_tokens=192),
                   parallelism=Parallelism(tp=2))
    assert two.memory.kv_cache_bytes == pytest.approx(one.memory.kv_cache_bytes / 2)
