"""vLLM V0's multi-step scheduling (--num-scheduler-steps, vllm-v0) and the server options read
from replayed server commands (--max-model-len and its SGLang / trtllm-serve names). Times are
worked out by hand from a step coster whose GPU time is fixed: 5 ms a decode step, 20 ms a
prefill step, with the vllm-v0 profile's host costs (2.77 ms a decode step, 0.4 ms a prefill
pass, 5 us a sequence)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli.flags import server_flags
from planner.core.errors import LlmplanError, UsageError
from planner.core.estimate import prepare
from planner.core.specs import Options, Precision
from planner.io import catalog
from planner.serving.config import SchedulerConfig
from planner.serving.cost import StepCoster
from planner.serving.metrics import summary
from planner.serving.sim import simulate
from planner.serving.traffic import Request

OPTS = Options()
G, GP = 5e-3, 20e-3  # the fake GPU's decode and prefill step
H, PH, PS = 2.77e-3, 0.4e-3, 5e-6  # vllm-v0's host costs


class Fixed(StepCoster):
    """The GPU's share of a step is fixed; the engine's host costs are its own."""

    prices_decodes_directly = False

    def gpu_s(self, shape, *, prefill, graphed=None):
        return GP if prefill else G


@pytest.fixture(scope="module")
def coster():
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("vllm-v0")
    assert (eng.step_overhead_s, eng.prefill_step_overhead_s, eng.per_sequence_overhead_s,
            eng.async_scheduling) == (H, PH, PS, False)
    return Fixed(m, hw, prepare(hw, Precision(), None, OPTS, eng), OPTS)


def _cfg(steps: int, **kw) -> SchedulerConfig:
    """vLLM 0.6's scheduler at a short context: prefills whole, in steps of their own."""
    base = dict(chunked_prefill=False, mixed_batches=False, max_num_batched_tokens=2048,
                max_num_seqs=256, scheduler_steps=steps)
    return SchedulerConfig(**{**base, **kw})


def test_one_request_pays_the_host_once_a_block():
    """16 decode tokens in blocks of 4: a block's first step pays the host's 2.77 ms + 5 us
    beside the 5 ms GPU step; its three later steps hide the host under the GPU (max(5,
    2.775) = 5 ms). TPOT = (4 x 7.775 + 12 x 5) / 16 = 5.694 ms, against 7.775 ms a step
    scheduled every time."""
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    c = Fixed(m, hw, prepare(hw, Precision(), None, OPTS, catalog.load_engine("vllm-v0")),
              OPTS)
    reqs = [Request(0, 0.0, 100, 17)]
    first = GP + PH + PS
    for steps, tpot in ((1, G + H + PS), (4, (4 * (G + H + PS) + 12 * G) / 16)):
        r = simulate(reqs, c, _cfg(steps)).requests[0]
        assert r.first_token_s == pytest.approx(first)
        assert (r.finish_s - r.first_token_s) / 16 == pytest.approx(tpot)
    assert tpot == pytest.approx(5.694e-3, abs=1e-6)


def test_a_block_ends_early_when_its_requests_are_done(coster):
    """14 decode tokens, blocks of 4: three whole blocks, then one of 2 steps."""
    r = simulate([Request(0, 0.0, 100, 15)], coster, _cfg(4)).requests[0]
    block = G + H + PS + 3 * G
    assert r.finish_s - r.first_token_s == pytest.approx(3 * block + G + H + PS + G)


def test_a_request_arriving_mid_block_waits_for_the_block(coster):
    """A prefills (20.405 ms) and decodes; B arrives 1 ms into A's first decode step. Every
    step scheduled: B's prefill is the next step, after A's 7.775 ms one (TTFT 27.18 ms). In
    blocks of 4, B waits for A's whole block (7.775 + 3 x 5 ms): TTFT 42.18 ms."""
    first = GP + PH + PS
    reqs = [Request(0, 0.0, 100, 41), Request(1, first + 1e-3, 100, 5)]
    for steps, ttft in ((1, G + H + PS - 1e-3 + first),
                        (4, G + H + PS + 3 * G - 1e-3 + first)):
        b = simulate(reqs, coster, _cfg(steps)).requests[1]
        assert b.first_token_s - b.arrival_s == pytest.approx(ttft)
    assert ttft == pytest.approx(42.18e-3)


