"""Batching policies, one class each over one base, as Vidur's replica schedulers
(vidur/scheduler/replica_scheduler/) are: a new policy is a new class.

A scheduler holds the queues (``waiting``, front first, preempted requests put back at the
front; ``running`` in admission order, the newest last; ``prefilling``, those of them still
prefilling), the KV pool (``planner.serving.kv``) and the decode pool
(``planner.serving.decoding``). Each step the event loop (``planner.serving.sim``) asks it
``wait_until`` (whether to idle first), ``schedule`` (the step's prefill chunks; every
request in the decode pool decodes), and after the step ``on_step_end`` (tokens computed,
requests done).

``ContinuousScheduler`` follows vLLM's v1 scheduler (vllm/v1/core/sched/scheduler.py): each
step spends a token budget (``max_num_batched_tokens`` per rank) on the running requests first
(a decode takes one token, 1 + k when speculating; an unfinished prefill its next chunk), then
admits waiting requests in arrival order while the budget, ``max_num_seqs`` and the KV cache
allow, a long prompt getting a chunk (with chunked prefill; without it a prompt must fit the
budget whole); with ``full_prompt_admission`` (vLLM 0.19 and later, scheduler_reserve_full_isl)
a request is admitted only where its whole prompt fits in the free KV, not its first chunk
alone. KV blocks are allocated as a request's tokens reach a new block; when a step
needs a block and none is free, the newest running request is preempted: its blocks are freed
and it goes back to the front of the queue, to recompute its prompt and the tokens it had
generated (vLLM's recompute preemption); with prefix caching on, the whole blocks it had
computed stay cached until the pool evicts them, and its recompute starts from those it finds
(``planner.serving.kv.PrefixCache.stash``). A preempted request whose prompt and generated
tokens no longer fit one step's budget, with chunked prefill off, is refused as vLLM V0's
scheduler ignores it (``RequestResult.failed``).

Two switches of ``SchedulerConfig`` change it to other engines' schedulers.
``capacity_policy="guaranteed-no-evict"`` is TensorRT-LLM's default capacity scheduler
(tensorrt_llm/_torch/pyexecutor/scheduler.py): a request is admitted only when the blocks of
its whole prompt and output are free beside what the running requests were promised, so a
step never runs out of blocks and nothing is preempted; the pool reserves each request's
whole length at admission. ``mixed_batches=False`` is SGLang's default (no
``--enable-mixed-chunk``, python/sglang/srt/managers/scheduler.py ``get_next_batch_to_run``):
a step that can prefill (a chunk to continue or a request to admit) runs those prefills
alone, and the running requests decode only in steps with no prefill; their tokens wait.
``decode_reserve`` is SGLang's admission (python/sglang/srt/managers/schedule_policy.py
``PrefillAdder``): a waiting request is admitted only if its uncached prompt and its output
(up to a clip) fit in the free and evictable KV less the running requests' outputs still to
come (each up to the clip) times a ratio, and less what the requests admitted before it in the
same step asked for; the ratio falls with each decode step to a floor, is set from the
decoders' progress after a retraction, and starts over when the server idles (a request still
prefilling in chunks is held at the ratio, as a running one). A request sent with ignore_eos to
a server whose prefix cache is off is admitted by SGLang's other path: its prompt must fit, and
every request's whole output with it as they finish shortest first (``eos_fits``).

With prefix caching (the KV pool's ``PrefixCache``, continuous batching), a request admitted
while its prefix is cached starts with those tokens computed and holds them with the others;
one that computes its prefix caches it for those after it. Making room evicts cached
prefixes no request uses before it preempts anyone.

``StaticScheduler`` forms a batch of up to ``max_num_seqs`` waiting requests (each reserving
its whole length), runs their prefill, then decodes the whole batch until its longest request
is done (finished sequences are padding), then forms the next. ``DynamicScheduler`` does the
same, but an idle server waits up to ``max_wait_s`` after the oldest waiting request's arrival
for the batch to fill. Pure: no I/O.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable

from planner.core.errors import UsageError
from planner.serving.config import SchedulerConfig
from planner.serving.decoding import DecodePool
from planner.serving.kv import KVPool
from planner.serving.requests import RequestState, SimRequest

Chunks = list[tuple[SimRequest, int]]  # (request, tokens it prefills this step)

_DECODING = RequestState.DECODING
_PREFILLING = RequestState.PREFILLING
_PREFILLED = RequestState.PREFILLED


def eos_fits(states: list[tuple[int, int]], free: int) -> bool:
    """SGLang 0.5.10's test of a request sent with ignore_eos (PrefillAdder
    add_one_req_ignore_eos, python/sglang/srt/managers/schedule_policy.py), ``free`` the free
    and evictable KV less the newcomer's prompt in pages, ``states`` every request's (output
    tokens to come, prompt + generated) ascending, the newcomer's among them: as they finish
    shortest first, when the i-th finishes the n - i still running have each written its
    tokens to come, beside the prompts and outputs the i before it freed; each stage must
    leave more than IGNORE_EOS_RESERVE_TOKENS (1) a running request."""
    return eos_fits_at([(left, 0, held, 0) for left, held in states], free, 0)


def _insert_after_first(states: list, entry: tuple) -> None:
    """SGLang's insertion of a step's second and later ignore_eos newcomers into its
    req_states (add_req_state with insert_sort, 0.5.10): before the first entry with as many
    tokens to come or more, scanning from the front, and where none has, before the last
    entry (its loop variable keeps the last index), not after it."""
    i, key = 0, entry[0]
    for i in range(len(states)):
        if key <= states[i][0]:
            break
    states.insert(i, entry)


# the rank among entries with as many tokens to come of a request prefilling (SGLang's
# can_run_list, after its running batch in req_states), above any decoder's joining order
_AFTER_RUNNING = 1 << 60


def eos_fits_at(states: list[tuple[int, int, int, int]], free: int, G: int) -> bool:
    """``eos_fits`` over ``states`` written G-invariant, as a decode pool keeps them
    (``DecodePool.outputs_left``): (tokens to come + G, rank among equals, tokens held - G,
    id), in SGLang's order."""
    n, freed = len(states), 0
    for i, (left, _, held, _) in enumerate(states):
        running = n - i
        if free + freed - (left - G) * running <= running:
            return False
        freed += held + G
    return True


