"""The serving simulator as each engine schedules: CUDA-graph capture sizes (vLLM),
guaranteed-no-evict admission (TensorRT-LLM), prefill batches apart from decodes (SGLang), and
requests an engine refuses. Each against figures worked out by hand from the step coster."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.engine import graph_sizes
from planner.core.estimate import prepare
from planner.core.ops import StepShape
from planner.core.specs import Options, Precision
from planner.io import catalog
from planner.serving.config import SchedulerConfig
from planner.serving.cost import StepCoster, idle_coster
from planner.serving.decoding import DecodePool
from planner.serving.kv import PagedKV
from planner.serving.metrics import summary
from planner.serving.sim import simulate
from planner.serving.steps import StepPricer
from planner.serving.traffic import Request, synthetic

OPTS = Options()


@pytest.fixture(scope="module")
def vllm():
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = replace(catalog.load_engine("vllm"), request_overhead_s=0.0,
                  prompt_token_overhead_s=0.0, frontend_request_s=0.0, frontend_token_s=0.0)
    prep = prepare(hw, Precision(), None, OPTS, eng)
    return eng, StepCoster(m, hw, prep, OPTS)


def test_vllm_v1_capture_sizes():
    """[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16), max = min(2 x seqs, 512)."""
    rule = catalog.load_engine("vllm").graph_rule
    big = graph_sizes(rule, 1024, 8192)
    assert len(big) == 51 and big[:5] == (1, 2, 4, 8, 16) and big[-2:] == (496, 512)
    assert 248 in big and 256 in big and 264 not in big and 272 in big
    assert graph_sizes(rule, 64, 8192)[-1] == 128  # 2 x max_num_seqs
    assert graph_sizes(rule, 1024, 100)[-1] == 96  # no larger than the step budget
    assert catalog.load_engine("vllm-v0").graph_rule is not None
    assert graph_sizes(catalog.load_engine("vllm-v0").graph_rule, 256)[-1] == 256
    cfg = SchedulerConfig.for_engine(catalog.load_engine("vllm"), max_num_seqs=100)
    assert cfg.graph_sizes[-1] == 200
    eager = replace(catalog.load_engine("vllm"), cuda_graphs=False)
    assert SchedulerConfig.for_engine(eager).graph_sizes == ()


def _decode_pool(n: int, context: int) -> DecodePool:
    """A pool of ``n`` requests decoding after ``context`` cached tokens each."""
    from planner.serving.requests import RequestResult, SimRequest

    kv = PagedKV(10**9, 16)
    pool = DecodePool(kv, 16)
    for i in range(n):
        q = SimRequest.of(RequestResult(i, 0.0, context, 100))
        q.computed = context
        pool.join(q)
    return pool


@pytest.mark.parametrize("run, gpu, tp", [
    ("mcs-qwen3-32b-h100pcie-sglang0514-c32", "h100-pcie", 1),
    ("mcs-llama33-70b-h100pcie-tp2-sglang0514-c32", "h100-pcie", 2),
    ("mcs-llama31-8b-l40s-sglang0514-c32", "l40s", 1)])
def test_sglangs_capture_sizes_are_the_ones_its_servers_printed(run, gpu, tp):
    """SGLang 0.5.14's published runs state the decode batches their servers captured
    (server_info.cuda_graph_config.decode.bs): 36 sizes up to 256 on an 80 GB H100, 8 up to
    32 on the 48 GB L40S. The profile's rule gives the same lists for those GPUs and TP."""
    import json

    info = json.loads((catalog.SERVED_DIR / f"{run}.json").read_text())["server_info"]
    printed = tuple(info["cuda_graph_config"]["decode"]["bs"])
    assert info["tp_size"] == tp
    hw = catalog.load_hardware(gpu)
    rule = catalog.load_engine("sglang").graph_rule
    assert graph_sizes(rule, 2048, 8192, memory_bytes=hw.memory_bytes, tp=tp) == printed
    # at TP 4 and more on the same GPUs SGLang captures twice to five times as many sizes
    # (512 on the H100, 160 on the L40S); --cuda-graph-max-bs 8 keeps 1, 2, 4, 8
    assert graph_sizes(rule, 2048, 8192, memory_bytes=hw.memory_bytes, tp=8)[-1] == \
        {"h100-pcie": 512, "l40s": 160}[gpu]
    assert graph_sizes(rule, 2048, 8192, memory_bytes=hw.memory_bytes, tp=tp,
                       max_bs=8) == (1, 2, 4, 8)


