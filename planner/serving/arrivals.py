"""Requests arriving at the replica's queue: an open stream at its arrival times, or a closed
loop of ``max_concurrency`` clients, each sending its next request when its last one is done
(``vllm bench serve --max-concurrency``). With an API server that costs time per request
(``planner.serving.frontend``), the engine sees each request once the server has handled it
(``SimRequest.visible_s``), in arrival order. Pure."""

from __future__ import annotations

import math
from collections import deque

from planner.serving.frontend import Frontend
from planner.serving.requests import SimRequest


class Arrivals:
    """An open stream: each request arrives at its ``arrival_s`` and reaches the engine at its
    ``visible_s``."""

    __slots__ = ("pending", "arrived", "front")

    def __init__(self, reqs: list[SimRequest], front: Frontend | None = None):
        self.pending = deque(reqs)  # sent, not yet seen by the engine, in arrival order
        self.arrived = 0
        self.front = front
        for q in reqs:
            q.visible_s = q.r.arrival_s if front is None else front.admit(q.r.arrival_s)

    def next_s(self) -> float:
        """When the engine sees the next request (nan: none is in flight to it)."""
        return self.pending[0].visible_s if self.pending else math.nan

    def arrive(self, now: float, waiting: deque, finished: int) -> None:
        """Queue on ``waiting`` every request the engine has seen by ``now``."""
        pending = self.pending
        while pending and pending[0].visible_s <= now:
            waiting.append(pending.popleft())
            self.arrived += 1


class ClosedLoop(Arrivals):
    """``clients`` clients: a client that is free sends its next request at that time."""

    __slots__ = ("clients", "unsent", "sent")

    def __init__(self, reqs: list[SimRequest], clients: int, front: Frontend | None = None):
        super().__init__([], front)
        self.unsent = deque(reqs)
        self.clients = clients
        self.sent = 0
        for q in reqs:
            q.r.arrival_s = math.nan

    def arrive(self, now: float, waiting: deque, finished: int) -> None:
        """Each client whose last request is finished sends its next one at ``now``; the
        engine sees it once the API server has handled it."""
        unsent, pending, front = self.unsent, self.pending, self.front
        while unsent and self.sent - finished < self.clients:
            q = unsent.popleft()
            q.r.arrival_s = now
            q.visible_s = now if front is None else front.admit(now)
            pending.append(q)
            self.sent += 1
        super().arrive(now, waiting, finished)


def arrivals(reqs: list[SimRequest], max_concurrency: int | None,
             front: Frontend | None = None) -> Arrivals:
    return (Arrivals(reqs, front) if max_concurrency is None
            else ClosedLoop(reqs, max_concurrency, front))
