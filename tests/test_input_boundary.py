"""The input boundary (planner/io/boundary.py): every structured file is a regular file within
its size, nested at most 64 deep, with no number of more than 30 digits; any other is one line
on stderr and exit code 2, never a crash, a traceback or a hang (issue 27)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from planner.core.errors import SpecError
from planner.io import boundary

ROOT = Path(__file__).resolve().parent.parent
BASE = ["-m", "llama-3.1-8b", "-g", "h100-sxm"]
SERVED = ROOT / "tests" / "fixtures" / "servers" / "vllm_bench_serve.json"

# option -> (argv before the file, argv after it); {} is where the file goes
FILE_OPTIONS = {
    "model": (["estimate", "-g", "h100-sxm", "-m"], []),
    "gpu": (["estimate", "-m", "llama-3.1-8b", "-g"], []),
    "engine": (["estimate", *BASE, "--engine"], []),
    "calibration": (["estimate", *BASE, "--calibration"], []),
    "budget": (["check"], []),
    "check --calibration": (["check", "examples/budget.yaml", "--calibration"], []),
    "validation dataset": (["validate", "--dataset"], []),
    "served manifest": (["validate", "--served-dataset"], []),
    "simulate --dataset": (["simulate", *BASE, "-n", "3", "--dataset"], []),
    "compare": (["compare"], BASE),
    "calibrate": (["calibrate"], [*BASE, "-o", "out.yaml", "--no-leave-one-out"]),
}
YAML_KINDS = ["model", "gpu", "engine", "calibration", "budget", "validation dataset",
              "served manifest"]
SUFFIX = {"simulate --dataset": ".jsonl", "compare": ".json", "calibrate": ".json"}


def _argv(kind: str, path: Path) -> list[str]:
    before, after = FILE_OPTIONS[kind]
    return [*before, str(path), *after]


def _one_line_error(code, err):
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.fixture
def in_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # examples/budget.yaml


# ------------------------------------------------------------------------- nesting depth

@pytest.mark.parametrize("kind", YAML_KINDS)
def test_50000_levels_is_one_line_in_a_fresh_process(tmp_path, kind):
    """The fuzz's segmentation fault: run as a subprocess, since a crash would take pytest
    with it."""
    p = tmp_path / "deep.yaml"
    p.write_text("- " * 25_000 + "[" * 25_000 + "]" * 25_000 + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "planner", *_argv(kind, p)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    _one_line_error(r.returncode, r.stderr)
    assert "deep.yaml" in r.stderr and "nest" in r.stderr, r.stderr


@pytest.mark.parametrize("text", [
    "deployments: " + "[" * 999 + "]" * 999 + "\n",  # flow: 1,000 levels, under libyaml's cap
    "deployments:\n" + "".join("  " * i + "- a:\n" for i in range(1000)),  # block
    "a: &a " + "[" * 40 + "]" * 40 + "\ndeployments: " + "[" * 40 + "*a" + "]" * 40 + "\n",
])
def test_a_deep_budget_names_the_limit(run_cli, tmp_path, text):
    p = tmp_path / "budget.yaml"
    p.write_text(text)
    code, _, err = run_cli("check", str(p))
    _one_line_error(code, err)
    assert f"{p}:" in err and "nested more than 64 levels" in err


def test_depth_limit_is_exact():
    ok = "a: " + "[" * 63 + "]" * 63 + "\n"  # the mapping and 63 lists: 64 levels
    boundary.check_yaml(ok, "f.yaml")
    with pytest.raises(SpecError, match="f.yaml:1: nested more than 64"):
        boundary.check_yaml("a: " + "[" * 64 + "]" * 64 + "\n", "f.yaml")
    boundary.check_json_depth("[" * 64 + "]" * 64, "f.json")
    boundary.check_json_depth('["' + "[" * 500 + '"]', "f.json")  # brackets in a string
    with pytest.raises(SpecError, match="f.json: nested more than 64"):
        boundary.check_json_depth("[" * 65 + "]" * 65, "f.json")
    with pytest.raises(SpecError, match="nested more than 64"):  # JSON Lines: per record
        boundary.check_json_depth('{"a": 1}\n' + '{"a": ' * 70 + "1" + "}" * 70, "f.jsonl")


@pytest.mark.parametrize("kind,text", [
    ("model", "[" * 5000 + "]" * 5000),
    ("simulate --dataset", '{"prompt_tokens": 5, "output_tokens": 5, "x": '
     + "[" * 500 + "]" * 500 + "}\n"),
    ("compare", "[" * 500 + "]" * 500),
    ("calibration", '{"a": ' + "[" * 100 + "]" * 100 + "}"),
])
def test_deep_json_names_the_limit(run_cli, tmp_path, in_root, kind, text):
    p = tmp_path / f"deep{SUFFIX.get(kind, '.json')}"
    p.write_text(text)
    code, _, err = run_cli(*_argv(kind, p))
    _one_line_error(code, err)
    assert "nested more than 64 levels" in err


# ------------------------------------------------------------------------------- numbers

def test_number_limits():
    boundary.check_yaml("a: " + "9" * 30 + "\n", "f.yaml")
    boundary.check_yaml("a: '" + "9" * 5000 + "'\n", "f.yaml")  # a string may be long
    with pytest.raises(SpecError, match=r"f.yaml:2: a.b.1: a number of 31 digits"):
        boundary.check_yaml("a:\n  b: [1, " + "9" * 31 + "]\n", "f.yaml")
    with pytest.raises(SpecError, match="beyond a float's range"):
        boundary.check_yaml("a: 1.0e+999\n", "f.yaml")
    assert boundary.loads_json('{"a": ' + "9" * 30 + "}", "f") == {"a": int("9" * 30)}
    with pytest.raises(SpecError, match="f:2: b: a number of 5,000 digits"):
        boundary.loads_json('{"a": 1,\n "b": -' + "9" * 5000 + "}", "f")
    with pytest.raises(SpecError, match="beyond a float's range"):
        boundary.loads_json('{"a": 1e999}', "f")


@pytest.mark.parametrize("kind,text,field", [
    ("budget", "deployments:\n- model: llama-3.1-8b\n  tp: " + "9" * 5000 + "\n",
     "deployments.0.tp"),
    ("gpu", (ROOT / "hardware_db" / "h100-sxm.yaml").read_text()
     .replace("tdp_w: 700", "tdp_w: " + "9" * 5000), "tdp_w"),
    ("calibration", "memory_bandwidth_gb_per_s: " + "9" * 5000 + "\n",
     "memory_bandwidth_gb_per_s"),
    ("validation dataset", "source:\n  id: " + "1" * 5000 + "\n", "source.id"),
    ("simulate --dataset", '{"prompt_tokens": ' + "9" * 5000 + ', "output_tokens": 5}\n', ":1:"),
    ("compare", '{"completed": ' + "9" * 5000 + "}", ""),
    ("model", '{"model_type": "llama", "vocab_size": ' + "9" * 5000 + "}", ""),
])
def test_a_5000_digit_number_is_one_line(run_cli, tmp_path, in_root, kind, text, field):
    p = tmp_path / f"big{SUFFIX.get(kind, '.yaml' if kind != 'model' else '.json')}"
    p.write_text(text)
    code, _, err = run_cli(*_argv(kind, p))
    _one_line_error(code, err)
    assert "a number of 5,000 digits (at most 30)" in err and field in err, err


# ------------------------------------------------------------------ not a regular file

class _Unblock:
    """Should a read open the pipe (the bug), a writer opens it after a few seconds and
    closes it, so the read ends and the test fails instead of hanging."""

    def __init__(self, fifo: Path):
        self.fifo, self.stop = fifo, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.wait(3.0):
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass  # no reader: nothing blocks

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
@pytest.mark.parametrize("kind", list(FILE_OPTIONS))
def test_a_named_pipe_is_refused_unopened(run_cli, tmp_path, in_root, kind):
    p = tmp_path / f"pipe{SUFFIX.get(kind, '.yaml')}"
    os.mkfifo(p)
    with _Unblock(p):
        code, _, err = run_cli(*_argv(kind, p))
    _one_line_error(code, err)
    assert f"{p}: is a named pipe, not a regular file" in err, err


@pytest.mark.parametrize("kind", [k for k in FILE_OPTIONS if k != "model"])  # -m: a snapshot
def test_a_directory_is_refused(run_cli, tmp_path, in_root, kind):
    p = tmp_path / f"folder{SUFFIX.get(kind, '.yaml')}"
    p.mkdir()
    code, _, err = run_cli(*_argv(kind, p))
    _one_line_error(code, err)
    assert f"{p}: is a directory, not a regular file" in err, err


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_device_is_refused(run_cli):
    code, _, err = run_cli("simulate", *BASE, "-n", "3", "--dataset", "/dev/zero")
    _one_line_error(code, err)
    assert "is a device, not a regular file" in err


def test_a_name_still_means_a_built_in_entry_beside_a_folder(run_cli, tmp_path, monkeypatch):
    (tmp_path / "h100-sxm").mkdir()
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("estimate", *BASE)
    assert code == 0, err


# --------------------------------------------------------------------------------- sizes

@pytest.mark.parametrize("kind,size", [("gpu", boundary.SPEC_BYTES + 1),
                                       ("budget", boundary.SPEC_BYTES + 1),
                                       ("validation dataset", boundary.DATASET_BYTES + 1),
                                       ("simulate --dataset", boundary.RESULT_BYTES + 1)])
def test_a_file_over_its_kinds_size_is_refused_unread(run_cli, tmp_path, in_root, kind, size):
    p = tmp_path / f"big{SUFFIX.get(kind, '.yaml')}"
    with p.open("wb") as f:
        f.truncate(size)  # sparse: nothing written
    code, _, err = run_cli(*_argv(kind, p))
    _one_line_error(code, err)
    assert f"larger than the {size // boundary.MiB} MiB" in err, err


def test_shipped_files_are_well_inside_the_limits():
    """The limits leave headroom over every file the project ships or tests with."""
    for pattern, limit in (("models_db/*.yaml", boundary.SPEC_BYTES),
                           ("hardware_db/*.yaml", boundary.SPEC_BYTES),
                           ("engines_db/*.yaml", boundary.SPEC_BYTES),
                           ("planner/data/**/*.yaml", boundary.DATASET_BYTES),
                           ("tests/fixtures/**/*.json*", boundary.RESULT_BYTES)):
        files = list(ROOT.glob(pattern))
        assert files, pattern
        assert max(f.stat().st_size for f in files) * 10 < limit, pattern


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
def test_measure_resume_and_report_refuse_a_named_pipe(tmp_path):
    from harness.measure import load_done
    from planner.io.report import load_measured

    p = tmp_path / "results.jsonl"
    os.mkfifo(p)
    with _Unblock(p):
        for read in (load_done, load_measured):
            with pytest.raises(SpecError, match="is a named pipe, not a regular file"):
                read(p)


def test_a_key_given_twice_is_refused_with_both_lines(run_cli, tmp_path):
    """A YAML loader keeps the last of two equal keys silently: a deleted line merges two
    entries (a price set's rtx-4090 took the T4's price and power, the T4 was gone). Every
    YAML input is refused, naming the key, its line and the first one's."""
    src = (ROOT / "planner" / "data" / "prices" / "owned.yaml").read_text()
    assert "\n  t4:\n" in src
    merged = tmp_path / "owned.yaml"
    merged.write_text(src.replace("\n  t4:\n", "\n", 1))
    code, _, err = run_cli("prices", str(merged))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "gpus.rtx-4090.purchase_usd: given twice (first on line" in err
    model = tmp_path / "m.yaml"
    model.write_text((ROOT / "models_db" / "llama-3.1-8b.yaml").read_text() + "num_layers: 64\n")
    code, _, err = run_cli("estimate", "-m", str(model), "-g", "h100-sxm")
    assert code == 2 and "num_layers: given twice" in err
    # the same key in two different mappings is no repeat
    boundary.check_yaml("a: {x: 1}\nb: {x: 2}\n", "f.yaml")
    with pytest.raises(SpecError, match=r"f.yaml:3: a.x: given twice \(first on line 2\)"):
        boundary.check_yaml("a:\n  x: 1\n  x: 2\n", "f.yaml")


def test_a_control_character_names_its_line(run_cli, tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text((ROOT / "models_db" / "llama-3.1-8b.yaml").read_text() + "x: a\x00b\n")
    n = p.read_text().count("\n")
    code, _, err = run_cli("estimate", "-m", str(p), "-g", "h100-sxm")
    assert code == 2 and f"m.yaml: line {n}: malformed YAML: unacceptable character" in err
    assert "::" not in err