def test_a_sglang_server_told_to_capture_8_runs_larger_decodes_eagerly():
    """GPUStack's Qwen3-8B run with --cuda-graph-max-bs 8: the replay's scheduler captures
    decode batches up to 8 only."""
    from planner.cli.compare import served_setup, server_overrides
    from planner.serving import run as serving

    spec = catalog.load_engine_spec("sglang")
    cmd = "python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --cuda-graph-max-bs 8"
    dep = served_setup("qwen3-8b", "h100-sxm", spec, 1, "bf16", None,
                       server=server_overrides(cmd))
    assert dep.engine.graph_max_bs == 8
    assert serving.scheduler(dep).graph_sizes == (1, 2, 4, 8)
    plain = served_setup("qwen3-8b", "h100-sxm", spec, 1, "bf16", None)
    assert serving.scheduler(plain).graph_sizes[-1] == 256


def test_a_decode_batch_of_37_runs_as_the_captured_40(vllm):
    eng, c = vllm
    sizes = graph_sizes(eng.graph_rule, 1024, 8192)
    pool = _decode_pool(37, 500)
    got, _ = StepPricer(c, pool, sizes).time_s([])
    dec = StepShape.uniform(37, 1, 500)
    padded = replace(dec, tokens=40.0, logit_rows=40.0)  # 3 empty rows: no attention
    assert got == pytest.approx(c.step_time(padded, sequences=37, prefill=False), rel=1e-12)
    assert got > c.step_time(dec, sequences=37, prefill=False)  # the padding costs
    # unpadded where the engine captures no sizes, and a size captured exactly is not padded
    assert StepPricer(c, pool, ()).time_s([])[0] == pytest.approx(
        c.step_time(dec, sequences=37, prefill=False), rel=1e-12)
    pool40 = _decode_pool(40, 500)
    assert StepPricer(c, pool40, sizes).time_s([])[0] == pytest.approx(
        c.step_time(StepShape.uniform(40, 1, 500), sequences=40, prefill=False), rel=1e-12)


def test_a_decode_batch_above_the_largest_graph_runs_eagerly(vllm):
    eng, c = vllm
    sizes = graph_sizes(eng.graph_rule, 1024, 8192)  # up to 512
    pool = _decode_pool(600, 300)
    got, _ = StepPricer(c, pool, sizes).time_s([])
    dec = StepShape.uniform(600, 1, 300)
    eager = c.step_time(dec, sequences=600, prefill=False, graphed=False)
    assert got == pytest.approx(eager, rel=1e-12)
    assert eager > c.step_time(dec, sequences=600, prefill=False)  # host launches exposed


def test_tensorrt_llms_pytorch_backend_captures_1_to_32_64_128_and_does_not_pad():
    """TorchLlmArgs' default CudaGraphConfig: max_batch_size 128, enable_padding off, so
    range(1, 32) + [32, 64, 128]; a decode batch of another size runs without a graph."""
    eng = catalog.load_engine("trtllm")
    assert eng.graph_padding is False
    sizes = graph_sizes(eng.graph_rule, 2048, 8192)
    assert sizes == tuple(range(1, 33)) + (64, 128)
    cfg = SchedulerConfig.for_engine(eng)
    assert cfg.graph_sizes == sizes and cfg.graph_padding is False
    # vLLM and SGLang pad
    assert SchedulerConfig.for_engine(catalog.load_engine("vllm")).graph_padding is True
    assert SchedulerConfig.for_engine(catalog.load_engine("sglang")).graph_padding is True


def test_an_unpadded_engine_runs_a_batch_between_its_sizes_eagerly(vllm):
    """With padding off a decode batch of 37 (between 32 and 64) runs eagerly, not as the
    captured 64; one of exactly 32 replays its graph unpadded; above 128, eager as before."""
    _, c = vllm
    sizes = tuple(range(1, 33)) + (64, 128)
    for n, graphed in ((37, False), (32, True), (64, True), (100, False), (200, False)):
        pool = _decode_pool(n, 500)
        dec = StepShape.uniform(n, 1, 500)
        want = c.step_time(dec, sequences=n, prefill=False, graphed=graphed)
        assert StepPricer(c, pool, sizes, pads=False).time_s([])[0] == pytest.approx(
            want, rel=1e-12), n
    # the same batch of 37 with padding on replays the graph of 64
    pool = _decode_pool(37, 500)
    padded = replace(StepShape.uniform(37, 1, 500), tokens=64.0, logit_rows=64.0)
    assert StepPricer(c, pool, sizes).time_s([])[0] == pytest.approx(
        c.step_time(padded, sequences=37, prefill=False), rel=1e-12)
    eager = c.step_time(StepShape.uniform(37, 1, 500), sequences=37, prefill=False,
                        graphed=False)
    assert eager > c.step_time(StepShape.uniform(37, 1, 500), sequences=37, prefill=False)


