"""The decoding requests of a replica, as a pool the scheduler adds to and takes from.

``DecodePool`` keeps them in aggregate, so a step costs O(1) work whatever the batch: every
decoding request gains one token per step, so after joining at the pool's decode step G0 with
c0 tokens cached a request holds c0 + G - G0 at step G; the pool keeps their count, the sum of
c0 - G0 (their contexts are that sum + count x G), the requests by the step at which they
finish (a heap of those steps),
and a count per block offset ((c0 - G0) mod block_size) of those whose next token opens a new
block, which is what a paged pool must find for a step (its reservations grow in aggregate:
a request's own ``reserved`` is brought up to date when it leaves).

``SpecDecodePool`` is the same pool under speculative decoding
(``planner.serving.speculation``): each request takes 1 + k tokens of a step and keeps E of
them on average, so after n steps it has generated floor(n E) (capped at its output); it
tracks each request, O(decoding requests) a step: their contexts, the lookahead slots reserved
ahead of each (vLLM's), and the drafter's time.

Sliding-window layers: the aggregate pool costs its decoders as reading min(sum of contexts,
count x window) keys in those layers, exact when every context is below the window or every
one above it, and an upper bound otherwise; the speculative pool costs each exactly.
Pure: no I/O.
"""

from __future__ import annotations

import bisect
import heapq
import math

from planner.core.errors import UsageError
from planner.core.ops import StepShape, window_pairs
from planner.serving.config import SchedulerConfig
from planner.serving.kv import KVPool
from planner.serving.requests import RequestState, SimRequest
from planner.serving.speculation import SpecServing

_DECODING = RequestState.DECODING


