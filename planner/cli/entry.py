"""The `llmplan` console script: imports nothing before it can turn a Ctrl-C into exit 130.

A SIGINT while the CLI is still importing (typer, rich, the planner), or after the command
has finished and the interpreter is tearing down, would otherwise end in a traceback or in
death by signal; here it is one line and exit code 130, and a finished command keeps its
own exit code.
"""

import contextlib
import os
import signal
import sys


@contextlib.contextmanager
def deferred_sigint():
    """Hold a Ctrl-C until the block is over, then raise it. For imports and set-up of C++
    extensions (torch): a KeyboardInterrupt raised inside their callbacks aborts the process
    (pybind11 terminates) instead of unwinding."""
    got: list[int] = []
    try:
        old = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    except ValueError:  # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if got:
        raise KeyboardInterrupt


def run() -> None:
    try:
        from planner.cli.app import main

        code = main()
    except KeyboardInterrupt:
        print("llmplan: interrupted", file=sys.stderr)
        code = 130
    except Exception as err:  # the app failed to import: main's own handling is not there yet
        if os.environ.get("LLMPLAN_DEBUG", "") not in ("", "0"):
            import traceback

            traceback.print_exc()
        print(f"llmplan: error: internal error while starting: {type(err).__name__}: "
              f"{' '.join(str(err).split())[:200]}; please report it to the llmplan "
              "maintainers (LLMPLAN_DEBUG=1 prints the traceback)", file=sys.stderr)
        code = 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the work is done: finish tearing down
    if code == 130:
        # A Ctrl-C that landed inside an extension's embedded Python (torch's pybind11) marks
        # the interpreter to kill itself with SIGINT at exit even though it was handled:
        # leave directly, with the code said.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(code)
