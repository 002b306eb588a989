"""The simulator's parts one at a time (planner/serving/: requests, kv, decoding, schedulers,
arrivals, occupancy), against counts worked by hand."""

from __future__ import annotations

import math
from collections import deque

import pytest

from planner.core.engine import ReserveRule
from planner.core.errors import UsageError
from planner.io import catalog
from planner.layouts.speculation import SpeculationConfig
from planner.serving.arrivals import Arrivals, ClosedLoop
from planner.serving.config import SchedulerConfig
from planner.serving.decoding import DecodePool, SpecDecodePool
from planner.serving.kv import ContiguousKV, PagedKV, kv_pool
from planner.serving.occupancy import Occupancy
from planner.serving.requests import RequestResult, RequestState, SimRequest
from planner.serving.schedulers import (
    SCHEDULERS,
    ContinuousScheduler,
    DynamicScheduler,
    StaticScheduler,
    make_scheduler,
)
from planner.serving.speculation import SpecServing


def _req(i: int, prompt: int, output: int, arrival_s: float = 0.0) -> SimRequest:
    return SimRequest.of(RequestResult(i, arrival_s, prompt, output))


def _step(sched, now: float) -> list:
    """One step as the event loop runs it, less the pricing."""
    chunks = sched.schedule()
    if sched.batch.n:
        sched.batch.step()
    sched.on_step_end(chunks, now)
    return chunks


def test_a_state_is_a_member_not_a_string():
    with pytest.raises(AttributeError):
        RequestState.DECODNG  # noqa: B018 (the typo a bare string let through)
    with pytest.raises(ValueError):
        RequestState("decode")  # the old spelling is no state
    assert RequestState.DECODING != "decoding"
    done = {s for s in RequestState if s.finished}
    assert done == {RequestState.PADDING_PREFILLED, RequestState.PADDING,
                    RequestState.FINISHED}


def test_paged_pool_counts_whole_blocks():
    """1,000 tokens in blocks of 16: 62 blocks (992 tokens); 17 tokens take 2 blocks, 33 take
    3; a request that needs more than is free gets nothing."""
    kv = PagedKV(1000, 16)
    assert (kv.capacity_tokens, kv.num_blocks, kv.free_blocks) == (992, 62, 62)
    a, b = _req(0, 17, 1), _req(1, 1, 1)
    assert kv.reserve(a, 17) and a.reserved == 32 and kv.free_tokens == 960
    assert kv.blocks(17) == 2 and kv.blocks(32) == 2 and kv.blocks(33) == 3
    assert kv.extra_for(a, 32) == 0 and kv.extra_for(a, 33) == 16
    kv.grow(a, kv.extra_for(a, 33))
    assert a.reserved == 48 and kv.free_tokens == 944 and kv.reserved_tokens == 48
    kv.grow(a, kv.extra_for(a, 20))  # holds more than 20 already: nothing changes
    assert a.reserved == 48 and kv.free_tokens == 944
    assert not kv.reserve(b, 945) and b.reserved == 0 and kv.free_tokens == 944
    assert kv.reserve(b, 944) and kv.free_tokens == 0 and kv.free_blocks == 0
    kv.release(a)
    assert a.reserved == 0 and kv.free_tokens == 48 and kv.free_blocks == 3
    kv.release(b)
    assert kv.free_tokens == kv.capacity_tokens


def test_contiguous_pool_reserves_max_model_len_whatever_the_length():
    kv = ContiguousKV(10_000, 4096)
    assert kv.capacity_tokens == 10_000 and kv.block_growth_tokens == 0  # no rounding
    a, b, c = _req(0, 1, 1), _req(1, 3000, 1), _req(2, 1, 1)
    assert kv.reserve(a, 1) and kv.reserve(b, 3000) and a.reserved == b.reserved == 4096
    assert kv.extra_for(b, 4096) == 0 and not kv.reserve(c, 1)  # 1,808 left
    kv.release(a)
    assert kv.free_tokens == 10_000 - 4096


def test_kv_pool_picks_the_layout():
    assert isinstance(kv_pool("paged", 100, block_size=16, max_model_len=64), PagedKV)
    assert isinstance(kv_pool("contiguous", 100, block_size=16, max_model_len=64), ContiguousKV)
    with pytest.raises(UsageError, match="kv-layout"):
        kv_pool("pagd", 100, block_size=16, max_model_len=64)


def test_decode_pool_keeps_contexts_and_blocks_in_aggregate():
    """Contexts 5, 8 and 12 (blocks of 4) with 3, 2 and 9 tokens to go: their sum grows by 3
    a step; those at 8 and 12 open a block with their next token, the one at 5 three steps
    later; each is due at the step its last token comes."""
    kv = PagedKV(400, 4)
    pool = DecodePool(kv, 4)
    reqs = [_req(i, p, o) for i, (p, o) in enumerate([(5, 4), (8, 3), (12, 10)])]
    for q in reqs:
        q.computed, q.generated = q.r.prompt_tokens, 1
        pool.join(q)
    assert all(q.state is RequestState.DECODING for q in reqs)
    assert [q.finish_G for q in reqs] == [3, 2, 9]
    assert pool.shape(None)[2] == 25 and pool.growth_tokens() == 2 * 4
    pool.step()
    assert pool.shape(None)[2] == 28 and pool.growth_tokens() == 0
    assert pool.pop_due() is None
    pool.step()
    assert [pool.context(q) for q in reqs] == [7, 10, 14]
    assert pool.pop_due() is reqs[1]
    reqs[1].state = RequestState.FINISHED
    pool.leave(reqs[1])
    assert pool.pop_due() is None
    pool.step()
    assert pool.growth_tokens() == 4  # the one at 5 is at 8
    assert pool.pop_due() is reqs[0]
    pool.leave(reqs[0])
    assert pool.n == 1 and pool.shape(None)[2] == 15
    pool.settle(reqs[2])  # its blocks grew in aggregate: 15 tokens in 4 blocks
    assert reqs[2].reserved == 16


