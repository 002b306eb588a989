"""Issue 26 §2: every option of every llmplan command says what it is and what it takes.

The rule, for each option of each command of ``planner.cli.app``'s typer app, of the plugin
commands registered under ``llmplan.commands`` (the harness's ``measure``) and of the
``llmplan-check`` script:

1. Its help text is not empty.
2. An option that takes a value shows a metavar written for it: a list of its choices
   (``<bf16|fp16|...>``, an enum's) or upper-case words of our own (``N``, ``TOKENS``,
   ``MODEL``, ``GPU,...``, ``SET|FILE``, ``GPU=USD``), never the name of a type that typer,
   click or argparse writes by itself (``<str>``, ``<int>``, ``<float>``, ``<path>``, ``TEXT``,
   ``INTEGER``, ``FLOAT``, ``PATH``, argparse's upper-cased option name).
3. The metavar names the kind of value where the option's type or name says it: a path names
   the file (``FILE``, ``DIR``, or its format: ``PNG``, ``CSV``, ``YAML``, ``JSONL``, ``XML``);
   a duration option (parsed by ``duration_s``: ``500ms``, ``3s``) says ``DURATION``; a name
   ending in a unit carries the unit (``-us``: ``US``, ``-gib`` / ``-gb``: ``GIB``, ``-s``:
   ``SECONDS``; a rate, ``-per-s``, is a ``RATE``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import pytest
import typer

from planner.cli.options import duration_option

BARE = {"<str>", "<int>", "<float>", "<path>", "<text>", "<bool>", "<file>", "TEXT", "INTEGER",
        "FLOAT", "PATH", "FILENAME", "DIRECTORY", "BOOLEAN"}
OURS = re.compile(r"^[A-Z][A-Z0-9_]*(=[A-Z]+)?(\|[A-Za-z0-9_]+)*(,\.\.\.)?$"  # N, GPU,..., SET|FILE
                  r"|^[A-Z]+,[A-Z]+$"  # a pair: FROM,TO
                  r"|^[a-z0-9-]+(\|[a-z0-9-]+)+$")  # choices spelled out: auto|cuda|cpu
CHOICES = re.compile(r"^<[^<>|]+(\|[^<>|]+)+>$")
FILE_WORDS = {"FILE", "DIR", "PNG", "CSV", "YAML", "JSONL", "XML"}
UNITS = {"-us": {"US"}, "-gib": {"GIB"}, "-gb": {"GIB", "GB"}, "-s": {"SECONDS", "DURATION"}}


def _commands():
    """(name, click command) of every llmplan command, the plugins' included."""
    from importlib.metadata import entry_points

    from planner.cli.app import app

    root = typer.main.get_command(app)
    out = sorted(root.commands.items())
    for ep in entry_points(group="llmplan.commands"):
        one = typer.Typer()
        one.command(name=ep.name)(ep.load())
        out.append((ep.name, typer.main.get_command(one)))
    return out


def _problems(name: str, p, ctx) -> list[str]:
    flag = max(p.opts, key=len)
    if not (p.help or "").strip():
        return [f"{name} {flag}: no help text"]
    if p.is_flag or getattr(p, "count", False):
        return []
    record = p.get_help_record(ctx)[0]
    metavar = record.rsplit(" ", 1)[-1]
    if metavar in BARE or not (OURS.match(metavar) or CHOICES.match(metavar)):
        return [f"{name} {flag}: metavar {metavar!r} is not one written for it"]
    td = getattr(p, "type_descriptor", None)
    annotation = getattr(td, "annotation", None)
    parser = getattr(getattr(td, "parameter_info", None), "parser", None)
    words = set(re.split(r"[|,=.]+", metavar)) - {""}
    problems = []
    if annotation is Path and not words & FILE_WORDS:
        problems.append(f"{name} {flag}: a path, but {metavar!r} names no file")
    if parser is not None and parser.__name__ == "duration_s" and "DURATION" not in words:
        problems.append(f"{name} {flag}: a duration, but {metavar!r} does not say so")
    for suffix, allowed in UNITS.items():
        if flag.endswith(suffix) and not flag.endswith("-per-s") and not words & allowed:
            problems.append(f"{name} {flag}: {metavar!r} drops the unit of {suffix}")
    return problems


def test_every_option_has_help_and_a_readable_metavar():
    problems, seen = [], 0
    for name, cmd in _commands():
        ctx = cmd.context_class(cmd, info_name=name)
        for p in cmd.params:
            if p.param_type_name == "option":
                seen += 1
                problems += _problems(name, p, ctx)
    assert seen > 250  # every command was walked: ~290 options
    assert problems == []


def test_the_rule_catches_a_bare_metavar():
    """The audit can fail: a bare int, a path without a file word, a duration without
    DURATION, a unit dropped and a missing help are each caught."""
    import typer

    bad = typer.Typer()

    @bad.command()
    def c(
        count: Annotated[int, typer.Option(help="How many.")] = 1,
        out: Annotated[Optional[Path], typer.Option(help="Where.", metavar="WHERE")] = None,
        wait: Annotated[float, duration_option("--wait", help="How long.",
                                               metavar="TIME")] = 1.0,
        delay_us: Annotated[float, typer.Option(help="Delay.", metavar="DELAY")] = 0.0,
        name: Annotated[str, typer.Option(metavar="NAME")] = "x",
        ok: Annotated[int, typer.Option(help="Fine.", metavar="N")] = 1,
    ) -> None:
        """Five options with one problem each, and one fine option."""

    cmd = typer.main.get_command(bad)
    ctx = cmd.context_class(cmd, info_name="c")
    found = {p.name: _problems("c", p, ctx) for p in cmd.params}
    assert all(found[k] for k in ("count", "out", "wait", "delay_us", "name")), found
    assert found["ok"] == []


def test_llmplan_check_options_have_help_and_metavars():
    from planner.cli.budgets import _parser

    for action in _parser()._actions:
        if action.dest == "help":
            continue
        assert (action.help or "").strip(), action.dest
        if action.nargs == 0:  # a switch
            continue
        # argparse writes the upper-cased dest (ENGINE, JUNIT_DIR) unless told: say it
        assert action.metavar and (OURS.match(action.metavar)), action.dest
        if action.type is Path:
            assert set(re.split(r"[|,=.]+", action.metavar)) & FILE_WORDS, action.dest


@pytest.mark.parametrize("command", ["estimate", "plan", "simulate", "measure"])
def test_help_shows_the_metavars(command):
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "planner", command, "--help"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "100",
                            "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert r.returncode == 0, r.stderr
    assert not re.search(r"<(str|int|float|path)>", r.stdout)
    assert "--model MODEL" in r.stdout or "-m, --model MODEL" in r.stdout