class DecodePool:
    """Decoding requests in aggregate: a token each per step."""

    __slots__ = ("kv", "G", "n", "sum_c0_minus_G0", "bucket", "bs", "finishing", "heap",
                 "due", "due_G", "padding", "sum_out", "sum_left_G0", "clip", "long",
                 "ordered", "order_keys", "joins")
    k1 = 1  # tokens a decoding request takes of a step

    def __init__(self, kv: KVPool, block_size: int):
        self.kv = kv
        self.G = 0  # decode steps so far
        self.n = 0  # requests decoding
        self.sum_c0_minus_G0 = 0
        self.bs = block_size
        self.bucket = [0] * block_size  # requests by (c0 - G0) mod block_size
        # finish_G -> [(admitted, id, q)] of the requests due then, and a heap of those
        # finish_G: a request's entry is pushed on a short list, and only the steps are
        # ordered (a heap of every request's (finish_G, admitted, id) took a tenth of a run)
        self.finishing: dict[int, list[tuple[int, int, SimRequest]]] = {}
        self.heap: list[int] = []
        self.due: list[tuple[int, int, SimRequest]] = []  # the step's, last first
        self.due_G = -1  # their finish_G
        self.padding = 0  # static batching: finished requests decoding on as padding
        # what the decoders have still to generate, for an admission that holds KV back for
        # it (``left_tokens``): the sums of their outputs and of (output - generated at join
        # + G0), and those with more than ``clip`` tokens left at joining, counted apart
        self.sum_out = 0
        self.sum_left_G0 = 0
        self.clip: int | None = None
        self.long: dict[int, SimRequest] = {}
        # SGLang's ignore_eos admission (``outputs_left``): the decoders as (finish_G, the
        # order they joined in, prompt + generated at join - G0, id), ascending, kept as they
        # join and leave (each one's entry by id); a step moves every one alike (a token less
        # to come, one more held), so the order holds. None: not kept
        self.ordered: list[tuple[int, int, int, int]] | None = None
        self.order_keys: dict[int, tuple[int, int, int, int]] = {}
        self.joins = 0  # requests joined so far: SGLang's running batch in joining order

    def gained(self, q: SimRequest) -> int:
        """Tokens ``q`` generated since it joined."""
        return self.G - q.G0

    def context(self, q: SimRequest) -> int:
        """KV tokens cached for ``q``."""
        return q.c0 + self.G - q.G0

    def steps_for(self, left: int) -> int:
        """Decode steps that generate ``left`` more tokens: one a step."""
        return left

    def join(self, q: SimRequest) -> None:
        """``q``'s prefill is computed: it decodes from this step on, and is due once the
        steps its remaining tokens take have run."""
        q.state = _DECODING
        G = self.G
        q.c0, q.g0, q.G0 = q.computed, q.generated, G
        q.finish_G = G + self.steps_for(q.r.output_tokens - q.generated)
        off = q.computed - G
        self.n += 1
        self.sum_c0_minus_G0 += off
        self.bucket[off % self.bs] += 1
        out = q.r.output_tokens
        self.sum_out += out
        self.sum_left_G0 += out - q.g0 + G
        if self.clip is not None and out - q.g0 > self.clip:
            self.long[q.id] = q
        self.joins += 1
        if self.ordered is not None:
            key = (q.finish_G, self.joins, q.r.prompt_tokens + q.g0 - G, q.id)
            self.order_keys[q.id] = key
            bisect.insort(self.ordered, key)
        entry = (q.admitted, q.id, q)
        same = self.finishing.get(q.finish_G)
        if same is None:
            self.finishing[q.finish_G] = [entry]
            heapq.heappush(self.heap, q.finish_G)
        else:
            same.append(entry)

    def leave(self, q: SimRequest) -> None:
        """``q`` stops decoding (finished or preempted); its entry goes stale."""
        off = q.c0 - q.G0
        self.n -= 1
        self.sum_c0_minus_G0 -= off
        self.bucket[off % self.bs] -= 1
        out = q.r.output_tokens
        self.sum_out -= out
        self.sum_left_G0 -= out - q.g0 + q.G0
        if self.long:
            self.long.pop(q.id, None)
        if self.ordered is not None:
            key = self.order_keys.pop(q.id, None)
            i = -1 if key is None else bisect.bisect_left(self.ordered, key)
            if i < 0 or i == len(self.ordered) or self.ordered[i] != key:
                raise RuntimeError(f"decode pool: request {q.id} left without joining")
            del self.ordered[i]

    def left_tokens(self) -> int:
        """The tokens the decoders have still to generate, each counted up to ``clip``."""
        left = self.sum_left_G0 - self.n * self.G
        clip, G = self.clip, self.G
        for q in self.long.values():
            mine = q.r.output_tokens - q.g0 + q.G0 - G
            left -= mine - min(mine, clip)
        return left

    def all_left(self) -> int:
        """The tokens the decoders have still to generate, unclipped."""
        return self.sum_left_G0 - self.n * self.G

    def most_left(self) -> int:
        """No fewer than the most tokens one decoder has still to generate (0: none)."""
        if not self.n:
            return 0
        if self.ordered is not None:
            return self.ordered[-1][0] - self.G
        return max(max(self.finishing, default=0), self.due_G) - self.G

    def outputs_left(self) -> list[tuple[int, int, int, int]]:
        """Each decoder's (tokens it has still to generate + the pool's step G, its rank
        among equals, its prompt and the tokens it has generated - G, its id), ascending
        (``planner.serving.schedulers.eos_fits_at``: G-invariant): SGLang's req_states, its
        running batch in the order it joined. A copy of ``ordered`` where it is kept (start
        keeping it with ``keep_order``); found from the pool's entries otherwise, ranked by
        admission."""
        if self.ordered is not None:
            return self.ordered.copy()
        out, seen = [], set()
        for fg, entries in (*self.finishing.items(), (self.due_G, self.due)):
            for _, _, q in entries:
                if q.state is _DECODING and q.finish_G == fg and q.id not in seen:
                    seen.add(q.id)
                    out.append((fg, q.admitted, q.r.prompt_tokens + q.g0 - q.G0, q.id))
        out.sort()
        return out

    def keep_order(self) -> None:
        """Keep ``ordered`` from now on (an empty pool)."""
        if self.n:
            raise ValueError("keep_order: the pool must be empty")
        self.ordered, self.order_keys = [], {}

    def decoded_tokens(self) -> tuple[int, int]:
        """(tokens the decoders have generated, the sum of their outputs)."""
        return self.sum_out - (self.sum_left_G0 - self.n * self.G), self.sum_out

    def pop_due(self) -> SimRequest | None:
        """A request whose last token came in the last step, or None. The caller moves it out
        of the DECODING state before asking again (a stale entry, of a request preempted and
        rejoined since, is skipped by its state or its finish step). In the order of
        (finish_G, admitted, id): the earliest due, then the oldest admitted."""
        due, heap = self.due, self.heap
        while True:
            while due:
                _, _, q = due.pop()
                if q.state is _DECODING and q.finish_G == self.due_G:
                    return q
            if not heap or heap[0] > self.G:
                return None
            self.due_G = heapq.heappop(heap)
            due.extend(sorted(self.finishing.pop(self.due_G), reverse=True))

    def step(self) -> None:
        """A decode step ran: every decoding request gained its token(s)."""
        self.G += 1

    def growth_tokens(self) -> int:
        """KV tokens the next step's tokens need beyond what is reserved: a block for each
        request whose next token opens one."""
        return self.bucket[(-self.G) % self.bs] * self.kv.block_growth_tokens

    def take_growth(self, grow: int) -> None:
        """Reserve ``growth_tokens()`` for the step."""
        self.kv.free_tokens -= grow

    def settle(self, q: SimRequest) -> None:
        """Bring ``q.reserved`` up to date (grown in aggregate) before it is released; a
        reservation made whole at admission stays as it is."""
        held = self.kv.need_for(q, self.context(q)) - q.shared
        if held > q.reserved:
            q.reserved = held

    def shape(self, window: int | None) -> tuple[list[float], list[float] | None, int]:
        """The decoders' share of a step as the StepShape's six amounts (each adding one token
        after its context), the same as the sliding-window layers see it (None without them),
        and the tokens they have cached."""
        n = self.n
        past = self.sum_c0_minus_G0 + n * self.G
        dec = [float(n), float(past + n), float(past + n), float(past), float(past + n),
               float(n)]
        if window is None:
            return dec, None, past
        w = min(past + n, n * window)
        dl = [float(n), float(w), float(w), float(min(past, n * window)), float(w), float(n)]
        return dec, dl, past

    def draft_s(self, past: int, chunks: list, decodes: bool = True) -> float:
        """The drafter's time in a step: none without speculation."""
        return 0.0


