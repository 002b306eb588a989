"""Speculative decoding in the serving simulator (planner/serving/speculation.py,
simulate --speculative)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.estimate import prepare
from planner.core.memory import kv_cache_bytes_per_token
from planner.core.ops import StepShape
from planner.core.specs import Options, Precision
from planner.io import catalog
from planner.layouts.speculation import SpeculationConfig, speculate
from planner.serving.cost import StepCoster, idle_coster
from planner.serving.sim import SchedulerConfig, simulate
from planner.serving.speculation import spec_serving
from planner.serving.traffic import Request, synthetic


def _setup(model="llama-3.1-8b", gpu="h100-sxm"):
    m, hw = catalog.load_model(model), catalog.load_hardware(gpu)
    eng = catalog.load_engine("vllm")
    o = Options(prefill_chunk_tokens=eng.max_num_batched_tokens)
    prep = prepare(hw, Precision(), None, o, eng)
    return m, hw, o, prep, StepCoster(m, hw, prep, o), SchedulerConfig.for_engine(eng)


def test_one_request_by_hand_when_every_proposal_is_accepted():
    """n-gram lookup (no GPU drafting), k = 3, a = 1: every step keeps k + 1 = 4 tokens, so
    200 tokens after the first take 50 verification steps, the j-th over 4 new tokens after
    512 + 4 j cached, every position's logits sampled."""
    m, hw, o, prep, coster, cfg = _setup()
    spec = spec_serving(m, hw, prep, o, tp=1, cfg=SpeculationConfig("ngram", 3, 1.0))
    assert spec.tokens_per_step == 4 and spec.draft is None and spec.draft_weight_bytes == 0
    res = simulate([Request(0, 0.0, 512, 201)], coster, cfg, spec=spec)
    r = res.requests[0]
    steps = [coster.step_time(replace(StepShape.uniform(1, 4, 512 + 4 * j), logit_rows=4.0),
                              sequences=1, prefill=False) for j in range(50)]
    idle = idle_coster(coster)  # its first step
    prefill = idle.step_time(StepShape.uniform(1, 512, 0), sequences=1, prefill=True,
                             decodes=False)
    assert r.ttft_s == pytest.approx(prefill + coster.engine.request_path_s(512))
    assert r.tpot_s == pytest.approx(sum(steps) / 200)
    assert res.steps == 51


def _draft_model_by_hand(engine: str):
    """A lone request drafted by Llama-3.2-1B, k = 3, a = 1, under ``engine``: the simulated
    run, the prefill's drafter time and each decode step's (target and drafter) by hand."""
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine(engine)
    o = Options(prefill_chunk_tokens=eng.max_num_batched_tokens)
    prep = prepare(hw, Precision(), None, o, eng)
    coster, cfg = StepCoster(m, hw, prep, o), SchedulerConfig.for_engine(eng)
    c = SpeculationConfig("draft-model", 3, 1.0, catalog.load_model("llama-3.2-1b"))
    spec = spec_serving(m, hw, prep, o, tp=1, cfg=c)
    res = simulate([Request(0, 0.0, 512, 201)], coster, cfg, spec=spec)
    d = spec.draft
    one = lambda past: d.gpu_s(StepShape.uniform(1, 1, past), prefill=False)  # noqa: E731
    # the prompt's step: the drafter's pass over the prompt (one row of logits)
    prefill_draft = d.gpu_s(StepShape.uniform(1, 512, 0), prefill=True)
    steps = []
    for j in range(50):  # 4 tokens a step: 200 after the first in 50 steps
        past = 512 + 4 * j
        verify = coster.step_time(replace(StepShape.uniform(1, 4, past), logit_rows=4.0),
                                  sequences=1, prefill=False)
        # the drafter: one pass over the 4 tokens just verified (a row of logits), then
        # k - 1 = 2 of one token
        first = d.gpu_s(StepShape.uniform(1, 4, past, prefill=False), prefill=False)
        steps.append(verify + first + 2 * one(past))
    return res, coster, prefill_draft, one, steps