def test_without_streaming_a_blocks_tokens_come_in_one_burst(coster):
    """--multi-step-stream-outputs False (vLLM 0.6.0-0.6.2): each block's tokens reach the
    client at its end, one gap per block: the ITL is a block's time, about N x TPOT, as
    LambdaLabs' vLLM 0.6.0 runs with --num-scheduler-steps 10 printed (ITL 198 ms against
    TPOT 25.7 ms). A request that finishes mid-block is seen done at the block's end."""
    block = G + H + PS + 3 * G
    stream = simulate([Request(0, 0.0, 100, 17)], coster, _cfg(4))
    burst = simulate([Request(0, 0.0, 100, 17)], coster, _cfg(4, multi_step_stream=False))
    assert summary(stream)["mean_itl_ms"] == pytest.approx(block / 4 * 1e3)
    assert summary(burst)["mean_itl_ms"] == pytest.approx(block * 1e3)
    assert burst.requests[0].finish_s == pytest.approx(stream.requests[0].finish_s)
    # A (41 tokens) keeps the block running while B (3 tokens) is done 2 steps in
    reqs = [Request(0, 0.0, 100, 41), Request(1, 0.0, 100, 3)]
    s = simulate(reqs, coster, _cfg(4)).requests[1]
    b = simulate(reqs, coster, _cfg(4, multi_step_stream=False)).requests[1]
    assert s.first_token_s == b.first_token_s  # a prefill is a block of its own
    assert s.finish_s == pytest.approx(b.first_token_s + G + H + 2 * PS + G)
    assert b.finish_s == pytest.approx(b.first_token_s + G + H + 2 * PS + 3 * G)
    assert b.first_token_s == pytest.approx(GP + PH + 2 * PS)  # one prefill step of both


def test_chunked_prefill_under_multi_step_takes_prompts_whole():
    """vLLM V0's SchedulerConfig: with chunked prefill and multi-step, max-num-batched-tokens
    defaults to max(max_model_len, 2048) and prompts are not chunked; without chunking it was
    max(max_model_len, 2048) already."""
    eng = catalog.load_engine("vllm-v0")
    long = SchedulerConfig.for_engine(eng, context_tokens=131072, scheduler_steps=8)
    assert (long.chunked_prefill, long.chunks_prompts, long.mixed_batches,
            long.max_num_batched_tokens) == (True, False, True, 131072)
    single = SchedulerConfig.for_engine(eng, context_tokens=131072)
    assert (single.chunks_prompts, single.max_num_batched_tokens) == (True, 512)
    short = SchedulerConfig.for_engine(eng, context_tokens=4096, scheduler_steps=8)
    assert (short.chunked_prefill, short.mixed_batches, short.max_num_batched_tokens) == \
        (False, False, 4096)
    # a prompt above a given budget is refused, not chunked
    given_budget = SchedulerConfig.for_engine(eng, context_tokens=131072, scheduler_steps=8,
                                              max_num_batched_tokens=1024)
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    c = StepCoster(m, hw, prepare(hw, Precision(), None, OPTS, eng), OPTS)
    res = simulate([Request(0, 0.0, 2000, 4), Request(1, 0.0, 500, 4)], c, given_budget)
    assert "multi-step scheduling does not chunk prompts" in res.requests[0].failed
    assert not res.requests[1].failed


