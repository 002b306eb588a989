"""`llmplan calibrate --jobs`: the leave-one-out fits in forked workers give the figures one
process gives, and Ctrl-C still ends the command in one line, workers included
(planner/evidence/workers.py)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool as mp_pool
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from planner.evidence import workers

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "tests" / "fixtures" / "servers"
needs_fork = pytest.mark.skipif(not workers.can_fork(), reason="no fork start method here")


def _fit(jobs: int, monkeypatch):
    from planner.cli.compare import read_result_files, server_setup
    from planner.cli.options import QuantizedLayers
    from planner.evidence import calibrate

    monkeypatch.setattr(calibrate, "FIT_MAX_REQUESTS", 20)
    s, spec = server_setup("llama-3.1-8b", "h100-sxm", "vllm", 1, None, None, None,
                           QuantizedLayers.all)
    runs = read_result_files([SERVERS / "sglang_bench_serving.jsonl",
                              SERVERS / "vllm_bench_serve.json"])
    seen: list[str] = []
    res = calibrate.calibrate(runs, s, spec, name="t", date="2026-11-27", sweeps=2,
                              jobs=jobs, progress=seen.append)
    return res, seen, len(runs)


@needs_fork
def test_leave_one_out_in_workers_gives_the_same_figures(monkeypatch):
    one, seen1, n = _fit(1, monkeypatch)
    two, seen2, _ = _fit(2, monkeypatch)
    assert n > 1 and one.values and one.values == two.values
    assert one.errors == two.errors  # in-sample and leave-one-out, figure for figure
    assert all(e.held_out is not None for e in two.errors)
    # the workers' simulations are reported too, under their own stage
    assert f"leaving out each of {n} runs" in seen2 and len(seen2) > seen1.count("fitting")


def test_one_job_or_one_item_is_not_forked():
    with workers.forked(lambda i: i, [0, 1], 1) as got:
        assert got is None
    with workers.forked(lambda i: i, [0], 4) as got:
        assert got is None


@needs_fork
def test_workers_return_in_order_and_raise_what_a_task_raised():
    with workers.forked(lambda i: i * i, [3, 1, 2], 2) as got:
        assert got() == [9, 1, 4]

    def bad(i: int) -> int:
        if i == 1:
            raise ValueError(f"run {i} is malformed")
        return i

    with pytest.raises(ValueError, match="run 1 is malformed"):
        with workers.forked(bad, [0, 1], 2) as got:
            got()


@needs_fork
@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers are set in the main thread only")
def test_ctrl_c_while_the_pool_forks_leaves_no_worker(monkeypatch):
    """Ctrl-C that lands while the pool is forking its workers (the pool's own clean-up
    covers errors, not KeyboardInterrupt) still ends every worker: it is held until the
    pool is made, then raised where the pool is ended."""
    real = mp_pool.Pool._repopulate_pool_static

    def forked_then_interrupted(*args):
        real(*args)  # the workers exist; the pool is not yet returned
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(mp_pool.Pool, "_repopulate_pool_static",
                        staticmethod(forked_then_interrupted))
    try:
        with pytest.raises(KeyboardInterrupt):
            with workers.forked(lambda i: i, [0, 1], 2) as got:
                got()
        assert multiprocessing.active_children() == []
    finally:
        for child in multiprocessing.active_children():  # what the defect leaves behind
            child.kill()
            child.join()


@needs_fork
@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers are set in the main thread only")
def test_ctrl_c_while_the_workers_finish_ends_them(monkeypatch):
    """Ctrl-C while the parent waits for its workers to finish their last tasks (the pool
    closed, joining) ends them at once rather than leaving them to run on."""
    real = mp_pool.Pool.join
    calls = []

    def interrupted_once(self):
        calls.append(self)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(mp_pool.Pool, "join", interrupted_once)
    try:
        with pytest.raises(KeyboardInterrupt):
            with workers.forked(lambda i: time.sleep(0.5) or i, [0, 1], 2):
                pass  # the tasks are still running when the pool is closed and joined
        assert multiprocessing.active_children() == []
    finally:
        for child in multiprocessing.active_children():
            child.kill()
            child.join()


@needs_fork
@pytest.mark.slow
def test_ctrl_c_ends_calibrate_and_its_workers(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: the workers ignore it, the
    parent ends them and prints one line, exit 130; no process of the group is left."""
    files = [str(SERVERS / f) for f in ("vllm_bench_serve.json", "sglang_bench_serving.jsonl",
                                        "guidellm_report.json")]
    p = subprocess.Popen([sys.executable, "-m", "planner", "calibrate", *files, "-m",
                          "llama-3.1-8b", "-g", "h100-sxm", "--out", str(tmp_path / "c.yaml"),
                          "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    time.sleep(4.0)  # past start-up, into the fits
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert "Traceback" not in err, err
    assert p.returncode == 130, err  # the whole fit takes 45 s on a two-core machine
    assert [ln for ln in err.splitlines() if ln.startswith("llmplan: interrupted")], err
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.killpg(p.pid, 0)  # nothing of the group is left running