def test_the_drafter_runs_the_verified_tokens_once_then_k_minus_1_passes_by_hand():
    """vLLM V1 (0.19.1's ``propose``): each step the drafter runs once over the 1 + k tokens
    the target just verified, with one row of logits a request, then k - 1 passes of one
    token; the prompt's step runs it over the prompt and then k - 1 one-token passes, as
    vLLM drafts for every request the step schedules."""
    res, coster, prefill_draft, one, steps = _draft_model_by_hand("vllm")
    r = res.requests[0]
    prefill = idle_coster(coster).step_time(StepShape.uniform(1, 512, 0), sequences=1,
                                            prefill=True, decodes=False)
    want_ttft = prefill + prefill_draft + 2 * one(512) + coster.engine.request_path_s(512)
    assert r.ttft_s == pytest.approx(want_ttft, rel=1e-9)
    assert r.tpot_s == pytest.approx(sum(steps) / 200, rel=1e-9)
    assert res.steps == 51


def test_an_engine_that_prefills_apart_drafts_the_prompt_in_one_pass():
    """SGLang runs prefill batches apart from decodes (``mixed_batches`` off) and its drafter
    extends over a prefill batch once (``forward_draft_extend``), with no one-token passes
    after it; its decode steps draft as vLLM's do."""
    res, coster, prefill_draft, one, steps = _draft_model_by_hand("sglang")
    assert not coster.engine.mixed_batches
    r = res.requests[0]
    prefill = idle_coster(coster).step_time(StepShape.uniform(1, 512, 0), sequences=1,
                                            prefill=True, decodes=False)
    assert r.ttft_s == pytest.approx(prefill + prefill_draft
                                     + coster.engine.request_path_s(512), rel=1e-9)
    assert r.tpot_s == pytest.approx(sum(steps) / 200, rel=1e-9)


def test_alone_it_is_the_estimates_speculation_at_batch_1():
    """A lone request with a draft model decodes at the TPOT estimate's speculative section
    gives at batch 1 (which costs every step at the mean context; within 3%)."""
    m, hw, o, prep, coster, cfg = _setup()
    c = SpeculationConfig("draft-model", 4, 0.7, catalog.load_model("llama-3.2-1b"))
    spec = spec_serving(m, hw, prep, o, tp=1, cfg=c)
    r = simulate([Request(0, 0.0, 1024, 257)], coster, cfg, spec=spec).requests[0]
    est = speculate(m, hw, prep, o, tp=1, batch=1, prompt_tokens=1024, output_tokens=256,
                    cfg=c)
    assert r.tpot_s == pytest.approx(est.tpot_s, rel=0.03)
    base = simulate([Request(0, 0.0, 1024, 257)], coster, cfg).requests[0]
    assert base.tpot_s / r.tpot_s == pytest.approx(est.speedup, rel=0.04)
    assert r.ttft_s > base.ttft_s  # the draft prefills the prompt too