class SpecDecodePool(DecodePool):
    """Decoding requests under speculative decoding: 1 + k tokens each of a step, E kept."""

    __slots__ = ("spec", "k1", "per_step", "members")

    def __init__(self, kv: KVPool, block_size: int, spec: SpecServing):
        super().__init__(kv, block_size)
        self.spec = spec
        self.k1 = spec.k + 1
        self.per_step = spec.tokens_per_step  # E
        self.members: dict[int, SimRequest] = {}  # in joining order

    def gained(self, q: SimRequest) -> int:
        return min(int(self.per_step * (self.G - q.G0) + 1e-9), q.r.output_tokens - q.g0)

    def context(self, q: SimRequest) -> int:
        return q.c0 + self.gained(q)

    def steps_for(self, left: int) -> int:
        """The first step count n whose floor(n E) reaches ``left``."""
        e = self.per_step
        steps = max(0, math.ceil(left / e - 1e-9))
        while int(e * steps + 1e-9) < left:
            steps += 1
        return steps

    def join(self, q: SimRequest) -> None:
        super().join(q)
        self.members[q.id] = q

    def leave(self, q: SimRequest) -> None:
        del self.members[q.id]
        super().leave(q)

    def left_tokens(self) -> int:
        clip = self.clip if self.clip is not None else math.inf
        return sum(min(q.r.output_tokens - q.g0 - self.gained(q), clip)
                   for q in self.members.values())

    def all_left(self) -> int:
        gained = self.gained
        return sum(q.r.output_tokens - q.g0 - gained(q) for q in self.members.values())

    def most_left(self) -> int:
        gained = self.gained
        return max((q.r.output_tokens - q.g0 - gained(q) for q in self.members.values()),
                   default=0)

    def outputs_left(self) -> list[tuple[int, int, int, int]]:
        gained, G = self.gained, self.G
        return sorted((q.r.output_tokens - q.g0 - gained(q) + G, rank,
                       q.r.prompt_tokens + q.g0 + gained(q) - G, q.id)
                      for rank, q in enumerate(self.members.values()))  # joining order

    def keep_order(self) -> None:
        pass  # tracked request by request already (``members``)

    def decoded_tokens(self) -> tuple[int, int]:
        done = sum(q.g0 + self.gained(q) for q in self.members.values())
        return done, self.sum_out

    def growth_tokens(self) -> int:
        """Each request's lookahead: KV for its context + 1 + k tokens."""
        kv, k1, context = self.kv, self.k1, self.context
        return sum(max(0, kv.extra_for(q, context(q) + k1)) for q in self.members.values())

    def take_growth(self, grow: int) -> None:
        kv, k1, context = self.kv, self.k1, self.context
        for q in self.members.values():
            q.reserved = max(q.reserved, kv.need_for(q, context(q) + k1) - q.shared)
        kv.free_tokens -= grow

    def settle(self, q: SimRequest) -> None:
        pass  # reserved request by request, ahead of each step

    def _verified(self, n: int, past: int, rows: float) -> list[float]:
        """StepShape's six amounts of ``n`` requests each adding their k1 = 1 + k tokens
        after ``past`` cached in all, with ``rows`` rows of logits: the target's verification
        (every position's), the drafter's first pass (one a request)."""
        k1 = self.k1
        return [float(n * k1), float(k1 * past + n * k1 * (k1 + 1) / 2), float(past + n * k1),
                float(past), float(k1 * (past + n * k1)), rows]

    def shape(self, window: int | None) -> tuple[list[float], list[float] | None, int]:
        """As ``DecodePool.shape``, each request verifying k1 = 1 + k tokens."""
        n, k1 = self.n, self.k1
        ctxs = [self.context(q) for q in self.members.values()]
        past = sum(ctxs)
        dec = self._verified(n, past, float(n * k1))
        if window is None:
            return dec, None, past
        dl = [float(n * k1), 0.0, 0.0, 0.0, 0.0, float(n * k1)]
        for c in ctxs:
            span = min(c + k1, window + k1 - 1)
            dl[1] += window_pairs(c + k1, window) - window_pairs(c, window)
            dl[2] += span
            dl[3] += min(c, window)
            dl[4] += k1 * span
        return dec, dl, past

    def draft_s(self, past: int, chunks: list, decodes: bool = True) -> float:
        """The drafter's GPU time in a step (``past``: the decoding requests' cached tokens),
        in k passes as vLLM V1 and SGLang run an EAGLE head, an MTP layer or a draft model.
        The first takes every token the step schedules: each decoding request's 1 + k (the
        tokens just verified, rejected ones included, as the drafter's cache must hold what
        the target's holds) and the step's prompt chunks, with a row of logits a request
        (vLLM 0.19.1: ``propose`` over ``input_ids[:num_scheduled_tokens]``,
        vllm/v1/worker/gpu_model_runner.py line 4647, vllm/v1/spec_decode/eagle.py line 384;
        SGLang 0.5.6: ``forward_draft_extend_after_decode``, speculative_num_steps + 1 tokens
        a request, and ``forward_draft_extend`` over a prefill batch). Then k - 1 passes of
        one token a request: over every request of the step where the engine, by its own
        default, mixes prompt chunks into decode steps (vLLM's runner drafts for its whole
        ``batch_size``, partial prompts included, whatever the step holds), over the decoding
        requests otherwise (SGLang's ``draft_forward``; its prefill batches run none). The
        drafter's sliding-window layers, if any, are costed as full ones (an upper bound)."""
        spec = self.spec
        draft = spec.draft
        if draft is None:  # n-gram lookup: on the host
            return 0.0
        n = self.n if decodes else 0
        if not n and not chunks:
            return 0.0
        if not n:  # a step without the decoders: none of their cache is read
            past = 0
        # the decoders' 1 + k tokens each (a row of logits a request), then the chunks (a
        # row each, finishing their prompts or not)
        first = with_chunks(self._verified(n, past, float(n)), None, chunks, None,
                            every_chunk_logits=True)
        t = draft.gpu_s(first, prefill=bool(chunks))
        later = n + len(chunks) if chunks and draft.engine.mixed_batches else n
        if spec.k > 1 and later:
            cached = past + sum(q.computed + c for q, c in chunks) if later > n else past
            one = StepShape(float(later), float(cached + later), float(cached + later),
                            float(cached), float(cached + later), float(later))
            t += (spec.k - 1) * draft.gpu_s(one, prefill=False)
        return t


