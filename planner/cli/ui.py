"""`llmplan ui`: serve the local web page (planner/ui) until interrupted."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from planner.core.errors import LlmplanError

DEFAULT_PORT = 8765


def ui(
    host: Annotated[str, typer.Option(
        metavar="ADDRESS", help="Address to listen on. The default, 127.0.0.1, is reachable "
        "from this machine only; any other address lets anyone who can reach it run llmplan "
        "here.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(
        metavar="PORT",
        help="Port to listen on; 0 picks a free one (the URL is printed).")] = DEFAULT_PORT,
    open_browser: Annotated[bool, typer.Option(
        "--open/--no-open", help="Open the page in the default browser.")] = False,
) -> None:
    """Serve a local web page: estimate, plan and simulate from forms, with charts (needs
    the ui extra: pip install "llmplan[ui]")."""
    if not 0 <= port <= 65535:
        raise LlmplanError(f"--port: must be 0 to 65535, got {port}")
    from planner.ui.server import EXTRA_MISSING, Server, is_loopback, plotly_js

    try:
        plotly_js()
    except LookupError as err:
        print(str(err) or EXTRA_MISSING, file=sys.stderr)
        raise typer.Exit(2) from None
    try:
        server = Server(host, port)
    except OSError as err:
        raise LlmplanError(f"--host {host} --port {port}: cannot listen: "
                           f"{err.strerror or err}") from None
    if not is_loopback(host):
        print(f"llmplan ui: warning: listening on {host}, not a loopback address: anyone who "
              "can reach it can use this page", file=sys.stderr)
    print(f"llmplan ui: serving {server.url} (Ctrl-C stops it)", flush=True)
    if open_browser:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    finally:
        server.server_close()
