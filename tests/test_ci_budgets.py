"""Capacity budgets where users wire them (issue 26 §5): the composite GitHub Action
(action.yml), the pre-commit hook (.pre-commit-hooks.yaml), `llmplan-check` behind both, and
the container recipe (Containerfile)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from planner.cli.budgets import main as check_budgets

ROOT = Path(__file__).resolve().parent.parent
GOOD, FAILING = "examples/budget.yaml", "examples/budget-failing.yaml"


def test_llmplan_check_over_several_files(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert check_budgets([GOOD, "--junit-dir", str(tmp_path)]) == 0
    assert check_budgets([GOOD, FAILING, "--engine", "vllm", "--junit-dir", str(tmp_path)]) == 1
    suites = {p.stem: ET.parse(p).getroot() for p in tmp_path.glob("*.xml")}
    assert set(suites) == {"budget", "budget-failing"}
    assert int(suites["budget"].get("failures")) == 0 < int(suites["budget-failing"]
                                                            .get("failures"))
    bad = tmp_path / "bad-budget.yaml"
    bad.write_text("deployments: nope\n")
    assert check_budgets([GOOD, str(bad), FAILING]) == 2  # a bad file is the worst outcome
    out = capsys.readouterr().out
    assert f"== {GOOD}" in out and f"== {FAILING}" in out


def _check_step() -> dict:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    assert {"budgets", "engine", "prices", "at", "python-version", "junit-dir"} <= \
        set(action["inputs"])
    assert action["inputs"]["at"]["default"] == "predicted"
    return next(s for s in action["runs"]["steps"] if s.get("name") == "Check the budgets")


def test_the_actions_script_on_the_shipped_examples(tmp_path):
    """The Action's own check step, run as the runner runs it: its inputs substituted, bash,
    GITHUB_ACTIONS=true; `llmplan-check` is this checkout's (the step installs it)."""
    step = _check_step()
    script = step["run"].replace("${{ inputs.budgets }}", f"{GOOD} {FAILING}")
    assert "${{" not in script
    shim = tmp_path / "bin"
    shim.mkdir()
    exe = shim / "llmplan-check"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -m planner.cli.budgets \"$@\"\n")
    exe.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "GITHUB_ACTIONS": "true",
           "PYTHONPATH": str(ROOT), "LLMPLAN_ENGINE": "vllm", "LLMPLAN_PRICE_SET": "",
           "LLMPLAN_AT": "predicted",
           "LLMPLAN_JUNIT_DIR": str(tmp_path / "junit"), "COLUMNS": "100"}
    r = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stderr  # the failing example fails the job
    # the failing limits annotated on the pull request, at their line in the file
    notes = re.findall(r"::error file=examples/budget-failing\.yaml,line=\d+,title=llmplan "
                       r"budget::", r.stdout)
    assert notes and "::error file=examples/budget.yaml" not in r.stdout
    assert len(list((tmp_path / "junit").glob("*.xml"))) == 2
    env["LLMPLAN_PRICE_SET"] = "specialty-on-demand"
    ok = subprocess.run(["bash", "-c", step["run"].replace("${{ inputs.budgets }}", GOOD)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    # at its error bands' slow end the shipped example breaks a limit (docs/check.md)
    env["LLMPLAN_AT"] = "high"
    high = subprocess.run(["bash", "-c", step["run"].replace("${{ inputs.budgets }}", GOOD)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert high.returncode == 1 and "band's slow end" in high.stdout, high.stderr


def test_the_pre_commit_hook():
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "llmplan-check" and hook["language"] == "python"
    assert hook["pass_filenames"] is True
    # its entry is a console script of this package
    scripts = re.search(r"\[project\.scripts\](.*?)\n\[", (ROOT / "pyproject.toml").read_text(),
                        re.S).group(1)
    assert f'{hook["entry"]} = "planner.cli.budgets:main"' in scripts
    files = re.compile(hook["files"])
    for path in ("examples/budget.yaml", "budgets/serving.yml", "ci/prod-budget.yaml",
                 "budget.yaml"):
        assert files.search(path), path
    for path in ("models_db/llama-3.1-8b.yaml", "hardware_db/h100-sxm.yaml", "budget.txt"):
        assert not files.search(path), path


def test_the_container_recipe_copies_what_exists_and_no_torch():
    text = (ROOT / "Containerfile").read_text()
    copies = re.findall(r"^COPY (\S+)", text, re.M)
    assert copies and all((ROOT / c).exists() for c in copies)
    assert "torch" not in "".join(line for line in text.splitlines()
                                  if not line.startswith("#"))
    assert 'ENTRYPOINT ["llmplan"]' in text
    # what it installs: the package without the measure extra, so no torch is pulled in
    deps = re.search(r"dependencies = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(),
                     re.S).group(1)
    assert "torch" not in deps


@pytest.mark.parametrize("args", [[], ["--junit-dir"], [GOOD, "--no-such-option"]])
def test_llmplan_check_bad_usage_is_one_line(args, capsys):
    with pytest.raises(SystemExit) as e:
        check_budgets(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("llmplan-check: error: ")


def test_llmplan_check_help(capsys):
    with pytest.raises(SystemExit) as e:
        check_budgets(["--help"])
    assert e.value.code == 0 and "--junit-dir" in capsys.readouterr().out
