"""The `llmplan` console script: imports nothing before it can turn a Ctrl-C into exit 130.

A SIGINT while the CLI is still importing (typer, rich, the planner), or after the command
has finished and the interpreter is tearing down, would otherwise end in a traceback or in
death by signal; here it is one line and exit code 130, and a finished command keeps its
own exit code.
"""

import signal
import sys


def run() -> None:
    try:
        from planner.cli import main

        code = main()
    except KeyboardInterrupt:
        print("llmplan: interrupted", file=sys.stderr)
        code = 130
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the work is done: finish tearing down
    sys.exit(code)
