"""vLLM's hybrid KV cache manager in the simulator's pool (planner/serving/kv.py
``HybridPagedKV``): the groups as vLLM forms them, a request's blocks worked by hand, the
scheduler's accounting closing to zero, and the concurrency it buys a gpt-oss replica."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.estimate import prepare
from planner.core.memory import kv_cache_groups
from planner.core.specs import DType, Options, Precision
from planner.io import catalog
from planner.serving.config import SchedulerConfig
from planner.serving.cost import StepCoster
from planner.serving.decoding import DecodePool
from planner.serving.kv import HybridPagedKV, PagedKV, kv_pool
from planner.serving.requests import RequestResult, RequestState, SimRequest
from planner.serving.schedulers import ContinuousScheduler
from planner.serving.sim import simulate
from planner.serving.traffic import Request, synthetic


def _req(i: int, prompt: int, output: int) -> SimRequest:
    return SimRequest.of(RequestResult(i, 0.0, prompt, output))


def test_groups_as_vllm_forms_them():
    """vLLM's _get_kv_cache_groups_uniform_page_size: a group holds as many layers as the
    kind with fewer (as many as the kind with more where that is under 1.5 times the other).
    gpt-oss-120b: 18 full, 18 sliding -> groups of 18, one of each. Gemma-3-27B: 62 layers,
    every sixth full (10), 52 sliding -> groups of 10, one full and ceil(52 / 10) = 6
    sliding. A model with no sliding layer, or only sliding ones, has no hybrid groups."""
    assert kv_cache_groups(catalog.load_model("gpt-oss-120b")) == (18, 1, 1)
    assert kv_cache_groups(catalog.load_model("gpt-oss-20b")) == (12, 1, 1)
    assert kv_cache_groups(catalog.load_model("gemma-3-27b")) == (10, 1, 6)
    assert kv_cache_groups(catalog.load_model("gemma-2-9b")) == (21, 1, 1)
    assert kv_cache_groups(catalog.load_model("llama-3.1-8b")) is None
    assert kv_cache_groups(catalog.load_model("mistral-7b")) is None  # every layer slides


def test_a_request_holds_its_length_in_the_full_group_and_the_window_in_each_sliding_one():
    """Blocks of 16, a window of 128, steps of 256 tokens: a sliding group keeps at most
    ceil(127 / 16) + 1 = 9 blocks (remove_skipped_blocks frees those before (computed - 127)
    // 16), and a chunk takes at most ceil((127 + 256) / 16) + 1 = 25 while it is computed.
    A 100-token prompt of 900 output tokens, admitted: 7 full blocks and 2 x 9 sliding ones
    for its whole length. A chunk of 256 from token 500: 48 full blocks, and in each sliding
    group blocks 23 ((500 - 127) // 16) to 47, 25 of them, 2 x 25 - 2 x 9 = 32 more than it
    keeps, given back once the chunk is computed."""
    kv = HybridPagedKV(16_000, 16, sliding_groups=2, window=128, step_tokens=256)
    assert (kv.window_blocks, kv.chunk_blocks) == (9, 25)
    assert kv.tokens_for(1000) == (63 + 2 * 25) * 16  # the most it holds at once
    assert kv.tokens_for(100) == (7 + 2 * 7) * 16
    q = _req(0, 100, 900)
    assert kv.reserve(q, 100)
    assert q.reserved == (7 + 18) * 16 and kv.window_reserved == 18 * 16
    assert kv.extra_for(q, 1000) == (63 - 7) * 16  # decoding: the full group's blocks only
    kv.release(q)
    assert kv.free_tokens == kv.capacity_tokens and kv.window_reserved == 0
    q = _req(1, 2000, 10)
    assert kv.reserve(q, 256)
    assert q.reserved == (16 + 2 * 16) * 16  # its first chunk: 16 blocks in every group
    q.state, q.computed = RequestState.PREFILLING, 500
    q.reserved = (32 + 2 * 16) * 16  # as if it had computed 500 tokens
    assert kv.extra_for(q, 756) == (48 + 2 * 25) * 16 - q.reserved
    kv.grow(q, kv.extra_for(q, 756))
    q.computed = 756
    kv.after_chunk(q)
    assert q.reserved == (48 + 2 * 9) * 16


def test_kv_pool_builds_the_hybrid_pool_where_asked():
    kv = kv_pool("paged", 1600, block_size=16, max_model_len=4096, sliding=(1, 128, 256))
    assert isinstance(kv, HybridPagedKV)
    assert type(kv_pool("paged", 1600, block_size=16, max_model_len=4096)) is PagedKV


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.integers(1, 300)), min_size=1,
                max_size=12),
       st.integers(40, 160), st.sampled_from([16, 32, 128]), st.integers(1, 3))
def test_every_block_comes_back(lengths, blocks, window, sliding):
    """Whatever the requests, the pool's size, the window and the sliding groups: each step
    reserves no more than the pool holds, and once every request is done (through
    preemptions and recomputes) every block is free again and no sliding block is counted
    as held."""
    bs = 16
    kv = HybridPagedKV(blocks * bs, bs, sliding_groups=sliding, window=window,
                       step_tokens=256)
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, block_size=bs)
    sched = ContinuousScheduler(cfg, kv, DecodePool(kv, bs))
    reqs = [_req(i, p, o) for i, (p, o) in enumerate(lengths)
            if kv.tokens_for(p + o) <= kv.capacity_tokens]
    sched.waiting.extend(reqs)
    for step in range(20_000):
        if sched.finished == len(reqs):
            break
        chunks = sched.schedule()
        assert 0 <= kv.free_tokens <= kv.capacity_tokens
        if sched.batch.n:
            sched.batch.step()
        sched.on_step_end(chunks, float(step))
    assert sched.finished == len(reqs)
    assert kv.free_tokens == kv.capacity_tokens and kv.window_reserved == 0


def _run(engine: str, n: int = 24) -> tuple[int, int]:
    """gpt-oss-120b (MXFP4) on one H100 under ``engine``: ``n`` requests of 16,000 + 200
    tokens at once; (the pool's capacity in tokens, the most requests running)."""
    m, hw = catalog.load_model("gpt-oss-120b"), catalog.load_hardware("h100-sxm")
    eng, opts = catalog.load_engine(engine), Options()
    prep = prepare(hw, Precision(weights=DType.mxfp4), None, opts, eng)
    coster = StepCoster(m, hw, prep, opts)
    cfg = SchedulerConfig.for_engine(eng, memory_bytes=hw.memory_bytes)
    res = simulate(synthetic(n, prompt_tokens=16_000, output_tokens=200), coster, cfg)
    assert not res.failed
    return res.kv_capacity_tokens, res.max_running


def test_gpt_oss_holds_about_twice_the_long_requests_with_the_hybrid_manager():
    """Half of gpt-oss-120b's layers slide over 128 tokens: with the hybrid manager (vLLM
    0.10 and later) a request of 16,200 tokens holds 1,013 blocks of its full group and 9 of
    its sliding one where vLLM 0.9 held 1,013 in every layer, so the same memory (twice the
    blocks, each of 18 layers instead of 36) holds 2 x 1,013 / 1,022 = 1.98 times as many:
    4 whole requests before, 8 after (each run also holds one more whose first chunk fits
    beside them, the rest of its prompt to come)."""
    before, running_before = _run("vllm@0.9")
    after, running_after = _run("vllm@0.10")
    assert abs(after - 2 * before) <= 32  # the same memory in blocks of one group
    assert before // (1013 * 16) == 4 and after // ((1013 + 9) * 16) == 8
    # running at most: those whole requests, and one more whose first chunk fits beside them
    assert (running_before, running_after) == (4 + 1, 8 + 1)


def test_vllms_flag_turns_it_off_on_the_command_line_and_in_a_server_command(run_json,
                                                                             run_cli):
    """--disable-hybrid-kv-cache-manager (vLLM's name) or --no-hybrid-kv-cache: the pool of
    every layer at full context, half the tokens; a server command with vLLM's flag says
    the same to a replay; two spellings that disagree are refused."""
    from planner.cli.flags import server_flags

    args = ("simulate", "-m", "gpt-oss-120b", "-g", "h100-sxm", "--weights", "mxfp4",
            "-n", "4", "-p", "2000", "-o", "20")
    on = run_json(*args)
    off = run_json(*args, "--disable-hybrid-kv-cache-manager")
    assert on["hybrid_kv_cache"] and not off["hybrid_kv_cache"]
    # half, within the rounding of each pool to whole 64-token blocks (vLLM 0.34's)
    assert abs(on["kv_capacity_tokens"] - 2 * off["kv_capacity_tokens"]) <= 2 * 64
    assert run_json(*args, "--no-hybrid-kv-cache")["kv_capacity_tokens"] == \
        off["kv_capacity_tokens"]
    # a model with no sliding layer is not changed by it
    dense = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "4")
    assert not run_json(*dense)["hybrid_kv_cache"]
    assert run_json(*dense)["kv_capacity_tokens"] == \
        run_json(*dense, "--no-hybrid-kv-cache")["kv_capacity_tokens"]
    code, _, err = run_cli(*args, "--hybrid-kv-cache", "--disable-hybrid-kv-cache-manager")
    assert code == 2 and "disagree" in err
    assert server_flags("vllm serve openai/gpt-oss-120b --disable-hybrid-kv-cache-manager") \
        == {"--hybrid-kv-cache": False}


def test_one_long_request_needs_what_vllm_said_it_needs():
    """vLLM (vllm-project/vllm#27508, 2025-10-31: `vllm serve openai/gpt-oss-120b
    --gpu-memory-utilization 0.95 --max-num-batched-tokens 1024` on an H100) refused to start
    with "To serve at least one request with the models's max seq len (131072), (4.54 GiB KV
    cache is needed". By hand, a token takes 8 KV heads x 64 x 2 (K and V) x 2 bytes = 2,048
    bytes a layer; one group holds 18 layers. The most one request of 131,072 tokens holds:
    8,192 blocks of 16 in the full group, and in the sliding one a step's chunk and the
    window before it, ceil((127 + 1,024) / 16) + 1 = 73 blocks: (8,192 + 73) x 16 x 18 x
    2,048 bytes = 4.54 GiB. Once the chunks are done it keeps 9 sliding blocks, 4.505 GiB;
    every layer at full context, as before the manager, would be 9.0 GiB."""
    from planner.core.memory import kv_cache_bytes_per_token

    m, prec = catalog.load_model("gpt-oss-120b"), Precision(weights=DType.mxfp4)
    per_group_bytes = kv_cache_bytes_per_token(m, prec) / m.num_layers * 18
    assert per_group_bytes == 18 * 2048
    kv = HybridPagedKV(10**9, 16, sliding_groups=1, window=m.sliding_window, step_tokens=1024)
    assert round(kv.tokens_for(131_072) * per_group_bytes / 2**30, 2) == 4.54
    q = _req(0, 131_000, 72)
    assert round(kv.need_for(q, 131_072) * per_group_bytes / 2**30, 3) == 4.505
    assert round(kv_cache_bytes_per_token(m, prec) * 131_072 / 2**30, 2) == 9.0


def test_a_static_batch_keeps_its_whole_reservation():
    """Static batching reserves each request's whole length at admission (no chunk takes
    more, none gives any back): 300 + 100 tokens in blocks of 16, a window of 128, one
    sliding group: 25 full blocks and 9 sliding ones, held through the prefill and the
    decodes, all free again once the batch is done."""
    from planner.serving.schedulers import StaticScheduler

    kv = HybridPagedKV(4000, 16, sliding_groups=1, window=128, step_tokens=None)
    cfg = SchedulerConfig(kind="static", max_num_seqs=4, max_num_batched_tokens=256,
                          block_size=16)
    sched = StaticScheduler(cfg, kv, DecodePool(kv, 16))
    q = _req(0, 300, 100)
    sched.waiting.append(q)
    for step in range(1000):
        if sched.finished:
            break
        chunks = sched.schedule()
        if q.state is not RequestState.FINISHED:
            assert q.reserved == (25 + 9) * 16
        if sched.batch.n:
            sched.batch.step()
        sched.on_step_end(chunks, float(step))
    assert sched.finished == 1 and kv.free_tokens == kv.capacity_tokens


def test_simulate_gives_a_static_batch_the_whole_reservation():
    """Through ``simulate``: one request of 300 + 100 tokens of gpt-oss-20b, batched
    statically, reserves 25 full blocks and 9 sliding ones (544 tokens of one group) and
    nothing more at any step (continuous batching would take its prompt's 19 sliding blocks
    for the step that computes it)."""
    m, hw = catalog.load_model("gpt-oss-20b"), catalog.load_hardware("h100-sxm")
    # a release of 16-token blocks (0.34 takes 64)
    eng, opts = catalog.load_engine_spec("vllm").at_version("0.33").model(), Options()
    coster = StepCoster(m, hw, prepare(hw, Precision(weights=DType.mxfp4), None, opts, eng),
                        opts)
    req = [Request(0, 0.0, 300, 100)]
    static = SchedulerConfig.for_engine(eng, memory_bytes=hw.memory_bytes, kind="static")
    assert simulate(req, coster, static).peak_kv_reserved_tokens == (25 + 9) * 16
    cont = SchedulerConfig.for_engine(eng, memory_bytes=hw.memory_bytes)
    assert simulate(req, coster, cont).peak_kv_reserved_tokens == (19 + 19) * 16