def with_chunks(dec: list[float], dl: list[float] | None, chunks: list,
                 window: int | None, every_chunk_logits: bool = False) -> StepShape:
    """The decoders' share ``dec`` (``dl`` in the sliding-window layers) plus the chunks'.
    A chunk that finishes its prompt samples a token (a row of logits); one that does not
    gets a row too where ``every_chunk_logits`` (its token thrown away)."""
    if not chunks:  # the pool's amounts are floats already
        return StepShape(*dec, None if window is None else StepShape(*dl))
    tokens, pairs, kv_read, held, score, rows = dec
    fill_pairs = fill_past = 0.0  # the chunks' share: prefilling sequences
    for q, c in chunks:
        tokens += c
        chunk_pairs = c * q.computed + c * (c + 1) / 2
        pairs += chunk_pairs
        fill_pairs += chunk_pairs
        fill_past += q.computed
        kv_read += q.computed + c
        held += q.computed
        score += c * (q.computed + c)
        rows += 1 if every_chunk_logits or q.computed + c >= q.target else 0
    local = None
    if window is not None:
        _, l_pairs, l_read, l_held, l_score, _ = dl
        for q, c in chunks:
            span = min(q.computed + c, window + c - 1)
            l_pairs += window_pairs(q.computed + c, window) - window_pairs(q.computed, window)
            l_read += span
            l_held += min(q.computed, window)
            l_score += c * span
        local = StepShape(float(tokens), float(l_pairs), float(l_read), float(l_held),
                          float(l_score), float(rows))
    return StepShape(float(tokens), float(pairs), float(kv_read), float(held), float(score),
                     float(rows), local, float(fill_pairs), float(fill_past))


def decode_pool(cfg: SchedulerConfig, kv: KVPool, spec: SpecServing | None) -> DecodePool:
    """The decode pool for ``cfg``, speculating with ``spec`` (continuous batching only)."""
    if spec is None:
        return DecodePool(kv, cfg.block_size)
    return SpecDecodePool(kv, cfg.block_size, spec)


def check_spec(cfg: SchedulerConfig, spec: SpecServing | None) -> None:
    """Speculation is simulated under continuous batching, with a step budget that holds
    every running request's 1 + k tokens."""
    if spec is None:
        return
    k1 = spec.k + 1
    if cfg.kind != "continuous":
        raise UsageError("speculative decoding is simulated with continuous batching only")
    if cfg.max_num_batched_tokens < cfg.max_num_seqs * k1:
        raise UsageError(f"max-num-batched-tokens ({cfg.max_num_batched_tokens}) is below "
                         f"max-num-seqs ({cfg.max_num_seqs}) x {k1} tokens a speculating "
                         "request takes of a step; lower --max-num-seqs")