def test_decode_pool_sliding_window_bound():
    """Three decoders with contexts 5, 8 and 12 under a window of 6: their windowed layers
    read min(25 + 3, 3 x 6) = 18 keys and hold min(25, 18) = 18."""
    pool = DecodePool(PagedKV(400, 4), 4)
    for i, c in enumerate((5, 8, 12)):
        q = _req(i, c, 10)
        q.computed = c
        pool.join(q)
    dec, dl, past = pool.shape(6)
    assert past == 25 and dec == [3.0, 28.0, 28.0, 25.0, 28.0, 3.0]
    assert dl == [3.0, 18.0, 18.0, 18.0, 18.0, 3.0]


def _spec(e: float, k: int = 3) -> SpecServing:
    return SpecServing(SpeculationConfig("ngram", k, 0.5), e, None, 0.0, 0.0, 2.0)


def test_speculative_pool_keeps_e_tokens_a_step_and_reserves_lookahead():
    """E = 2.5, k = 3: 10 tokens left take 4 steps (floor(4 x 2.5) = 10); a context of 108
    with 1 + 3 tokens ahead fits its 7 blocks of 16 (112), and needs an 8th after one step
    (110 + 4 = 114)."""
    kv = PagedKV(10_000, 16)
    pool = SpecDecodePool(kv, 16, _spec(2.5))
    q = _req(0, 108, 11)
    kv.reserve(q, 108)
    q.computed, q.generated = 108, 1
    pool.join(q)
    assert q.finish_G == 4 and pool.k1 == 4
    assert pool.growth_tokens() == 0
    pool.step()
    assert pool.gained(q) == 2 and pool.context(q) == 110 and pool.growth_tokens() == 16
    pool.take_growth(pool.growth_tokens())
    assert q.reserved == 128 and kv.free_tokens == kv.capacity_tokens - 128
    pool.step()
    pool.step()
    assert pool.gained(q) == 7 and pool.pop_due() is None
    pool.step()
    assert pool.gained(q) == 10 and pool.pop_due() is q
    pool.settle(q)  # reserved request by request: nothing to bring up to date
    assert q.reserved == 128


