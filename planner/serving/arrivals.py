"""Requests arriving at the replica's queue: an open stream at its arrival times, or a closed
loop of ``max_concurrency`` clients, each sending its next request when its last one is done
(``vllm bench serve --max-concurrency``). With an API server that costs time per request
(``planner.serving.frontend``), the engine sees each request once the server has handled it
(``SimRequest.visible_s``), in arrival order. Pure."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from planner.core.errors import UsageError
from planner.serving.frontend import Frontend
from planner.serving.requests import SimRequest


class Arrivals:
    """An open stream: each request arrives at its ``arrival_s`` and reaches the engine at its
    ``visible_s``. ``reqs`` may be an iterator: each request is drawn from it when it is the
    next to reach the engine, so a stream made as it is read holds only those in flight."""

    __slots__ = ("pending", "arrived", "front", "source")

    def __init__(self, reqs: Iterable[SimRequest], front: Frontend | None = None):
        self.pending: deque[SimRequest] = deque()  # sent, not yet seen by the engine
        self.arrived = 0
        self.front = front
        self.source = iter(reqs)  # in arrival order
        self._draw()

    def _draw(self) -> None:
        """The next request into ``pending`` once it is empty, with when the engine sees it
        (the API server admits requests in arrival order)."""
        if not self.pending:
            q = next(self.source, None)
            if q is not None:
                front = self.front
                q.visible_s = q.r.arrival_s if front is None else front.admit(q.r.arrival_s)
                if not math.isfinite(q.visible_s):  # a rate so small its times overflowed
                    raise UsageError(f"request {q.id} arrives at t = {q.visible_s:g} s: the "
                                     "stream's arrival times are out of range")
                self.pending.append(q)

    def next_s(self) -> float:
        """When the engine sees the next request (nan: none is in flight to it)."""
        return self.pending[0].visible_s if self.pending else math.nan

    def arrive(self, now: float, waiting: deque, finished: int) -> None:
        """Queue on ``waiting`` every request the engine has seen by ``now``."""
        pending = self.pending
        while pending and pending[0].visible_s <= now:
            waiting.append(pending.popleft())
            self.arrived += 1
            self._draw()


class ClosedLoop(Arrivals):
    """``clients`` clients: a client that is free sends its next request at that time."""

    __slots__ = ("clients", "unsent", "sent")

    def __init__(self, reqs: Iterable[SimRequest], clients: int,
                 front: Frontend | None = None):
        super().__init__((), front)
        self.unsent = iter(reqs)  # drawn as clients send them
        self.clients = clients
        self.sent = 0

    def arrive(self, now: float, waiting: deque, finished: int) -> None:
        """Each client whose last request is finished sends its next one at ``now``; the
        engine sees it once the API server has handled it."""
        pending, front = self.pending, self.front
        while self.sent - finished < self.clients:
            q = next(self.unsent, None)
            if q is None:
                break
            q.r.arrival_s = now
            q.visible_s = now if front is None else front.admit(now)
            pending.append(q)
            self.sent += 1
        super().arrive(now, waiting, finished)


def arrivals(reqs: Iterable[SimRequest], max_concurrency: int | None,
             front: Frontend | None = None) -> Arrivals:
    return (Arrivals(reqs, front) if max_concurrency is None
            else ClosedLoop(reqs, max_concurrency, front))
