"""A request as the simulator tracks it: its state, its progress, and the result it reports.

As in vLLM (``vllm/v1/request.py``), a request has no "prefill phase" or "decode phase" of its
own, only tokens computed against tokens to compute (``computed`` against ``target``) and
tokens generated; ``RequestState`` says where the scheduler holds it, the finished states
grouped (``RequestState.finished``). A typo in a state is an AttributeError, not a silent
mismatch. Pure: no I/O.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class RequestState(enum.Enum):
    WAITING = "waiting"  # queued, not yet run
    PREEMPTED = "preempted"  # queued again (at the front), its KV freed, to recompute
    PREFILLING = "prefilling"  # running: computing its prompt (and any regenerated tokens)
    PREFILLED = "prefilled"  # static batching: prompt done, waits for its batch to decode
    DECODING = "decoding"  # running: a token per step (E on average when speculating)
    # finished: every output token generated
    PADDING_PREFILLED = "padding-prefilled"  # static: done at its prefill, will pad the batch
    PADDING = "padding"  # static: done, decoding on as padding until the batch's longest is
    FINISHED = "finished"  # done and its KV freed

    @property
    def finished(self) -> bool:
        """Every output token is generated (vLLM's ``RequestStatus.is_finished``)."""
        return self in _FINISHED


_FINISHED = frozenset({RequestState.PADDING_PREFILLED, RequestState.PADDING,
                       RequestState.FINISHED})


@dataclass(slots=True)
class RequestResult:
    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float = math.nan
    finish_s: float = math.nan
    preemptions: int = 0
    # why the engine refused it (a prompt beyond its step budget with chunked prefill off,
    # a request larger than the whole KV cache): it is not served and not in the figures
    failed: str = ""
    cached_tokens: int = 0  # prompt tokens its (last) admission found in the prefix cache

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """vLLM's definition: (e2e - TTFT) / (output tokens - 1); nan for one token."""
        if self.output_tokens <= 1:
            return math.nan
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass(slots=True, eq=False)
class SimRequest:
    """A request inside the simulation (its ``RequestResult`` is what the caller sees)."""

    r: RequestResult
    id: int
    target: int  # tokens to prefill (prompt, or prompt + generated after a preemption)
    computed: int = 0
    generated: int = 0
    reserved: int = 0  # KV tokens reserved: blocks x block_size, or max_model_len
    admitted: int = 0  # admission stamp: the newest is preempted first
    # decoding, in aggregate (``planner.serving.decoding``): cache c0 and generated g0 when
    # joining at the pool's decode step G0, and the step at which it is done
    c0: int = 0
    g0: int = 0
    G0: int = 0
    finish_G: int = 0
    state: RequestState = RequestState.WAITING
    # its prompt's shared prefix (``planner.serving.traffic.Request``), and the KV tokens of
    # it that the prefix cache holds for it rather than its own reservation
    prefix: int = -1
    prefix_tokens: int = 0
    shared: int = 0
    # when the engine sees it: its arrival, or later once the API server has handled it
    # (``planner.serving.frontend``)
    visible_s: float = 0.0
    # prompt tokens whose KV arrives with it (computed by a prefill instance): it starts with
    # them computed at its first admission; a recompute after a preemption computes them
    loaded: int = 0
    # its position in the stream given: its row of the run's records
    # (``planner.serving.records``), written when it is done
    index: int = -1

    @classmethod
    def of(cls, r: RequestResult, prefix: int = -1, prefix_tokens: int = 0,
           loaded: int = 0) -> SimRequest:
        q = cls(r, r.id, r.prompt_tokens)  # the rest at their defaults, then these four:
        # half the time of passing them as keywords to the generated __init__ (per request)
        q.prefix, q.prefix_tokens, q.visible_s, q.loaded = \
            prefix, prefix_tokens, r.arrival_s, loaded
        return q
