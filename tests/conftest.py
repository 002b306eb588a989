from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.io import catalog

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def model():
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = catalog.load_model(name)
        return cache[name]
    return get


@pytest.fixture(scope="session")
def gpu():
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = catalog.load_hardware(name)
        return cache[name]
    return get


@pytest.fixture
def run_cli(capsys):
    """Run the CLI's entry point in-process: (exit code, stdout, stderr)."""
    from planner.cli.app import main

    def run(*args: str):
        code = main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


@pytest.fixture
def run_json(run_cli):
    def run(*args: str):
        code, out, err = run_cli(*args, "--json")
        assert code == 0, err
        return json.loads(out)
    return run


@pytest.fixture
def on_a_terminal():
    """Run llmplan in a subprocess with stderr on a pseudo-terminal and stdout to a file:
    (exit code, stdout, what stderr showed), for what only a terminal is shown (progress).
    stdout goes to a file, not a pipe nobody reads while the run lasts: a large --json would
    fill the pipe and block the child forever. Each run is limited to 600 s."""
    def run(args: list[str]) -> tuple[int, bytes, bytes]:
        import os
        import pty
        import select
        import subprocess
        import sys
        import tempfile
        import time

        master, slave = pty.openpty()
        root = str(Path(__file__).resolve().parent.parent)
        with tempfile.TemporaryFile() as out_file:
            p = subprocess.Popen([sys.executable, "-m", "planner", *args], stdout=out_file,
                                 stderr=slave, env={**os.environ, "PYTHONPATH": root,
                                                    "COLUMNS": "100"})
            os.close(slave)
            err, deadline = b"", time.monotonic() + 600
            while time.monotonic() < deadline:
                ready, _, _ = select.select([master], [], [], 0.2)
                if ready:
                    try:
                        chunk = os.read(master, 65536)
                    except OSError:  # the other end closed
                        break
                    if not chunk:
                        break
                    err += chunk
                elif p.poll() is not None:
                    break
            else:
                p.kill()
            p.wait()
            os.close(master)
            out_file.seek(0)
            return p.returncode, out_file.read(), err
    return run


@pytest.fixture(scope="module")
def ui_url():
    """``llmplan ui``'s server on a free loopback port, in a thread, for one test module: its
    URL (tests/test_ui.py and test_ui_browser.py; both skip first where plotly is missing)."""
    import threading

    from planner.ui.server import Server

    server = Server("127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.url
    server.shutdown()
    server.server_close()
