"""The event loop's inner loop over runs of decode-only steps (``planner.serving.sim``'s
``QUICK_DECODE_RUNS``) gives the steps the loop itself gives, to the bit: every request's
times, and every figure of the run's occupancy, with it on and off, over open streams and
closed loops, prefix caching, an API server that costs time per token streamed, samples and
a KV cache small enough to preempt."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner.serving.sim as sim
from planner.core.estimate import prepare
from planner.core.specs import Options, Precision
from planner.io import catalog
from planner.serving.config import SchedulerConfig
from planner.serving.cost import StepCoster
from planner.serving.schedulers import ContinuousScheduler
from planner.serving.traffic import synthetic


def _coster(model: str, gpu: str):
    m, hw = catalog.load_model(model), catalog.load_hardware(gpu)
    eng = catalog.load_engine("vllm")
    return StepCoster(m, hw, prepare(hw, Precision(), None, Options(), eng), Options()), eng, hw


@pytest.fixture(scope="module")
def h100():
    return _coster("llama-3.1-8b", "h100-sxm")


def _run(coster, cfg, reqs, quick: bool, monkeypatch, sample_every_s=0.25):
    monkeypatch.setattr(sim, "QUICK_DECODE_RUNS", quick)
    calls = [0]
    schedule = ContinuousScheduler.schedule

    def counted(self):
        calls[0] += 1
        return schedule(self)

    monkeypatch.setattr(ContinuousScheduler, "schedule", counted)
    res = sim.simulate(reqs, coster, cfg, sample_every_s=sample_every_s)
    monkeypatch.undo()
    return res, calls[0]


def _same_run(a, b) -> None:
    for x, y in zip(a.requests, b.requests, strict=True):
        for f in ("id", "arrival_s", "first_token_s", "finish_s", "preemptions",
                  "cached_tokens", "failed"):
            u, v = getattr(x, f), getattr(y, f)
            assert u == v or (math.isnan(u) and math.isnan(v)), f
    for f in ("duration_s", "steps", "itl", "samples", "busy_s", "running_integral",
              "kv_held_integral", "kv_reserved_integral", "max_running",
              "peak_kv_held_tokens", "peak_kv_reserved_tokens", "api_server_stream_s",
              "prefix_hit_tokens"):
        assert getattr(a, f) == getattr(b, f), f


def _both(coster, cfg, reqs):
    """The run with the inner loop and without, held to be the same; the first, and the
    scheduler's calls in it."""
    with pytest.MonkeyPatch.context() as mp:
        quick, calls = _run(coster, cfg, reqs, True, mp)
    with pytest.MonkeyPatch.context() as mp:
        loop, _ = _run(coster, cfg, reqs, False, mp)
    _same_run(quick, loop)
    return quick, calls


def _cfg(eng, hw, **kw):
    return SchedulerConfig.for_engine(eng, memory_bytes=hw.memory_bytes, tp=1, **kw)


@settings(max_examples=12, deadline=None)
@given(rate=st.floats(0.5, 60) | st.just(math.inf), ratio=st.sampled_from([0.0, 0.5, 0.9]),
       output=st.integers(2, 400), clients=st.sampled_from([None, 1, 7, 64]),
       prefix=st.sampled_from([0, 300]), seed=st.integers(0, 50))
def test_the_same_steps_with_and_without_the_inner_loop(h100, rate, ratio, output, clients,
                                                         prefix, seed):
    coster, eng, hw = h100
    cfg = _cfg(eng, hw, max_concurrency=clients, prefix_caching=bool(prefix))
    reqs = synthetic(150, prompt_tokens=600, output_tokens=output, range_ratio=ratio,
                     request_rate=rate, seed=seed, prefix_tokens=prefix)
    with pytest.MonkeyPatch.context() as mp:
        quick, _ = _run(coster, cfg, reqs, True, mp)
    with pytest.MonkeyPatch.context() as mp:
        loop, _ = _run(coster, cfg, reqs, False, mp)
    _same_run(quick, loop)


def test_the_inner_loop_runs_and_preempts_as_the_loop_does(monkeypatch):
    """An L4's KV cache (about 23 of these requests) under 40 requests a second of 2,000-token
    outputs: the decodes run out of blocks and preempt, in the loop's order. The inner loop
    takes the steps where nothing waits (the preempted wait, so not most of them here)."""
    coster, eng, hw = _coster("llama-3.1-8b", "l4")
    cfg = _cfg(eng, hw)
    reqs = synthetic(120, prompt_tokens=1500, output_tokens=2000, range_ratio=0.5,
                     request_rate=40.0, seed=1)
    with pytest.MonkeyPatch.context() as mp:
        quick, quick_calls = _run(coster, cfg, reqs, True, mp)
    with pytest.MonkeyPatch.context() as mp:
        loop, loop_calls = _run(coster, cfg, reqs, False, mp)
    _same_run(quick, loop)
    assert sum(r.preemptions for r in loop.requests) > 0
    assert loop_calls == loop.steps and quick_calls < loop.steps


