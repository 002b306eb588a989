"""Independent computations in forked worker processes: `llmplan calibrate --jobs`.

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
    global _TASK
    if jobs <= 1 or len(items) < 2 or not can_fork():
        yield None
        return
    _TASK = task
    pool = mp.get_context("fork").Pool(processes=min(jobs, len(items)),
                                       initializer=_ignore_sigint)
    try:
        pending = [pool.apply_async(_run, (i,)) for i in items]
        yield lambda: [p.get() for p in pending]
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        _TASK = None


__all__ = ["can_fork", "forked"]