def _in_pages(tokens: int, page: int) -> int:
    """``tokens`` rounded up to whole pages of ``page`` (SGLang's ceil_paged_tokens)."""
    return tokens if page == 1 else -(-tokens // page) * page


# a step's budget where none binds (SGLang with chunked prefill off:
# ``SchedulerConfig.takes_whole_prompts``)
WHOLE = 1 << 62


class Scheduler:
    """The queues, the pools and what every policy does alike."""

    inner = False  # the step ``schedule`` filled continues a multi-step block
    bursts = False  # a multi-step block's tokens reach the client at its end

    __slots__ = ("kv", "batch", "waiting", "running", "prefilling", "finished", "preemptions",
                 "stamp", "token_budget", "chunk_tokens", "max_seqs", "chunked", "unchunked",
                 "whole", "mixed", "decodes", "refused", "on_done", "reserve", "ratio",
                 "retracted", "full_prompt", "prefill_cap", "page", "holds_long",
                 "ranks", "wait_iters", "wait_tokens", "waited", "eos_check", "blocked",
                 "blocked_free")

    def __init__(self, cfg: SchedulerConfig, kv: KVPool, batch: DecodePool):
        self.kv, self.batch = kv, batch
        self.waiting: deque[SimRequest] = deque()
        # dicts, so that a finish or a preemption is O(1) and the newest is the last key
        self.running: dict[int, SimRequest] = {}
        self.prefilling: dict[int, SimRequest] = {}
        self.finished = 0  # requests whose every token is out
        self.preemptions = 0
        self.stamp = 0  # admissions so far
        self.token_budget = cfg.max_num_batched_tokens * cfg.ranks  # a step's, all ranks'
        self.chunk_tokens = cfg.max_num_batched_tokens  # the largest prefill chunk: a rank's
        if cfg.takes_whole_prompts:  # SGLang unchunked: max_prefill_tokens bounds a step
            self.token_budget = self.chunk_tokens = WHOLE
        self.max_seqs = cfg.max_num_seqs * cfg.ranks
        self.chunked = cfg.chunks_prompts
        self.unchunked = cfg.unchunked_why  # a refusal's reason when not chunked
        self.whole = cfg.capacity_policy == "guaranteed-no-evict"  # reserve whole lengths
        # vLLM's scheduler_reserve_full_isl (0.19 and later): a waiting request's whole
        # prompt must fit in the free and evictable KV before its first chunk is admitted
        self.full_prompt = cfg.full_prompt_admission and not self.whole
        # SGLang mixes a prefill step with the decodes only where it chunks (is_mixed_chunk:
        # chunked_prefill_size set and --enable-mixed-chunk)
        self.mixed = cfg.mixed_batches and not cfg.takes_whole_prompts
        # SGLang's max_prefill_tokens (``SchedulerConfig.max_prefill_tokens``), each rank's
        # pooled over the ranks as the step budget is, counted in its pages; each rank's
        # first request is taken whatever its length
        self.prefill_cap = None if cfg.max_prefill_tokens is None else \
            cfg.max_prefill_tokens * cfg.ranks
        self.ranks = cfg.ranks
        # SGLang counts a step's tokens in its pages; 1 (nothing to round) elsewhere
        self.page = cfg.block_size if self.prefill_cap is not None else 1
        # TensorRT-LLM's batch waiting (``SchedulerConfig.batch_wait_iters``): off under
        # attention data parallelism, and where either figure is 0 (its test
        # 'iters >= timeout or tokens >= ratio x max' then always stops waiting)
        self.wait_iters = cfg.batch_wait_iters if cfg.ranks == 1 and \
            cfg.batch_wait_tokens_ratio > 0 else 0
        self.wait_tokens = cfg.batch_wait_tokens_ratio * cfg.max_num_batched_tokens
        self.waited = 0  # steps in a row the prefills were held back
        # SGLang's add_one_req: a prompt whole at or above what is left waits, and a
        # truncated chunk is rounded down to whole pages; a request sent with ignore_eos to a
        # server whose prefix cache is off goes by add_one_req_ignore_eos, which does neither
        self.holds_long = self.prefill_cap is not None and not (
            cfg.ignore_eos and not cfg.prefix_caching)
        # ... and admits a request only where the KV left, as the requests finish shortest
        # first, holds every one's whole output (``eos_fits``); SGLang skips that test on
        # its hybrid sliding-window pool (is_hybrid_swa), which llmplan does not model: every
        # model is tested
        self.eos_check = cfg.decode_reserve is not None and cfg.ignore_eos and \
            not cfg.prefix_caching
        if self.eos_check:
            batch.keep_order()
        # SGLang's admission (``SchedulerConfig.decode_reserve``): KV held back for the
        # running requests' future tokens, at a ratio of what they have left that falls
        # with every decode step
        self.reserve = r = cfg.decode_reserve
        self.ratio = 0.0
        if r is not None:
            self.ratio, batch.clip = r.init_ratio, r.clip_tokens
        self.retracted = False  # this step's decodes preempted to make room
        self.decodes = True  # whether the step ``schedule`` filled runs the decode pool
        self.refused = 0  # requests refused while queued (their recompute grew too long)
        # called with each request as it is done or refused (its figures final): the run's
        # records keep them (``planner.serving.records``) and let the objects go
        self.on_done: Callable[[SimRequest], None] | None = None
        # the head of the queue whose admission last failed for want of KV (or of the step's
        # budget) in a step that admitted nothing, and the free tokens then: until KV is
        # released it fails again in every step where free tokens only fall (the event
        # loop's inner loop steps on past it; ``planner.serving.sim._decode_run``)
        self.blocked: SimRequest | None = None
        self.blocked_free = 0

    def wait_until(self, now: float, arrivals) -> float | None:
        """The time to idle until before the next step; None: step now."""
        return None

    def schedule(self) -> Chunks:
        """The prefill chunks of the next step, beside the decode pool's requests."""
        raise NotImplementedError

    def on_step_end(self, chunks: Chunks, now: float) -> None:
        """The step ended at ``now``: the decoders due are done, the chunks computed."""
        batch = self.batch
        r = self.reserve
        if r is not None and self.decodes and batch.n:
            # a decode step ran: SGLang trusts the running requests' outputs to be shorter,
            # unless it had to retract some to run it (the ratio was set then)
            if not self.retracted:
                self.ratio = max(self.ratio - r.ratio_fall_per_step, r.min_ratio)
            self.retracted = False
        pop_due, decoded = batch.pop_due, self._decoded
        q = pop_due()
        while q is not None:
            q.generated = q.r.output_tokens
            q.computed = batch.context(q)
            decoded(q, now)
            q = pop_due()
        prefilling, cache, after_chunk = self.prefilling, self.kv.prefixes, self.kv.after_chunk
        for q, c in chunks:
            q.computed += c
            if cache is not None and q.prefix >= 0 and q.shared < q.prefix_tokens and \
                    q.computed >= q.prefix_tokens:
                q.reserved -= cache.publish(q)
            after_chunk(q)
            if q.computed < q.target:
                continue
            prefilling.pop(q.id, None)
            q.generated += 1  # the prefill's token
            if math.isnan(q.r.first_token_s):
                q.r.first_token_s = now
            self._prefilled(q, now)

    def _decoded(self, q: SimRequest, now: float) -> None:
        """``q``'s last token came out of a decode step."""
        raise NotImplementedError

    def _prefilled(self, q: SimRequest, now: float) -> None:
        """``q``'s prefill is computed, its first token out (of a recompute: the next)."""
        raise NotImplementedError

    def stuck(self) -> UsageError:
        """Why a step found nothing to run while requests wait."""
        q = self.waiting[0]
        if not self.chunked and q.target > self.chunk_tokens:
            return UsageError(f"request {q.id}'s prompt ({q.target:,} tokens) exceeds "
                              f"max-num-batched-tokens ({self.chunk_tokens:,}) "
                              f"and {self.unchunked}")
        return UsageError("no request could be scheduled: the KV cache cannot hold the "
                          "next request beside those running")

    def _admit(self, q: SimRequest, tokens: int, hit: int = 0, own: int = 0) -> bool:
        """Move the head of the queue into the running set, reserving KV for ``tokens`` (its
        whole length under guaranteed-no-evict) beyond the ``hit`` tokens of its prefix
        found cached and the ``own`` tokens of its own kept from a preemption, which it
        starts with computed."""
        if self.whole:
            tokens = q.r.prompt_tokens + q.r.output_tokens + self.batch.k1 - 1 - hit - own
        kv = self.kv
        cache = kv.prefixes
        if hit:
            cache.pin(q, hit)  # before reserving, which may evict what is not in use
        kept = cache.claim(q) if own else 0
        if not kv.reserve(q, tokens):
            if hit:
                cache.unpin(q)
            if kept:
                cache.unclaim(q, kept, hit)
            return False
        if cache is not None:
            cache.count(q, hit)  # the hit rate counts prefixes, not recomputes
            q.computed = hit + own
            q.reserved += own
            kv.free_tokens += kept - own  # blocks beyond what it can use go back
        if q.loaded:  # its KV arrived with it; a recompute after a preemption computes it
            q.computed, q.loaded = q.loaded, 0
        self.waiting.popleft()
        q.admitted = self.stamp = self.stamp + 1
        q.state = _PREFILLING
        self.running[q.id] = q
        self.prefilling[q.id] = q
        return True

    def _release(self, q: SimRequest) -> None:
        self.blocked = None  # its KV may let the head in
        if q.state is _DECODING:
            self.batch.settle(q)  # while its state still says how much it holds
        self.kv.release(q)

    def _done(self, q: SimRequest, now: float) -> None:
        q.r.finish_s = now
        self.finished += 1
        if self.on_done is not None:
            self.on_done(q)

    def _refuse_head(self, reason: str) -> None:
        """The head of the queue can never run: it leaves unserved, ``reason`` recorded."""
        q = self.waiting.popleft()
        q.r.failed = reason
        q.state = RequestState.FINISHED
        self.finished += 1
        self.refused += 1
        if self.on_done is not None:
            self.on_done(q)


class ContinuousScheduler(Scheduler):
    """vLLM's continuous batching with chunked prefill and recompute preemption."""

    __slots__ = ()

    def schedule(self) -> Chunks:
        batch = self.batch
        if not self.mixed:
            return self._schedule_apart()
        if batch.n:
            self._make_room_for_decodes()
        chunks: Chunks = []
        if not self.prefilling and not self.waiting:  # a decode-only step
            return chunks
        if self.wait_iters and batch.n and self._holds_prefills():
            return chunks  # TensorRT-LLM's batch waiting: the decodes run alone
        budget = self._continue_prefills(chunks, self.token_budget - batch.n * batch.k1)
        self._admit_waiting(chunks, budget)
        return chunks

    def _holds_prefills(self) -> bool:
        """TensorRT-LLM's PyExecutor._waiting_requests: the prefills this step would run (its
        unfinished ones, then the waiting requests the budget, the seats and, under
        guaranteed-no-evict, the KV cache let in, as the capacity and micro-batch schedulers
        choose them; each counted by its whole prompt, as len(get_tokens(0))) are held back
        while they and the decodes' tokens stay under the share of max_num_tokens and fewer
        than the timeout's steps have held them; a step that would run none holds nothing and
        counts nothing."""
        batch, kv = self.batch, self.kv
        cache = kv.prefixes
        left = self.token_budget - batch.n * batch.k1
        seats = self.max_seqs - len(self.running)
        room = kv.free_or_evictable_tokens() if self.whole else 0
        tokens = found = 0
        for q in self.prefilling.values():
            if left <= 0:
                break
            left -= min(q.target - q.computed, left, self.chunk_tokens)
            tokens, found = tokens + q.target, found + 1
        for q in self.waiting:
            hit, own = cache.lookup(q) if cache is not None else (0, 0)
            need = q.target - hit - own - q.loaded
            if left <= 0 or seats <= 0 or (not self.chunked and need > min(left,
                                                                          self.chunk_tokens)):
                break
            if self.whole:  # the blocks of its whole length, as _admit reserves them
                room -= kv.tokens_for(q.r.prompt_tokens + q.r.output_tokens + batch.k1 - 1
                                      - hit - own)
                if room < 0:
                    break
            left -= min(need, left, self.chunk_tokens)
            seats -= 1
            tokens, found = tokens + q.target, found + 1
        if not found:
            return False
        if self.waited >= self.wait_iters or tokens + batch.n * batch.k1 >= self.wait_tokens:
            self.waited = 0
            return False
        self.waited += 1
        return True

    def _schedule_apart(self) -> Chunks:
        """SGLang's order: prefill whatever can be prefilled, in a step of its own; decode
        only when nothing can."""
        chunks: Chunks = []
        budget = self._continue_prefills(chunks, self.token_budget)
        self._admit_waiting(chunks, budget)
        self.decodes = not chunks
        if self.decodes and self.batch.n:
            self._make_room_for_decodes()
        return chunks

    def _make_room_for_decodes(self) -> None:
        """Decodes first: reserve the blocks the decoding requests' next tokens open (their
        1 + k slots when speculating, as vLLM's lookahead slots), preempting the newest
        running requests until they fit."""
        batch, kv, running = self.batch, self.kv, self.running
        grow = batch.growth_tokens()
        if grow <= kv.free_tokens:  # the common step: room without evicting or preempting
            batch.take_growth(grow)
            return
        retracted = False
        # under speculative decoding SGLang retracts from the back (the newest), unsorted
        by_outputs = self.reserve is not None and self.reserve.fewest_outputs_first \
            and batch.k1 == 1
        while True:
            grow = batch.growth_tokens()
            if kv.make_room(grow) or not running:
                break
            self._preempt(self._fewest_outputs() if by_outputs else self._newest())
            retracted = True
        batch.take_growth(grow)
        if retracted and self.reserve is not None:
            # SGLang's retract_decode: the ratio the running requests' outputs have shown
            done, outs = batch.decoded_tokens()
            if outs:
                self.ratio = min(1.0, (done + self.reserve.retract_steps * batch.n) / outs)
            self.retracted = True

    def _fewest_outputs(self) -> SimRequest:
        """SGLang's retraction victim: of the decoding requests, the one with the fewest
        output tokens (those before a retraction count), the longest prompt among them, the
        newest of full ties; the newest running request when none decodes."""
        # a request's outputs are g0 + G - G0 (the plain pool's ``gained``: SGLang sorts so
        # only without speculation); G is the same for all, so g0 - G0 orders them
        best, fewest, longest = None, 0, 0
        for q in self.running.values():
            if q.state is not _DECODING:
                continue
            outs, prompt = q.g0 - q.G0, q.r.prompt_tokens
            if best is None or outs < fewest or (outs == fewest and prompt >= longest):
                best, fewest, longest = q, outs, prompt
        return best if best is not None else self._newest()

    def _newest(self) -> SimRequest:
        """The running request admitted last: vLLM's preemption victim."""
        running = self.running
        return running[next(reversed(running))]

    def _continue_prefills(self, chunks: Chunks, budget: int) -> int:
        """Unfinished prefills continue, in admission order; returns the budget left."""
        if not self.prefilling:
            return budget
        per_rank, chunked = self.chunk_tokens, self.chunked
        for q in list(self.prefilling.values()):
            if budget <= 0:
                break
            if q.id not in self.prefilling:  # preempted to make room for an older one
                continue
            left = q.target - q.computed
            cap = min(budget, per_rank)
            chunk = min(left, cap) if chunked else (left if left <= cap else 0)
            if chunk <= 0:
                continue
            if not self._ensure(q, q.computed + chunk):
                self._preempt(q)
                continue
            chunks.append((q, chunk))
            # SGLang's add_chunked_req: the chunk is not rounded, its pages are counted
            budget -= _in_pages(chunk, self.page)
        return budget

    def _admit_waiting(self, chunks: Chunks, budget: int) -> None:
        """Admit waiting requests in order while the budget, the seats and the KV allow."""
        if not self.waiting:
            return
        waiting, running, per_rank = self.waiting, self.running, self.chunk_tokens
        cache, chunked, max_seqs, admit = self.kv.prefixes, self.chunked, self.max_seqs, \
            self._admit
        reserve = self.reserve
        room = clip = 0
        eos, states = self.eos_check, None  # SGLang's req_states, built at first use
        eos_sum = eos_n = eos_most = None  # their outputs to come, count, most, unbuilt
        eos_new: list[tuple[int, int, int, int]] = []  # the step's admissions by that path
        if reserve is not None and waiting:
            # less a page for each prefill the step continues (add_chunked_req's
            # _update_prefill_budget)
            room, clip = self._reserve_room() - self.page * len(chunks), reserve.clip_tokens
        # SGLang's PrefillAdder.rem_input_tokens: what is left of max_prefill_tokens after
        # the prefills this step continues (and, mixed, one token a running request)
        most, ranks, holds, page = self.prefill_cap, self.ranks, self.holds_long, self.page
        rem = math.inf
        if most is not None:
            rem = most - sum(_in_pages(c, page) for _, c in chunks) - \
                (self.batch.n if self.mixed else 0)
        # the first waiting request is tried whatever is left (SGLang checks the budget after
        # each add_one_req, not before the first)
        while waiting and budget > 0 and len(running) < max_seqs:
            q = waiting[0]
            hit, own = cache.lookup(q) if cache is not None else (0, 0)
            loaded = q.loaded  # KV that came with it: held from admission, not computed
            left = q.target - hit - own - loaded
            if not chunked and left > per_rank:  # a recompute grown too long
                self._refuse_head(f"its recompute ({q.target:,} tokens) exceeds "
                                  f"max-num-batched-tokens ({per_rank:,}) and "
                                  f"{self.unchunked}")
                continue
            paged_left = _in_pages(left, page)
            if holds and len(chunks) >= ranks and paged_left >= rem:
                break  # add_one_req: a whole prompt at or above what is left, not the first
            cap = min(budget, per_rank)
            if not chunked:
                chunk = left
            elif holds and paged_left > cap:  # truncated to whole pages
                chunk = cap // page * page
                if chunk <= 0:
                    break
            else:
                chunk = min(left, cap)
            if reserve is not None:
                # SGLang's PrefillAdder.add_one_req: its whole uncached prompt and its output
                # (up to the clip) must fit in what the running requests leave
                want = min(q.r.output_tokens - q.generated, clip)
                if not eos:
                    if left + want >= room:
                        break
                else:  # add_one_req_ignore_eos: the prompt alone, then the outputs to come
                    # cur_rem_tokens: a page for each request added this step beside its KV
                    free = self.kv.free_or_evictable_tokens() - page * len(chunks)
                    if paged_left > min(free, room):
                        break
                    mine = q.r.output_tokens - q.generated
                    G = self.batch.G
                    # a step's first newcomer heads the entries with as many to come
                    entry = (mine + G, -1, q.r.prompt_tokens + q.generated - G, q.id)
                    if states is None:
                        if eos_sum is None:
                            eos_sum, eos_n, eos_most = self._outputs_to_come(chunks)
                        # no stage needs more than every output to come and a token a
                        # request, in the sorted list of a step's first newcomer; in the
                        # order SGLang's insertion leaves a later one, the longest once
                        # more: where that fits, so does its test (O(1))
                        total, n = eos_sum + max(mine, 0), eos_n + (mine > 0)
                        if free - paged_left - total - \
                                (max(eos_most, mine) if eos_new else 0) <= n:
                            states = self._outputs_left(chunks, eos_new)
                    if states is not None:  # a refusal ends the step's admissions: no copy
                        if mine > 0:
                            (_insert_after_first if eos_new else bisect.insort)(states, entry)
                        if not eos_fits_at(states, free - paged_left, G):
                            break
                    elif mine > 0:
                        eos_sum, eos_n = eos_sum + mine, eos_n + 1
                        eos_most = max(eos_most, mine)
                    eos_new.append(entry)
            if chunk > cap or (self.full_prompt and chunk < left and
                               not self._whole_prompt_fits(q, hit)) or \
                    not admit(q, chunk + loaded, hit, own):
                if not chunks:
                    self.blocked, self.blocked_free = q, self.kv.free_tokens
                break
            chunks.append((q, chunk))
            used = _in_pages(chunk, page)
            budget -= used
            rem -= used
            if reserve is not None:  # a truncated first chunk reserves no output yet
                # _update_prefill_budget: its pages, a page more and its output up to the clip
                # (ignore_eos: the whole output's, generated tokens not taken off)
                out = min(q.r.output_tokens, clip) if eos else want
                room -= used + page + (out if chunk == left else 0)
            if rem <= 0 and len(chunks) >= ranks:
                break  # budget_state: max_prefill_tokens spent (each rank's first taken)

    def _outputs_to_come(self, chunks: Chunks) -> tuple[int, int, int]:
        """The sum of the output tokens still to come of what ``_outputs_left`` lists, their
        count and (no fewer than) the most of one: O(1) for the decoders."""
        batch = self.batch
        total, n, most = batch.all_left(), batch.n, batch.most_left()
        if self.prefilling or chunks:  # most steps add nothing beside the decoders
            for _, left in self._step_others(chunks):
                total, n, most = total + left, n + 1, max(most, left)
        return total, n, most

    def _step_others(self, chunks: Chunks) -> list[tuple[SimRequest, int]]:
        """The requests beside the decoders that SGLang's req_states lists: those prefilling
        and those this step has added, each once, with the output tokens it has still to
        come, where it has any."""
        out, seen = [], set()
        for q in (*self.prefilling.values(), *(c[0] for c in chunks)):
            if q.id not in seen:
                seen.add(q.id)
                left = q.r.output_tokens - q.generated
                if left > 0:
                    out.append((q, left))
        return out

    def _outputs_left(self, chunks: Chunks, new: list[tuple[int, int, int, int]]
                      ) -> list[tuple[int, int, int, int]]:
        """SGLang's req_states (PrefillAdder.add_one_req_ignore_eos) as it stands before the
        step's next such admission: built at the step's first one from that request, the
        running requests and those added so far (the prefill it continues), ascending by the
        output tokens each has still to come; each later newcomer (``new``, this step's
        admissions by that path, in order) inserted as SGLang inserts it
        (``_insert_after_first``). Each entry is (tokens to come + G, rank among equals,
        prompt and tokens generated - G, id), G the decode pool's step (``eos_fits_at``).
        Every request of such a run is sent with ignore_eos, so each counts its whole output
        (new_token_ratio 1.0), with no clip."""
        out, G = self.batch.outputs_left(), self.batch.G
        if not self.prefilling and not chunks:
            return out
        first = new[0][3] if new else None
        later = {e[3] for e in new[1:]}
        for k, (q, left) in enumerate(self._step_others(chunks)):
            if q.id not in later:  # the first newcomer before its equals, the prefill after
                rank = -1 if q.id == first else _AFTER_RUNNING + k
                bisect.insort(out, (left + G, rank, q.r.prompt_tokens + q.generated - G, q.id))
        for e in new[1:]:
            if e[0] > G:
                _insert_after_first(out, e)
        return out

    def _whole_prompt_fits(self, q: SimRequest, hit: int) -> bool:
        """vLLM's KVCacheManager.can_fit_full_sequence (0.19.1 vllm/v1/core/kv_cache_manager.py
        and single_type_kv_cache_manager.py get_num_blocks_to_allocate): the blocks ``q``'s
        whole prompt (with what it generated before a preemption) takes, less the ``hit``
        tokens of its prefix found cached where running requests hold them, are no more than
        the free blocks, those of cached prefixes no running request uses among them (vLLM's
        free queue holds them). A hit no request holds, and the blocks a preempted request
        kept of its own, sit among those free blocks and are counted as blocks to take, as
        vLLM counts an evictable computed block. A sliding-window model's pool counts its
        sliding layers' window (``need_for``), as vLLM does once its admission cap counts
        them (vllm-project/vllm#39866; 0.19.1 counted the whole prompt there, #39734)."""
        kv = self.kv
        cache = kv.prefixes
        need = kv.need_for(q, q.target)
        if hit and cache.entries.get(q.prefix, (0, 0))[1] > 0:  # held by running requests
            need -= hit
        if need <= kv.free_tokens:  # without summing the idle prefixes
            return True
        return need <= kv.free_or_evictable_tokens()

    def _reserve_room(self) -> int:
        """SGLang's rem_total_tokens before a step's admissions: the free and evictable KV
        less the running requests' tokens still to come, each up to the clip, at the ratio
        (an idle server starts over from the initial ratio)."""
        r = self.reserve
        if not self.running:
            self.ratio = r.init_ratio
        clip = r.clip_tokens
        left = self.batch.left_tokens() + sum(
            min(q.r.output_tokens - q.generated, clip) for q in self.prefilling.values())
        kv = self.kv
        free = kv.free_or_evictable_tokens()
        return free - self.ratio * left

    def _ensure(self, q: SimRequest, tokens: int) -> bool:
        """Reserve KV for ``q`` to hold ``tokens``; preempt the newest others if needed."""
        kv = self.kv
        need = kv.extra_for(q, tokens)
        while not kv.make_room(need):
            victim = self._newest()
            if victim is q:
                return False
            self._preempt(victim)
        kv.grow(q, need)
        return True

    def _preempt(self, q: SimRequest) -> None:
        """Free ``q``'s KV and queue it first, to recompute what it had (vLLM's recompute
        preemption)."""
        del self.running[q.id]
        self.prefilling.pop(q.id, None)
        decoding = q.state is _DECODING
        kept, shared = (self.batch.context(q) if decoding else q.computed), q.shared
        self._release(q)
        if decoding:
            q.generated = q.g0 + self.batch.gained(q)
            self.batch.leave(q)  # its entry goes stale: the state check skips it
        if self.kv.prefixes is not None:  # its blocks stay cached, evictable
            self.kv.free_tokens -= self.kv.prefixes.stash(q, kept, shared)
        q.state, q.computed = RequestState.PREEMPTED, 0
        q.target = q.r.prompt_tokens + q.generated
        q.r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(q)

    def _finish(self, q: SimRequest, now: float) -> None:
        del self.running[q.id]
        self.prefilling.pop(q.id, None)
        self._release(q)
        q.state = RequestState.FINISHED
        self._done(q, now)

    def _decoded(self, q: SimRequest, now: float) -> None:
        self._finish(q, now)
        self.batch.leave(q)

    def _prefilled(self, q: SimRequest, now: float) -> None:
        if q.generated >= q.r.output_tokens:
            self._finish(q, now)
        else:
            self.batch.join(q)


class MultiStepScheduler(ContinuousScheduler):
    """vLLM V0's multi-step scheduling (``--num-scheduler-steps`` N, 0.6-0.7): the scheduler
    runs once for N forward steps. A step that decodes opens a block of N: the N - 1 after it
    decode the same requests, with no admission and no prefill chunk, however many requests
    wait (vLLM's ``_has_remaining_steps`` skips the scheduler until the block is done). A
    prefill without chunked prefill is a block of one step (``init_multi_step_from_lookahead_
    slots``: no lookahead slots for it). With chunked prefill on, prompts are still not
    chunked (``SchedulerConfig.chunks_prompts``: each is scheduled whole, when it fits the
    step's budget, beside the decodes), and a step holding prefills opens a block too, whose
    later steps decode the requests decoding by then, those it prefilled among them (its
    lookahead slots "for when the prefills turn into decodes"). ``inner`` says the step
    being filled is one of a block's later ones, which the event loop prices with the host's
    work beside the GPU's (``planner.serving.sim``): scheduling and input preparation ran
    once, for the block. Requests that finish within a block leave it at their last token;
    vLLM computes them to the block's end and discards those tokens, a cost (their KV reads)
    left out here.

    Tokens stream as each step ends (``multi_step_stream_outputs``, on by default since 0.6.3)
    or, with it off (0.6.0-0.6.2's only way), in bursts: a block's tokens reach the client
    when the block ends, so a first token or a last one that came mid-block is seen then
    (``held``; the event loop counts one inter-token gap per request and block)."""

    __slots__ = ("steps", "left", "inner", "bursts", "held_first", "held_done")

    def __init__(self, cfg: SchedulerConfig, kv: KVPool, batch: DecodePool):
        super().__init__(cfg, kv, batch)
        self.steps = cfg.scheduler_steps
        self.left = 0  # steps of the current block still to run
        self.inner = False
        self.bursts = not cfg.multi_step_stream
        self.held_first: list[SimRequest] = []  # first tokens out at the block's end
        self.held_done: list[SimRequest] = []  # last tokens likewise

    def schedule(self) -> Chunks:
        batch = self.batch
        if self.left and batch.n:
            self.left -= 1
            self.inner = self.decodes = True
            self._make_room_for_decodes()
            return []
        self.inner = False
        chunks = super().schedule()
        opens = self.decodes and batch.n if not chunks else self.mixed
        self.left = self.steps - 1 if opens else 0
        return chunks

    def on_step_end(self, chunks: Chunks, now: float) -> None:
        super().on_step_end(chunks, now)
        if not self.left or not self.batch.n:  # the block is done
            self.left = 0
            if self.held_first or self.held_done:
                self._deliver(now)

    def _prefilled(self, q: SimRequest, now: float) -> None:
        if self.bursts and q.r.first_token_s == now:
            self.held_first.append(q)
        super()._prefilled(q, now)

    def _done(self, q: SimRequest, now: float) -> None:
        # held even at a block's last step: its first token may be held too, and both are
        # out before the step's end (``on_step_end`` delivers them)
        if self.bursts:
            self.held_done.append(q)
        else:
            super()._done(q, now)

    def _deliver(self, now: float) -> None:
        """The block's tokens reach the client: the first and last tokens held are out now."""
        for q in self.held_first:
            q.r.first_token_s = now
        for q in self.held_done:
            super()._done(q, now)
        self.held_first, self.held_done = [], []


class StaticScheduler(Scheduler):
    """Whole batches: prefill together, decode together until the longest is done."""

    __slots__ = ("members",)

    def __init__(self, cfg: SchedulerConfig, kv: KVPool, batch: DecodePool):
        super().__init__(cfg, kv, batch)
        self.members: list[SimRequest] = []  # the batch being served

    def schedule(self) -> Chunks:
        if not self.members:
            self._form_batch()
        chunks: Chunks = []
        budget = self.token_budget - self.batch.n * self.batch.k1
        for q in list(self.prefilling.values()):  # the batch's prompts, chunked
            if budget <= 0:
                break
            chunk = min(q.target - q.computed, budget, self.chunk_tokens)
            if chunk <= 0:
                continue
            chunks.append((q, chunk))
            budget -= chunk
        return chunks

    def _form_batch(self) -> None:
        """The next batch from what is waiting, each request reserving its whole length."""
        waiting, members = self.waiting, self.members
        while waiting and len(members) < self.max_seqs:
            q = waiting[0]
            if not self._admit(q, q.r.prompt_tokens + q.r.output_tokens):
                break
            members.append(q)

    def _decoded(self, q: SimRequest, now: float) -> None:
        q.state = RequestState.PADDING  # decodes on until the batch's longest is done
        self.batch.padding += 1
        self._done(q, now)

    def _prefilled(self, q: SimRequest, now: float) -> None:
        q.state = _PREFILLED  # decodes start when the whole batch is prefilled
        if q.generated >= q.r.output_tokens:
            q.state = RequestState.PADDING_PREFILLED
            self._done(q, now)

    def on_step_end(self, chunks: Chunks, now: float) -> None:
        super().on_step_end(chunks, now)
        members = self.members
        if not members:
            return
        if not self.batch.n and any(q.state is _PREFILLED for q in members) and all(
                q.state is not _PREFILLING for q in members):
            self._start_decoding()
        if all(q.state.finished for q in members):
            self._end_batch()

    def _start_decoding(self) -> None:
        """The whole batch is prefilled: it decodes together from here."""
        batch = self.batch
        for q in self.members:
            if q.state is _PREFILLED:
                batch.join(q)
            elif q.state is RequestState.PADDING_PREFILLED:  # one token only: pads along
                batch.join(q)
                q.state = RequestState.PADDING  # its entry is skipped as stale
                batch.padding += 1

    def _end_batch(self) -> None:
        """The batch's longest is done: free it all."""
        batch, running = self.batch, self.running
        for q in self.members:
            if q.state is RequestState.PADDING:
                batch.leave(q)
            del running[q.id]
            self._release(q)
            q.state = RequestState.FINISHED
        batch.padding = 0
        self.members = []


class DynamicScheduler(StaticScheduler):
    """Static batches that an idle server holds open for up to ``max_wait_s``."""

    __slots__ = ("max_wait_s",)

    def __init__(self, cfg: SchedulerConfig, kv: KVPool, batch: DecodePool):
        super().__init__(cfg, kv, batch)
        self.max_wait_s = cfg.max_wait_s

    def wait_until(self, now: float, arrivals) -> float | None:
        """Hold the batch open until it fills or its oldest request has waited max_wait_s
        (the server cannot know that nothing more is coming), counted from when the engine saw
        it (``SimRequest.visible_s``: after the API server)."""
        waiting = self.waiting
        if self.members or not waiting or len(waiting) >= self.max_seqs:
            return None
        deadline = waiting[0].visible_s + self.max_wait_s
        if not deadline > now:
            return None
        nxt = arrivals.next_s()
        return min(deadline, nxt) if nxt == nxt else deadline  # nan: none is coming


SCHEDULERS: dict[str, type[Scheduler]] = {"continuous": ContinuousScheduler,
                                          "static": StaticScheduler,
                                          "dynamic": DynamicScheduler}


def make_scheduler(cfg: SchedulerConfig, kv: KVPool, batch: DecodePool) -> Scheduler:
    """The scheduler of ``cfg.kind`` over these pools."""
    cls = SCHEDULERS.get(cfg.kind)
    if cls is None:
        raise UsageError(f"scheduler: {cfg.kind!r} is not one of {', '.join(SCHEDULERS)}")
    if cls is ContinuousScheduler and cfg.scheduler_steps > 1:
        cls = MultiStepScheduler
    return cls(cfg, kv, batch)
