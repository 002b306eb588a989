"""The top-level error printer (planner/cli/app.py ``main``, planner/cli/entry.py ``run``):
whatever escapes a command is one line on stderr, never a traceback, with its own exit code:
2 for a resource limit (MemoryError, RecursionError), 130 for an interrupt, 1 for an internal
error, whose line asks for a report. LLMPLAN_DEBUG=1 prints the traceback first.

Exceptions of every kind, with messages of every shape (empty, multi-line, control
characters, huge, a __str__ that itself fails), are raised from inside real commands.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message")


INTERNAL = [ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError, IndexError,
            AssertionError, RuntimeError, NotImplementedError, LookupError, ArithmeticError,
            OverflowError, StopIteration, UnicodeError, Unprintable]
LIMITS = [MemoryError, RecursionError]
CODE = {**{k: 1 for k in INTERNAL}, MemoryError: 2, RecursionError: 2, KeyboardInterrupt: 130}

messages = st.one_of(st.just(""), st.text(max_size=50), st.just("line one\nline two\n\n"),
                     st.just("\x1b[31mred\x1b[0m\r\x07 bell"), st.just("x" * 10_000),
                     st.text(alphabet=st.characters(), max_size=300))
# (command, where the command calls into the library: module, attribute)
COMMANDS = [
    (["estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm"], "planner.io.catalog", "load_model"),
    (["estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--json"],
     "planner.layouts.deployment", "estimate_deployment"),
    (["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "5"],
     "planner.serving.run", "run"),
    (["sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm"], "planner.search.sweep", "iter_sweep"),
    (["models"], "planner.io.catalog", "model_names"),
    (["check", str(ROOT / "examples" / "budget.yaml")], "planner.io.catalog", "load_budget"),
]


def _raiser(kind, message):
    def boom(*a, **k):
        if kind is StopIteration:
            raise StopIteration(message)
        raise kind(message)
    return boom


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(INTERNAL + LIMITS + [KeyboardInterrupt]), message=messages,
       where=st.sampled_from(COMMANDS))
def test_anything_escaping_a_command_is_one_line_with_its_code(kind, message, where):
    import importlib

    from planner.cli.app import main

    args, module, attr = where
    mod = importlib.import_module(module)
    if not hasattr(mod, attr):
        pytest.skip(f"{module}.{attr} moved")
    real = getattr(mod, attr)
    out, err = _capture(lambda: _with(mod, attr, _raiser(kind, message),
                                      lambda: main(list(args))))
    code, text = out
    assert getattr(mod, attr) is real
    assert code == CODE[kind], (kind, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    line = err.strip()
    assert line.startswith("llmplan: "), line
    assert all(c.isprintable() for c in line)
    assert len(line) < 600
    if code == 1:
        assert "internal error" in line and "please report" in line and kind.__name__ in line
        assert "LLMPLAN_DEBUG=1" in line
    elif code == 2:
        assert "out of memory" in line or "nested" in line
    else:
        assert line == "llmplan: interrupted"


def _with(mod, attr, value, fn):
    real = getattr(mod, attr)
    setattr(mod, attr, value)
    try:
        return fn()
    finally:
        setattr(mod, attr, real)


def _capture(fn):
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = fn()
    return (code, out.getvalue()), err.getvalue()


@pytest.mark.parametrize("kind", [ValueError, MemoryError, RecursionError])
def test_debug_env_prints_the_traceback_first(monkeypatch, kind):
    import planner.io.catalog as catalog
    from planner.cli.app import main

    monkeypatch.setenv("LLMPLAN_DEBUG", "1")
    monkeypatch.setattr(catalog, "load_model", _raiser(kind, "deep inside"))
    (code, _), err = _capture(lambda: main(["estimate", "-m", "x", "-g", "h100-sxm"]))
    assert code == CODE[kind]
    assert "Traceback" in err and "load_model" not in err.splitlines()[-1]
    assert err.splitlines()[-1].startswith("llmplan: error: ")
    monkeypatch.setenv("LLMPLAN_DEBUG", "0")  # 0 is off
    (code, _), err = _capture(lambda: main(["estimate", "-m", "x", "-g", "h100-sxm"]))
    assert "Traceback" not in err and err.count("\n") == 1


def test_user_errors_keep_their_own_line_and_code(run_cli):
    """The catch-all does not swallow what was already handled: a bad flag is still 2 with its
    own message, a failed check 1 without "internal"."""
    code, _, err = run_cli("estimate", "-m", "no-such-model", "-g", "h100-sxm")
    assert code == 2 and "internal" not in err and err.count("\n") == 1
    code, _, err = run_cli("check", str(ROOT / "examples" / "budget-failing.yaml"))
    assert code == 1 and "internal" not in err


SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import planner.io.catalog as catalog
def boom(*a, **k):
    raise {kind}("broken\\nin two lines")
catalog.load_model = boom
sys.argv = ["llmplan", "estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm"]
from planner.cli.entry import run
run()
"""


@pytest.mark.parametrize("kind,code", [("ValueError", 1), ("MemoryError", 2),
                                       ("RecursionError", 2), ("KeyboardInterrupt", 130)])
def test_the_console_script_exits_with_the_code_and_one_line(kind, code):
    """Through the real entry point, in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "LLMPLAN_DEBUG"}
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT), kind=kind)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_an_app_that_cannot_start_is_one_line(tmp_path):
    """A broken install (the app module fails while importing): still one line, code 1."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "import builtins\nreal = builtins.__import__\n"
            "def imp(name, *a, **k):\n"
            "    if name == 'planner.cli.app':\n        raise ImportError('half installed')\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = imp\n"
            "from planner.cli.entry import run\nrun()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and "please report" in r.stderr