def test_an_unpadded_engine_keys_its_graphs_by_requests_under_speculation():
    """TensorRT-LLM picks a decode graph by batch size, the requests, with speculation as
    without: 10 requests decoding 1 + 3 tokens each (40 tokens) replay the graph of 10; 33
    requests (between its sizes 32 and 64) run eagerly."""
    from planner.core.specs import Options as Opts
    from planner.layouts.speculation import SpeculationConfig
    from planner.serving.decoding import SpecDecodePool
    from planner.serving.requests import RequestResult, SimRequest
    from planner.serving.speculation import spec_serving

    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("trtllm")
    prep = prepare(hw, Precision(), None, Opts(), eng)
    c = StepCoster(m, hw, prep, Opts())
    cfg = SchedulerConfig.for_engine(eng, memory_bytes=hw.memory_bytes)
    spec = spec_serving(m, hw, prep, Opts(), tp=1, cfg=SpeculationConfig("ngram", 3, 0.5))
    for n, graphed in ((10, True), (32, True), (33, False)):
        pool = SpecDecodePool(PagedKV(10**9, 16), 16, spec)
        for i in range(n):
            q = SimRequest.of(RequestResult(i, 0.0, 500, 100))
            q.computed = 500
            pool.join(q)
        dec, _, _ = pool.shape(None)
        assert int(dec[0]) == 4 * n  # 1 + 3 tokens a request
        want = c.step_time(StepShape(*dec), sequences=n, prefill=False, graphed=graphed)
        got = StepPricer(c, pool, cfg.graph_sizes, cfg.graph_padding).time_s([])[0]
        assert got == pytest.approx(want + pool.draft_s(pool.shape(None)[2], []), rel=1e-12), n


@pytest.mark.parametrize("model, context, chunked, budget", [
    ("llama-3.1-8b", None, True, 512),     # 131,072 tokens of context: chunked, 512 a step
    ("llama-2-7b", None, False, 4096),     # 4,096: unchunked, the whole context a step
    ("llama-3.1-8b", 8192, False, 8192),   # --max-model-len 8192: unchunked
    ("llama-3.1-8b", 32768, False, 32768),  # 32K is not above 32K
    ("llama-3.1-8b", 1024, False, 2048),   # at least 2,048 tokens a step
])
def test_vllm_v0_chunks_prefill_by_default_only_above_32k_of_context(model, context, chunked,
                                                                      budget):
    """vLLM 0.6-0.7 (EngineArgs.create_engine_config, SchedulerConfig): chunked prefill is on
    by default for a max-model-len above 32K, with 512 tokens a step; at or below it a
    prompt is prefilled whole in a step of its own of max(max-model-len, 2048) tokens."""
    from planner.layouts.deployment import Deployment
    from planner.serving import run

    dep = Deployment.build(catalog.load_model(model), catalog.load_hardware("h100-sxm"),
                           engine=catalog.load_engine("vllm-v0"))
    cfg = run.scheduler(dep, **({} if context is None else {"max_model_len": context}))
    assert (cfg.chunked_prefill, cfg.mixed_batches, cfg.max_num_batched_tokens) == \
        (chunked, chunked, budget)
    assert cfg.max_num_seqs == 256


def test_vllm_v0_flags_stand_over_its_context_rule():
    """--no-chunked-prefill on a long context takes the whole context a step, as V0 does;
    --enable-chunked-prefill on a short one takes the 512-token chunks; a budget given
    stands as given. Other engines ignore the context length."""
    from planner.layouts.deployment import Deployment
    from planner.serving import run

    dep = Deployment.build(catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm"),
                           engine=catalog.load_engine("vllm-v0"))
    off = run.scheduler(dep, chunked_prefill=False)
    assert (off.chunked_prefill, off.mixed_batches, off.max_num_batched_tokens) == \
        (False, False, 131072)
    on = run.scheduler(dep, chunked_prefill=True, max_model_len=4096)
    assert (on.chunked_prefill, on.max_num_batched_tokens) == (True, 512)
    given = run.scheduler(dep, max_num_batched_tokens=2048, max_model_len=4096)
    assert given.max_num_batched_tokens == 2048
    v1 = Deployment.build(catalog.load_model("llama-2-7b"), catalog.load_hardware("h100-sxm"),
                          engine=catalog.load_engine("vllm"))
    cfg = run.scheduler(v1)
    assert (cfg.chunked_prefill, cfg.max_num_batched_tokens) == (True, 8192)


