"""benchmarks/fuzz.py's two ways of running a case: a child forked from a process that has
the planner imported (the default, fast) and a fresh interpreter (``--mode subprocess``, full
fidelity) must give every case the same exit code and verdict; a case past its limit is
killed with everything it started and called a hang; the hostile metrics server's every
class is answered by ``watch`` in one line or a window."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import fuzz  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "measure"
SLOW_COMMANDS = {"validate", "measure", "plan", "calibrate", "report"}


@pytest.fixture(scope="module")
def setup_dir(tmp_path_factory):
    """What ``fuzz.prepare`` measures, from the committed CPU fixtures instead (seconds)."""
    d = tmp_path_factory.mktemp("fuzz-setup")
    shutil.copy(FIXTURES / "cpu-calibration.yaml", d / "calibration.yaml")
    shutil.copy(FIXTURES / "cpu-results.jsonl", d / "results.jsonl")
    fuzz.write_inputs(d)
    fuzz.HostileServer.start()
    return d


def _sample(setup_dir, n: int, seed: int) -> list:
    """``n`` of the seed's cases that run in about a second each, every kind represented
    where the first few hundred cases hold one."""
    cases = [c for c in fuzz.make_cases(400, seed, setup_dir)
             if c.args and c.args[0] not in SLOW_COMMANDS
             and not any("drip" in a or "slow-start" in a for a in c.args)]
    by_kind: dict[str, list] = {}
    for c in cases:
        by_kind.setdefault(c.kind, []).append(c)
    picked = [cs[0] for cs in by_kind.values()]
    picked += [c for c in cases if c not in picked][:max(0, n - len(picked))]
    return picked[:n]


_nonce = re.compile(r"127\.0\.0\.1:\d+/\d+/")


def test_fork_and_subprocess_classify_alike(setup_dir):
    cases = _sample(setup_dir, 20, seed=2027)
    assert {"cli", "watch", "check-cli"} <= {c.kind for c in cases}

    def outcomes(mode):
        return {o.case.index: o for o in fuzz.run_cases(cases, lambda c: 120, mode=mode,
                                                          memory_mib=8192)}

    sub = outcomes("subprocess")
    fuzz.preload()  # what --mode fork does first (this process has most of it already)
    forked = outcomes("fork")
    for i, s in sub.items():
        f = forked[i]
        assert (f.code, f.verdict) == (s.code, s.verdict), (s.case.what, s.stderr, f.stderr)
        # the same one line, word for word (but the hostile server's run nonce in a URL)
        assert _nonce.sub("", f.stderr) == _nonce.sub("", s.stderr), s.case.what
        if s.code == 0 and "--json" in s.case.args and s.case.kind != "watch":
            assert f.stdout == s.stdout, s.case.what
    # how much faster forking is, is a figure the fuzz run prints, not a timed test here


@pytest.mark.parametrize("mode", ["fork", "subprocess"])
def test_a_case_past_its_limit_is_a_hang_and_its_whole_group_is_killed(tmp_path, monkeypatch,
                                                                        mode):
    marker = tmp_path / "grandchild.pid"
    code = (f"import os, subprocess, sys, time; "
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(60)")

    def sleeper():
        exec(code)

    monkeypatch.setitem(fuzz.ENTRIES, "sleeper", [sys.executable, "-c", code])
    monkeypatch.setitem(fuzz.ENTRY_POINTS, "sleeper", sleeper)
    case = fuzz.Case(0, "test", [], entry="sleeper")
    t0 = time.perf_counter()
    o = fuzz.run_case(case, 2.0, mode=mode)
    assert o.code is None and o.verdict == "hang"
    assert 2.0 <= time.perf_counter() - t0 < 10
    pid = int(marker.read_text())
    for _ in range(100):  # the grandchild, in the case's process group, is gone too
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    else:
        pytest.fail("the case's grandchild outlived it")


@pytest.mark.parametrize("mode", ["fork", "subprocess"])
def test_verdicts_of_an_uncaught_exception_and_a_memory_cap(monkeypatch, mode):
    """A traceback is a failure in either mode; an address-space cap turns an allocation
    too large into a MemoryError, which the interpreter reports with a traceback."""
    code = "raise ValueError('boom')"

    def boom():
        raise ValueError("boom")

    monkeypatch.setitem(fuzz.ENTRIES, "boom", [sys.executable, "-c", code])
    monkeypatch.setitem(fuzz.ENTRY_POINTS, "boom", boom)
    o = fuzz.run_case(fuzz.Case(0, "test", [], entry="boom"), 30, mode=mode)
    assert o.code == 1 and o.verdict == "traceback" and "ValueError: boom" in o.stderr

    big = "bytearray(6 * 2**30)"
    monkeypatch.setitem(fuzz.ENTRIES, "big", [sys.executable, "-c", big])
    monkeypatch.setitem(fuzz.ENTRY_POINTS, "big", lambda: eval(big))
    o = fuzz.run_case(fuzz.Case(0, "test", [], entry="big"), 30, mode=mode, memory_mib=4096)
    assert o.verdict == "traceback" and "MemoryError" in o.stderr


def test_verdict_rules():
    case = fuzz.Case(0, "cli", ["estimate"])

    def v(code, err="", out=""):
        return fuzz.Outcome(case, code, err, 0.1, out).verdict

    assert v(None) == "hang"
    assert v(-11) == "exit -11"
    assert v(2, "llmplan: error: a\nb\n") == "multi-line error"
    assert v(1, "llmplan: error: internal error: KeyError: 'x'; please report") == \
        "internal error"
    assert v(0, out='{"ttft_s": NaN}') == "impossible figure"
    assert v(0, out="TPOT  inf ms") == "impossible figure"
    assert v(0, out='{"request_rate": "inf"}\nrequests at inf req/s') == "ok"
    assert v(0, out="20 requests at inf \nreq/s") == "ok"  # wrapped by rich
    assert v(0, out="200x4-tp4-sglang-offline sglang rate=inf") == "ok"  # a run's label
    assert v(0, out="Infinity-fabric, Infinity Fabric, information, nanoseconds") == "ok"
    assert v(2, "llmplan: error: bad\n") == "ok"
    assert v(2, "llmplan: error: unknown model '\x1b]0;t\x07'\n") == "terminal escape"
    assert v(2, "llmplan: error: unknown model '\\x1b]0;t\\x07'\n") == "ok"  # escaped
    check = fuzz.Case(0, "check-cli", ["a.yaml", "b.yaml"], entry="llmplan-check")
    two = "llmplan: error: a.yaml:1: x\nllmplan: error: b.yaml:2: y\n"
    assert fuzz.Outcome(check, 2, two, 0.1).verdict == "ok"  # one line per file
    assert fuzz.Outcome(check, 2, "llmplan: error: x\nllmplan: error: x\n", 0.1).verdict == \
        "multi-line error"


@pytest.mark.parametrize("kind", fuzz.HOSTILE_CLASSES)
def test_every_hostile_page_class_is_answered_in_one_line_or_a_window(setup_dir, run_cli,
                                                                       kind):
    for seed in range(3):
        url = f"{fuzz.HostileServer.base()}/{next(fuzz._NONCE)}/{kind}/{seed}/metrics"
        args = ["watch", url, *fuzz.BASE, "--once", "--interval", "0.05", "--timeout", "1"]
        for extra in ([], ["--json", "--follow-redirects"]):
            t0 = time.monotonic()
            code, out, err = run_cli(*args, *extra)
            # the whole-scrape deadline; a page just under the 16 MiB limit takes its parse
            limit_s = 30 if kind.startswith("oversize") else 5
            assert time.monotonic() - t0 < limit_s, (kind, seed)
            assert code in (0, 2), (kind, seed, err)
            if code == 2:
                assert len(err.strip().splitlines()) == 1, (kind, seed, err)
            assert not fuzz.IMPOSSIBLE.search(out), (kind, seed, out)
            assert "\x1b" not in out + err and "\x07" not in out + err, (kind, seed)
