"""The KV cache of a replica as a pool of tokens, paged or contiguous.

``PagedKV`` is vLLM's block pool (vllm/v1/core/block_pool.py, PagedAttention): the pool holds
``capacity // block_size`` blocks of ``block_size`` tokens, and a request holds
ceil(tokens / block_size) blocks, allocated as its tokens reach a new block. ``ContiguousKV``
reserves ``max_model_len`` tokens for each request up front, as servers did before
PagedAttention. Both count tokens (blocks x block_size), so the scheduler, the decode pool and
the metrics see one unit; a request's holding is its ``reserved`` field, which the pool keeps
in step with ``free_tokens``. The scheduler decides what to reserve and whom to preempt; the
pool only counts.

``PrefixCache`` is automatic prefix caching (vLLM's, vllm/v1/core/kv_cache_manager.py and
block_pool.py; SGLang's radix cache and TensorRT-LLM's block reuse alike): once a request has
computed the whole blocks of its shared prefix, they are kept under the prefix's id, and a
later request with that prefix starts with them computed and holds them with the others
rather than as its own. Blocks no running request refers to stay cached until the pool needs
them, then go least recently used first (vLLM's free queue hands out the least recently freed
cached block first), before any running request is preempted. Prefixes are whole: a request
finds its prefix's blocks or none (a cache keyed by block would also share a partial prefix);
at least one prompt token is always computed, as in vLLM.

A preempted request's own blocks are freed the same way: with prefix caching on they keep
their contents (vLLM frees a request's blocks into the free queue still hashed; SGLang inserts
a retracted request into its radix tree), so when it is admitted again it finds the whole
blocks of what it had computed, unless the pool evicted them meanwhile, and recomputes only
the rest (``PrefixCache.stash``). They are kept under the request's own key, after its
prefix's blocks, and found only with them. Pure: no I/O.
"""

from __future__ import annotations

from collections import OrderedDict

from planner.core.errors import UsageError
from planner.serving.requests import RequestState, SimRequest

_PREFILLING = RequestState.PREFILLING
OWN = -2  # a preempted request's own cached blocks are keyed OWN - its id (prefix ids >= 0)


