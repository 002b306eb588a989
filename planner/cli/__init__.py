"""The ``llmplan`` command line: one module per command (parse, one library call, render),
``options`` for the shared options, ``app`` for the typer app and its error handling, and
``entry`` for the console script. Imports nothing here, so ``entry`` can guard the imports."""