def test_the_draft_shares_the_kv_pool_by_hand():
    """Pool tokens = (target tokens x target bytes - draft weights) / (target + draft bytes
    per token): Llama-3.2-1B drafting for Llama-3.1-8B, 16 layers x 8 KV heads x 64 x 2 x 2 =
    32 KiB per token beside the target's 128 KiB."""
    m, hw, o, prep, coster, cfg = _setup()
    d = catalog.load_model("llama-3.2-1b")
    spec = spec_serving(m, hw, prep, o, tp=1, cfg=SpeculationConfig("draft-model", 4, 0.7, d))
    assert spec.draft_kv_bytes_per_token == 16 * 8 * 64 * 2 * 2
    assert spec.target_kv_bytes_per_token == 32 * 8 * 128 * 2 * 2
    plain = simulate([Request(0, 0.0, 16, 2)], coster, cfg).kv_capacity_tokens
    want = int((plain * 131072 - spec.draft_weight_bytes) // (131072 + 32768))
    got = simulate([Request(0, 0.0, 16, 2)], coster, cfg, spec=spec).kv_capacity_tokens
    assert got == want // cfg.block_size * cfg.block_size
    # Llama-3.2-1B: 1,235,814,400 parameters (tied embeddings), 2 bytes each
    assert spec.draft_weight_bytes == 2 * 1_235_814_400
    assert kv_cache_bytes_per_token(d, prep.precision) == spec.draft_kv_bytes_per_token


def test_nothing_accepted_only_costs():
    """a = 0: one token per step, as without speculation, but each step verifies k + 1:
    never faster, under any load."""
    m, hw, o, prep, coster, cfg = _setup()
    spec = spec_serving(m, hw, prep, o, tp=1, cfg=SpeculationConfig("ngram", 2, 0.0))
    reqs = synthetic(200, prompt_tokens=512, output_tokens=128, request_rate=8.0, seed=3)
    a = simulate(reqs, coster, cfg)
    b = simulate(reqs, coster, cfg, spec=spec)
    assert all(r.finish_s == r.finish_s for r in b.requests)  # all complete (not nan)
    mean = lambda rs: sum(r.tpot_s for r in rs) / len(rs)  # noqa: E731
    assert mean(b.requests) > mean(a.requests)


@settings(max_examples=15, deadline=None)
@given(k=st.integers(1, 6), a=st.floats(0.0, 1.0), rate=st.sampled_from([2.0, 50.0]),
       seed=st.integers(0, 10))
def test_tight_memory_preempts_and_everything_completes(k, a, rate, seed):
    """On an L4 (24 GB) the 8B model's KV is scarce: with speculation's lookahead slots the
    pool overflows, requests are preempted and recomputed, every request finishes, and no
    more KV is ever reserved than the pool holds."""
    m, hw, o, prep, coster, cfg = _setup(gpu="l4")
    spec = spec_serving(m, hw, prep, o, tp=1, cfg=SpeculationConfig("ngram", k, a))
    reqs = synthetic(60, prompt_tokens=1500, output_tokens=400, range_ratio=0.5,
                     request_rate=rate, seed=seed)
    res = simulate(reqs, coster, cfg, spec=spec)
    assert all(r.finish_s >= r.first_token_s >= r.arrival_s for r in res.requests)
    assert res.peak_kv_reserved_tokens <= res.kv_capacity_tokens


def test_cli(run_json, run_cli):
    base = ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "100",
            "--request-rate", "2"]
    plain = run_json(*base)
    d = run_json(*base, "--speculative", "draft-model", "--draft-model", "llama-3.2-1b",
                 "--num-speculative-tokens", "4", "--acceptance-rate", "0.7")
    assert d["speculative"]["tokens_per_step"] == pytest.approx((1 - 0.7 ** 5) / 0.3)
    assert d["mean_tpot_ms"] < plain["mean_tpot_ms"] / 1.4
    assert d["kv_capacity_tokens"] < plain["kv_capacity_tokens"]
    code, _, err = run_cli(*base, "--speculative", "mtp")
    assert code == 2 and "ships no multi-token-prediction layer" in err
    code, _, err = run_cli(*base, "--num-speculative-tokens", "0")  # a zero is not ignored
    assert code == 2 and "go with --speculative" in err
    for extra, msg in ((["--pp", "2"], "TP replica only"),
                       (["--scheduler", "static"], "continuous only"),
                       ([], "give --acceptance-rate")):
        code, _, err = run_cli(*base, "--speculative", "ngram", *extra)
        assert code == 2 and msg in err, err