def test_guaranteed_no_evict_admits_whole_lengths_and_never_preempts():
    """A cache of 8,192 tokens; requests of 1,000 + 1,000 tokens (125 blocks of 16):
    no-evict runs at most 4 at once and preempts none; on-demand allocation admits more and
    then has to preempt."""
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("trtllm")
    prep = prepare(hw, Precision(), None, OPTS, eng)

    class Small(StepCoster):
        def kv_capacity_tokens(self, max_num_seqs, step_tokens):
            return 8192

    c = Small(m, hw, prep, OPTS)
    reqs = synthetic(12, prompt_tokens=1000, output_tokens=1000, seed=1)
    base = dict(max_num_seqs=64, max_num_batched_tokens=8192, block_size=16)
    whole = simulate(reqs, c, SchedulerConfig(capacity_policy="guaranteed-no-evict", **base))
    s = summary(whole)
    assert s["completed"] == 12 and s["preemptions"] == 0 and s["failed"] == 0
    assert s["max_running_requests"] == 8192 // 2000 == 4
    assert s["kv_cache_reserved_frac_peak"] == pytest.approx(4 * 2000 / 8192)
    greedy = summary(simulate(reqs, c, SchedulerConfig(**base)))
    assert greedy["completed"] == 12 and greedy["preemptions"] > 0
    assert greedy["max_running_requests"] > 4
    # the engine profile says so
    assert SchedulerConfig.for_engine(eng).capacity_policy == "guaranteed-no-evict"


def test_separate_prefill_makes_the_decodes_wait(vllm):
    """A decodes alone; B arrives during A's first decode step. Mixed (vLLM): B's prefill
    shares A's next step. Apart (SGLang): B's prefill runs alone, A's token waits for it, so
    there is one step more and A's gap across it is B's prefill plus the next decode. (Without
    async scheduling, whose one-step lag in admitting B is another test's.)"""
    eng, c = vllm
    eng = replace(eng, async_scheduling=False)
    c = c.with_engine(eng)
    reqs_of = lambda: [Request(0, 0.0, 16, 6), Request(1, 0.0, 4000, 2)]  # noqa: E731
    pre_a = c.step_time(StepShape.uniform(1, 16, 0), sequences=1, prefill=True,
                        decodes=False)
    d1 = c.step_time(StepShape.uniform(1, 1, 16), sequences=1, prefill=False)
    reqs = reqs_of()
    reqs[1] = Request(1, pre_a + d1 / 2, 4000, 2)
    base = dict(max_num_seqs=8, max_num_batched_tokens=8192)
    apart = simulate([replace(r) for r in reqs], c, SchedulerConfig(mixed_batches=False,
                                                                      **base))
    mixed = simulate([replace(r) for r in reqs], c, SchedulerConfig(**base))
    assert apart.steps == mixed.steps + 1
    a = apart.requests[0]
    # by hand: A's prefill, its first decode, B's prefill alone, then A and B decode together
    # (B's second token ends B), then A alone for the rest
    pre_b = c.step_time(StepShape.uniform(1, 4000, 0), sequences=1, prefill=True,
                        decodes=False)
    both = c.step_time(StepShape(2.0, 16 + 1 + 1 + 4000 + 1, 18 + 4001, 17 + 4000, 18 + 4001,
                                 2.0), sequences=2, prefill=False)
    t = pre_a
    assert a.first_token_s == pytest.approx(t, rel=1e-12)
    t += d1 + pre_b
    b = apart.requests[1]
    assert b.first_token_s == pytest.approx(t, rel=1e-12)
    t += both
    assert b.finish_s == pytest.approx(t, rel=1e-12)
    for ctx in (19, 20, 21):
        t += c.step_time(StepShape.uniform(1, 1, ctx - 1), sequences=1, prefill=False)
    assert a.finish_s == pytest.approx(t, rel=1e-9)
    # the ITL across B's prefill is counted once, as one long gap
    assert max(v for v, _ in apart.itl) == pytest.approx(pre_b + both, rel=1e-12)
    assert max(v for v, _ in mixed.itl) < pre_b + both


def test_a_recompute_that_outgrows_the_budget_is_refused(vllm):
    """Chunked prefill off, a step budget of 1,024 and a cache so small that requests are
    preempted: one preempted after generating more than 24 tokens would need to recompute
    1,000 + 25 > 1,024 tokens in one step, which vLLM V0 refuses; the rest are served."""
    eng, c0 = vllm

    class Small(StepCoster):
        def kv_capacity_tokens(self, max_num_seqs, step_tokens):
            return 6000

    c = Small(c0.model, c0.hardware, c0.prep, OPTS)
    reqs = synthetic(30, prompt_tokens=1000, output_tokens=400, seed=3)
    res = simulate(reqs, c, SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=1024,
                                            chunked_prefill=False))
    s = summary(res)
    assert s["preemptions"] > 0 and 0 < s["failed"] < 30
    assert s["completed"] + s["failed"] == 30 and s["in_flight"] == 0
    for r in res.requests:
        if r.failed:
            assert r.failed.startswith("its recompute (") and "(1,024)" in r.failed
            assert r.preemptions >= 1 and math.isnan(r.finish_s)
    assert "recompute" in s["failed_reason"]


