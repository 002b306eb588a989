"""Speculative decoding: the expected-tokens formula, the step costs and where it stops paying."""

from __future__ import annotations

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