def test_a_mixed_step_opens_a_block(coster):
    """With chunked prefill on, a step that prefills opens a block too: A's prefill (20.405
    ms) is followed by three decode steps of A (5 ms each, the host hidden); B, arriving 1 ms
    after A's first token, waits for them, then its whole prompt shares a step with A's
    decode (the larger host cost: 2.77 ms), which opens the next block, in whose three later
    steps B's other tokens come."""
    cfg = _cfg(4, chunked_prefill=True, mixed_batches=True, max_num_batched_tokens=4096)
    first = GP + PH + PS
    reqs = [Request(0, 0.0, 100, 41), Request(1, first + 1e-3, 100, 4)]
    b = simulate(reqs, coster, cfg).requests[1]
    mixed = GP + max(H, PH) + 2 * PS
    assert b.first_token_s == pytest.approx(first + 3 * G + mixed)
    assert b.finish_s == pytest.approx(b.first_token_s + 3 * G)


def test_refused_where_the_engine_has_no_multi_step():
    with pytest.raises(UsageError, match="multi-step scheduling is vLLM V0's"):
        SchedulerConfig.for_engine(catalog.load_engine("vllm"), scheduler_steps=4)
    with pytest.raises(UsageError, match="continuous only"):
        SchedulerConfig(kind="static", scheduler_steps=4).check()
    assert SchedulerConfig.for_engine(catalog.load_engine("vllm")).scheduler_steps == 1


def test_simulate_flags(run_json, run_cli):
    base = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", "vllm-v0",
            "--request-rate", "8", "-n", "300", "-p", "512", "-o", "256")
    one = run_json(*base)
    eight = run_json(*base, "--num-scheduler-steps", "8")
    burst = run_json(*base, "--num-scheduler-steps", "8", "--no-multi-step-stream-outputs")
    assert eight["mean_tpot_ms"] < 0.85 * one["mean_tpot_ms"]
    assert eight["mean_ttft_ms"] > one["mean_ttft_ms"]
    assert burst["mean_itl_ms"] > 5 * eight["mean_itl_ms"]
    assert one == run_json(*base, "--num-scheduler-steps", "1")
    for extra, says in ((("-e", "vllm", "--num-scheduler-steps", "4"), "vLLM V0's"),
                        (("--pp", "2", "--num-scheduler-steps", "4"), "TP replica only"),
                        (("--num-scheduler-steps", "0"), "--num-scheduler-steps"),
                        (("--num-scheduler-steps", "4", "--speculative", "ngram"),
                         "speculative")):
        code, _, err = run_cli(*base, *extra)
        assert code == 2 and says in err, (extra, err)


def test_server_commands_name_the_options():
    assert server_flags("vllm serve m --num-scheduler-steps 8 --multi-step-stream-outputs "
                        "False --max-model-len 4096") == {
        "--num-scheduler-steps": 8, "--multi-step-stream-outputs": False,
        "--max-model-len": 4096}
    assert server_flags("vllm serve m --multi-step-stream-outputs --max-model-len=8192") == {
        "--multi-step-stream-outputs": True, "--max-model-len": 8192}
    assert server_flags("vllm serve m --multi-step-stream-outputs=false") == {
        "--multi-step-stream-outputs": False}
    assert server_flags("vllm serve m --multi-step-stream-outputs") == {
        "--multi-step-stream-outputs": True}
    assert server_flags("python -m sglang.launch_server --context-length 4096") == {
        "--max-model-len": 4096}
    assert server_flags("trtllm-serve m --max_seq_len=40960") == {"--max-model-len": 40960}
    with pytest.raises(LlmplanError, match="not one of"):
        server_flags("vllm serve m --multi-step-stream-outputs maybe")