def test_a_request_larger_than_the_cache_is_refused_not_fatal(vllm):
    eng, c = vllm
    cap = c.kv_capacity_tokens(256, 8192)
    reqs = [Request(0, 0.0, 100, 10), Request(1, 0.0, cap, 10), Request(2, 0.0, 100, 10)]
    res = simulate(reqs, c, SchedulerConfig())
    s = summary(res)
    assert s["completed"] == 2 and s["failed"] == 1
    assert f"the replica holds {cap // 16 * 16:,}" in res.requests[1].failed


def _one_at_a_time(n: int, prompt: int, output: int, prefixes: list[int],
                   prefix_tokens: int) -> list[Request]:
    """Requests 100 s apart (each is done before the next arrives), with these prefix ids."""
    return [Request(i, 100.0 * i, prompt, output, prefixes[i], prefix_tokens)
            for i in range(n)]


def test_async_scheduling_admits_an_arrival_the_step_after_next(vllm):
    """vLLM's engine core schedules step N + 1 as it launches step N. A decodes alone; B
    arrives halfway through A's first decode step, when the step after it is already
    scheduled: B's prefill waits for that step too, so B's first token comes no sooner than
    half a decode step, a whole one and a step at least as long as a decode (its own) after
    it arrives. Scheduled as it arrives (async off), B joins the very next step."""
    eng, c = vllm
    pre_a = idle_coster(c).step_time(StepShape.uniform(1, 16, 0), sequences=1, prefill=True,
                                     decodes=False)
    d1 = c.step_time(StepShape.uniform(1, 1, 16), sequences=1, prefill=False)
    d2 = c.step_time(StepShape.uniform(1, 1, 17), sequences=1, prefill=False)
    reqs = [Request(0, 0.0, 16, 6), Request(1, pre_a + d1 / 2, 4, 2)]
    a, b = simulate([replace(r) for r in reqs], c, SchedulerConfig()).requests
    assert a.first_token_s == pytest.approx(pre_a, rel=1e-12)  # an idle engine's first step
    assert b.ttft_s >= d1 / 2 + d2 + d2
    now = simulate([replace(r) for r in reqs], idle_coster(c), SchedulerConfig()).requests[1]
    assert now.ttft_s < d1 / 2 + d2 + d2


def test_a_cached_prefix_is_computed_once(vllm):
    """Ten requests of 3,000 prompt tokens whose first 2,010 are shared, one at a time: the
    first computes all 3,000; 2,010 is not whole 16-token blocks, so 2,000 are cached and each
    later one computes 1,000: the hit rate is 9 x 2,000 / 30,000, and their TTFT is a
    1,000-token prefill after 2,000 cached tokens."""
    eng, c = vllm
    reqs = _one_at_a_time(10, 3000, 50, [7] * 10, 2010)
    on = simulate(reqs, c, SchedulerConfig(prefix_caching=True))
    s = summary(on)
    assert s["prefix_cache_hit_rate"] == pytest.approx(9 * 2000 / 30000, rel=1e-12)
    assert [r.cached_tokens for r in on.requests] == [0] + [2000] * 9
    # each prefill is the first step of an idle engine: no step before it to hide its host
    # work under (async scheduling)
    idle = idle_coster(c)
    cold = idle.step_time(StepShape.uniform(1, 3000, 0), sequences=1, prefill=True,
                          decodes=False)
    warm = idle.step_time(StepShape.uniform(1, 1000, 2000), sequences=1, prefill=True,
                          decodes=False)
    assert on.requests[0].ttft_s == pytest.approx(cold, rel=1e-12)
    assert all(r.ttft_s == pytest.approx(warm, rel=1e-12) for r in on.requests[1:])
    off = simulate(reqs, c, SchedulerConfig())
    assert summary(off)["prefix_cache_hit_rate"] is None
    assert all(r.ttft_s == pytest.approx(cold, rel=1e-12) for r in off.requests)
    # different prefixes share nothing
    other = simulate(_one_at_a_time(10, 3000, 50, list(range(10)), 2010), c,
                     SchedulerConfig(prefix_caching=True))
    assert summary(other)["prefix_cache_hit_rate"] == 0.0


def test_unused_prefixes_are_evicted_least_recently_used_first(vllm):
    """A cache of 4,096 tokens and prefixes of 1,024: after four requests the pool is full of
    cached prefixes no one uses; the fifth evicts the oldest (prefix 0) rather than wait or
    preempt, so prefix 0 misses when it returns and prefix 4 hits."""
    eng, c0 = vllm

    class Small(StepCoster):
        def kv_capacity_tokens(self, max_num_seqs, step_tokens):
            return 4096

    c = Small(c0.model, c0.hardware, c0.prep, OPTS)
    order = [0, 1, 2, 3, 4, 0, 4]
    res = simulate(_one_at_a_time(7, 1040, 10, order, 1024), c,
                   SchedulerConfig(prefix_caching=True))
    s = summary(res)
    assert s["completed"] == 7 and s["preemptions"] == 0
    assert [r.cached_tokens for r in res.requests] == [0, 0, 0, 0, 0, 0, 1024]