def test_newest_request_is_preempted_when_decodes_need_a_block():
    """A pool of 4 blocks of 4 tokens, two 4-token prompts of 10 output tokens: the prefill
    step takes a block each; the first decode step a second each (both contexts at 4); four
    steps later both open a third, one block is left for two, so the newer is preempted,
    to recompute its prompt and the 5 tokens it had (9), and cannot come back yet."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, block_size=4)
    kv = PagedKV(16, 4)
    sched = ContinuousScheduler(cfg, kv, DecodePool(kv, 4))
    a, b = _req(0, 4, 10), _req(1, 4, 10)
    sched.waiting.extend([a, b])
    assert _step(sched, 1.0) == [(a, 4), (b, 4)]
    assert kv.free_tokens == 8 and a.r.first_token_s == 1.0
    assert a.state is b.state is RequestState.DECODING
    _step(sched, 2.0)
    assert kv.free_tokens == 0  # a second block each
    for t in (3.0, 4.0, 5.0):
        _step(sched, t)
    assert sched.preemptions == 0
    _step(sched, 6.0)
    assert sched.preemptions == 1 and b.r.preemptions == 1
    assert b.state is RequestState.PREEMPTED and list(sched.waiting) == [b]
    assert (b.target, b.computed, b.generated, b.reserved) == (9, 0, 5, 0)
    assert list(sched.running) == [0] and kv.free_tokens == 4 and kv.reserved_tokens == 12


def test_static_batch_decodes_until_its_longest_is_done():
    """Outputs of 1, 2 and 4 tokens: each reserves its whole length up front, the one-token
    request pads from its prefill, and the batch is freed only after its longest's last
    decode step."""
    cfg = SchedulerConfig(kind="static", max_num_seqs=8, max_num_batched_tokens=64,
                          block_size=4)
    kv = PagedKV(64, 4)
    sched = StaticScheduler(cfg, kv, DecodePool(kv, 4))
    reqs = [_req(i, 4, o) for i, o in enumerate((1, 2, 4))]
    sched.waiting.extend(reqs)
    _step(sched, 1.0)  # prefill: the first token of each
    assert kv.reserved_tokens == 8 + 8 + 8 and sched.finished == 1
    assert sched.batch.n == 3 and sched.batch.padding == 1  # the done one pads along
    _step(sched, 2.0)
    assert sched.finished == 2 and reqs[1].r.finish_s == 2.0
    _step(sched, 3.0)
    assert sched.members and kv.reserved_tokens == 24
    _step(sched, 4.0)
    assert sched.finished == 3 and reqs[2].r.finish_s == 4.0
    assert not sched.members and not sched.running and kv.free_tokens == 64
    assert all(q.state is RequestState.FINISHED for q in reqs)


class _NextAt:
    def __init__(self, t: float):
        self.t = t

    def next_s(self) -> float:
        return self.t


def test_dynamic_batching_holds_an_idle_batch_open():
    cfg = SchedulerConfig(kind="dynamic", max_num_seqs=2, max_wait_s=0.5)
    kv = PagedKV(1024, 16)
    sched = DynamicScheduler(cfg, kv, DecodePool(kv, 16))
    sched.waiting.append(_req(0, 10, 10, arrival_s=1.0))
    assert sched.wait_until(1.0, _NextAt(1.2)) == 1.2  # the next arrival comes first
    assert sched.wait_until(1.2, _NextAt(9.0)) == 1.5  # else until the oldest waited 0.5 s
    assert sched.wait_until(1.2, _NextAt(math.nan)) == 1.5  # a closed loop: no next time
    assert sched.wait_until(1.5, _NextAt(9.0)) is None  # it has waited long enough
    sched.waiting.append(_req(1, 10, 10, arrival_s=1.1))
    assert sched.wait_until(1.2, _NextAt(9.0)) is None  # the batch is full
    assert StaticScheduler(cfg, kv, DecodePool(kv, 16)).wait_until(1.2, _NextAt(9.0)) is None


def test_a_policy_is_a_class():
    assert set(SCHEDULERS) == {"continuous", "static", "dynamic"}
    kv = PagedKV(1024, 16)
    for kind, cls in SCHEDULERS.items():
        assert type(make_scheduler(SchedulerConfig(kind=kind), kv, DecodePool(kv, 16))) is cls
    with pytest.raises(UsageError, match="scheduler"):
        make_scheduler(SchedulerConfig(kind="orca"), kv, DecodePool(kv, 16))


def test_arrivals_open_stream_and_closed_loop():
    reqs = [_req(i, 1, 1, arrival_s=t) for i, t in enumerate((0.0, 0.5, 0.5, 2.0))]
    arr, waiting = Arrivals(reqs), deque()
    arr.arrive(0.5, waiting)
    assert [q.id for q in waiting] == [0, 1, 2] and arr.next_s() == 2.0
    closed = ClosedLoop([_req(i, 1, 1) for i in range(4)], 2)
    waiting = deque()
    assert closed.next_s() == 0.0 and closed.more  # both clients free at the start
    closed.arrive(0.0, waiting)
    assert [q.r.arrival_s for q in waiting] == [0.0, 0.0] and closed.arrived == 2
    assert math.isnan(closed.next_s()) and not closed.more  # both clients busy
    closed.arrive(1.0, waiting)
    assert closed.arrived == 2
    closed.release(2.5)  # one has its answer whole at 2.5 s (its path included)
    assert closed.next_s() == 2.5 and closed.more
    closed.arrive(3.0, waiting)  # it sent its next at 2.5 s, not when the loop looked
    assert closed.arrived == 3 and waiting[-1].r.arrival_s == 2.5
    closed.release(math.nan)  # refused: the client has its answer when the loop last looked
    closed.arrive(3.5, waiting)
    assert closed.arrived == 4 and waiting[-1].r.arrival_s == 3.0
    closed.release(4.0)  # no request left to send
    assert math.isnan(closed.next_s()) and not closed.more


def test_occupancy_integrates_over_steps():
    occ = Occupancy(sample_every_s=1.0)
    occ.record(0.5, running=4, kv_held=100, kv_reserved=160, tokens_out=3)
    occ.record(0.25, running=2, kv_held=300, kv_reserved=320, tokens_out=0)
    assert occ.running_integral == 4 * 0.5 + 2 * 0.25
    assert occ.kv_held_integral == 100 * 0.5 + 300 * 0.25
    assert occ.kv_reserved_integral == 160 * 0.5 + 320 * 0.25
    assert (occ.max_running, occ.peak_kv_held_tokens, occ.peak_kv_reserved_tokens) == \
        (4, 300, 320)
    assert occ.steps == 2 and occ.busy_s == 0.75 and occ.itl == [(0.5, 3)]  # padding only
    assert occ.next_sample_s == 0.0
    occ.sample(0.75, 2, 0, 320)
    assert occ.samples == [(0.75, 2, 0, 320)] and occ.next_sample_s == 1.75
    assert Occupancy().next_sample_s == math.inf


# A stream that once made the continuous scheduler loop until its step limit: Llama-3.1-8B on an
# L4 with two data-parallel ranks and a 192-token step budget. Making room for one unfinished
# prefill preempted a newer one later in the same pass, which then got a chunk and KV blocks
# while it sat in the waiting queue: the blocks leaked, the pool filled, nothing could run.
LEAK_STREAM = [
    (0.0486290898793247, 3763, 740), (0.12717062479997945, 2281, 649),
    (0.15084104216400188, 1262, 695), (0.15084104216400188, 4465, 591),
    (0.16271773929699065, 2682, 855), (1.7385179747680515, 4351, 341),
    (2.7306987183059146, 2356, 132), (5.218685853703357, 276, 268),
    (5.239784913524398, 400, 586), (7.983871510572307, 1510, 262),
    (8.012661872886051, 1180, 657), (12.62700179275063, 2996, 866),
    (12.814769645115959, 853, 550), (14.551686152605612, 46, 708),
    (16.2974030709178, 2683, 725), (16.642258078439394, 3084, 842),
    (16.66886453313215, 2942, 442), (17.46476487455101, 168, 860),
    (17.46476487455101, 684, 427), (18.147489162895223, 603, 757),
    (18.196466307135687, 2611, 383), (18.21770444768504, 2418, 239),
    (18.231214261295026, 2262, 167), (18.23158538321196, 1, 759),
    (18.32693768304859, 975, 9), (18.35871225498923, 1948, 349),
    (18.459034812798446, 3415, 709), (18.465117533251664, 3469, 551),
    (18.465117533251664, 4290, 128), (21.841798616159135, 106, 78),
    (22.540345869907288, 4293, 447), (22.540345869907288, 3972, 96),
    (23.408447186502812, 2503, 333), (26.675868046337595, 3427, 457),
    (26.675868046337595, 1172, 552), (26.675868046337595, 1749, 280),
    (27.07578909962423, 739, 793), (27.1363306730719, 4248, 171),
    (27.1363306730719, 40, 572), (27.22846981292686, 2597, 839),
    (27.344924667741324, 2329, 441), (27.832150477851847, 3782, 587),
    (27.844873579191745, 1225, 325), (27.844873579191745, 4461, 665),
    (29.049877504129476, 1515, 807), (29.071235542229296, 1491, 706),
]


def test_a_prefill_preempted_in_the_same_pass_gets_no_chunk():
    from planner.core.specs import Options
    from planner.layouts.deployment import Deployment
    from planner.serving import run
    from planner.serving.sim import simulate
    from planner.serving.traffic import Request

    dep = Deployment.build(catalog.load_model("llama-3.1-8b"), catalog.load_hardware("l4"),
                           engine=catalog.load_engine("vllm"), options=Options())
    cfg = SchedulerConfig(max_num_seqs=24, max_num_batched_tokens=192, block_size=32,
                          max_model_len=6000, ranks=2)
    reqs = [Request(i, a, p, o) for i, (a, p, o) in enumerate(LEAK_STREAM)]
    res = simulate(reqs, run.coster(dep), cfg, max_steps=200_000)
    assert len(res.requests) == len(reqs) and res.preemptions > 0
    assert res.peak_kv_reserved_tokens <= res.kv_capacity_tokens


def test_a_preempted_request_finds_its_own_blocks():
    """Prefix caching on, 10 blocks of 16: A's 100-token prompt is computed and its first
    token out (101 tokens of context, 100 written); preempted, its 6 whole blocks (96 tokens)
    stay cached, out of the free pool; admitted again it starts with those 96 computed and
    prefills the other 5 of its 101 tokens in one block more."""
    from planner.serving.kv import PrefixCache

    kv = PagedKV(160, 16)
    kv.prefixes = PrefixCache(16)
    batch = DecodePool(kv, 16)
    sched = ContinuousScheduler(SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8,
                                                prefix_caching=True), kv, batch)
    a = _req(0, 100, 50)
    sched.waiting.append(a)
    assert _step(sched, 1.0) == [(a, 100)] and a.state is RequestState.DECODING
    kept = batch.context(a)
    sched._preempt(a)
    assert a.state is RequestState.PREEMPTED and a.target == 101
    assert kv.free_tokens == 160 - kept // 16 * 16 == 64
    assert kv.prefixes.lookup(a) == (0, 96)
    chunks = sched.schedule()
    assert chunks == [(a, 5)] and a.computed == 96
    assert a.reserved == 96 + 16 and kv.free_tokens == 160 - 112
    assert a.r.cached_tokens == 0  # the hit rate counts shared prefixes, not recomputes


def test_kept_blocks_are_evicted_from_their_tail():
    """A preempted request's 6 kept blocks: a need of 20 tokens takes two whole blocks from
    their tail and leaves it the first 4; more than they hold takes them all."""
    from planner.serving.kv import PrefixCache

    kv = PagedKV(160, 16)
    kv.prefixes = cache = PrefixCache(16)
    a = _req(0, 100, 50)
    kv.free_tokens -= cache.stash(a, 100, 0)
    assert kv.free_tokens == 64 and kv.make_room(84)
    assert kv.free_tokens == 96 and cache.lookup(a) == (0, 64)
    assert kv.make_room(160) and kv.free_tokens == 160 and cache.lookup(a) == (0, 0)


def test_kept_blocks_follow_their_prefix():
    """Kept blocks computed after a shared prefix of 32 are found only while the prefix is
    cached: with it, the request starts from 32 + its own; without it, from nothing."""
    from planner.serving.kv import PrefixCache

    cache = PrefixCache(16)
    a = SimRequest.of(RequestResult(0, 0.0, 100, 10), prefix=7, prefix_tokens=40)
    cache.stash(a, 90, 32)  # 80 whole tokens, 32 of them the prefix's
    a.target = 100
    assert cache.lookup(a) == (0, 0)  # its prefix is not cached
    cache.entries[7] = [32, 0]
    cache.idle[7] = 32
    assert cache.lookup(a) == (32, 48)
    del cache.entries[7], cache.idle[7]
    assert cache.lookup(a) == (0, 0)


def test_decode_pool_hands_out_due_requests_by_finish_step_then_admission():
    """Each decoding request is handed out at the step its last token comes; those due at
    one step oldest admitted first, whatever order they joined in; a request preempted and
    rejoined is due at its new finish step only (its first entry is stale)."""
    pool = DecodePool(PagedKV(10_000, 4), 4)
    # joins at each step: (admitted, tokens left); due at the join step + tokens left
    plan = {0: [(5, 4), (2, 4)], 1: [(9, 4), (1, 2)], 2: [(7, 2), (3, 5)]}
    reqs = {}
    seen = []
    while pool.G < 9:
        for admitted, left in plan.get(pool.G, ()):
            q = reqs[admitted] = _req(admitted, 10, left + 1)
            q.computed, q.generated, q.admitted = 10, 1, admitted
            pool.join(q)
        late = reqs.get(9)
        if pool.G == 3:  # preempted before it is due at 5
            pool.leave(late)
            late.state = RequestState.PREEMPTED
        if pool.G == 4:  # admitted again (stamp 11), 2 tokens left: due at 6
            late.admitted, late.computed, late.generated = 11, 12, 3
            pool.join(late)
        pool.step()
        q = pool.pop_due()
        while q is not None:
            seen.append((pool.G, q.admitted))
            q.state = RequestState.FINISHED
            pool.leave(q)
            q = pool.pop_due()
    assert seen == [(3, 1), (4, 2), (4, 5), (4, 7), (6, 11), (7, 3)]


def test_decode_pool_counts_what_its_decoders_have_left_up_to_a_clip():
    """Two decoders, 10 and 4 output tokens, one generated each at joining; a clip of 5:
    the longer counts 5 until it has fewer left (after 4 steps: 5, then 3 after 6)."""
    kv = PagedKV(1000, 1)
    pool = DecodePool(kv, 1)
    pool.clip = 5
    long_, short = _req(0, 8, 10), _req(1, 8, 4)
    for q in (long_, short):
        q.computed, q.generated = 8, 1
        pool.join(q)
    assert pool.left_tokens() == 5 + 3
    assert pool.decoded_tokens() == (2, 14)
    for _ in range(2):
        pool.step()
    assert pool.left_tokens() == 5 + 1 and pool.decoded_tokens() == (6, 14)
    pool.leave(short)
    for _ in range(4):
        pool.step()
    assert pool.left_tokens() == 3 and pool.decoded_tokens() == (7, 10)


def _reserving(reserve: ReserveRule, blocks: int = 4) -> ContinuousScheduler:
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, block_size=4,
                          mixed_batches=False, decode_reserve=reserve)
    kv = PagedKV(4 * blocks, 4)
    return ContinuousScheduler(cfg, kv, DecodePool(kv, 4))


def test_sglang_admission_holds_kv_back_for_the_outputs_to_come():
    """The pool of test_newest_request_is_preempted_when_decodes_need_a_block (16 tokens),
    under SGLang's rule: the first request asks 4 + 10 of the 16 and leaves 2, so the second
    (4 + 10 again) waits instead of being admitted and preempted later; a step later the
    first's 9 tokens to come are held at the ratio 0.7 (6.3) beside its 4 tokens of prompt
    and 4 of its first block: 16 - 4 - 6.3 = 5.7 < 14, still waiting."""
    sched = _reserving(ReserveRule(0.7, 0.098, 0.001, 4096, 20))
    a, b = _req(0, 4, 10), _req(1, 4, 10)
    sched.waiting.extend([a, b])
    assert _step(sched, 1.0) == [(a, 4)]
    assert list(sched.waiting) == [b] and sched.ratio == 0.7
    assert sched._reserve_room() == pytest.approx(16 - 4 - 0.7 * 9)
    for t in range(2, 12):
        _step(sched, float(t))
    assert sched.preemptions == 0 and a.state is RequestState.FINISHED
    assert b.state is not RequestState.WAITING


def test_sglang_ratio_falls_with_each_decode_step_and_rises_after_a_retraction():
    """A clip of 1 token lets both requests in, as vLLM would (each asks 4 + 1), and the
    pool runs out at the same step as in test_newest_request_is_preempted_when_decodes_
    need_a_block. Before it, four decode steps lowered the ratio by 0.1 each from 0.9 (to
    0.5); the retraction then sets it from the survivor: (5 decoded + 20 x 1) / 10 = 2.5,
    at most 1."""
    sched = _reserving(ReserveRule(0.9, 0.2, 0.1, 1, 20))
    a, b = _req(0, 4, 10), _req(1, 4, 10)
    sched.waiting.extend([a, b])
    assert _step(sched, 1.0) == [(a, 4), (b, 4)]
    for t in (2.0, 3.0, 4.0, 5.0):
        _step(sched, t)
    assert sched.ratio == pytest.approx(0.5) and sched.preemptions == 0
    _step(sched, 6.0)
    assert sched.preemptions == 1 and sched.ratio == 1.0


@pytest.mark.parametrize("fewest_outputs_first", [True, False])
def test_sglang_retracts_the_fewest_outputs_then_the_longest_prompt(fewest_outputs_first):
    """Two requests admitted in one step decode side by side, with as many outputs each,
    until the 16-token pool runs out: SGLang's retract_decode takes the longest prompt
    among the fewest outputs (the older request here, 8 prompt tokens against 4); the
    newest-first order takes the other."""
    sched = _reserving(ReserveRule(0.9, 0.2, 0.1, 1, 20, fewest_outputs_first))
    a, b = _req(0, 8, 10), _req(1, 4, 10)
    sched.waiting.extend([a, b])
    assert _step(sched, 1.0) == [(a, 8), (b, 4)]
    t = 2.0
    while not sched.preemptions:
        _step(sched, t)
        t += 1
    taken, kept = (a, b) if fewest_outputs_first else (b, a)
    assert taken.r.preemptions == 1 and kept.r.preemptions == 0
    assert kept.state is RequestState.DECODING


def test_sglang_retraction_spares_a_readmitted_request():
    """A request retracted before keeps its output tokens: admitted again it has more than
    a request that has just started decoding, and the next retraction takes the newcomer's
    fewer outputs although the readmitted request is the newest in the running order."""
    from planner.serving.schedulers import _DECODING

    sched = _reserving(ReserveRule(0.9, 0.2, 0.1, 1, 20, True), blocks=64)
    old, new = _req(0, 4, 20), _req(1, 4, 20)
    sched.waiting.extend([new, old])
    _step(sched, 1.0)
    for t in range(2, 5):
        _step(sched, float(t))
    assert new.state is _DECODING and old.state is _DECODING
    old.g0 += 7  # as if 7 tokens came before an earlier retraction (kept, as SGLang keeps them)
    del sched.running[old.id]
    sched.running[old.id] = old  # and it was admitted again: the newest running
    assert next(reversed(sched.running)) == old.id  # what newest-first would take
    assert sched._fewest_outputs() is new


def test_sglang_ratio_floor_and_idle_reset():
    sched = _reserving(ReserveRule(0.9, 0.2, 0.1, 4096, 20), blocks=64)
    a = _req(0, 4, 30)
    sched.waiting.append(a)
    for t in range(1, 20):
        _step(sched, float(t))
    assert sched.ratio == pytest.approx(0.2)  # 0.9 less 0.1 a step, held at the least
    while a.state is not RequestState.FINISHED:
        _step(sched, 30.0)
    sched.waiting.append(_req(1, 4, 4))
    _step(sched, 31.0)  # an idle server starts over
    assert sched.ratio == 0.9


def _prefill_capped(most: int | None, chunk: int = 8192, page: int = 1,
                    mixed: bool = False) -> ContinuousScheduler:
    cfg = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=chunk, block_size=page,
                          mixed_batches=mixed, max_prefill_tokens=most)
    kv = PagedKV(1_000_000, page)
    return ContinuousScheduler(cfg, kv, DecodePool(kv, 64))


def test_sglang_s_max_prefill_tokens_closes_a_prefill_batch():
    """SGLang's PrefillAdder (schedule_policy.py, 0.5.10): rem_input_tokens starts at
    max_prefill_tokens; a request joins a batch already holding one only where its whole
    uncached prompt is under what is left, and none joins once it is spent; the first is
    taken whatever its length, chunked by the budget. Worked by hand."""
    # 32,768 each (InferenceX's DeepSeek-R1 servers): prompts of 7,000, 7,000, 7,000 and
    # 12,000 tokens. 21,000 go in whole; 11,768 are left, under the fourth's 12,000, so it
    # waits, where a budget alone gives it a chunk of 11,768
    reqs = [_req(i, p, 10) for i, p in enumerate((7000, 7000, 7000, 12000))]
    capped, budget_only = _prefill_capped(32768, 32768), _prefill_capped(None, 32768)
    for s in (capped, budget_only):
        s.waiting.extend(_req(r.r.id, r.r.prompt_tokens, 10) for r in reqs)
    assert [c for _, c in capped.schedule()] == [7000, 7000, 7000]
    assert [c for _, c in budget_only.schedule()] == [7000, 7000, 7000, 11768]
    # at exactly what is left it waits too (">="): 7,000 + 25,768 = 32,768
    s = _prefill_capped(32768, 32768)
    s.waiting.extend([_req(0, 7000, 10), _req(1, 25768, 10)])
    assert [c for _, c in s.schedule()] == [7000]
    # the first request of a step is taken whatever its length: 40,000 tokens, a chunk of
    # the 32,768 budget; the next step continues it (7,232 tokens), and 25,536 are left:
    # a 25,536-token prompt waits, a 25,535-token one joins
    for second, joins in ((25536, False), (25535, True)):
        s = _prefill_capped(32768, 32768)
        s.waiting.extend([_req(0, 40000, 10), _req(1, second, 10)])
        assert [c for _, c in _step(s, 1.0)] == [32768]
        assert [c for _, c in s.schedule()] == ([7232, second] if joins else [7232])
    # SGLang's defaults on an 80 GB GPU (16,384 and a chunk of 8,192): after a 4,000-token
    # prompt, 12,384 are left; a 12,384-token prompt waits where the budget would give it a
    # chunk of 4,192, and a 3,000-token one joins whole
    s = _prefill_capped(16384, 8192)
    s.waiting.extend([_req(0, 4000, 10), _req(1, 12384, 10)])
    assert [c for _, c in s.schedule()] == [4000]
    s = _prefill_capped(16384, 8192)
    s.waiting.extend([_req(0, 4000, 10), _req(1, 3000, 10), _req(2, 9000, 10)])
    assert [c for _, c in s.schedule()] == [4000, 3000, 1192]  # 9,000 < 9,384: a chunk
    # counted in pages (_update_prefill_budget): pages of 64, 4,000 take 4,032 of both
    # bounds; 12,352 are left of max_prefill_tokens, which a 12,290-token prompt (12,352 in
    # pages) is not under, and a 12,288-token one is; it is truncated to whole pages of the
    # 4,160 left of the chunk (add_one_req: trunc_len = rem_chunk_tokens // page x page)
    s = _prefill_capped(16384, 8192, page=64)
    s.waiting.extend([_req(0, 4000, 10), _req(1, 12290, 10)])
    assert [c for _, c in s.schedule()] == [4000]
    s = _prefill_capped(16384, 8192, page=64)
    s.waiting.extend([_req(0, 4000, 10), _req(1, 12288, 10)])
    assert [c for _, c in s.schedule()] == [4000, 4160]
    # 8,130 tokens take 8,192 of the chunk in pages: a 100-token prompt finds none left
    s = _prefill_capped(16384, 8192, page=64)
    s.waiting.extend([_req(0, 8130, 10), _req(1, 100, 10)])
    assert [c for _, c in s.schedule()] == [8130]


def test_sglang_s_ignore_eos_path_chunks_a_long_prompt_beside_others():
    """A request sent with ignore_eos to a server whose radix cache is off goes through
    PrefillAdder.add_one_req_ignore_eos, which does not hold a long prompt back: five
    7,000-token prompts at 32,768 each take 4 x 7,000 and a 4,768-token chunk of the fifth;
    with the prefix cache on, or without ignore_eos, the fifth waits."""
    def five(**kw):
        cfg = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=32768, block_size=1,
                              mixed_batches=False, max_prefill_tokens=32768, **kw)
        kv = PagedKV(1_000_000, 1)
        s = ContinuousScheduler(cfg, kv, DecodePool(kv, 64))
        s.waiting.extend(_req(i, 7000, 10) for i in range(5))
        return [c for _, c in s.schedule()]

    assert five(ignore_eos=True) == [7000] * 4 + [4768]
    assert five(ignore_eos=True, prefix_caching=True) == [7000] * 4
    assert five() == [7000] * 4


def test_a_step_s_first_request_goes_in_whatever_max_prefill_tokens_leaves():
    """Under mixed chunking SGLang takes one token a running request from max_prefill_tokens
    before any prompt, but checks it only after each add_one_req: with a bound of 2 and two
    requests decoding, nothing is left, and the next prompt still goes in, alone."""
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, block_size=1,
                          mixed_batches=True, max_prefill_tokens=2)
    kv = PagedKV(10_000, 1)
    s = ContinuousScheduler(cfg, kv, DecodePool(kv, 8))
    s.waiting.extend(_req(i, 5, 50) for i in range(4))
    assert [q.r.id for q, _ in _step(s, 1.0)] == [0]  # 2 - 5 < 0: full
    assert [q.r.id for q, _ in _step(s, 2.0)] == [1]  # 2 - 1 running = 1 left: the first
    assert s.batch.n == 2
    assert [q.r.id for q, _ in _step(s, 3.0)] == [2]  # 2 - 2 running = 0 left: still first


def test_data_parallel_ranks_each_take_a_first_request():
    """With chunking off each data-parallel rank's first prompt goes in whole: two ranks
    take two 20,000-token prompts in a step (the bound pooled as the budget is), not a third."""
    cfg = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=8192, block_size=1,
                          mixed_batches=False, chunked_prefill=False, max_prefill_tokens=16384,
                          ranks=2)
    kv = PagedKV(1_000_000, 1)
    s = ContinuousScheduler(cfg, kv, DecodePool(kv, 64))
    s.waiting.extend(_req(i, 20000, 10) for i in range(3))
    assert [c for _, c in s.schedule()] == [20000, 20000]


def test_max_prefill_tokens_comes_from_sglang_s_profile_and_its_server_flag():
    from planner.cli.flags import server_flags

    assert SchedulerConfig.for_engine(catalog.load_engine("sglang")).max_prefill_tokens == 16384
    assert SchedulerConfig.for_engine(catalog.load_engine("vllm")).max_prefill_tokens is None
    cmd = ("python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-R1-0528 "
           "--chunked-prefill-size 32768 --max-prefill-tokens 32768")
    assert server_flags(cmd)["--max-prefill-tokens"] == 32768
    with pytest.raises(UsageError, match="max-prefill-tokens: must be positive"):
        SchedulerConfig(max_prefill_tokens=0).check()


def test_sglang_without_chunking_prefills_a_prompt_of_any_length_whole():
    """SGLang with --chunked-prefill-size -1 (PrefillAdder's rem_chunk_tokens None): a step's
    first request goes in whole whatever its length, the others while their prompts are under
    what max_prefill_tokens leaves; no step budget refuses a long prompt, as vLLM's does."""
    cfg = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=8192, block_size=1,
                          mixed_batches=False, chunked_prefill=False, max_prefill_tokens=16384)
    assert cfg.takes_whole_prompts
    assert not replace_cfg(cfg, max_prefill_tokens=None).takes_whole_prompts
    assert not replace_cfg(cfg, chunked_prefill=True).takes_whole_prompts
    # a static batch is not SGLang's scheduler; mixed chunking needs chunks (is_mixed_chunk)
    assert not replace_cfg(cfg, kind="static").takes_whole_prompts
    kv = PagedKV(1000, 1)
    assert not ContinuousScheduler(replace_cfg(cfg, mixed_batches=True), kv,
                                   DecodePool(kv, 4)).mixed
    kv = PagedKV(1_000_000, 1)
    s = ContinuousScheduler(cfg, kv, DecodePool(kv, 64))
    s.waiting.extend([_req(0, 20000, 10), _req(1, 3000, 10)])
    assert [c for _, c in s.schedule()] == [20000]  # 16,384 - 20,000 < 0: the step is full
    kv = PagedKV(1_000_000, 1)
    s = ContinuousScheduler(cfg, kv, DecodePool(kv, 64))
    # 3,000 in (13,384 left), 6,000 under it (7,384 left), 9,000 not: it waits
    s.waiting.extend([_req(0, 3000, 10), _req(1, 6000, 10), _req(2, 9000, 10)])
    assert [c for _, c in s.schedule()] == [3000, 6000]