def test_a_replayed_server_keeps_its_max_model_len():
    """The server's --max-model-len sets what it refuses and, for vLLM 0.6, whether prefill is
    chunked (only above 32K): Llama-3.1-8B (131,072 positions) served at 8,192 prefills
    whole prompts in steps of 8,192 tokens."""
    from planner.cli.compare import served_setup
    from planner.serving import run

    spec = catalog.load_engine_spec("vllm-v0")
    dep = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, None, None,
                       server=server_flags("vllm serve m --max-model-len 8192 "
                                           "--num-scheduler-steps 4"))
    cfg = run.scheduler(dep, max_model_len=dep.engine.max_model_len)
    assert (cfg.max_model_len, cfg.chunked_prefill, cfg.max_num_batched_tokens,
            cfg.scheduler_steps) == (8192, False, 8192, 4)
    plain = run.scheduler(served_setup("llama-3.1-8b", "h100-sxm", spec, 1, None, None))
    assert (plain.chunked_prefill, plain.max_num_batched_tokens) == (True, 512)
    with pytest.raises(LlmplanError, match="multi-step scheduling is vLLM V0's"):
        served_setup("llama-3.1-8b", "h100-sxm", catalog.load_engine_spec("vllm"), 1, None,
                     None, server={"--num-scheduler-steps": 4})
    with pytest.raises(LlmplanError, match="must be positive"):
        served_setup("llama-3.1-8b", "h100-sxm", spec, 1, None, None,
                     server={"--max-model-len": 0})


@settings(max_examples=40, deadline=None)
@given(steps=st.integers(1, 12), chunked=st.booleans(), stream=st.booleans(),
       n=st.integers(1, 40), rate=st.floats(5.0, 400.0), p=st.integers(1, 3000),
       o=st.integers(1, 300))
def test_any_stream_completes_under_multi_step(coster, steps, chunked, stream, n, rate, p, o):
    from planner.serving.traffic import synthetic

    reqs = synthetic(n, prompt_tokens=p, output_tokens=o, request_rate=rate, seed=n)
    cfg = _cfg(steps, chunked_prefill=chunked, mixed_batches=chunked,
               max_num_batched_tokens=4096, multi_step_stream=stream)
    res = simulate(reqs, coster, cfg)
    assert summary(res)["completed"] == n
    for r in res.requests:
        assert r.arrival_s <= r.first_token_s <= r.finish_s
    # bursts change when tokens are seen, not how the steps run: never earlier
    other = simulate(reqs, coster, replace(cfg, multi_step_stream=not stream))
    burst, streamed = (other, res) if stream else (res, other)
    assert burst.steps == streamed.steps and burst.duration_s == streamed.duration_s
    for b, s in zip(burst.requests, streamed.requests, strict=True):
        assert b.first_token_s >= s.first_token_s and b.finish_s >= s.finish_s
    itl_b, itl_s = summary(burst)["mean_itl_ms"], summary(streamed)["mean_itl_ms"]
    if itl_s is not None:  # some request had a second token
        assert itl_b >= itl_s - 1e-9


def test_a_burst_counts_the_prefill_stall_only_for_those_who_sat_it_out(coster):
    """Bursts, prefills whole in steps of their own. A prefills (20.405 ms) and runs its first
    block (22.775 ms): one gap of 22.775. B arrives in it and prefills in a step of its own
    (20.405 ms, A's tokens wait); the next block (5 + 2.77 + 2 x 0.005 + 15 = 22.78 ms) ends
    with A's gap over both, 43.185 ms, and B's over the block alone, 22.78 ms."""
    first = GP + PH + PS
    reqs = [Request(0, 0.0, 100, 9), Request(1, first + 1e-3, 100, 5)]
    res = simulate(reqs, coster, _cfg(4, multi_step_stream=False))
    block1 = G + H + PS + 3 * G
    block2 = G + H + 2 * PS + 3 * G
    assert [round(g * 1e3, 6) for g, _ in res.itl] == \
        [round(block1 * 1e3, 6), round((block2 + first) * 1e3, 6), round(block2 * 1e3, 6)]
    assert [n for _, n in res.itl] == [1, 1, 1]
    b = res.requests[1]
    assert b.first_token_s == pytest.approx(first + block1 + first)
    assert b.finish_s == pytest.approx(b.first_token_s + block2)


