"""A discrete-event simulation of one replica serving a request stream, step by step.

Continuous batching follows vLLM's v1 scheduler (vllm/v1/core/sched/scheduler.py): each step
spends a token budget (``max_num_batched_tokens``) on the running requests first (a decode
takes one token, an unfinished prefill its next chunk), then admits waiting requests in arrival
order while the budget, ``max_num_seqs`` and the KV cache allow, a long prompt getting a chunk
(with chunked prefill; without it a prompt must fit the budget whole). The KV cache is a pool of
blocks of ``block_size`` tokens (``kv_layout="paged"``, PagedAttention) allocated as a request's
tokens reach a new block; when a step needs a block and none is free, the newest running request
is preempted: its blocks are freed and it goes back to the front of the queue, to recompute its
prompt and the tokens it had generated (vLLM's recompute preemption). ``kv_layout="contiguous"``
reserves ``max_model_len`` tokens for each admitted request up front, as servers did before
PagedAttention. Static batching forms a batch of up to ``max_num_seqs`` waiting requests, runs
their prefill, then decodes the whole batch until its longest request is done (finished
sequences are padding), then forms the next. Dynamic batching does the same, but an idle server
waits up to ``max_wait_s`` after the oldest waiting request's arrival for the batch to fill.

Each step takes ``StepCoster.step_time`` of its shape: the estimate's operator and engine
model. Decoding requests are kept in aggregate (their count, the sum of their contexts, a heap
of the steps at which they finish and a count per block offset of those about to need a new
block), so a step costs O(1) work whatever the batch: 100,000 requests simulate in seconds.
Speculative decoding (``planner.serving.speculation``) advances each request by a fraction of a
token per step on average, so it tracks each decoding request: O(running requests) a step.

Sliding-window layers (Gemma-2/3, gpt-oss, Mistral-7B v0.1): a prefill chunk's windowed
attention is costed exactly; the decoders, held in aggregate, are costed as reading
min(sum of their contexts, count x window) keys in those layers, which is exact when every
context is below the window or every one above it, and an upper bound otherwise. The KV pool
is sized and filled as if every layer cached the whole context (vLLM before its hybrid KV cache
manager, 0.10): conservative for these models, where ``estimate`` applies the window.
Pure: no I/O, no printing.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field, replace

from planner.core.errors import UsageError
from planner.core.ops import StepShape, window_pairs
from planner.serving.config import SchedulerConfig
from planner.serving.cost import StepCoster
from planner.serving.requests import RequestResult, RequestState, SimRequest
from planner.serving.speculation import SpecServing
from planner.serving.traffic import Request

__all__ = ["RequestResult", "SchedulerConfig", "SimResult", "kv_capacity_tokens", "simulate"]

PREEMPTED, PREFILLING, PREFILLED = (RequestState.PREEMPTED, RequestState.PREFILLING,
                                    RequestState.PREFILLED)
DECODING, PADDING_PREFILLED, PADDING, FINISHED = (RequestState.DECODING,
                                                  RequestState.PADDING_PREFILLED,
                                                  RequestState.PADDING, RequestState.FINISHED)


@dataclass
class SimResult:
    requests: list[RequestResult]
    duration_s: float
    steps: int
    kv_capacity_tokens: int
    itl: list[tuple[float, int]]  # (inter-token latency, how many tokens waited it)
    samples: list[tuple[float, int, int, int]]  # (t, running, waiting, KV tokens reserved)
    busy_s: float = 0.0
    running_integral: float = 0.0  # integral of running requests over time
    kv_held_integral: float = 0.0  # of KV tokens holding data
    kv_reserved_integral: float = 0.0  # of KV tokens reserved (blocks or reservations)
    max_running: int = 0
    peak_kv_held_tokens: int = 0
    peak_kv_reserved_tokens: int = 0
    preemptions: int = 0
    arrived: int = 0
    in_flight: int = 0


@dataclass
class _State:
    t: float = 0.0
    G: int = 0  # decode steps so far (every decoding request gains a token per step)
    free_tokens: int = 0  # KV tokens not reserved
    n_dec: int = 0
    sum_c0_minus_G0: int = 0  # sum over decoders of c0 - G0: their contexts = this + n_dec G
    bucket: list[int] = field(default_factory=list)  # decoders by (c0 - G0) mod block_size
    heap: list[tuple[int, int, int]] = field(default_factory=list)  # (finish_G, stamp, id)
    stamp: int = 0
    padding: int = 0  # static batching: finished sequences still decoding as padding


def kv_capacity_tokens(coster: StepCoster, cfg: SchedulerConfig) -> int:
    """Tokens of KV cache the replica holds at this scheduler's step size (the coster's
    layout decides: one TP group, pipeline stages, expert-parallel GPUs)."""
    return coster.kv_capacity_tokens(cfg.max_num_seqs, cfg.max_num_batched_tokens)


def simulate(requests: list[Request], coster: StepCoster, cfg: SchedulerConfig, *,
             sample_every_s: float | None = None, max_steps: int = 50_000_000,
             spec: SpecServing | None = None) -> SimResult:
    """Serve ``requests`` on one replica; every request runs to completion. ``spec``:
    speculative decoding (``planner.serving.speculation``; continuous batching only)."""
    if cfg.ranks == 1 and getattr(coster, "dp_ranks", 1) > 1:
        cfg = replace(cfg, ranks=coster.dp_ranks)
    cfg.check()
    k1 = 1 if spec is None else spec.k + 1  # tokens a decoder takes of a step
    per_step = 1.0 if spec is None else spec.tokens_per_step  # tokens it keeps
    if spec is not None:
        if cfg.kind != "continuous":
            raise UsageError("speculative decoding is simulated with continuous batching only")
        if cfg.max_num_batched_tokens < cfg.max_num_seqs * k1:
            raise UsageError(f"max-num-batched-tokens ({cfg.max_num_batched_tokens}) is below "
                             f"max-num-seqs ({cfg.max_num_seqs}) x {k1} tokens a speculating "
                             "request takes of a step; lower --max-num-seqs")
    per_rank = cfg.max_num_batched_tokens  # the largest prefill chunk
    seqs_cap = cfg.max_num_seqs * cfg.ranks
    bs = cfg.block_size
    capacity = kv_capacity_tokens(coster, cfg)
    if spec is not None:  # the drafter's weights and KV share the pool
        capacity = spec.kv_capacity_tokens(capacity)
    window = coster.model.sliding_window
    split_parts = getattr(coster, "splits_parts", False)
    if cfg.kv_layout == "paged":
        capacity = capacity // bs * bs
    if capacity < bs:
        drafter = " and the drafter's" if spec is not None and spec.draft_weight_bytes else ""
        raise UsageError(f"the weights{drafter} leave no room for a KV cache on this GPU "
                         f"({capacity} tokens); use more GPUs (--tp) or a smaller precision")
    results = [RequestResult(q.id, q.arrival_s, q.prompt_tokens, q.output_tokens)
               for q in requests]
    reqs = [SimRequest.of(r) for r in results]
    for q in reqs:
        need = _reserve_tokens(cfg, q.r.prompt_tokens + q.r.output_tokens + k1 - 1)
        if need > capacity:
            raise UsageError(f"request {q.r.id} ({q.r.prompt_tokens} + {q.r.output_tokens} "
                             f"tokens) needs {need:,} KV tokens; the replica holds "
                             f"{capacity:,}")
    st = _State(free_tokens=capacity, bucket=[0] * bs)
    res = SimResult(results, 0.0, 0, capacity, [], [])
    closed = cfg.max_concurrency is not None
    pending = deque(reqs)  # not yet arrived, in arrival order
    if closed:
        for q in pending:
            q.r.arrival_s = math.nan
    waiting: deque[SimRequest] = deque()
    # admission order (prefill and decode): a dict, so a finish or a preemption is O(1) and the
    # newest is its last key
    running: dict[int, SimRequest] = {}
    prefilling: dict[int, SimRequest] = {}  # the running requests still prefilling, in order
    decoding: dict[int, SimRequest] = {}  # the running requests decoding
    by_id = {q.r.id: q for q in reqs}
    clients_busy = 0
    next_sample = 0.0
    done = 0
    n = len(reqs)

    def arrive(now: float) -> None:
        nonlocal clients_busy
        if closed:
            while pending and clients_busy < cfg.max_concurrency:
                q = pending.popleft()
                q.r.arrival_s = now
                clients_busy += 1
                waiting.append(q)
                res.arrived += 1
            return
        while pending and pending[0].r.arrival_s <= now:
            waiting.append(pending.popleft())
            res.arrived += 1

    def gained(q: SimRequest) -> int:  # tokens a decoding request generated since it joined
        if spec is None:
            return st.G - q.G0
        return min(int(per_step * (st.G - q.G0) + 1e-9), q.r.output_tokens - q.g0)

    def context(q: SimRequest) -> int:  # KV tokens cached for a decoding request
        return q.c0 + gained(q)

    def leave_decode(q: SimRequest) -> None:
        decoding.pop(q.r.id, None)
        st.n_dec -= 1
        st.sum_c0_minus_G0 -= q.c0 - q.G0
        st.bucket[(q.c0 - q.G0) % bs] -= 1

    def join_decode(q: SimRequest) -> None:
        q.state = DECODING
        q.c0, q.g0, q.G0 = q.computed, q.generated, st.G
        left = q.r.output_tokens - q.generated
        if spec is None:
            q.finish_G = st.G + left
        else:  # the first step count whose floor(n E) reaches what is left
            steps = max(0, math.ceil(left / per_step - 1e-9))
            while int(per_step * steps + 1e-9) < left:
                steps += 1
            q.finish_G = st.G + steps
        decoding[q.r.id] = q
        st.n_dec += 1
        st.sum_c0_minus_G0 += q.c0 - q.G0
        st.bucket[(q.c0 - q.G0) % bs] += 1
        heapq.heappush(st.heap, (q.finish_G, q.admitted, q.r.id))

    def release(q: SimRequest) -> None:
        if q.state is DECODING and cfg.kind == "continuous" and spec is None:
            # a decoder's blocks grew in aggregate: it holds whole blocks of its context
            q.reserved = _reserve_tokens(cfg, context(q))
        st.free_tokens += q.reserved
        q.reserved = 0

    def preempt(q: SimRequest) -> None:
        del running[q.r.id]
        prefilling.pop(q.r.id, None)
        release(q)
        if q.state is DECODING:
            q.generated = q.g0 + gained(q)
            leave_decode(q)  # its heap entry goes stale: the state check skips it
        q.state, q.computed = PREEMPTED, 0
        q.target = q.r.prompt_tokens + q.generated
        q.r.preemptions += 1
        res.preemptions += 1
        waiting.appendleft(q)

    def ensure(q: SimRequest, tokens: int) -> bool:
        """Reserve KV for ``q`` to hold ``tokens``; preempt the newest others if needed."""
        need = _reserve_tokens(cfg, tokens) - q.reserved
        while need > st.free_tokens:
            victim = running[next(reversed(running))]
            if victim is q:
                return False
            preempt(victim)
        st.free_tokens -= max(need, 0)
        q.reserved += max(need, 0)
        return True

    def admit(q: SimRequest, tokens: int) -> bool:
        """Move the head of the queue into the running set, reserving KV for ``tokens``."""
        need = _reserve_tokens(cfg, tokens)
        if need > st.free_tokens:
            return False
        waiting.popleft()
        st.free_tokens -= need
        q.reserved = need
        st.stamp += 1
        q.admitted, q.state = st.stamp, PREFILLING
        running[q.r.id] = q
        prefilling[q.r.id] = q
        return True

    def finish(q: SimRequest, now: float) -> None:
        nonlocal done, clients_busy
        del running[q.r.id]
        prefilling.pop(q.r.id, None)
        release(q)  # while its state still says how much it holds
        q.state = FINISHED
        q.r.finish_s = now
        done += 1
        if closed:
            clients_busy -= 1

    arrive(0.0)
    static_batch: list[SimRequest] = []
    while done < n:
        if res.steps >= max_steps:
            raise UsageError(f"the simulation did not finish within {max_steps:,} steps")
        if not running and not waiting:
            if not pending:
                break
            st.t = max(st.t, pending[0].r.arrival_s)
            arrive(st.t)
            continue
        # ---------------------------------------------------------------- schedule
        budget = cfg.max_num_batched_tokens * cfg.ranks
        chunks: list[tuple[SimRequest, int]] = []
        batched = cfg.kind != "continuous"  # static or dynamic: whole batches
        if cfg.kind == "dynamic" and not static_batch and waiting and \
                len(waiting) < seqs_cap and \
                waiting[0].r.arrival_s + cfg.max_wait_s > st.t:
            # hold the batch open until it fills or its oldest request has waited max_wait_s
            # (the server cannot know that nothing more is coming)
            deadline = waiting[0].r.arrival_s + cfg.max_wait_s
            nxt = pending[0].r.arrival_s if pending else math.nan
            st.t = min(deadline, nxt) if nxt == nxt else deadline  # nan: a closed loop
            arrive(st.t)
            continue
        if batched and not static_batch:
            # form the next batch from what is waiting, reserving each request's whole length
            while waiting and len(static_batch) < seqs_cap:
                q = waiting[0]
                if not admit(q, q.r.prompt_tokens + q.r.output_tokens):
                    break
                static_batch.append(q)
        # decodes first: every running decoder takes one token (1 + k when speculating, whose
        # KV slots are reserved ahead, as vLLM's lookahead slots)
        if spec is not None and st.n_dec:
            while True:
                grow = sum(max(0, _reserve_tokens(cfg, context(q) + k1) - q.reserved)
                           for q in decoding.values())
                if grow <= st.free_tokens or not running:
                    break
                preempt(running[next(reversed(running))])
            for q in decoding.values():
                q.reserved = max(q.reserved, _reserve_tokens(cfg, context(q) + k1))
            st.free_tokens -= grow
        elif cfg.kind == "continuous" and st.n_dec and cfg.kv_layout == "paged":
            while True:
                grow = st.bucket[(-st.G) % bs] * bs  # decoders whose next token opens a block
                if grow <= st.free_tokens or not running:
                    break
                preempt(running[next(reversed(running))])
            st.free_tokens -= grow
        budget -= st.n_dec * k1
        # unfinished prefills continue, in admission order
        for q in list(prefilling.values()):
            if budget <= 0:
                break
            left = q.target - q.computed
            chunk = min(left, budget, per_rank) if (cfg.chunked_prefill or batched) \
                else (left if left <= min(budget, per_rank) else 0)
            if chunk <= 0:
                continue
            if cfg.kind == "continuous" and not ensure(q, q.computed + chunk):
                preempt(q)
                continue
            chunks.append((q, chunk))
            budget -= chunk
        # admit waiting requests (continuous)
        if cfg.kind == "continuous":
            while waiting and budget > 0 and len(running) < seqs_cap:
                q = waiting[0]
                left = q.target
                chunk = min(left, budget, per_rank) if cfg.chunked_prefill else left
                if chunk > min(budget, per_rank):
                    break
                if not admit(q, chunk):
                    break
                chunks.append((q, chunk))
                budget -= chunk
        if not chunks and not st.n_dec:
            if pending and not waiting:
                st.t = max(st.t, pending[0].r.arrival_s)
                arrive(st.t)
                continue
            q = waiting[0]
            if not cfg.chunked_prefill and q.target > cfg.max_num_batched_tokens:
                raise UsageError(f"request {q.r.id}'s prompt ({q.target:,} tokens) exceeds "
                                 f"max-num-batched-tokens ({cfg.max_num_batched_tokens:,}) "
                                 "and chunked prefill is off")
            raise UsageError("no request could be scheduled: the KV cache cannot hold the "
                             "next request beside those running")
        # ---------------------------------------------------------------- cost the step
        n_dec = st.n_dec
        # the decoders' share of the step (each adding k1 tokens after its context)
        dl = None
        if spec is None:
            past = st.sum_c0_minus_G0 + n_dec * st.G  # decoders' cached tokens
            dec = [float(n_dec), float(past + n_dec), float(past + n_dec), float(past),
                   float(past + n_dec), float(n_dec)]
            if window is not None:  # what the sliding-window layers see (see the module notes)
                w = min(past + n_dec, n_dec * window)
                dl = [float(n_dec), float(w), float(w), float(min(past, n_dec * window)),
                      float(w), float(n_dec)]
        else:
            ctxs = [context(q) for q in decoding.values()]
            past = sum(ctxs)
            dec = [float(n_dec * k1), float(k1 * past + n_dec * k1 * (k1 + 1) / 2),
                   float(past + n_dec * k1), float(past), float(k1 * (past + n_dec * k1)),
                   float(n_dec * k1)]
            if window is not None:
                dl = [float(n_dec * k1), 0.0, 0.0, 0.0, 0.0, float(n_dec * k1)]
                for c in ctxs:
                    span = min(c + k1, window + k1 - 1)
                    dl[1] += window_pairs(c + k1, window) - window_pairs(c, window)
                    dl[2] += span
                    dl[3] += min(c, window)
                    dl[4] += k1 * span
        tokens, pairs, kv_read, held, score, rows = dec
        for q, c in chunks:
            tokens += c
            pairs += c * q.computed + c * (c + 1) / 2
            kv_read += q.computed + c
            held += q.computed
            score += c * (q.computed + c)
            rows += 1 if q.computed + c >= q.target else 0
        local = None
        if window is not None:
            l_tok, l_pairs, l_read, l_held, l_score, l_rows = dl
            for q, c in chunks:
                span = min(q.computed + c, window + c - 1)
                l_pairs += window_pairs(q.computed + c, window) - window_pairs(q.computed,
                                                                                 window)
                l_read += span
                l_held += min(q.computed, window)
                l_score += c * span
            local = StepShape(float(tokens), float(l_pairs), float(l_read), float(l_held),
                              float(l_score), float(rows))
        shape = StepShape(float(tokens), float(pairs), float(kv_read), float(held),
                          float(score), float(rows), local)
        if chunks and n_dec and split_parts:  # the decodes alone, for a layout that places
            # them apart from the prefill chunks (expert parallelism's data-parallel ranks)
            parts = (StepShape(*dec, None if dl is None else StepShape(*dl)), len(chunks))
            dt = coster.step_time(shape, sequences=n_dec + len(chunks), prefill=True,
                                  decodes=True, parts=parts)
        else:
            dt = coster.step_time(shape, sequences=n_dec + len(chunks), prefill=bool(chunks),
                                  decodes=bool(n_dec))
        if spec is not None and spec.draft is not None:
            dt += _draft_s(spec, n_dec, past, chunks)
        # time-weighted occupancy over the step
        res.running_integral += len(running) * dt
        reserved = res.kv_capacity_tokens - st.free_tokens
        held_now = past + sum(q.computed for q in prefilling.values())
        res.kv_held_integral += held_now * dt
        res.kv_reserved_integral += reserved * dt
        res.max_running = max(res.max_running, len(running))
        res.peak_kv_held_tokens = max(res.peak_kv_held_tokens, held_now)
        res.peak_kv_reserved_tokens = max(res.peak_kv_reserved_tokens, reserved)
        st.t += dt
        res.busy_s += dt
        res.steps += 1
        if n_dec:
            if n_dec > st.padding:
                res.itl.append((dt, n_dec - st.padding))
            st.G += 1
        # ---------------------------------------------------------------- apply
        while st.heap and st.heap[0][0] <= st.G:
            fg, _, rid = heapq.heappop(st.heap)
            q = by_id[rid]
            if q.state is not DECODING or q.finish_G != fg:
                continue  # stale: preempted and rejoined since
            q.generated = q.r.output_tokens
            q.computed = context(q)
            if batched:
                q.state = PADDING  # decodes on until the batch's longest is done
                st.padding += 1
                q.r.finish_s = st.t
                done += 1
                if closed:
                    clients_busy -= 1
            else:
                finish(q, st.t)
                leave_decode(q)
        for q, c in chunks:
            q.computed += c
            if q.computed < q.target:
                continue
            prefilling.pop(q.r.id, None)
            q.generated += 1
            if math.isnan(q.r.first_token_s):
                q.r.first_token_s = st.t
            if batched:
                q.state = PREFILLED  # decodes start when the whole batch is prefilled
                if q.generated >= q.r.output_tokens:
                    q.state = PADDING_PREFILLED
                    q.r.finish_s = st.t
                    done += 1
                    if closed:
                        clients_busy -= 1
            elif q.generated >= q.r.output_tokens:
                finish(q, st.t)
            else:
                join_decode(q)
        if batched and static_batch:
            if all(q.state is not PREFILLING for q in static_batch) and not st.n_dec and any(
                    q.state is PREFILLED for q in static_batch):
                for q in static_batch:  # the whole batch decodes together from here
                    if q.state is PREFILLED:
                        join_decode(q)
                    elif q.state is PADDING_PREFILLED:  # one token only: pads along
                        join_decode(q)
                        q.state = PADDING  # its heap entry is skipped as stale
                        st.padding += 1
            if all(q.state.finished for q in static_batch):
                for q in static_batch:  # the batch's longest is done: free it all
                    if q.state is PADDING:
                        leave_decode(q)
                    del running[q.r.id]
                    release(q)
                    q.state = FINISHED
                st.padding = 0
                static_batch = []
        arrive(st.t)
        if sample_every_s is not None and st.t >= next_sample:
            res.samples.append((st.t, len(running), len(waiting),
                                res.kv_capacity_tokens - st.free_tokens))
            next_sample = st.t + sample_every_s
    res.duration_s = st.t
    res.in_flight = res.arrived - done
    return res


def _draft_s(spec: SpecServing, n_dec: int, past: int, chunks: list) -> float:
    """The drafter's GPU time in a step: k decode steps over the decoding requests (each
    proposing one token after its context), and the prefill of the step's prompt chunks.
    Its sliding-window layers, if any, are costed as full ones (an upper bound)."""
    t = 0.0
    if n_dec:
        one = StepShape(float(n_dec), float(past + n_dec), float(past + n_dec), float(past),
                        float(past + n_dec), float(n_dec))
        t += spec.k * spec.draft.gpu_s(one, prefill=False)
    if chunks:
        c_tok = sum(c for _, c in chunks)
        shape = StepShape(float(c_tok),
                          float(sum(c * q.computed + c * (c + 1) / 2 for q, c in chunks)),
                          float(sum(q.computed + c for q, c in chunks)),
                          float(sum(q.computed for q, _ in chunks)),
                          float(sum(c * (q.computed + c) for q, c in chunks)), 0.0)
        t += spec.draft.gpu_s(shape, prefill=True)
    return t


def _reserve_tokens(cfg: SchedulerConfig, tokens: int) -> int:
    """KV tokens reserved to hold ``tokens``: whole blocks, or a contiguous max_model_len."""
    if cfg.kv_layout == "contiguous":
        return cfg.max_model_len
    return -(-tokens // cfg.block_size) * cfg.block_size