def test_concurrent_requests_share_one_copy_of_a_prefix(vllm):
    """Forty requests at once after one that cached a 4,096-token prefix: the cache holds
    one copy, so the KV holding data stays below the forty private copies' worth."""
    eng, c = vllm
    first = [Request(0, 0.0, 4196, 4, 1, 4096)]
    rest = [Request(i, 10.0, 4196, 64, 1, 4096) for i in range(1, 41)]
    res = simulate(first + rest, c, SchedulerConfig(prefix_caching=True))
    s = summary(res)
    cap = s["kv_capacity_tokens"]
    assert s["prefix_cache_hit_rate"] == pytest.approx(40 * 4096 / (41 * 4196), rel=1e-12)
    one_copy = 4096 + 40 * (100 + 64)
    assert s["kv_cache_used_frac_peak"] * cap <= one_copy
    assert s["kv_cache_reserved_frac_peak"] * cap <= one_copy + 40 * 16


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(0, 3), st.integers(1, 2000), st.integers(1, 300),
       st.sampled_from([0.5, 5.0, math.inf]), st.booleans(), st.booleans())
def test_any_stream_with_prefixes_completes(n, groups, p, o, rate, whole, mixed):
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("vllm")
    prep = prepare(hw, Precision(), None, OPTS, eng)

    class Small(StepCoster):  # tight enough to evict and preempt
        def kv_capacity_tokens(self, max_num_seqs, step_tokens):
            return 12_000

    c = Small(m, hw, prep, OPTS)
    reqs = synthetic(n, prompt_tokens=p, output_tokens=o, request_rate=rate, seed=n)
    reqs = [replace(r, prefix_id=(i % groups) if groups else -1,
                    prefix_tokens=min(r.prompt_tokens, 1 + p // 2) if groups else 0)
            for i, r in enumerate(reqs)]
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048, prefix_caching=True,
                          capacity_policy="guaranteed-no-evict" if whole else
                          "max-utilization", mixed_batches=mixed)
    res = simulate(reqs, c, cfg)
    s = summary(res)
    assert s["completed"] + s["failed"] == n and s["in_flight"] == 0
    assert s["kv_cache_reserved_frac_peak"] <= 1.0
    assert 0.0 <= s["prefix_cache_hit_rate"] < 1.0
    for r in res.requests:
        assert r.failed or r.arrival_s <= r.first_token_s <= r.finish_s
        assert 0 <= r.cached_tokens < r.prompt_tokens + r.output_tokens


def test_a_conversation_extends_its_cached_prefix_turn_by_turn(vllm):
    """Three turns of one conversation (the same prefix id, each turn's prefix the previous
    turn's prompt and answer): turn 2 finds turn 1's prompt cached (992 of its 1,000 tokens,
    whole blocks) and caches its own 1,200-token prefix; turn 3 finds those 1,200. The
    answers' own blocks are not cached (vLLM would also reuse them: an under-estimate of
    200 tokens a turn)."""
    eng, c = vllm
    turns = [Request(0, 0.0, 1000, 200, 5, 1000), Request(1, 100.0, 1500, 200, 5, 1200),
             Request(2, 200.0, 2000, 200, 5, 1700)]
    res = simulate(turns, c, SchedulerConfig(prefix_caching=True))
    assert [r.cached_tokens for r in res.requests] == [0, 992, 1200]
    assert summary(res)["prefix_cache_hit_rate"] == pytest.approx((992 + 1200) / 4500)


def test_prefixes_cached_before_the_run_are_found(vllm):
    """A server that served each prompt's first 1,000 tokens in an earlier run (Scicom's runs
    of longer prompts with the same seed): each request finds its own 992 tokens (whole
    blocks of 16) cached and prefills the rest; the cache holds them out of the free pool
    from the start. With prefix caching off the server kept nothing."""
    eng, c = vllm
    reqs = [Request(i, 0.0, 2000, 50, i, 1000) for i in range(4)]
    warm = {i: 1000 for i in range(4)}
    cfg = SchedulerConfig(prefix_caching=True)
    res = simulate(reqs, c, cfg, warm_prefixes=warm)
    cold = simulate(reqs, c, cfg)
    assert [r.cached_tokens for r in res.requests] == [992] * 4
    assert [r.cached_tokens for r in cold.requests] == [0] * 4
    assert max(r.first_token_s for r in res.requests) < \
        0.75 * max(r.first_token_s for r in cold.requests)
    off = simulate(reqs, c, SchedulerConfig(prefix_caching=False), warm_prefixes=warm)
    assert [r.cached_tokens for r in off.requests] == [0] * 4
    pool = PagedKV(5000, 16)
    from planner.serving.kv import PrefixCache
    pool.prefixes = PrefixCache(16)
    assert pool.warm({0: 1000, 1: 1000, 2: 4000}) == 992 + 992 + 3008  # while there is room
    assert pool.free_tokens == 5000 // 16 * 16 - 4992


def test_a_request_beyond_max_model_len_is_refused(vllm):
    """vLLM's server answers 400 to a request whose prompt and output exceed max-model-len;
    the rest are served."""
    eng, c = vllm
    reqs = [Request(0, 0.0, 3000, 100), Request(1, 0.0, 4000, 97), Request(2, 0.0, 4000, 96)]
    res = simulate(reqs, c, SchedulerConfig(max_model_len=4096))
    assert [bool(r.failed) for r in res.requests] == [False, True, False]
    assert res.requests[1].failed == "4,000 + 97 tokens exceed max-model-len (4,096)"


def test_sglang_admits_as_its_prefill_adder_does_and_vllm_does_not():
    """SGLang's profile states its GlobalConfig: the ratio starts at 0.7, falls over 600
    decode steps to 0.7 x 0.14 = 0.098, outputs count up to 4,096 tokens, a retraction adds
    20 steps a request and takes the fewest outputs first; vLLM's and TensorRT-LLM's hold
    nothing back for future tokens."""
    s = SchedulerConfig.for_engine(catalog.load_engine("sglang"))
    init, low, fall, clip, retract, fewest_first = s.decode_reserve
    assert (init, clip, retract, fewest_first) == (0.7, 4096, 20, True)
    assert low == pytest.approx(0.098) and fall == pytest.approx((0.7 - 0.098) / 600)
    for name in ("vllm", "vllm-0.8", "trtllm"):
        assert SchedulerConfig.for_engine(catalog.load_engine(name)).decode_reserve is None


def test_sglangs_admission_spares_the_preemptions_of_a_tight_kv_pool():
    """Qwen3-32B in bf16 on one H100 leaves SGLang a small KV pool: 400 requests sent at
    once, admitted as vLLM admits them, preempt hundreds of times; held back as SGLang
    holds them, a few, with fewer running at once."""
    m, hw = catalog.load_model("qwen3-32b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("sglang")
    coster = StepCoster(m, hw, prepare(hw, Precision(), None, OPTS, eng), OPTS)
    reqs = synthetic(400, prompt_tokens=220, output_tokens=200, seed=3)
    sglang = SchedulerConfig.for_engine(eng, memory_bytes=hw.memory_bytes)
    held = simulate([replace(r) for r in reqs], coster, sglang)
    eager = simulate([replace(r) for r in reqs], coster, replace(sglang, decode_reserve=None))
    assert eager.preemptions > 100 > held.preemptions
    assert held.max_running < eager.max_running


def test_simulate_takes_sglangs_max_prefill_tokens(run_json, run_cli):
    """SGLang's profile bounds a prefill step's new tokens at 16,384 and says so; a server's
    --max-prefill-tokens moves it: with 6,000-token prompts arriving at once and a budget of
    32,768, 16,384 lets two whole prompts a step (a third would not be under the 4,384 left),
    where a bound of a million lets five and a chunk of a sixth: smaller prefill steps let
    the first requests out sooner (the mean first token earlier) and the last later (more
    steps, each with its own cost); vLLM has no such bound."""
    base = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "60",
            "--request-rate", "inf", "-p", "6000", "-o", "50", "--max-num-batched-tokens",
            "32768")
    own = run_json(*base, "-e", "sglang")
    loose = run_json(*base, "-e", "sglang", "--max-prefill-tokens", "1000000")
    assert (own["max_prefill_tokens"], loose["max_prefill_tokens"]) == (16384, 1_000_000)
    assert own["mean_ttft_ms"] < loose["mean_ttft_ms"]
    assert own["p99_ttft_ms"] > loose["p99_ttft_ms"]
    assert run_json(*base, "-e", "vllm")["max_prefill_tokens"] is None
    code, _, err = run_cli(*base, "-e", "sglang", "--max-prefill-tokens", "0")
    assert code == 2 and err.strip().count("\n") == 0 and "--max-prefill-tokens" in err
    # sent with ignore_eos to a server whose prefix cache is off, a long prompt is chunked
    # beside the others (add_one_req_ignore_eos): the steps differ; with the cache on, not
    off = (*base, "-e", "sglang", "--max-prefill-tokens", "32768", "-p", "7000")
    assert run_json(*off, "--prefix-cache", "off", "--ignore-eos")["ignore_eos"] is True
    assert run_json(*off, "--prefix-cache", "off", "--ignore-eos")["mean_ttft_ms"] != \
        run_json(*off, "--prefix-cache", "off")["mean_ttft_ms"]
    assert run_json(*off, "--ignore-eos")["mean_ttft_ms"] == run_json(*off)["mean_ttft_ms"]


def test_sglang_without_chunking_runs_long_prompts_that_vllm_refuses(run_json, run_cli):
    """20,000-token prompts with chunked prefill off: SGLang prefills each whole (its
    PrefillAdder has no chunk bound then), vLLM refuses them beyond max-num-batched-tokens;
    --max-prefill-tokens is SGLang's alone."""
    base = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "10", "--request-rate",
            "1", "-p", "20000", "-o", "20", "--no-chunked-prefill")
    d = run_json(*base, "-e", "sglang")
    assert d["completed"] == 10 and d["failed"] == 0
    code, _, err = run_cli(*base, "-e", "vllm")
    assert code == 2 and "exceeds max-num-batched-tokens (8,192)" in err
    code, _, err = run_cli(*base, "-e", "vllm", "--max-prefill-tokens", "4096")
    assert code == 2 and "engine vllm has none" in err
    # estimate says so too: SGLang's profile with chunking off refuses no prompt
    sglang = catalog.load_engine("sglang")
    assert not replace(sglang, chunked_prefill=False).refuses_prompt(20000)
    assert replace(catalog.load_engine("vllm"), chunked_prefill=False).refuses_prompt(20000)