def test_a_burst_holds_a_first_token_prefilled_in_a_block(coster):
    """Bursts with chunked prefill on: B's prompt shares the block-opening step with A's decode
    and its first token, with the three after it, reaches the client when the block ends."""
    cfg = _cfg(4, chunked_prefill=True, mixed_batches=True, max_num_batched_tokens=4096)
    first = GP + PH + PS
    reqs = [Request(0, 0.0, 100, 41), Request(1, first + 1e-3, 100, 4)]
    stream = simulate(reqs, coster, cfg).requests[1]
    burst = simulate(reqs, coster, replace(cfg, multi_step_stream=False)).requests[1]
    assert burst.first_token_s == pytest.approx(stream.first_token_s + 3 * G)
    assert burst.finish_s == pytest.approx(burst.first_token_s) == \
        pytest.approx(stream.finish_s)


def test_a_slowed_server_slows_a_blocks_later_steps_too(coster):
    """plan --size-at high's slower server (SlowedCoster): every step of a block, the later
    ones priced by the hidden-host coster as well, takes twice as long."""
    from planner.serving.steps import SlowedCoster

    reqs = [Request(0, 0.0, 100, 17)]
    fast = simulate(reqs, coster, _cfg(4)).requests[0]
    slow = simulate(reqs, SlowedCoster(coster, 2.0), _cfg(4)).requests[0]
    assert slow.first_token_s == pytest.approx(2 * fast.first_token_s)
    assert slow.finish_s == pytest.approx(2 * fast.finish_s)


def test_the_servers_max_model_len_sets_the_v0_defaults():
    """An engine whose server was started with --max-model-len (Engine.max_model_len) takes
    its context-dependent defaults from it, not from the model's context."""
    eng = replace(catalog.load_engine("vllm-v0"), max_model_len=8192)
    cfg = SchedulerConfig.for_engine(eng, context_tokens=131072)
    assert (cfg.max_model_len, cfg.chunked_prefill, cfg.max_num_batched_tokens) == \
        (8192, False, 8192)


def test_releases_before_0_6_3_stream_a_blocks_tokens_at_its_end():
    spec = catalog.load_engine_spec("vllm-v0")
    assert spec.model().multi_step_stream is True
    assert spec.at_version("0.6.0").model().multi_step_stream is False
    assert spec.at_version("0.6.3").model().multi_step_stream is True
    assert SchedulerConfig.for_engine(spec.at_version("0.6.1").model()).multi_step_stream \
        is False


def test_human_readable_lengths_in_server_commands():
    assert server_flags("vllm serve m --max-model-len 32k") == {"--max-model-len": 32000}
    assert server_flags("vllm serve m --max-model-len 32K") == {"--max-model-len": 32768}
    assert server_flags("vllm serve m --max-model-len auto") == {}
    assert server_flags("vllm serve m --multi-step-stream-outputs FALSE") == {
        "--multi-step-stream-outputs": False}
    with pytest.raises(LlmplanError, match="'1.5K' is not a number"):
        server_flags("vllm serve m --max-model-len 1.5K")


def test_validate_replays_a_multi_step_run_with_engines_that_have_none():
    """validate replays each run with the ideal engine too (and with --engine): those have no
    multi-step scheduling, so the run is replayed as they schedule, every step."""
    from types import SimpleNamespace

    from planner.cli.validate import replay_setup
    from planner.core.specs import DType

    entry = SimpleNamespace(
        model="llama-3.1-8b", gpu="h100-sxm", tp=1, weights=DType.bf16, kv_cache=None,
        checkpoint=None,
        traffic=SimpleNamespace(server_command="vllm serve m --num-scheduler-steps 8 "
                                "--multi-step-stream-outputs False"))
    own = replay_setup(entry, catalog.load_engine_spec("vllm-v0"))
    assert (own.engine.scheduler_steps, own.engine.multi_step_stream) == (8, False)
    for other in ("ideal", "vllm"):
        dep = replay_setup(entry, catalog.load_engine_spec(other))
        assert dep.engine.scheduler_steps is None