def replace_cfg(cfg: SchedulerConfig, **kw) -> SchedulerConfig:
    from dataclasses import replace

    return replace(cfg, **kw)


def _batch_waiting(iters: int = 3, share: float = 0.5) -> ContinuousScheduler:
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=1000, block_size=1,
                          chunked_prefill=False, batch_wait_iters=iters,
                          batch_wait_tokens_ratio=share)
    kv = PagedKV(100_000, 1)
    return ContinuousScheduler(cfg, kv, DecodePool(kv, 16))


def test_tensorrt_llm_s_batch_waiting_holds_prefills_beside_decodes():
    """PyExecutor._waiting_requests with timeout 3 and a share of 0.5 of 1,000 tokens: an
    idle server prefills at once ('no need to wait'); beside a decode, a 100-token prompt
    (100 + 1 tokens, under 500) is held 3 steps and goes in on the 4th; a 450-token one
    arriving meanwhile makes 100 + 450 + 1 = 551 and both go in at once."""
    s = _batch_waiting()
    s.waiting.append(_req(0, 100, 50))
    assert [q.r.id for q, _ in _step(s, 1.0)] == [0]  # no decodes: no waiting
    s.waiting.append(_req(1, 100, 50))
    assert [_step(s, t) for t in (2.0, 3.0, 4.0)] == [[], [], []]  # held, the decode runs
    assert s.batch.n == 1 and s.waited == 3
    assert [q.r.id for q, _ in _step(s, 5.0)] == [1] and s.waited == 0
    s = _batch_waiting()
    s.waiting.append(_req(0, 100, 50))
    _step(s, 1.0)
    s.waiting.append(_req(1, 100, 50))
    assert _step(s, 2.0) == [] and s.waited == 1
    s.waiting.append(_req(2, 450, 50))
    assert [q.r.id for q, _ in _step(s, 3.0)] == [1, 2] and s.waited == 0
    # either figure 0 waits for nothing (its test then always stops waiting)
    for iters, share in ((0, 0.5), (3, 0.0)):
        s = _batch_waiting(iters, share)
        s.waiting.append(_req(0, 100, 50))
        _step(s, 1.0)
        s.waiting.append(_req(1, 100, 50))
        assert [q.r.id for q, _ in _step(s, 2.0)] == [1]


