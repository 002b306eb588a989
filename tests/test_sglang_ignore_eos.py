"""SGLang's admission of requests sent with ignore_eos to a server whose radix cache is off
(PrefillAdder.add_one_req_ignore_eos, python/sglang/srt/managers/schedule_policy.py, 0.5.10):
each request counts its whole output, and a newcomer is admitted only where the KV left, as
the requests finish shortest first, holds what each has still to write. By hand, in the
scheduler, and as a property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.engine import ReserveRule
from planner.serving.config import SchedulerConfig
from planner.serving.decoding import DecodePool
from planner.serving.kv import PagedKV
from planner.serving.requests import RequestResult, RequestState, SimRequest
from planner.serving.schedulers import ContinuousScheduler, eos_fits, eos_fits_at


def _req(i: int, prompt: int, output: int) -> SimRequest:
    return SimRequest.of(RequestResult(i, 0.0, prompt, output))


def test_eos_fits_by_hand():
    """Two requests with 10 and 20 tokens to come, holding 100 and 50: while both run the
    first's 10 steps take 2 x 10 of the free KV, which must leave more than 2 (free > 22);
    then the second alone, with the first's 100 freed, needs free + 100 - 20 > 1."""
    states = [(10, 100), (20, 50)]
    assert eos_fits(states, 23) and not eos_fits(states, 22)
    assert eos_fits([(5, 1)], 7) and not eos_fits([(5, 1)], 6)  # 7 - 5 > 1
    assert eos_fits([], 0)
    # the same written G-invariant, G = 5
    assert eos_fits_at([(15, 0, 95, 0), (25, 1, 45, 1)], 23, 5)
    assert not eos_fits_at([(15, 0, 95, 0), (25, 1, 45, 1)], 22, 5)


@pytest.mark.parametrize("kept", [False, True])
def test_the_decode_pool_lists_what_each_has_to_come(kept):
    """Two decoders, 8 + 10 and 30 + 4 tokens, one generated at joining: two steps later
    they have 7 and 1 tokens to come and hold 11 and 33, listed shortest first as (to come
    + G, rank, held - G, id) with G = 2; kept as they join and leave (``keep_order``), or
    found from the pool's entries, the same."""
    kv = PagedKV(10_000, 1)
    pool = DecodePool(kv, 1)
    if kept:
        pool.keep_order()
    a, b = _req(0, 8, 10), _req(1, 30, 4)
    for q in (a, b):
        q.computed, q.generated = q.r.prompt_tokens, 1
        pool.join(q)
    for _ in range(2):
        pool.step()
    got = pool.outputs_left()
    assert [(left - pool.G, held + pool.G) for left, _, held, _ in got] == [(1, 33), (7, 11)]
    pool.leave(b)
    b.state = RequestState.FINISHED  # as the scheduler leaves it
    assert [e[3] for e in pool.outputs_left()] == [0]


def _sched(ignore_eos: bool, prefix_caching: bool = False) -> ContinuousScheduler:
    # a clip of one token: the ordinary rule asks each request's prompt and one token
    cfg = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=1024, block_size=1,
                          mixed_batches=False, ignore_eos=ignore_eos,
                          prefix_caching=prefix_caching,
                          decode_reserve=ReserveRule(0.7, 0.098, 0.001, 1, 20))
    kv = PagedKV(200, 1)
    return ContinuousScheduler(cfg, kv, DecodePool(kv, 1))


def test_ignore_eos_admits_what_the_whole_outputs_leave_room_for():
    """200 tokens of KV, requests of 8 prompt and 12 output tokens, all at once: the
    ordinary rule (each asks its prompt and one token, clipped) admits 10 + of them in the
    first step; the ignore_eos path, k requests each holding 8 and writing 12 more, needs
    200 - 8k - 12k > k, so 9 (9 x 21 = 189 < 200; 10 x 21 = 210 is not)."""
    reqs = [_req(i, 8, 12) for i in range(20)]
    plain = _sched(False)
    plain.waiting.extend(reqs)
    assert len(plain.schedule()) > 9
    eos = _sched(True)
    eos.waiting.extend(_req(i, 8, 12) for i in range(20))
    assert len(eos.schedule()) == 9
    cached = _sched(True, prefix_caching=True)  # the radix cache on: the ordinary rule
    cached.waiting.extend(_req(i, 8, 12) for i in range(20))
    assert len(cached.schedule()) > 9


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 500), st.integers(0, 2000)), max_size=12),
       st.integers(0, 20_000), st.integers(0, 500))
def test_more_free_kv_never_refuses_what_less_admitted(states, free, more):
    """The test is monotone in the free KV, and a request with less to come never fits
    worse than one with more."""
    states = sorted(states)
    if eos_fits(states, free):
        assert eos_fits(states, free + more)
    if states and eos_fits(states, free):
        left, held = states[-1]
        assert eos_fits(sorted([*states[:-1], (max(1, left - more), held)]), free)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["join", "leave", "step"]), st.integers(1, 50),
                          st.integers(2, 40)), max_size=40))
