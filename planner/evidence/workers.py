"""Independent computations in forked worker processes: `llmplan calibrate --jobs`, and
`llmplan plan --jobs` sizing candidate configurations side by side.

A leave-one-out fit per run is independent of every other fit and of the fit on all runs: run
side by side on a machine's cores, they give the very figures a single process gives (each is
deterministic, and a fit's cache only saves work), sooner. Workers are forked, so they start
with the parent's state (the runs, the prepared operators, the costs already cached) and need
nothing pickled but an index and a result. They ignore Ctrl-C: the parent takes it, ends
them and reports the interrupt as every command does.

Where ``fork`` is not a start method (Windows), or one job is asked for, the caller runs the
work in its own process.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_TASK: Callable[[int], Any] | None = None  # what a forked worker runs (set before the fork)


def _run(i: int) -> Any:
    assert _TASK is not None
    return _TASK(i)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def can_fork() -> bool:
    return "fork" in mp.get_all_start_methods()


@contextmanager
def forked(task: Callable[[int], Any], items: list[int],
           jobs: int) -> Iterator[Callable[[], list[Any]] | None]:
    """Start ``task(i)`` for each of ``items`` in up to ``jobs`` forked workers; yields a
    function that waits for and returns the results in ``items``' order, or None where the
    work is not forked (``jobs`` <= 1, a single item, no fork). The body of the ``with`` runs
    in the parent meanwhile. Leaving it (an error, Ctrl-C) ends the workers."""
    if jobs <= 1 or len(items) < 2 or not can_fork():
        yield None
        return
    with _pool(task, min(jobs, len(items))) as pool:
        pending = [pool.apply_async(_run, (i,)) for i in items]
        yield lambda: [p.get() for p in pending]


@contextmanager
def _pool(task: Callable[[int], Any], processes: int) -> Iterator[Any]:
    """A pool of forked workers running ``task`` (``_run``); closed when the body ends, ended
    at once where it raises (an error, Ctrl-C)."""
    global _TASK
    _TASK = task
    pool = mp.get_context("fork").Pool(processes=processes, initializer=_ignore_sigint)
    try:
        yield pool
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        _TASK = None


def cut_in_order(bounds: list[float], size: Callable[[int], Any], top: int, jobs: int = 1,
                 cost: Callable[[Any], float] = lambda r: r["usd_per_hour"],
                 started: Callable[[int], None] | None = None) -> list[Any]:
    """A search over candidates sorted by a lower bound on their cost (``bounds``): each is
    sized (``size(i)``: a result, or None where it cannot be), and the search stops at the
    first candidate whose bound is above the ``top``-th cost found before it, since none
    after it can make the list. The results in candidate order (Nones left out).

    With ``jobs`` > 1 the candidates are sized in that many forked workers, submitted in
    order while their bound can still make the list by what has come back so far: a superset
    of what one process sizes, as fewer costs are known at each submission. The results are
    then cut by the same rule, in order, so they are exactly one process's whatever ``jobs``
    is. ``started(i)``: called in this process as candidate i is submitted (progress)."""

    def over(i: int, costs: list[float]) -> bool:
        return len(costs) >= top and bounds[i] > sorted(costs)[top - 1]

    n = len(bounds)
    results: dict[int, Any] = {}
    if jobs > 1 and n > 1 and can_fork():
        with _pool(size, min(jobs, n)) as pool:
            pending: dict[int, Any] = {}
            costs: list[float] = []
            nxt = 0
            while True:
                while len(pending) < jobs and nxt < n and not over(nxt, costs):
                    if started is not None:
                        started(nxt)
                    pending[nxt] = pool.apply_async(_run, (nxt,))
                    nxt += 1
                if not pending:
                    break
                done = [i for i, r in pending.items() if r.ready()] or [min(pending)]
                for i in done:
                    results[i] = pending.pop(i).get()
                    if results[i] is not None:
                        costs.append(cost(results[i]))
    out: list[Any] = []
    costs = []
    for i in range(n):
        if over(i, costs):
            break
        if i not in results:
            if started is not None:
                started(i)
            results[i] = size(i)
        if results[i] is not None:
            out.append(results[i])
            costs.append(cost(results[i]))
    return out


__all__ = ["can_fork", "cut_in_order", "forked"]