class KVPool:
    """``capacity_tokens`` of KV cache, of which ``free_tokens`` are not reserved."""

    __slots__ = ("capacity_tokens", "free_tokens", "block_growth_tokens", "prefixes")
    layout = ""

    def __init__(self, capacity_tokens: int, block_growth_tokens: int):
        self.capacity_tokens = capacity_tokens
        self.free_tokens = capacity_tokens
        # what a request's next block takes of the pool as it grows (0: reserved whole)
        self.block_growth_tokens = block_growth_tokens
        self.prefixes: PrefixCache | None = None  # prefix caching on: the cached prefixes

    def free_or_evictable_tokens(self) -> int:
        """The free tokens and those of cached prefixes no running request uses, which the
        pool may evict for a new request."""
        idle = sum(self.prefixes.idle.values()) if self.prefixes is not None else 0
        return self.free_tokens + idle

    def make_room(self, need: int) -> bool:
        """Whether ``need`` tokens are free, once cached prefixes no request uses are
        evicted for them (least recently used first)."""
        if need > self.free_tokens and self.prefixes is not None:
            self.free_tokens += self.prefixes.evict(need - self.free_tokens)
        return need <= self.free_tokens

    def tokens_for(self, tokens: int) -> int:
        """KV tokens reserved to hold ``tokens``."""
        raise NotImplementedError

    def warm(self, prefixes: dict[int, int]) -> int:
        """Cache ``prefixes`` (prefix id -> tokens) before the run begins, in order, while the
        pool has room (nothing where prefix caching is off: the server kept nothing); returns
        the tokens cached."""
        if self.prefixes is None:
            return 0
        cached = 0
        for prefix, tokens in prefixes.items():
            took = self.prefixes.warm(prefix, min(tokens, self.free_tokens))
            self.free_tokens -= took
            cached += took
        return cached

    @property
    def reserved_tokens(self) -> int:
        return self.capacity_tokens - self.free_tokens

    def need_for(self, q: SimRequest, tokens: int) -> int:
        """KV tokens ``q`` holds with ``tokens`` of it cached: ``tokens_for(tokens)``
        (``HybridPagedKV`` adds its sliding layers' window for its whole length)."""
        return self.tokens_for(tokens)

    def admission_need(self, q: SimRequest, tokens: int) -> int:
        """KV tokens ``q`` takes when admitted to compute its first ``tokens``: ``need_for``
        (``HybridPagedKV`` adds its first chunk's peak in the sliding layers)."""
        return self.need_for(q, tokens)

    def reserve(self, q: SimRequest, tokens: int) -> bool:
        """Reserve what a request being admitted needs to hold ``tokens``; False, and nothing
        reserved, where the pool has not that much free."""
        need = self.admission_need(q, tokens)
        if not self.make_room(need):
            return False
        self.free_tokens -= need
        q.reserved = need
        return True

    def after_chunk(self, q: SimRequest) -> None:
        """``q``'s prompt chunk is computed: nothing to give back (``HybridPagedKV`` frees
        the sliding blocks the chunk needed behind the window)."""

    def held_of(self, tokens: int) -> int:
        """The pool's units that ``tokens`` cached by the running requests fill: ``tokens``
        (``HybridPagedKV`` adds the blocks their sliding layers hold)."""
        return tokens

    def extra_for(self, q: SimRequest, tokens: int) -> int:
        """Tokens ``q`` needs beyond its reservation (and the cached prefix it holds with
        others) to hold ``tokens`` (<= 0: none)."""
        return self.need_for(q, tokens) - q.shared - q.reserved

    def grow(self, q: SimRequest, extra: int) -> None:
        """Reserve ``extra`` more tokens for ``q`` (nothing for extra <= 0)."""
        if extra > 0:
            self.free_tokens -= extra
            q.reserved += extra

    def release(self, q: SimRequest) -> None:
        """Free everything ``q`` holds (it finished, or it is preempted); a cached prefix it
        used stays cached."""
        self.free_tokens += q.reserved
        q.reserved = 0
        if q.shared:
            self.prefixes.unref(q.prefix, q.shared)
            q.shared = 0