def test_batch_waiting_counts_what_the_capacity_scheduler_would_let_in():
    """Under guaranteed-no-evict TensorRT-LLM's capacity scheduler picks only requests whose
    whole length fits the free KV, and only they are counted: with room for one of two
    300-token prompts (300 + 50 tokens each, 400 free), 300 + 1 < 500 and the prefill is held
    (the dry run had counted 601 and let it in); a prefix found cached is not recomputed, so
    a 700-token prompt with 320 cached fits beside a 300-token one (300 + 380 of the 999
    left) and both count whole: 1,001 >= 500, no hold."""
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=1000, block_size=1,
                          chunked_prefill=False, batch_wait_iters=3,
                          batch_wait_tokens_ratio=0.5, capacity_policy="guaranteed-no-evict")
    kv = PagedKV(10 + 350 + 400, 1)
    s = ContinuousScheduler(cfg, kv, DecodePool(kv, 16))
    s.waiting.append(_req(0, 10, 340))  # 350 reserved whole, decoding
    assert [q.r.id for q, _ in _step(s, 1.0)] == [0]
    s.waiting.extend([_req(1, 300, 50), _req(2, 300, 50)])
    assert s._holds_prefills() and s.waited == 1
    # a prefix of 320 tokens (20 blocks of 16) cached before the run
    from planner.serving.kv import PrefixCache

    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=1000, block_size=16,
                          chunked_prefill=False, batch_wait_iters=3,
                          batch_wait_tokens_ratio=0.5, prefix_caching=True)
    kv = PagedKV(100_000, 16)
    kv.prefixes = PrefixCache(16)
    assert kv.warm({7: 320}) == 320
    s = ContinuousScheduler(cfg, kv, DecodePool(kv, 16))
    s.waiting.append(_req(0, 10, 200))
    _step(s, 1.0)
    assert s.batch.n == 1
    shared = SimRequest.of(RequestResult(2, 0.0, 700, 50), prefix=7, prefix_tokens=320)
    s.waiting.extend([_req(1, 300, 50), shared])
    assert kv.prefixes.lookup(shared)[0] == 320
    assert not s._holds_prefills() and s.waited == 0
