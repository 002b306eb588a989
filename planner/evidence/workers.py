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
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_TASK: Callable[[int], Any] | None = None  # what a forked worker runs (set before the fork)


def _run(i: int) -> Any:
    assert _TASK is not None
    return _TASK(i)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


_NOT_HELD = object()  # the main thread's SIGINT handler was not replaced


def _hold_sigint(held: list[int]) -> Any:
    """Hold Ctrl-C back while a pool forks its workers: ``Pool()`` ends the workers it has
    started where it fails with an error, not with KeyboardInterrupt, and a worker forked
    before its initializer ran ignores nothing yet. Returns the handler to put back (only
    the main thread can set one; elsewhere nothing is held)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is None):  # a handler not set from Python
        return _NOT_HELD
    return signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))


def _release_sigint(handler: Any, held: list[int]) -> None:
    """Put ``handler`` back and deliver to it a Ctrl-C that came while it was held."""
    if handler is _NOT_HELD:
        return
    signal.signal(signal.SIGINT, handler)
    if held:
        signal.raise_signal(signal.SIGINT)


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
    held: list[int] = []
    handler = _hold_sigint(held)
    try:
        pool = mp.get_context("fork").Pool(processes=processes, initializer=_ignore_sigint)
    except BaseException:
        _TASK = None
        _release_sigint(handler, held)
        raise
    try:
        _release_sigint(handler, held)  # a Ctrl-C held meanwhile is raised here
        yield pool
        pool.close()
        pool.join()  # a Ctrl-C while the workers finish their last tasks ends them (below)
    except BaseException:
        _end(pool)
        raise
    finally:
        _TASK = None


def _end(pool) -> None:
    """End the pool's workers and wait until they are gone, a further Ctrl-C held meanwhile
    (a worker ignores it, so cutting this short would leave them running) and raised after:
    it is what was asked for last."""
    held: list[int] = []
    handler = _hold_sigint(held)
    try:
        pool.terminate()
        pool.join()
    finally:
        _release_sigint(handler, held)


def prefetched(bounds: list[float], size: Callable[[int], Any], top: int,
               cost: Callable[[Any], float], started: Callable[[int], None] | None = None, *,
               jobs: int) -> dict[int, Any]:
    """Candidates of a search cut by a lower bound on their cost (``bounds``, sorted; the
    rule: ``planner.search.plan.cut_in_order``) sized side by side in up to ``jobs`` forked
    workers: submitted in order while their bound can still make the ``top`` by what has come
    back so far, so a superset of what one process sizes (fewer costs are known at each
    submission). Index -> ``size(i)``; the caller cuts them in order, so its results do not
    depend on ``jobs``. Empty where the work is not forked. ``started(i)``: called here as
    candidate i is submitted (progress)."""
    n = len(bounds)
    results: dict[int, Any] = {}
    if jobs <= 1 or n < 2 or not can_fork():
        return results
    costs: list[float] = []

    def over(i: int) -> bool:
        return len(costs) >= top and bounds[i] > sorted(costs)[top - 1]

    with _pool(size, min(jobs, n)) as pool:
        pending: dict[int, Any] = {}
        nxt = 0
        while True:
            while len(pending) < jobs and nxt < n and not over(nxt):
                if started is not None:
                    started(nxt)
                pending[nxt] = pool.apply_async(_run, (nxt,))
                nxt += 1
            if not pending:
                return results
            done = [i for i, r in pending.items() if r.ready()] or [min(pending)]
            for i in done:
                results[i] = pending.pop(i).get()
                if results[i] is not None:
                    costs.append(cost(results[i]))


def forked_map(task: Callable[[int], Any], n: int, *, jobs: int) -> list[Any]:
    """``task(i)`` for i in 0..n-1, side by side in up to ``jobs`` forked workers, the
    results in order; in this process where the work is not forked (``forked``)."""
    with forked(task, list(range(n)), jobs) as results:
        if results is not None:
            return results()
    return [task(i) for i in range(n)]


__all__ = ["can_fork", "forked", "forked_map", "prefetched"]