class PagedKV(KVPool):
    """Blocks allocated as a request's tokens reach them (``on_demand``), or a request's whole
    length in blocks at admission (a scheduler that never preempts: TensorRT-LLM's
    guaranteed-no-evict)."""

    __slots__ = ("block_size",)
    layout = "paged"

    def __init__(self, capacity_tokens: int, block_size: int, *, on_demand: bool = True):
        super().__init__(capacity_tokens // block_size * block_size,
                         block_size if on_demand else 0)
        self.block_size = block_size

    def tokens_for(self, tokens: int) -> int:
        bs = self.block_size
        return -(-tokens // bs) * bs

    def blocks(self, tokens: int) -> int:
        """Blocks that hold ``tokens``: ceil(tokens / block_size)."""
        return -(-tokens // self.block_size)

    @property
    def num_blocks(self) -> int:
        return self.capacity_tokens // self.block_size

    @property
    def free_blocks(self) -> int:
        return self.free_tokens // self.block_size


class HybridPagedKV(PagedKV):
    """vLLM's hybrid KV cache manager (vllm/v1/core/kv_cache_coordinator.py and
    single_type_kv_cache_manager.py) for a model whose layers mix full and sliding-window
    attention (``planner.core.memory.kv_cache_groups``): one block pool shared by one group
    of full-attention layers and ``sliding_groups`` groups of sliding-window layers of as many
    layers each. The pool counts tokens of one group (``capacity_tokens``: its blocks x
    block_size). A request holds ceil(tokens / block_size) blocks in the full group, so the
    prefix cache, growth by a block and preemption count as in ``PagedKV``; and in each
    sliding group the blocks of its last ``window`` tokens: ``SlidingWindowManager.
    remove_skipped_blocks`` frees every block before (computed - window + 1) // block_size,
    so at most ceil((window - 1) / block_size) + 1 (``window_blocks``).

    A request holds the sliding groups' blocks for its whole length (prompt and output, up
    to the window) from its admission (``window_tokens``); vLLM allocates them block by
    block until its context passes the window, so a request shorter than the window holds
    them a little early, and the decode pool's growth by a block is the full group's alone.
    A prompt chunk takes, in each sliding group, every block from the window before it to
    its end (vLLM allocates the chunk's slots whole), and gives back those behind the window
    once it is computed (``after_chunk``; vLLM frees them at its next allocation): the
    4.54 GiB vLLM asks for gpt-oss-120b's 131,072-token request with 1,024-token steps. A
    cached prefix keeps its full-group blocks only (vLLM keeps its window's sliding blocks
    too, which a hit needs)."""

    __slots__ = ("sliding_groups", "window", "window_blocks", "chunk_blocks", "chunked",
                 "window_reserved")

    def __init__(self, capacity_tokens: int, block_size: int, *, sliding_groups: int,
                 window: int, step_tokens: int | None, on_demand: bool = True):
        super().__init__(capacity_tokens, block_size, on_demand=on_demand)
        self.sliding_groups = sliding_groups
        self.window = window
        self.window_blocks = -(-(window - 1) // block_size) + 1
        # prompts come in chunks of at most ``step_tokens`` that reserve as they go (None:
        # each request reserves its whole length at once, static batching or a no-evict
        # policy, and holds its window from the start)
        self.chunked = step_tokens is not None and on_demand
        # the most a chunk takes in a sliding group (never fewer than the window's):
        # SlidingWindowSpec.max_memory_usage_bytes' ceil((window - 1 +
        # max_num_batched_tokens) / block_size) + 1
        self.chunk_blocks = -(-(window - 1 + step_tokens) // block_size) + 1 if self.chunked \
            else self.window_blocks
        self.window_reserved = 0  # what the running requests' sliding blocks take for good

    def window_tokens(self, tokens: int) -> int:
        """What the sliding groups' blocks take of the pool for a request of ``tokens``."""
        return self.sliding_groups * min(self.blocks(tokens), self.window_blocks) \
            * self.block_size

    def _window_of(self, q: SimRequest) -> int:
        """What ``q``'s sliding blocks take for good: its window, for its whole length."""
        return self.window_tokens(q.r.prompt_tokens + q.r.output_tokens)

    def _chunk_tokens(self, q: SimRequest, start: int, end: int) -> int:
        """What the sliding groups take while ``q`` computes its tokens ``start`` to ``end``:
        the blocks from the window before ``start`` to ``end``, or its window for good where
        that is more (only the latter where requests reserve their whole length at once)."""
        held = self._window_of(q)
        if not self.chunked:
            return held
        blocks = self.blocks(end) - max(0, start - self.window + 1) // self.block_size
        return max(held, self.sliding_groups * blocks * self.block_size)

    def tokens_for(self, tokens: int) -> int:
        """The most a request of ``tokens`` holds at once: its blocks in the full group, and
        in each sliding group those of a step's chunk and the window before it (vLLM's
        check that one request of max_model_len fits, check_enough_kv_cache_memory)."""
        b = self.blocks(tokens)
        return (b + self.sliding_groups * min(b, self.chunk_blocks)) * self.block_size

    def need_for(self, q: SimRequest, tokens: int) -> int:
        return self.blocks(tokens) * self.block_size + self._window_of(q)

    def admission_need(self, q: SimRequest, tokens: int) -> int:
        # its first chunk: ``tokens`` after the prefix tokens it found cached
        return self.blocks(tokens) * self.block_size + self._chunk_tokens(
            q, q.shared, q.shared + tokens)

    def reserve(self, q: SimRequest, tokens: int) -> bool:
        if not super().reserve(q, tokens):
            return False
        self.window_reserved += self._window_of(q)
        return True

    def extra_for(self, q: SimRequest, tokens: int) -> int:
        if q.state is not _PREFILLING:  # a decode's lookahead: its window is held already
            return super().extra_for(q, tokens)
        return self.blocks(tokens) * self.block_size + self._chunk_tokens(
            q, q.computed, tokens) - q.shared - q.reserved

    def after_chunk(self, q: SimRequest) -> None:
        if not self.chunked:
            return
        back = q.reserved + q.shared - self.need_for(q, q.computed)
        if back > 0:
            q.reserved -= back
            self.free_tokens += back

    def release(self, q: SimRequest) -> None:
        self.window_reserved -= self._window_of(q)
        super().release(q)

    def held_of(self, tokens: int) -> int:
        return tokens + self.window_reserved


class ContiguousKV(KVPool):
    __slots__ = ("max_model_len",)
    layout = "contiguous"

    def __init__(self, capacity_tokens: int, max_model_len: int):
        super().__init__(capacity_tokens, 0)
        self.max_model_len = max_model_len

    def tokens_for(self, tokens: int) -> int:
        return self.max_model_len


class PrefixCache:
    """Cached prefixes by id: their KV tokens (whole blocks), and how many running requests
    use each; those none uses, least recently released first, can be evicted."""

    __slots__ = ("block", "entries", "idle", "hit_tokens", "query_tokens", "double_counted")

    def __init__(self, block_size: int):
        self.block = block_size
        # prefix id -> [tokens, requests using it]; a preempted request's own blocks
        # (OWN - id) -> [tokens, 0, the prefix tokens they follow]
        self.entries: dict[int, list[int]] = {}
        self.idle: OrderedDict[int, int] = OrderedDict()  # unused ones: id -> tokens, LRU
        self.hit_tokens = 0  # prompt tokens admissions found cached
        self.query_tokens = 0  # prompt tokens of every admission (vLLM's hit-rate base)
        # the requests' shared tokens beyond one copy of each prefix in use: what summing
        # every running request's context counts twice
        self.double_counted = 0

    def warm(self, prefix: int, tokens: int) -> int:
        """Prefix ``prefix``'s first ``tokens`` cached before the run begins (the server
        computed them for an earlier run), in whole blocks, unused; returns the tokens it
        takes of the pool."""
        tokens = tokens // self.block * self.block
        if tokens <= 0 or prefix in self.entries:
            return 0
        self.entries[prefix] = [tokens, 0]
        self.idle[prefix] = tokens
        return tokens

    def lookup(self, q: SimRequest) -> tuple[int, int]:
        """Tokens cached for ``q``, leaving at least one token of what it must compute to be
        computed: (its prefix's whole blocks, held with others; its own blocks kept from a
        preemption, which follow the prefix tokens they were computed after and are found
        only with them); (0, 0) where nothing is cached."""
        b = self.block
        cap = (q.target - 1) // b * b
        e = self.entries.get(q.prefix) if q.prefix >= 0 else None
        hit = 0 if e is None else min(e[0], cap)
        own = self.entries.get(OWN - q.id)
        if own is not None and own[0] + own[2] > hit and (not own[2] or hit >= own[2]):
            start = own[2]
            return start, min(own[0], cap - start)
        return hit, 0

    def stash(self, q: SimRequest, kept: int, shared: int) -> int:
        """``q`` is preempted with ``kept`` tokens of KV written, ``shared`` of them its
        prefix's cached blocks: its own whole blocks beyond those stay cached, unused (the
        pool may evict them). Returns the tokens kept out of the pool."""
        own = kept // self.block * self.block - shared
        if own <= 0:
            return 0
        self._keep(q, own, shared)
        return own

    def claim(self, q: SimRequest) -> int:
        """``q`` takes back its own cached blocks (before reserving, which may evict what is
        not in use); returns their tokens."""
        key = OWN - q.id
        self.idle.pop(key, None)
        e = self.entries.pop(key, None)
        return 0 if e is None else e[0]

    def unclaim(self, q: SimRequest, tokens: int, shared: int) -> None:
        """``q`` was not admitted after all: its blocks are cached again, unused."""
        self._keep(q, tokens, shared)

    def _keep(self, q: SimRequest, tokens: int, shared: int) -> None:
        """Cache ``tokens`` of ``q``'s own blocks, after ``shared`` prefix tokens, unused."""
        key = OWN - q.id
        self.entries[key] = [tokens, 0, shared]
        self.idle[key] = tokens

    def pin(self, q: SimRequest, hit: int) -> None:
        """``q`` holds ``hit`` cached tokens of its prefix with the others: no eviction."""
        e = self.entries[q.prefix]
        e[1] += 1
        self.idle.pop(q.prefix, None)
        q.shared = hit
        self.double_counted += hit if e[1] > 1 else hit - e[0]

    def unpin(self, q: SimRequest) -> None:
        """``q`` was not admitted after all."""
        self.unref(q.prefix, q.shared)
        q.shared = 0

    def count(self, q: SimRequest, hit: int) -> None:
        """``q`` is admitted, ``hit`` of the ``q.target`` tokens it needed found cached."""
        self.query_tokens += q.target
        self.hit_tokens += hit
        q.r.cached_tokens = hit

    def publish(self, q: SimRequest) -> int:
        """``q`` has computed its prefix's whole blocks: cache them (the first to do so; a
        request that computed them beside it keeps its own copy), or, where ``q`` started
        from a shorter cached copy of its prefix (the next turn of a conversation: the same
        id, a longer prefix), extend that copy with the blocks ``q`` added. Returns the tokens
        that move from ``q``'s reservation to the cache."""
        tokens = q.prefix_tokens // self.block * self.block
        e = self.entries.get(q.prefix)
        if e is None:
            if not tokens:
                return 0
            self.entries[q.prefix] = [tokens, 1]
            q.shared = tokens
            return tokens
        if not q.shared or tokens <= e[0] or q.shared != e[0]:
            return 0
        moved = tokens - q.shared
        e[0] = q.shared = tokens  # its users' shares are unchanged: double_counted too
        return moved

    def unref(self, prefix: int, shared: int) -> None:
        """A request holding ``shared`` tokens of the prefix no longer uses it."""
        e = self.entries[prefix]
        e[1] -= 1
        self.double_counted -= shared if e[1] else shared - e[0]
        if not e[1]:
            self.idle[prefix] = e[0]

    def evict(self, need: int) -> int:
        """Evict unused prefixes, least recently used first, until ``need`` tokens are freed
        or none is left; returns the tokens freed. A preempted request's own blocks go from
        their tail, as many whole blocks as are needed (vLLM frees a request's blocks in
        reverse, so its last blocks are handed out first)."""
        freed, idle, b = 0, self.idle, self.block
        while freed < need and idle:
            key, tokens = next(iter(idle.items()))
            short = need - freed
            if key <= OWN and tokens > short:
                take = -(-short // b) * b
                if take < tokens:
                    self.entries[key][0] = idle[key] = tokens - take
                    return freed + take
            del idle[key]
            del self.entries[key]
            freed += tokens
        return freed


def kv_pool(layout: str, capacity_tokens: int, *, block_size: int,
            max_model_len: int, on_demand: bool = True,
            sliding: tuple[int, int, int | None] | None = None) -> KVPool:
    """The pool of ``layout`` ("paged" or "contiguous") over ``capacity_tokens``;
    ``on_demand``: paged blocks are allocated as tokens reach them (else reserved whole);
    ``sliding``: (sliding-window groups, window, the step's token budget, None where requests
    reserve their whole length at once) of a hybrid paged pool (``HybridPagedKV``,
    ``capacity_tokens`` then counting one group's tokens)."""
    if layout == "paged" and sliding is not None:
        groups, window, step_tokens = sliding
        return HybridPagedKV(capacity_tokens, block_size, sliding_groups=groups,
                             window=window, step_tokens=step_tokens, on_demand=on_demand)
    if layout == "paged":
        return PagedKV(capacity_tokens, block_size, on_demand=on_demand)
    if layout == "contiguous":
        return ContiguousKV(capacity_tokens, max_model_len)
    raise UsageError(f"kv-layout: {layout!r} is not paged or contiguous")
