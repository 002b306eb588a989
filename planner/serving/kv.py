"""The KV cache of a replica as a pool of tokens, paged or contiguous.

``PagedKV`` is vLLM's block pool (vllm/v1/core/block_pool.py, PagedAttention): the pool holds
``capacity // block_size`` blocks of ``block_size`` tokens, and a request holds
ceil(tokens / block_size) blocks, allocated as its tokens reach a new block. ``ContiguousKV``
reserves ``max_model_len`` tokens for each request up front, as servers did before
PagedAttention. Both count tokens (blocks x block_size), so the scheduler, the decode pool and
the metrics see one unit; a request's holding is its ``reserved`` field, which the pool keeps
in step with ``free_tokens``. The scheduler decides what to reserve and whom to preempt; the
pool only counts. Pure: no I/O.
"""

from __future__ import annotations

from planner.core.errors import UsageError
from planner.serving.requests import SimRequest


class KVPool:
    """``capacity_tokens`` of KV cache, of which ``free_tokens`` are not reserved."""

    __slots__ = ("capacity_tokens", "free_tokens", "block_growth_tokens")
    layout = ""

    def __init__(self, capacity_tokens: int, block_growth_tokens: int):
        self.capacity_tokens = capacity_tokens
        self.free_tokens = capacity_tokens
        # what a request's next block takes of the pool as it grows (0: reserved whole)
        self.block_growth_tokens = block_growth_tokens

    def tokens_for(self, tokens: int) -> int:
        """KV tokens reserved to hold ``tokens``."""
        raise NotImplementedError

    @property
    def reserved_tokens(self) -> int:
        return self.capacity_tokens - self.free_tokens

    def reserve(self, q: SimRequest, tokens: int) -> bool:
        """Reserve what a request being admitted needs to hold ``tokens``; False, and nothing
        reserved, where the pool has not that much free."""
        need = self.tokens_for(tokens)
        if need > self.free_tokens:
            return False
        self.free_tokens -= need
        q.reserved = need
        return True

    def extra_for(self, q: SimRequest, tokens: int) -> int:
        """Tokens ``q`` needs beyond its reservation to hold ``tokens`` (<= 0: none)."""
        return self.tokens_for(tokens) - q.reserved

    def grow(self, q: SimRequest, extra: int) -> None:
        """Reserve ``extra`` more tokens for ``q`` (nothing for extra <= 0)."""
        if extra > 0:
            self.free_tokens -= extra
            q.reserved += extra

    def release(self, q: SimRequest) -> None:
        """Free everything ``q`` holds (it finished, or it is preempted)."""
        self.free_tokens += q.reserved
        q.reserved = 0


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


class ContiguousKV(KVPool):
    __slots__ = ("max_model_len",)
    layout = "contiguous"

    def __init__(self, capacity_tokens: int, max_model_len: int):
        super().__init__(capacity_tokens, 0)
        self.max_model_len = max_model_len

    def tokens_for(self, tokens: int) -> int:
        return self.max_model_len


def kv_pool(layout: str, capacity_tokens: int, *, block_size: int,
            max_model_len: int, on_demand: bool = True) -> KVPool:
    """The pool of ``layout`` ("paged" or "contiguous") over ``capacity_tokens``;
    ``on_demand``: paged blocks are allocated as tokens reach them (else reserved whole)."""
    if layout == "paged":
        return PagedKV(capacity_tokens, block_size, on_demand=on_demand)
    if layout == "contiguous":
        return ContiguousKV(capacity_tokens, max_model_len)
    raise UsageError(f"kv-layout: {layout!r} is not paged or contiguous")
