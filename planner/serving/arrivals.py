"""Requests arriving at the replica's queue: an open stream at its arrival times, or a closed
loop of ``max_concurrency`` clients, each sending its next request when it has its last one
whole (``vllm bench serve --max-concurrency``), and where the requests have arrival times too
(a rate beside the cap), not before its time. With an API server that costs time per request
(``planner.serving.frontend``), the engine sees each request once the server has handled it
(``SimRequest.visible_s``), in arrival order. Pure."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from heapq import heappop, heappush

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

    @property
    def more(self) -> bool:
        """Whether a request is yet to reach the engine."""
        return bool(self.pending)

    def arrive(self, now: float, waiting: deque) -> None:
        """Queue on ``waiting`` every request the engine has seen by ``now``."""
        pending = self.pending
        while pending and pending[0].visible_s <= now:
            waiting.append(pending.popleft())
            self.arrived += 1
            self._draw()


class ClosedLoop(Arrivals):
    """``clients`` clients: a client sends its next request as soon as it has the last one
    whole, at the time ``release`` names (``vllm bench serve`` awaits each request's stream
    and starts the next at once). That is the engine's finish plus the part of the request path
    outside its steps (``Engine.request_path_s``: the last token's trip to the client, the
    next request's handling and tokenization), so requests that finish together are sent
    together again: with fixed lengths the clients stay in step, wave after wave, as measured
    (Scicom's vLLM 0.15 runs at 10 clients and 4,096-token prompts start in waves about 50 ms
    wide, the path longer than the last decodes' spread).

    Requests with arrival times (a finite rate beside the cap: ``vllm bench serve
    --request-rate R --max-concurrency N``, SGLang's ``bench_serving`` likewise) are paced as
    well: each benchmark client makes a request's task at its time and the task waits on a
    semaphore of N, first come first served, and starts its clock once it holds it. So a
    request goes out at its arrival time or when a client is free, whichever is later, and its
    ``arrival_s`` becomes that time. Untimed requests (nan: the loop alone) go out as soon as a
    client is free."""

    __slots__ = ("free", "unsent", "next_q", "now")

    def __init__(self, reqs: Iterable[SimRequest], clients: int,
                 front: Frontend | None = None):
        super().__init__((), front)
        self.unsent = iter(reqs)  # drawn as clients send them
        self.next_q = next(self.unsent, None)
        self.free = [0.0] * clients  # a heap of the times clients are free to send
        self.now = 0.0  # the time the queue was last brought up to date

    def release(self, at_s: float) -> None:
        """A client has its request whole at ``at_s`` and sends its next then (nan: the engine
        refused it, and the client has its answer now)."""
        if self.next_q is not None:
            heappush(self.free, at_s if at_s == at_s else self.now)

    def _sends_at(self, free_s: float) -> float:
        """When the next request goes out with a client free at ``free_s``: then, or at its own
        arrival time where that is later (nan, untimed, is never later)."""
        due = self.next_q.r.arrival_s
        return due if due > free_s else free_s

    def next_s(self) -> float:
        """When the engine sees the next request, or a client sends it (nan: neither)."""
        nxt = self.pending[0].visible_s if self.pending else math.inf
        if self.free and self.next_q is not None:
            nxt = min(nxt, self._sends_at(self.free[0]))
        return nxt if nxt < math.inf else math.nan

    @property
    def more(self) -> bool:
        return bool(self.pending) or (self.next_q is not None and bool(self.free))

    def arrive(self, now: float, waiting: deque) -> None:
        """Each client free by ``now`` sends the next request at the time it became free, or
        at the request's arrival time where that is later and still by ``now`` (in that order,
        which ``release``'s times keep: none is earlier than a step already run); the engine
        sees it once the API server has handled it."""
        pending, front, free = self.pending, self.front, self.free
        self.now = now
        while free and self.next_q is not None and self._sends_at(free[0]) <= now:
            q, sent_s = self.next_q, self._sends_at(heappop(free))
            self.next_q = next(self.unsent, None)
            q.r.arrival_s = sent_s
            q.visible_s = sent_s if front is None else front.admit(sent_s)
            pending.append(q)
        super().arrive(now, waiting)


def arrivals(reqs: Iterable[SimRequest], max_concurrency: int | None,
             front: Frontend | None = None) -> Arrivals:
    return (Arrivals(reqs, front) if max_concurrency is None
            else ClosedLoop(reqs, max_concurrency, front))