def test_simulate_headline_is_speculative_with_the_baseline_beside(run_json, run_cli):
    base = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--num-requests", "40",
            "--request-rate", "2", "--prompt-tokens", "256", "--output-tokens", "64")
    plain = run_json(*base)
    d = run_json(*base, "--speculative", "eagle3")
    assert "2503.01840" in d["speculative"]["acceptance_source"]
    b = d["baseline"]
    # the baseline object is the same requests served without speculation
    for k in ("mean_tpot_ms", "output_throughput", "mean_ttft_ms", "p99_tpot_ms"):
        assert b[k] == pytest.approx(plain[k], rel=1e-12), k
    assert d["speedup"] == pytest.approx(b["mean_tpot_ms"] / d["mean_tpot_ms"])
    assert d["mean_tpot_ms"] < plain["mean_tpot_ms"] / 2 and d["speedup"] > 2
    # the band rides on the speculative figure, as plain decoding's rides on its own (a band
    # need not hold its prediction: a profile's held-out ratios can all lie above 1)
    assert 0 < d["mean_tpot_ms_low"] < d["mean_tpot_ms_high"]
    assert d["mean_tpot_ms_low"] / d["mean_tpot_ms"] == pytest.approx(
        plain["mean_tpot_ms_low"] / plain["mean_tpot_ms"], rel=1e-6)
    # vLLM keeps async scheduling for EAGLE; with n-gram lookup 0.14-0.33 run without it,
    # while the baseline beside it (no speculation) keeps it; 0.34 keeps it for every method
    assert d["async_scheduling"] is True and plain["async_scheduling"] is True
    ngram = run_json(*base, "--speculative", "ngram", "--acceptance-rate", "0.5",
                     "--num-speculative-tokens", "3", "-e", "vllm@0.33")
    assert ngram["async_scheduling"] is False
    assert run_json(*base, "--speculative", "ngram", "--acceptance-rate", "0.5",
                    "--num-speculative-tokens", "3")["async_scheduling"] is True
    assert ngram["baseline"]["mean_tpot_ms"] == pytest.approx(
        run_json(*base, "-e", "vllm@0.33")["mean_tpot_ms"], rel=1e-12)
    code, out, _ = run_cli(*base, "--speculative", "eagle3")
    assert code == 0 and "without speculation" in out
    code, _, err = run_cli(*base, "--speculative", "eagle3", "--acceptance-rate", "2")
    assert code == 2 and "--acceptance-rate: must be in [0, 1]" in err


@pytest.mark.parametrize("engine,over,later", [("sglang", {}, 0),
                                               ("vllm", {"mixed_batches": False}, 2)])
def test_a_step_without_the_decoders_drafts_its_chunk_alone(engine, over, later, monkeypatch):
    """A short prompt arriving beside a 30,000-token decode, in a step that runs no decodes
    (SGLang's prefill batch; vLLM told not to mix): the drafter's first pass is the chunk's
    alone, none of the decoders' cache read (the review of 2026-12-08 found it charged for
    it); under vLLM, whose runner drafts for every request it schedules, then k - 1 = 2
    one-token passes over that request."""
    from planner.serving import decoding

    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine(engine)
    o = Options(prefill_chunk_tokens=eng.max_num_batched_tokens)
    prep = prepare(hw, Precision(), None, o, eng)
    coster, cfg = StepCoster(m, hw, prep, o), SchedulerConfig.for_engine(eng, **over)
    assert not cfg.mixed_batches
    spec = spec_serving(m, hw, prep, o, tp=1, cfg=SpeculationConfig(
        "draft-model", 3, 1.0, catalog.load_model("llama-3.2-1b")))
    seen = []
    bound = decoding.SpecDecodePool.draft_s

    def recorded(self, past, chunks, decodes=True):
        t = bound(self, past, chunks, decodes)
        if chunks and self.n and not decodes:
            seen.append(([(q.computed, c) for q, c in chunks], t))
        return t

    monkeypatch.setattr(decoding.SpecDecodePool, "draft_s", recorded)
    simulate([Request(0, 0.0, 30000, 4000), Request(1, 1.5, 64, 10)], coster, cfg, spec=spec)
    assert seen and seen[0][0] == [(0, 64)]
    d = spec.draft
    want = d.gpu_s(StepShape.uniform(1, 64, 0), prefill=True) + \
        later * d.gpu_s(StepShape.uniform(1, 1, 64), prefill=False)
    assert seen[0][1] == pytest.approx(want, rel=1e-12)