def test_simulate_takes_tensorrt_llm_s_batch_waiting(run_json, run_cli):
    """--batch-wait-timeout-iters / --batch-wait-max-tokens-ratio (TorchLlmArgs' keys): a
    closed loop of 64 clients whose lengths spread gets its first tokens later when prefills
    are held back for a batch; refused in one line for an engine without the executor, or
    out of range."""
    base = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--max-concurrency", "64",
            "-n", "400", "-p", "1000", "-o", "300", "--range-ratio", "0.2")
    plain = run_json(*base, "-e", "trtllm")
    held = run_json(*base, "-e", "trtllm", "--batch-wait-timeout-iters", "40",
                    "--batch-wait-max-tokens-ratio", "0.8")
    assert (held["batch_wait_iters"], held["batch_wait_tokens_ratio"]) == (40, 0.8)
    assert held["median_ttft_ms"] > plain["median_ttft_ms"]
    code, _, err = run_cli(*base, "-e", "vllm", "--batch-wait-timeout-iters", "4")
    assert code == 2 and "engine vllm has none" in err
    code, _, err = run_cli(*base, "-e", "trtllm", "--batch-wait-max-tokens-ratio", "nan")
    assert code == 2 and "within 0-1" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("computed,chunk,target", [(0, 2048, 20_000), (16_384, 2048, 20_000),
                                                   (18_000, 2000, 20_000)])
