import sys

try:
    from planner.cli.entry import run
except KeyboardInterrupt:  # a Ctrl-C before the entry could install its own handling
    sys.stderr.write("llmplan: interrupted\n")
    sys.exit(130)

run()