def test_the_kept_order_is_the_order_found(ops):
    """Joins, leaves (a finish or a preemption) and steps in any order: the list a pool keeps
    as requests come and go is the one found from its entries."""
    kept, found = DecodePool(PagedKV(10**6, 1), 1), DecodePool(PagedKV(10**6, 1), 1)
    kept.keep_order()
    live: dict[int, tuple[SimRequest, SimRequest]] = {}
    for i, (op, prompt, out) in enumerate(ops):
        if op == "join":
            pair = (_req(i, prompt, out), _req(i, prompt, out))
            for pool, q in zip((kept, found), pair, strict=True):
                q.computed, q.generated = prompt, 1
                pool.join(q)
            live[i] = pair
        elif op == "leave" and live:
            k = sorted(live)[prompt % len(live)]
            for pool, q in zip((kept, found), live.pop(k), strict=True):
                pool.leave(q)
                q.state = RequestState.PREEMPTED
        else:
            kept.step()
            found.step()
        # the same requests, ascending by what each has to come (the kept list ranks
        # equals by joining order, the found one by admission)
        got, want = kept.outputs_left(), found.outputs_left()
        assert sorted((e[0], e[2], e[3]) for e in got) == \
            sorted((e[0], e[2], e[3]) for e in want)
        assert [e[0] for e in got] == sorted(e[0] for e in got)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 500)), max_size=10),
       st.integers(0, 5000), st.integers(0, 1000))
def test_the_g_invariant_form_is_the_same_test(states, free, G):
    """``eos_fits_at`` over (to come + G, held - G) answers as ``eos_fits`` over the plain
    figures, whatever G."""
    states = sorted(states)
    shifted = [(left + G, i, held - G, i) for i, (left, held) in enumerate(states)]
    assert eos_fits_at(shifted, free, G) == eos_fits(states, free)


def _sglang_admits(decoders, waiting, free, rem_total, clip=1):
    """A transcription of SGLang 0.5.10's PrefillAdder.add_one_req_ignore_eos for a step that
    continues no prefill (page size 1, no sliding-window pool), each waiting request (prompt,
    output to come) tried in turn until one is refused: how many it admits. ``decoders``:
    (output to come, prompt + generated) of the running requests; ``free``: the free and
    evictable KV (cur_rem_tokens before the step's first), ``rem_total`` rem_total_tokens."""
    states, cur_off, tot_off = None, 0, 0
    for k, (prompt, out) in enumerate(waiting):
        if prompt > min(free - cur_off, rem_total - tot_off):
            return k
        if states is None:
            states = [(out, prompt)] + list(decoders)
            states.sort(key=lambda x: x[0])
        else:
            i = 0
            for i in range(len(states)):
                if out <= states[i][0]:
                    break
            states.insert(i, (out, prompt))
        cur = free - cur_off - prompt
        freed = 0
        for i, (left, held) in enumerate(states):
            bs = len(states) - i
            if cur + freed - left * bs <= bs:
                return k
            freed += held
        cur_off += prompt + 1  # _update_prefill_budget: the prompt and a page
        tot_off += prompt + min(out, clip) + 1  # the output as the clip counts it
    return len(waiting)


@settings(max_examples=300, deadline=None)
@given(dec=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 40)), max_size=6),
       wait=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 60)), min_size=1,
                     max_size=8),
       steps=st.integers(0, 5), frac=st.floats(0.3, 1.5))
def test_admission_is_sglangs(dec, wait, steps, frac):
    """Decoders of assorted lengths some steps in, then waiting requests of assorted
    lengths: the scheduler admits exactly as many as SGLang's code would, its insertion of
    a step's later newcomers included (before the last entry where none has as many tokens
    to come)."""
    from hypothesis import assume

    from planner.serving.requests import RequestState as S

    # the clip at one token and a ratio near 0, or a ratio of 1 and no clip: what the
    # running requests leave binds too
    rule = ReserveRule(1e-9, 1e-9, 0.0, 1, 20) if frac < 0.9 else \
        ReserveRule(1.0, 1.0, 0.0, 4096, 20)
    cfg = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096, block_size=1,
                          mixed_batches=False, ignore_eos=True, prefix_caching=False,
                          decode_reserve=rule)
    # a pool about as large as what every request asks, so that the test binds
    size = int(frac * (sum(p + o + steps + 1 for p, o in dec) + sum(p + o for p, o in wait)))
    kv = PagedKV(max(size, 1), 1)
    sched = ContinuousScheduler(cfg, kv, DecodePool(kv, 1))
    decoders = []
    for i, (prompt, out) in enumerate(dec):
        q = _req(i, prompt, out + steps + 1)
        q.computed, q.generated, q.state = prompt, 1, S.DECODING
        assume(kv.reserve(q, prompt + 1))
        sched.running[q.id] = q
        sched.batch.join(q)
    for _ in range(steps):
        grow = sched.batch.growth_tokens()
        assume(kv.free_tokens >= grow)
        sched.batch.take_growth(grow)
        sched.batch.step()
    G = sched.batch.G
    # SGLang's running batch, in the order its requests joined
    decoders = [(q.r.output_tokens - q.generated - G, q.r.prompt_tokens + q.generated + G)
                for q in sched.running.values()]
    queued = [_req(100 + i, prompt, out) for i, (prompt, out) in enumerate(wait)]
    sched.waiting.extend(queued)
    free = kv.free_or_evictable_tokens()
    rem_total = sched._reserve_room()
    chunks: list = []
    sched._admit_waiting(chunks, 4096)
    want = _sglang_admits(decoders, [(q.r.prompt_tokens, q.r.output_tokens) for q in queued],
                          free, rem_total, rule.clip_tokens)
    assert len(chunks) == want