def test_a_chunk_that_does_not_finish_its_prompt_takes_logits_where_the_engine_does(
        vllm, computed, chunk, target):
    """vLLM's V1 runner, SGLang and TensorRT-LLM (both backends) compute a row of logits for
    every request of a step, a prompt chunk that does not finish its prompt too, and throw its
    token away (read in their source: engines_db ``serving.partial_prefill_logits``); vLLM's
    V0 samples only a finishing chunk. Such a step costs the head over one row more:
    ``head_s(1)``, the final norm and the lm_head's weights."""
    from planner.serving.requests import RequestResult, SimRequest

    assert catalog.load_engine("vllm").partial_prefill_logits
    assert catalog.load_engine("sglang").partial_prefill_logits
    assert catalog.load_engine("vllm-0.8").partial_prefill_logits
    assert catalog.load_engine("trtllm").partial_prefill_logits  # its PyTorch backend
    assert not catalog.load_engine("vllm-v0").partial_prefill_logits
    assert catalog.load_engine("trtllm-engine").partial_prefill_logits  # its C++ runtime
    _, c = vllm
    q = SimRequest.of(RequestResult(0, 0.0, target, 100))
    q.computed = computed
    pool = _decode_pool(0, 0)
    every, _ = StepPricer(c, pool).time_s([(q, chunk)])
    c_v0 = c.with_engine(replace(c.engine, partial_prefill_logits=False))
    only_last, _ = StepPricer(c_v0, pool).time_s([(q, chunk)])
    if computed + chunk >= target:  # it finishes: it samples either way
        assert every == only_last
    else:
        assert every - only_last == pytest.approx(c.head_s(1, False), rel=1e-9)
        assert c.head_s(1, False) > 0.1e-3  # 8B's lm_head, 1 GB of weights a read
