"""Progress of a long simulation on stderr, without touching the simulator.

The simulator (planner/serving) is pure: it prints nothing and knows no terminal. It prices
every step through the step coster it is given (``run.run(..., step_coster=...)``); the CLI
hands it ``StepProgress``, the deployment's own coster wrapped so that each step also counts
toward a callback. The callback draws a bar on stderr, only when stderr is a terminal, not
under ``--json``, and only once the run has lasted ``SHOW_AFTER_S`` (a short run never
flickers one). ``LLMPLAN_PROGRESS_AFTER_S`` in the environment (seconds, 0 or more) sets both
waits, this one and ``task_progress``'s: the tests' way to see a bar whatever the machine's
speed; any other value leaves them as they are.
"""

from __future__ import annotations

import copy
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SHOW_AFTER_S = 0.5  # a run shorter than this shows no bar
EVERY_STEPS = 256  # the callback's rate: a clock read per 256 steps costs nothing measurable


def _after(default_s: float) -> float:
    """How long a bar waits: ``LLMPLAN_PROGRESS_AFTER_S`` where it is a number of seconds, 0 or
    more; otherwise ``default_s``."""
    try:
        v = float(os.environ.get("LLMPLAN_PROGRESS_AFTER_S", "nan"))
    except ValueError:
        return default_s
    return v if math.isfinite(v) and v >= 0 else default_s


class StepProgress:
    """A step coster that reports ``report(fraction, steps)`` every ``EVERY_STEPS`` steps,
    delegating everything to ``inner``. The fraction is the sequences stepped over the
    requests' output tokens (each decode step advances each running sequence by a token, or
    by ``tokens_per_step`` under speculation, a prefill chunk by its first): an estimate,
    held below 1 until the run ends (recomputed prefills move it at another pace)."""

    def __init__(self, inner, total_tokens: int, report: Callable[[float, int], None], *,
                 tokens_per_step: float = 1.0):
        self._inner = inner
        self._total = max(1.0, total_tokens / max(tokens_per_step, 1.0))
        self._report = report
        self._counter = self  # copies (``with_engine``) count here
        self.steps = 0
        self.sequences = 0

    def __getattr__(self, name: str):  # model, engine, dp_ranks, kv_capacity_tokens...
        # only what the instance lacks reaches here; "_inner" itself, and dunders, only
        # while a copy builds the instance, which must not recurse
        if name == "_inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def _tick(self, sequences: int) -> None:
        c = self._counter
        c.steps += 1
        c.sequences += sequences
        if c.steps % EVERY_STEPS == 0:
            c._report(min(c.sequences / c._total, 0.99), c.steps)

    def step_time(self, *args, **kwargs) -> float:
        self._tick(kwargs.get("sequences", 0))
        return self._inner.step_time(*args, **kwargs)

    def decode_step_s(self, tokens, attn_pairs, kv_read_tokens, score_elems, logit_rows,
                      sequences) -> float:
        """The inner coster's decode step priced from its amounts (most decode steps)."""
        self._tick(sequences)
        return self._inner.decode_step_s(tokens, attn_pairs, kv_read_tokens, score_elems,
                                         logit_rows, sequences)

    def uniform_decode_pricer(self, graphed: bool | None = None):
        """The inner coster's bound decode-step pricer (the plain pool's decode-only steps,
        padded or above the captured sizes), each step counted."""
        price, tick = self._inner.uniform_decode_pricer(graphed), self._tick

        def counted(tokens: int, attended: int, sequences: int) -> float:
            tick(sequences)
            return price(tokens, attended, sequences)

        return counted

    def with_engine(self, engine) -> StepProgress:
        """The inner coster's ``with_engine`` (a multi-step block's later steps), its steps
        counted here too."""
        other = copy.copy(self)
        other._inner = self._inner.with_engine(engine)
        return other


@contextmanager
def simulation_progress(dep, requests, *, enabled: bool,
                        tokens_per_step: float = 1.0) -> Iterator[StepProgress | None]:
    """The step coster to simulate ``requests`` on ``dep`` with: one that draws progress on
    stderr when ``enabled`` and stderr is a terminal, else None (the simulator's own).
    ``tokens_per_step``: a speculative run's expected tokens per request and step."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from planner.serving import run

    start, wait_s = time.monotonic(), _after(SHOW_AFTER_S)
    bar: list[Progress] = []

    def report(fraction: float, steps: int) -> None:
        if not bar:
            if time.monotonic() - start < wait_s:
                return
            p = Progress(TextColumn("simulating {task.fields[what]}"), BarColumn(),
                         TextColumn("about {task.percentage:>3.0f}%"), TimeElapsedColumn(),
                         console=Console(file=sys.stderr), transient=True)
            p.add_task("sim", total=1.0, what=f"{len(requests):,} requests")
            p.start()
            bar.append(p)
        bar[0].update(bar[0].task_ids[0], completed=fraction,
                      what=f"{len(requests):,} requests, {steps:,} steps")

    try:
        yield StepProgress(run.coster(dep), sum(r.output_tokens for r in requests), report,
                           tokens_per_step=tokens_per_step)
    finally:
        if bar:
            bar[0].stop()


SHOW_AFTER_TASK_S = 2.0  # a command's own work: a bar only once it has taken this long


@contextmanager
def task_progress(what: str, *, total: int | None = None,
                  enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """``advance(detail)`` to call once per unit of ``what`` (a served run replayed, a
    configuration sized): a bar (``total`` known) or a count on stderr, only when stderr is a
    terminal, ``enabled`` (not under --json) and the work has lasted ``SHOW_AFTER_TASK_S``."""
    if not enabled or not sys.stderr.isatty():
        yield lambda detail="": None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    start, wait_s = time.monotonic(), _after(SHOW_AFTER_TASK_S)
    bar: list[Progress] = []
    done = [0]

    def advance(detail: str = "") -> None:
        done[0] += 1
        if not bar:
            if time.monotonic() - start < wait_s:
                return
            cols = [TextColumn("{task.description}")]
            if total:
                cols += [BarColumn(), TextColumn("{task.completed:,.0f} of {task.total:,.0f}")]
            else:
                cols += [TextColumn("{task.completed:,.0f}")]
            p = Progress(*cols, TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                         console=Console(file=sys.stderr), transient=True)
            p.add_task(what, total=total, detail="")
            p.start()
            bar.append(p)
        bar[0].update(bar[0].task_ids[0], completed=done[0], detail=detail[:40])

    try:
        yield advance
    finally:
        if bar:
            bar[0].stop()
