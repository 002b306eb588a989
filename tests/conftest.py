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
