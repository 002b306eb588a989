"""The ``llmplan`` typer app: registers every command (one module each beside this one) and
turns every user error into one line on stderr.

Exit codes: 0 success; 1 a check failed, or an internal error (a bug: "please report");
2 bad input or usage, or a resource limit (MemoryError, RecursionError); 3 a requested device
is absent; 130 interrupted. Every error is one line on stderr, never a traceback
(LLMPLAN_DEBUG=1 prints the traceback of an unexpected one first).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from planner import __version__
from planner.cli.options import stderr
from planner.core.errors import Interrupted, LlmplanError, flagged


def _typer() -> typer.Typer:
    return typer.Typer(
        name="llmplan",
        help="Capacity planner and roofline calculator for LLM inference.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )


app = _typer()


BUILTIN = ("estimate", "models", "gpus", "engines", "prices", "sweep", "report", "check",
           "plan", "validate", "simulate", "compare", "calibrate", "watch", "ui")


def _commands() -> dict:
    """Each built-in command's function, by name, in ``--help``'s order."""
    from planner.cli import (
        calibrate,
        catalog,
        check,
        compare,
        estimate,
        plan,
        report,
        simulate,
        sweep,
        ui,
        validate,
        watch,
    )

    fns = (estimate.estimate, catalog.models, catalog.gpus, catalog.engines, catalog.prices,
           sweep.sweep, report.report, check.check, plan.plan, validate.validate,
           simulate.simulate, compare.compare, calibrate.calibrate, watch.watch, ui.ui)
    return {fn.__name__: fn for fn in fns}


def _register() -> None:
    for command in _commands().values():
        app.command()(command)


def _register_plugins(argv: list[str]) -> None:
    """Commands from other packages (``llmplan.commands`` entry points), such as the
    harness's ``measure``: looked up only when a built-in command is not what was asked for,
    so ``llmplan estimate`` starts without scanning installed packages."""
    first = next((a for a in argv if not a.startswith("-")), None)
    if first in BUILTIN:
        return
    from importlib.metadata import entry_points

    for ep in entry_points(group="llmplan.commands"):
        try:
            app.command(name=ep.name)(ep.load())
        except ImportError as err:  # a plugin whose extras are missing: say so when asked
            stderr.print(f"[dim]llmplan {ep.name} unavailable: {err}[/]")


_register()


def _print_version(value: bool) -> None:
    if value:
        print(f"llmplan {__version__}")
        raise typer.Exit(0)


def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version.", is_eager=True,
                                          callback=_print_version)] = False,
) -> None:
    """Capacity planner and roofline calculator for LLM inference."""


app.callback()(_root)


def _app_for(args: list[str]) -> typer.Typer:
    """The app a command line runs: where it names a built-in command, one that holds that
    command alone (the same group, root option and command, so the same parsing, help and
    errors; typer builds every command's click parameters from its signature at each run,
    which a one-command app spares: about 45 ms of ``llmplan estimate``'s start); else every
    command (``--help``, a misspelt name, a plugin's command)."""
    first = next((a for a in args if not a.startswith("-")), None)
    if first not in BUILTIN or any(a in ("--version", "--help") for a in
                                   args[:args.index(first)]):
        return app
    one = _typer()
    one.callback()(_root)
    one.command()(_commands()[first])
    return one


def _click_exceptions() -> dict[str, tuple[type[BaseException], ...]]:
    """Typer >= 0.29 carries its own copy of click (and raises its own Exit and Abort, from
    typer.exceptions); older ones use click itself."""
    mods = []
    for name in ("typer.exceptions", "typer._click.exceptions", "click.exceptions"):
        try:
            mods.append(__import__(name, fromlist=["UsageError"]))
        except ImportError:
            pass
    return {k: tuple(getattr(m, k) for m in mods if hasattr(m, k))
            for k in ("NoArgsIsHelpError", "UsageError", "Abort", "Exit")}


DEBUG_ENV = "LLMPLAN_DEBUG"  # =1: a traceback before the one line of an unexpected error


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and turns every error into one line on stderr, never a
    traceback (unless LLMPLAN_DEBUG=1): user errors and resource limits (MemoryError,
    RecursionError) exit 2, an interrupt 130, an internal error 1 with "please report"."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("llmplan: interrupted", file=sys.stderr)
        return 130
    except (MemoryError, RecursionError) as err:
        return _crash(err, 2, "out of memory: the inputs ask for more than this machine has; "
                      "try smaller ones" if isinstance(err, MemoryError) else
                      "the inputs are nested or chained too deeply to follow")
    except Exception as err:  # a bug: said in one line, with what to send
        return _crash(err, 1, f"internal error: {type(err).__name__}: {_one_line(err)}; please "
                      f"report it to the llmplan maintainers with the command line and the "
                      f"traceback ({DEBUG_ENV}=1 prints it)")


def _one_line(err: BaseException, limit: int = 200) -> str:
    """An exception's message as one printable line (it may quote a user's file)."""
    try:
        text = str(err)
    except Exception:  # a message that cannot be made: the type says enough
        text = ""
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text[:limit] + ("..." if len(text) > limit else "")


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on written as its escape (\\x1b,
    \\n): an error line quotes what the user gave (-m, -g, --prices, a file's value), which
    must not clear the screen or retitle the window."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _say(line: str) -> None:
    print(printable(line), file=sys.stderr)


def _crash(err: BaseException, code: int, message: str) -> int:
    import os

    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        import traceback

        traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
    try:
        sys.stdout.flush()  # what the command printed before it failed stays before the line
    except (OSError, ValueError):
        pass
    _say(f"llmplan: error: {message}")
    return code


# names users bring from the other commands or from the engines' own tools, and what each
# command calls them (a command that takes the name itself never raises for it)
NAMED_ELSEWHERE = {"--rps": "--request-rate", "--ttft": "--ttft-slo", "--tpot": "--tpot-slo",
                   "--kv-dtype": "--kv-cache-dtype", "--prompt": "--prompt-tokens",
                   "--output": "--output-tokens", "--input-len": "--prompt-tokens",
                   "--concurrency": "--max-concurrency", "--num-prompts": "--num-requests"}


def unknown_option(err) -> str | None:
    """"No such option: --rps; simulate calls it --request-rate" where the name is another
    command's or an engine tool's for one this command takes (click's guess, by spelling,
    had offered --ep, --pp, --tp); None otherwise."""
    name, ctx = getattr(err, "option_name", None), getattr(err, "ctx", None)
    ours = NAMED_ELSEWHERE.get(name or "")
    if not ours or ctx is None or ctx.command is None:
        return None
    takes = {o for p in ctx.command.params for o in (*getattr(p, "opts", ()),
                                                      *getattr(p, "secondary_opts", ()))}
    return f"No such option: {name}; {ctx.info_name} calls it {ours}" if ours in takes \
        else None


def bad_value(err, args: list[str]) -> str | None:
    """An option's refused value as llmplan's own errors say it: the option's long name, the
    value given and the problem ("--batch: 1.5: Input should be a valid integer"), not every
    alias of it ("Invalid value for '--output-tokens' / '-o' / '--random-output-len' /
    '--output-len': ..."). None where the error is not one option's value."""
    param = getattr(err, "param", None)
    opts = list(getattr(param, "opts", None) or ())
    if not opts or not opts[0].startswith("-") or not getattr(err, "message", ""):
        return None
    name = next((o for o in opts if o.startswith("--")), opts[0])
    given = None
    for i, word in enumerate(args):
        key, eq, inline = word.partition("=")
        if key in opts:
            given = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
    msg = err.message.replace("Value error, ", "")
    shown = "" if given is None or f"'{given}'" in msg else \
        f"{given[:60]!r}{'...' if len(given) > 60 else ''}: "
    return f"{name}: {shown}{msg}"


def _main(argv: list[str] | None) -> int:
    exc = _click_exceptions()
    args = sys.argv[1:] if argv is None else argv
    _register_plugins(args)
    try:
        from planner.cli.flags import check_duplicates

        check_duplicates(args)  # --tp 2 -tp 4: the parser alone would keep the last
        rv = _app_for(args)(args=argv, standalone_mode=False, prog_name="llmplan")
    except exc["NoArgsIsHelpError"] as err:
        print(err.ctx.get_help() if err.ctx else str(err))
        return 0
    except exc["UsageError"] as err:
        ctx = err.ctx
        where = f"llmplan {ctx.info_name}" if ctx and ctx.info_name != "llmplan" else "llmplan"
        msg = bad_value(err, args) or unknown_option(err) or \
            err.format_message().replace("Value error, ", "")
        _say(f"{where}: error: {msg}")
        return 2
    except exc["Abort"]:
        print("llmplan: interrupted", file=sys.stderr)
        return 130
    except exc["Exit"] as err:
        return err.exit_code
    except KeyboardInterrupt:
        print("llmplan: interrupted", file=sys.stderr)
        return 130
    except Interrupted as err:
        print(f"llmplan: interrupted: {err}", file=sys.stderr)
        return 130
    except LlmplanError as err:
        _say(f"llmplan: error: {flagged(err)}")
        return getattr(err, "exit_code", 2)
    except BrokenPipeError:
        return 0
    except OSError as err:  # a path the OS refuses (name too long, permission, disk full)
        name = f"{str(err.filename)[:120]}: " if err.filename is not None else ""
        _say(f"llmplan: error: {name}{err.strerror or err}")
        return 2
    except ValueError as err:  # a pydantic check that no edge check caught: still user input
        if type(err).__name__ != "ValidationError":
            raise
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or err.title
        _say(f"llmplan: error: {where}: {first['msg']}")
        return 2
    if rv == 130:  # typer turns a Ctrl-C inside a command into a silent exit code 130
        print("llmplan: interrupted", file=sys.stderr)
    return rv if isinstance(rv, int) else 0

