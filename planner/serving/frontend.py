"""The engine's API server as a resource the requests share, not a fixed delay.

A vLLM server's OpenAI-compatible front end is one Python process (``--api-server-count``
processes since 0.9): it parses each request, renders the chat template and hands the request
to the engine core, and for every token the engine emits it detokenizes, builds a server-sent
event and writes it to the client's stream. That work is serial within a process, so it is a
queue: a burst of a thousand requests reaches the engine at the rate the API server admits
them, and a thousand streams in flight are written at the rate it can write tokens, whatever
the GPU's pace (vLLM's RFC "Scale the API server across multiple CPUs",
https://github.com/vllm-project/vllm/issues/12705: "the API server runs in a single process,
utilizing a single CPU for its work").

``Frontend`` models it with two costs of the engine profile, each CPU time in the API server:

- ``request_s``, per request, before the engine sees it: request parsing, the chat template,
  the hand-off. Requests are admitted in arrival order; with ``servers`` processes a request
  is handed over no sooner than its own cost after it arrives, and the processes together
  admit ``servers / request_s`` requests a second (``admit``).
- ``token_s``, per output token streamed. The engine core runs ahead of its API server in its
  own process, but the client sees a token when the API server has written it, so a step is
  seen to take at least its tokens x ``token_s / servers`` (``step_floor_s``): coupling the
  two is exact for the client's throughput while the API server is the bottleneck, and leaves
  the engine no run-ahead (it does not admit new requests sooner than the streams drain).

Admission and streaming share the process's CPU; each is costed on its own. The fixed part of
the request path (network, the first token's hop between processes) stays
``Engine.request_overhead_s``. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Frontend:
    request_s: float = 0.0  # API-server CPU per request, before the engine sees it
    token_s: float = 0.0  # API-server CPU per output token streamed
    servers: int = 1  # API-server processes (vLLM's --api-server-count)
    free_s: float = -math.inf  # when the processes, pooled, are next free
    last_s: float = -math.inf  # when the last request admitted reached the engine

    def __post_init__(self) -> None:
        if self.servers < 1:
            raise ValueError("servers: must be at least 1")
        if not (self.request_s >= 0 and self.token_s >= 0):
            raise ValueError("request_s and token_s: must be >= 0")

    @property
    def active(self) -> bool:
        return self.request_s > 0 or self.token_s > 0

    def admit(self, arrival_s: float) -> float:
        """When a request arriving at ``arrival_s`` (after every earlier one) reaches the
        engine: its own handling time after it arrives, and no sooner than the pooled
        processes get to it; in arrival order."""
        a = self.request_s
        if not a:
            return arrival_s
        # max() written out, keeping the first of equals as max does: this runs per request
        free_s = self.free_s
        free_s = self.free_s = (arrival_s if arrival_s > free_s else free_s) + a / self.servers
        visible = arrival_s + a
        if free_s > visible:
            visible = free_s
        if self.last_s > visible:
            visible = self.last_s
        self.last_s = visible
        return visible

    def step_floor_s(self, tokens: int) -> float:
        """The least time a step that emits ``tokens`` output tokens is seen to take."""
        return tokens * self.token_s / self.servers