def test_the_inner_loop_takes_most_steps_of_a_stream_the_replica_keeps_up_with(h100,
                                                                              monkeypatch):
    """Two requests a second of 600 / 300 tokens: most steps decode only, with nothing
    waiting; the scheduler is asked for a small part of them."""
    coster, eng, hw = h100
    reqs = synthetic(100, prompt_tokens=600, output_tokens=300, request_rate=2.0, seed=4)
    with pytest.MonkeyPatch.context() as mp:
        quick, calls = _run(coster, _cfg(eng, hw), reqs, True, mp)
    with pytest.MonkeyPatch.context() as mp:
        loop, _ = _run(coster, _cfg(eng, hw), reqs, False, mp)
    _same_run(quick, loop)
    assert calls < quick.steps / 4


def test_an_api_server_that_streams_slowly_floors_the_same_steps(monkeypatch):
    """A front end whose token streaming (400 us a token, one API server) is slower than
    the GPU's steps at 64 requests decoding: each step is seen to take what its tokens need,
    inside the inner loop as outside."""
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = dataclasses.replace(catalog.load_engine("vllm"), frontend_token_s=4e-4)
    coster = StepCoster(m, hw, prepare(hw, Precision(), None, Options(), eng), Options())
    cfg = _cfg(eng, hw)
    reqs = synthetic(200, prompt_tokens=200, output_tokens=300, request_rate=20.0, seed=2)
    with pytest.MonkeyPatch.context() as mp:
        quick, _ = _run(coster, cfg, reqs, True, mp)
    with pytest.MonkeyPatch.context() as mp:
        loop, _ = _run(coster, cfg, reqs, False, mp)
    assert loop.api_server_stream_s > 0
    _same_run(quick, loop)


def test_a_queue_no_seat_can_take_leaves_the_steps_to_the_inner_loop(h100, monkeypatch):
    """Every request sent at once to 16 seats: the queue waits while the seats decode, and
    those steps are the inner loop's."""
    coster, eng, hw = h100
    cfg = _cfg(eng, hw, max_num_seqs=16)
    reqs = synthetic(200, prompt_tokens=300, output_tokens=200, seed=5)
    quick, calls = _both(coster, cfg, reqs)
    assert calls < quick.steps / 4


@pytest.mark.parametrize("model,gpu,rate", [("gpt-oss-20b", "h100-sxm", 8.0),
                                            ("gemma-3-27b", "h100-sxm", 6.0),
                                            ("gemma-2-9b", "l4", 30.0)])  # preempts
def test_windowed_layers_take_the_same_steps_in_the_inner_loop(model, gpu, rate,
                                                               monkeypatch):
    """Sliding-window layers (vLLM's hybrid KV cache manager: the windowed groups' blocks
    held apart): the inner loop prices their steps with the same bound pricer and counts the
    pool as the loop does, to the bit, an L4 small enough to preempt included."""
    coster, eng, hw = _coster(model, gpu)
    assert coster.model.attention_window is not None
    cfg = _cfg(eng, hw)
    reqs = synthetic(150, prompt_tokens=1200, output_tokens=600, range_ratio=0.5,
                     request_rate=rate, seed=3)
    quick, calls = _both(coster, cfg, reqs)
    assert calls < quick.steps  # the inner loop took some of them


@pytest.mark.parametrize("prefix,full_prompt", [(0, False), (400, False), (400, True)])
def test_a_head_the_kv_cannot_hold_leaves_the_steps_to_the_inner_loop(prefix, full_prompt,
                                                                       monkeypatch):
    """Every request sent at once to an L4, whose KV holds a few of them while 256 seats
    stand free: the head of the queue waits for a finish, and the decode steps until then are
    the inner loop's, to the bit (a cached prefix evicted by the first failed admission, and
    vLLM 0.19's whole-prompt admission test, included)."""
    coster, eng, hw = _coster("llama-3.1-8b", "l4")
    # prompts in chunks of 512 tokens, where the whole-prompt test applies
    kw = {"max_num_batched_tokens": 512, "max_num_seqs": 256} if full_prompt else {}
    cfg = _cfg(eng, hw, prefix_caching=bool(prefix), full_prompt_admission=full_prompt, **kw)
    reqs = synthetic(160, prompt_tokens=1500, output_tokens=400, range_ratio=0.5, seed=7,
                     prefix_tokens=prefix)
    quick, calls = _both(coster, cfg, reqs)
    # 160 requests wait from the start beside free seats: without the blocked head's steps
    # the inner loop would take almost none of them
    assert calls < quick.steps / 2
