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
    """Run llmplan in a subprocess with stderr on a pseudo-terminal and stdout on a pipe:
    (exit code, stdout, what stderr showed), for what only a terminal is shown (progress)."""
    def run(args: list[str]) -> tuple[int, bytes, bytes]:
        """Run llmplan with stderr on a pseudo-terminal and stdout on a pipe."""
        import os
        import pty
        import select
        import subprocess
        import sys

        master, slave = pty.openpty()
        root = str(Path(__file__).resolve().parent.parent)
        p = subprocess.Popen([sys.executable, "-m", "planner", *args], stdout=subprocess.PIPE,
                             stderr=slave, env={**os.environ, "PYTHONPATH": root,
                                                "COLUMNS": "100"})
        os.close(slave)
        err = b""
        while True:
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
        out = p.stdout.read()
        p.wait()
        os.close(master)
        return p.returncode, out, err
    return run
