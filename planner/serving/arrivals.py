"""Requests arriving at the replica's queue: an open stream at its arrival times, or a closed
loop of ``max_concurrency`` clients, each sending its next request when its last one is done
(``vllm bench serve --max-concurrency``). Pure."""

from __future__ import annotations

import math
from collections import deque

from planner.serving.requests import SimRequest


class Arrivals:
    """An open stream: each request arrives at its ``arrival_s``."""

    __slots__ = ("pending", "arrived")

    def __init__(self, reqs: list[SimRequest]):
        self.pending = deque(reqs)  # not yet arrived, in arrival order
        self.arrived = 0

    def next_s(self) -> float:
        """When the next request arrives (nan: none is pending, or a closed loop's)."""
        return self.pending[0].r.arrival_s if self.pending else math.nan

    def arrive(self, now: float, waiting: deque, finished: int) -> None:
        """Queue on ``waiting`` every request that has arrived by ``now``."""
        pending = self.pending
        while pending and pending[0].r.arrival_s <= now:
            waiting.append(pending.popleft())
            self.arrived += 1


class ClosedLoop(Arrivals):
    """``clients`` clients: a request arrives when a client is free, at that time."""

    __slots__ = ("clients",)

    def __init__(self, reqs: list[SimRequest], clients: int):
        super().__init__(reqs)
        self.clients = clients
        for q in reqs:
            q.r.arrival_s = math.nan

    def arrive(self, now: float, waiting: deque, finished: int) -> None:
        """Each client whose last request is finished sends its next one at ``now``."""
        pending = self.pending
        while pending and self.arrived - finished < self.clients:
            q = pending.popleft()
            q.r.arrival_s = now
            waiting.append(q)
            self.arrived += 1


def arrivals(reqs: list[SimRequest], max_concurrency: int | None) -> Arrivals:
    return Arrivals(reqs) if max_concurrency is None else ClosedLoop(reqs, max_concurrency)
