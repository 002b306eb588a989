"""Speculative decoding: the expected-tokens formula, the step costs and where it stops paying."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.core.estimate import estimate, prepare
from planner.core.specs import DType, Options, Parallelism, Precision, Workload
from planner.io import catalog
from planner.layouts.speculation import SpeculationConfig, expected_tokens, speculate


def test_expected_tokens_is_leviathans():
    # Leviathan et al. 2023, eq. 1: (1 - a^(k+1)) / (1 - a)
    assert expected_tokens(0.7, 4) == pytest.approx((1 - 0.7 ** 5) / 0.3)  # 2.7731
    assert expected_tokens(0.7, 4) == pytest.approx(2.7731)  # 0.83193 / 0.3
    assert expected_tokens(1.0, 4) == 5 and expected_tokens(0.0, 4) == 1
    assert expected_tokens(0.8, 1) == pytest.approx(1.8)


@given(a=st.floats(0, 0.999), k=st.integers(1, 16))
def test_expected_tokens_is_the_series(a, k):
    # 1 + a + a^2 + ... + a^k: the accepted prefix and the target's own token
    assert expected_tokens(a, k) == pytest.approx(sum(a ** i for i in range(k + 1)))
    assert 1 <= expected_tokens(a, k) <= k + 1


def _setup(model, gpu, tp=1, weights=DType.bf16):
    m, hw = catalog.load_model(model), catalog.load_hardware(gpu)
    eng, o = catalog.load_engine("vllm"), Options()
    prec = Precision.of(weights)
    return m, hw, eng, o, prec, prepare(hw, prec, None, o, eng)


def test_baseline_is_the_estimate_and_70b_gains_at_batch_1():
    m, hw, eng, o, prec, prep = _setup("llama-3.1-70b", "h100-sxm", tp=4)
    est = estimate(m, hw, precision=prec, options=o, engine=eng, parallelism=Parallelism(tp=4),
                   workload=Workload(batch=1, prompt_tokens=512, output_tokens=128))
    cfg = SpeculationConfig("draft-model", 4, 0.7, catalog.load_model("llama-3.2-1b"))
    r = speculate(m, hw, prep, o, tp=4, batch=1, prompt_tokens=512, output_tokens=128, cfg=cfg)
    assert r.baseline_tpot_s == pytest.approx(est.tpot_s, rel=1e-12)
    # memory-bound at batch 1: verifying 5 tokens costs little more than decoding one
    assert r.verify_s < 1.2 * r.baseline_tpot_s
    assert r.tpot_s == pytest.approx((r.verify_s + r.draft_s) / expected_tokens(0.7, 4))
    assert r.speedup > 1.5
    # near the compute bound it loses: the verification is k + 1 steps' FLOPs
    assert r.break_even_batch is not None and r.break_even_batch >= 64
    gains = [p.speedup for p in r.by_batch]
    assert gains == sorted(gains, reverse=True)  # the gain shrinks as the batch grows
    assert r.extra_weights_bytes == pytest.approx(
        2 * 1_235_814_400 / 4, rel=0.02)  # the 1B draft in bf16 over 4 GPUs (lm_head split)


def test_nothing_accepted_never_pays():
    m, hw, eng, o, prec, prep = _setup("llama-3.1-8b", "h100-sxm")
    r = speculate(m, hw, prep, o, tp=1, batch=1, prompt_tokens=512, output_tokens=128,
                  cfg=SpeculationConfig("ngram", 3, 0.0))
    assert r.tokens_per_step == 1 and r.draft_s == 0 and r.speedup < 1
    assert r.break_even_batch == 1 and r.extra_weights_bytes == 0


def test_mtp_holds_one_layer_and_uses_deepseeks_acceptance(run_json):
    d = run_json("estimate", "-m", "deepseek-v3", "-g", "h200", "--tp", "8", "--weights", "fp8",
                 "--speculative", "mtp")
    s = d["speculative"]
    assert s["num_speculative_tokens"] == 1 and s["acceptance_rate"] == 0.85
    assert s["tokens_per_step"] == pytest.approx(1.85)
    # one MoE layer of 61 (plus its share of nothing else): about 1/61 of the layers' weights
    assert 0 < s["extra_weights_bytes"] < d["weights_bytes"] / 40
    assert s["speedup"] > 1


@pytest.mark.parametrize("args,msg", [
    (["--speculative", "draft-model", "--num-speculative-tokens", "4", "--acceptance-rate",
      "0.7"], "--draft-model"),
    (["--speculative", "ngram"], "--acceptance-rate"),
    (["--speculative", "ngram", "--num-speculative-tokens", "3", "--acceptance-rate", "1.5"],
     "--acceptance-rate"),
    (["--draft-model", "llama-3.2-1b"], "--speculative"),
    (["--speculative", "draft-model", "--draft-model", "qwen2.5-0.5b",
      "--num-speculative-tokens", "4", "--acceptance-rate", "0.7"], "tokenizer"),
    (["--speculative", "ngram", "--num-speculative-tokens", "100", "--acceptance-rate", "0.5"],
     "1..64"),
])
def test_bad_speculative_input_is_one_line(run_cli, args, msg):
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", *args)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_text_section(run_cli):
    code, out, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                             "--speculative", "ngram", "--num-speculative-tokens", "3",
                             "--acceptance-rate", "0.6")
    assert code == 0, err
    assert "Speculative decoding" in out and "stops paying" in out


# ------------------------------------------------------- the headline (issue 25, section 3)

from planner.layouts.speculation import (  # noqa: E402
    acceptance_for_length,
    published_acceptance,
    speculation_tpot,
)


def test_acceptance_length_to_rate_by_hand():
    # k = 1: tau = 1 + a, so DeepSeek-V3's 1.85 tokens per step is a = 0.85
    assert acceptance_for_length(1.85, 1) == pytest.approx(0.85, abs=1e-9)
    # k = 3, a = 0.5: 1 + 0.5 + 0.25 + 0.125 = 1.875
    assert acceptance_for_length(1.875, 3) == pytest.approx(0.5, abs=1e-9)
    # k = 7, a = 0.9: (1 - 0.9^8) / 0.1 with 0.9^8 = 0.43046721 -> 5.6953279
    assert acceptance_for_length(5.6953279, 7) == pytest.approx(0.9, abs=1e-7)
    # the ends: nothing accepted is tau = 1, everything k + 1
    assert acceptance_for_length(1.0, 4) == pytest.approx(0.0, abs=1e-9)
    assert acceptance_for_length(5.0, 4) == pytest.approx(1.0, abs=1e-9)
    for bad in (0.5, 5.5):
        with pytest.raises(Exception, match="acceptance length"):
            acceptance_for_length(bad, 4)


@given(a=st.floats(0.01, 0.99), k=st.integers(1, 12))
def test_acceptance_length_round_trips(a, k):
    assert acceptance_for_length(expected_tokens(a, k), k) == pytest.approx(a, abs=1e-6)


def test_published_table_names_its_sources():
    table = catalog.load_acceptance()
    assert {e.method for e in table} >= {"mtp", "eagle3", "eagle", "draft-model"}
    assert not any(e.method == "ngram" for e in table)  # the traffic's, not the model's
    for e in table:
        assert "http" in e.source and e.retrieved and 0 < e.acceptance < 1
    m8, ds = catalog.load_model("llama-3.1-8b"), catalog.load_model("deepseek-v3")
    assert published_acceptance(table, ds, "mtp").acceptance == 0.85
    e3 = published_acceptance(table, m8, "eagle3")
    assert expected_tokens(e3.acceptance, e3.k) == pytest.approx(e3.length)
    assert published_acceptance(table, m8, "mtp") is None
    # a draft-model figure holds for the draft it was measured with only
    assert published_acceptance(table, m8, "draft-model") is None
    assert published_acceptance(table, m8, "draft-model",
                                catalog.load_model("llama-3.2-1b")) is not None


def test_bad_table_entry_is_named(tmp_path):
    from planner.core.errors import SpecError

    p = tmp_path / "s.yaml"
    p.write_text("entries:\n  - {method: eagle3, models: [x], k: 3, length: 5.5, source: s,"
                 " retrieved: '2026', estimated: true}\n")
    with pytest.raises(SpecError, match=r"entries\.0: length 5.5 is more than k \+ 1 = 4"):
        catalog.load_acceptance(p)
    p.write_text("entries:\n  - {method: medusa, models: [x], k: 3, rate: 0.5, source: s,"
                 " retrieved: '2026', estimated: true}\n")
    with pytest.raises(SpecError, match="method 'medusa'"):
        catalog.load_acceptance(p)


def test_headline_is_speculative_by_hand(run_json):
    base = ("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "1", "-p", "512",
            "-o", "128")
    plain = run_json(*base)
    d = run_json(*base, "--speculative", "ngram", "--num-speculative-tokens", "3",
                 "--acceptance-rate", "0.5")
    s = d["speculative"]
    # n-gram drafts on the host: a step is the verify step alone, 4 tokens per sequence
    assert s["draft_s"] == 0 and s["acceptance_source"] == "--acceptance-rate"
    tokens = 1 + 0.5 + 0.25 + 0.125  # E(0.5, 3) by hand
    assert s["tokens_per_step"] == pytest.approx(tokens)
    tpot = s["verify_s"] / tokens
    assert d["tpot_s"] == pytest.approx(tpot, rel=1e-12)
    assert d["baseline"]["tpot_s"] == pytest.approx(plain["tpot_s"], rel=1e-12)
    assert d["baseline"]["tpot_s"] / d["speedup"] == pytest.approx(tpot, rel=1e-12)
    assert d["latency_s"] == pytest.approx(d["ttft_s"] + tpot * 127, rel=1e-12)
    assert d["throughput_tokens_per_s"] == pytest.approx(1 / tpot, rel=1e-12)
    usd_per_s = d["price_usd_per_gpu_hour"] / 3600
    assert d["cost_usd_per_million_output_tokens"] == pytest.approx(
        usd_per_s * d["latency_s"] / 128 * 1e6, rel=1e-9)
    assert d["baseline"]["latency_s"] == pytest.approx(plain["latency_s"], rel=1e-12)
    # memory-bound at batch 1: verifying 4 tokens costs little more than decoding one
    assert 1.5 < d["speedup"] < tokens
    # the bands sit around the headline (speculative) TPOT
    assert d["tpot_s_low"] < d["tpot_s"] < d["tpot_s_high"]
    assert d["tpot_s"] < plain["tpot_s"]
    assert d["headline"] == "speculative" and "speculation_break_even_batch" in d


def test_break_even_batch_and_the_loss_above_it(run_json):
    args = ("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "128", "-o", "128",
            "--speculative", "ngram", "--num-speculative-tokens", "3", "--acceptance-rate",
            "0.6")
    d = run_json(*args)
    be = d["speculation_break_even_batch"]
    assert be is not None and 16 < be < d["speculative"]["break_even_search_max_batch"]
    m, hw, eng, o, prec, prep = _setup("llama-3.1-8b", "h100-sxm")
    cfg = SpeculationConfig("ngram", 3, 0.6)
    ctx = 128 + 128 / 2
    at = [speculation_tpot(m, prep, o, tp=1, cfg=cfg, batch=b, ctx=ctx).speedup
          for b in (1, be - 1, be, 2 * be)]
    assert at[0] > at[1] >= 1 > at[2] > at[3]  # the first batch where it is slower
    # the estimate at a batch above it: the headline TPOT is the (slower) speculative one
    hi = run_json(*args, "-b", str(2 * be))
    assert hi["speedup"] < 1 and hi["tpot_s"] > hi["baseline"]["tpot_s"]
    assert hi["throughput_tokens_per_s"] < hi["baseline"]["throughput_tokens_per_s"]


def test_published_default_and_the_users_rate_wins(run_json):
    base = ("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--speculative", "eagle3")
    d = run_json(*base)
    s = d["speculative"]
    assert s["num_speculative_tokens"] == 7 and "2503.01840" in s["acceptance_source"]
    assert s["tokens_per_step"] == pytest.approx(6.0)
    mine = run_json(*base, "--acceptance-rate", "0.7")["speculative"]
    assert mine["acceptance_rate"] == 0.7 and mine["acceptance_source"] == "--acceptance-rate"
    assert mine["num_speculative_tokens"] == 7  # the published k where none is given


@pytest.mark.parametrize("args,msg", [
    (["--speculative", "eagle3", "--acceptance-rate", "-0.1"], "--acceptance-rate"),
    (["--speculative", "eagle3", "--acceptance-rate", "1.01"], "[0, 1]"),
    (["--speculative", "medusa"], "--speculative"),
    (["--speculative", "eagle"], "no published acceptance for llama-3.1-8b"),
    (["--speculative", "draft-model", "--draft-model", "qwen2.5-0.5b"], "tokenizer"),
    (["--speculative", "eagle3", "--pp", "2"], "tensor-parallel replica only"),
])
def test_bad_speculative_headline_input(run_cli, args, msg):
    code, out, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", *args)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize("engine, ngram_pays", [("vllm@0.33", True), ("vllm", False),
                                                ("sglang", True), ("trtllm", False)])
def test_a_method_the_engine_does_not_overlap_pays_its_host_work(engine, ngram_pays):
    """vLLM 0.14-0.33 keep async scheduling with EAGLE and MTP (and a draft model from 0.28)
    but not with n-gram lookup on the host, 0.34 with every method; SGLang turns its overlap
    scheduler off for every method; TensorRT-LLM's profile states no such rule. The verify
    step of Llama-3.1-8B at batch 1 on an H100 is the same shape for n-gram and EAGLE and
    GPU-bound (milliseconds against a host cost of well under one): where the engine keeps
    its overlap for EAGLE only, n-gram's verify step is longer by exactly the host cost of a
    step of one sequence."""
    from planner.layouts.speculation import _costs

    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    e = catalog.load_engine(engine)
    prep = prepare(hw, Precision(), None, Options(), e)
    _, ngram, _ = _costs(m, prep, Options(), 1, SpeculationConfig("ngram", 3, 0.5), 1, 1000)
    _, eagle, _ = _costs(m, prep, Options(), 1, SpeculationConfig("eagle", 3, 0.5), 1, 1000)
    host = e.step_overhead_s + e.per_sequence_overhead_s
    assert e.async_scheduling and ngram > 3 * host
    if engine == "sglang":  # neither overlaps: both pay it
        assert ngram == pytest.approx(eagle, rel=1e-12)
        plain = replace(e, async_speculation=None)
        _, overlapped, _ = _costs(m, prepare(hw, Precision(), None, Options(), plain),
                                  Options(), 1, SpeculationConfig("eagle", 3, 0.5), 1, 1000)
        assert eagle - overlapped == pytest.approx(host, rel=1e-9)
    elif ngram_pays:
        assert ngram - eagle == pytest.approx(host, rel=1e-9)
    else:
        assert ngram == pytest.approx(eagle, rel=1e-12)