def _scenario(dec, wait, size, rule):
    """The scheduler's admissions this step and SGLang's, for decoders (prompt, output),
    joined in turn with one token generated, and waiting requests (prompt, output)."""
    from planner.serving.requests import RequestState as S

    cfg = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096, block_size=1,
                          mixed_batches=False, ignore_eos=True, prefix_caching=False,
                          decode_reserve=rule)
    kv = PagedKV(size, 1)
    sched = ContinuousScheduler(cfg, kv, DecodePool(kv, 1))
    for i, (prompt, out) in enumerate(dec):
        q = _req(i, prompt, out)
        q.computed, q.generated, q.state = prompt, 1, S.DECODING
        assert kv.reserve(q, prompt + 1)
        sched.running[q.id] = q
        sched.batch.join(q)
    decoders = [(q.r.output_tokens - q.generated, q.r.prompt_tokens + q.generated)
                for q in sched.running.values()]
    queued = [_req(100 + i, p, o) for i, (p, o) in enumerate(wait)]
    sched.waiting.extend(queued)
    free, rem_total = kv.free_or_evictable_tokens(), sched._reserve_room()
    chunks: list = []
    sched._admit_waiting(chunks, 4096)
    return len(chunks), _sglang_admits(decoders, wait, free, rem_total, rule.clip_tokens)


def test_a_tie_keeps_sglangs_order():
    """A decoder with 1 token to come (it holds 2), then a newcomer of 20 + 1 and one of
    1 + 10: the first newcomer sorts before the decoder, its equal (SGLang's stable sort puts
    the newcomer first), so the second, longer than both, lands before the decoder, the last
    entry, and at 31 tokens of KV both are admitted, as SGLang admits them."""
    rule = ReserveRule(1e-9, 1e-9, 0.0, 1, 20)
    for size in range(31, 45):
        ours, sglang = _scenario([(1, 2)], [(20, 1), (1, 10)], size, rule)
        assert ours == sglang, size
    assert _scenario([(1, 2)], [(20, 1), (1, 10)], 31, rule)[0] == 2


def test_what_the_running_requests_leave_counts_a_page_a_request():
    """A ratio of 1 and no clip: 18 tokens of KV, a request of 5 + 10 then one of 3 + 1:
    after the first, rem_total_tokens is 18 - (5 + 10 + 1), below the second's prompt:
    SGLang refuses it, and so does the scheduler."""
    rule = ReserveRule(1.0, 1.0, 0.0, 4096, 20)
    assert _scenario([], [(5, 10), (3, 1)], 18, rule) == (1, 1)


def test_the_ordinary_rule_counts_a_page_a_request_too():
    """Without ignore_eos (SGLang's add_one_req, refusing where its prompt and output reach
    rem_total_tokens): a ratio of 1 and no clip, requests of 5 + 10 each, each admission
    lowering what is left by 5 + 10 and a page. From 40 tokens: 15 < 40, 15 < 24, not
    15 < 8: 2. From 63: the fourth finds 63 - 3 x 16 = 15, not above its 15: 3 (4 without
    the page: 63 - 45 = 18). From 64: 4."""
    def admitted(size):
        cfg = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096, block_size=1,
                              mixed_batches=False,
                              decode_reserve=ReserveRule(1.0, 1.0, 0.0, 4096, 20))
        kv = PagedKV(size, 1)
        sched = ContinuousScheduler(cfg, kv, DecodePool(kv, 1))
        sched.waiting.extend(_req(i, 5, 10) for i in range(6))
        chunks: list = []
        sched._admit_waiting(chunks, 4096)
        return len(chunks)

    assert admitted(40) == 2
    assert admitted(63) == 3  # 63 - 3 x 16 = 15: the fourth asks 15, not under it
    assert admitted(64) == 4
