"""The README and the docs site (issue 26 §4): a short README whose two set-up commands are the
ones CI runs, every `llmplan` command shown in them parses, the mkdocs site builds with
`--strict` and fails on a broken link, and the example budget the docs use ships in the wheel."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
VENV = "python3 -m venv .venv && . .venv/bin/activate && "


def code_blocks(text: str) -> list[str]:
    """Fenced blocks and 4-space indented blocks, as a reader sees code."""
    blocks, fence, cur = [], False, []
    for line in text.splitlines():
        if line.startswith("```"):
            if fence:
                blocks.append("\n".join(cur))
            fence, cur = not fence, []
        elif fence:
            cur.append(line)
    blocks += re.findall(r"(?:^|\n\n)((?:    .*\n?)+)", re.sub(r"```.*?```", "", text, flags=re.S))
    return blocks


def commands(text: str) -> list[list[str]]:
    """Each `llmplan ...` command line of the code blocks, continuation lines joined, comments
    dropped; lines with placeholders (`...`, `[--opt N]`, `URL`) are not commands to parse."""
    out = []
    for block in code_blocks(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            for part in line.split(" && "):
                part = part.strip()
                if not part.startswith("llmplan ") or re.search(r"\.\.\.|\[|\bURL\b", part):
                    continue
                out.append(shlex.split(part, comments=True)[1:])
    return out


def setup_commands() -> tuple[str, str]:
    section = README.split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    lines = [ln.strip() for ln in section.splitlines() if ln.startswith("    python3 -m venv")]
    assert len(lines) == 2, lines
    return lines[0], lines[1]


def test_readme_is_short_and_links_the_docs():
    assert len(README.splitlines()) < 250
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).is_file(), target


def test_readme_test_command_is_the_one_ci_runs():
    _, tests = setup_commands()
    assert tests.startswith(VENV)
    ci = next(ln for ln in CI.splitlines() if "python -m pytest" in ln and not ln.startswith("#"))
    assert tests.removeprefix(VENV) == ci.strip()


def test_readme_estimate_command_is_the_one_ci_runs_from_a_wheel():
    estimate, _ = setup_commands()
    assert estimate.startswith(VENV + "pip install . && llmplan estimate ")
    args = estimate.split("&& llmplan ", 1)[1]
    ci = next(ln for ln in CI.splitlines() if "llmplan estimate" in ln and "pip install" in ln)
    assert f"llmplan {args} --json" in ci


def test_readme_error_table_quotes_the_recorded_figures():
    """The README's held-out medians are the ones `validate --check` holds CI to."""
    import yaml

    rec = yaml.safe_load((ROOT / "planner/data/validation_recorded.yaml").read_text())
    rec = {k: v["median_abs_error"] for k, v in rec["held_out"].items()}
    names = {"served TPOT": "served TPOT", "served TTFT": "served TTFT",
             "served output throughput": "served throughput", "served E2E": "served E2E",
             "static decode": "decode",
             "static end-to-end": "end-to-end"}
    found = re.findall(r"^\| (served [^|]+?|static [^|]+?) \| ([\d.]+)% \| ([\d.]+)% \|",
                       README, re.M)
    rows = {label: (float(today), float(ceiling)) for label, today, ceiling in found}
    assert set(rows) == set(names), rows
    for label, key in names.items():
        today, ceiling = rows[label]
        assert ceiling == pytest.approx(100 * rec[key], abs=0.05), label
        assert today <= ceiling + 0.05, label  # a figure above its ceiling fails --check


def test_readme_test_count_is_stated():
    # "about N of M tests": the counts of `pytest --collect-only` with and without -m "not slow"
    assert re.search(r"about [\d,]+ of [\d,]+ tests", README)


@pytest.mark.parametrize("source", ["README.md", *[f"docs/{p.name}" for p in DOCS]])
def test_every_shown_command_parses(source, run_cli):
    """Each command and option named exists (typer refuses an unknown one before --help)."""
    cmds = commands((ROOT / source).read_text())
    if source == "README.md":
        assert {c[0] for c in cmds} >= {"estimate", "simulate", "plan", "check", "validate",
                                        "compare", "measure", "report"}
    for argv in cmds:
        code, _, err = run_cli(*argv, "--help")
        assert code == 0, (source, argv, err)


def test_the_command_parser_catches_a_misspelled_option(run_cli):
    # the check above can fail: a misspelled option is refused even with --help
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8b", "--prompt-token", "5", "--help")
    assert code == 2 and "--prompt-token" in err


def test_readme_estimate_excerpt_is_real_output(run_cli):
    """The estimate excerpt in the README is what the set-up command prints now."""
    estimate, _ = setup_commands()
    code, out, _ = run_cli(*shlex.split(estimate.split("&& llmplan ", 1)[1]))
    assert code == 0
    block = next(b for b in code_blocks(README) if b.startswith("Timing (vllm"))
    printed = [ln.rstrip() for ln in out.splitlines()]
    for line in block.splitlines():
        assert line in printed, line


def mkdocs_build(docs_root: Path, site: Path):
    # no -q: mkdocs 1.6 quiet counts no warnings, so --strict passes a broken link
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(docs_root / "mkdocs.yml"), "-d", str(site)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    r = mkdocs_build(ROOT, tmp_path / "site")
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("link", ["[x](no-such-page.md)", "[x](estimate.md#no-such-anchor)"])
def test_docs_build_fails_on_a_broken_link(tmp_path, link):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + f"\n{link}\n")
    r = mkdocs_build(tmp_path, tmp_path / "site")
    assert r.returncode != 0


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS:
        assert f": {page.name}" in nav, page.name


def test_example_budget_ships_in_the_wheel_and_resolves_there(tmp_path):
    """Lay out the package as the wheel does (pyproject's force-include: the databases and
    examples inside planner/_data) and run the docs' `check examples/budget.yaml` from a
    directory without examples/."""
    table = (ROOT / "pyproject.toml").read_text().split(
        "[tool.hatch.build.targets.wheel.force-include]", 1)[1].split("\n[", 1)[0]
    forced = dict(re.findall(r'^"([^"]+)" = "([^"]+)"', table, flags=re.M))
    assert forced.get("examples") == "planner/_data/examples"
    site = tmp_path / "site"
    shutil.copytree(ROOT / "planner", site / "planner",
                    ignore=shutil.ignore_patterns("__pycache__", "_data"))
    for src, dest in forced.items():
        shutil.copytree(ROOT / src, site / dest)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    r = subprocess.run([sys.executable, "-m", "planner", "check", "examples/budget.yaml",
                        "--json"], cwd=cwd, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["passed"] is True
    shipped = site / "planner" / "_data" / "examples" / "budget.yaml"
    assert f"using the example shipped with llmplan: {shipped}" in r.stderr


def test_a_missing_budget_is_still_refused_by_name(tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("check", "examples/no-such-budget.yaml")
    assert code == 2 and "examples/no-such-budget.yaml" in err


def test_check_help_names_the_shipped_example_whole():
    r = subprocess.run([sys.executable, "-m", "planner", "check", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0
    assert "examples/budget.yaml" in r.stdout and "ship with llmplan" in r.stdout
    assert max(len(ln) for ln in r.stdout.splitlines()) <= 80


@pytest.mark.parametrize("source", ["README.md", *[f"docs/{p.name}" for p in DOCS]])
def test_shown_output_fits_80_columns(source):
    """The outputs pasted in fenced blocks were run at COLUMNS=80: no line is wider."""
    text = (ROOT / source).read_text()
    fenced = [b for b in code_blocks(text) if b in re.findall(r"```[^\n]*\n(.*?)\n```", text,
                                                               flags=re.S)]
    for block in fenced:
        for line in block.splitlines():
            assert len(line) <= 80, (source, line)


README_RUNS = [c for c in commands(README)
               if c[0] not in ("ui", "measure")]  # a server that runs until stopped; the
# harness's CPU run (tests/test_harness.py runs it)


@pytest.mark.slow
@pytest.mark.parametrize("argv", README_RUNS, ids=[" ".join(c[:3]) for c in README_RUNS])
def test_every_readme_example_runs_within_80_columns(argv, tmp_path):
    """Issue 26's "done when": every README example run at COLUMNS=80 prints no line wider."""
    argv = [str(tmp_path / "report") if prev == "--out" else a
            for prev, a in zip(["", *argv[:-1]], argv, strict=True)]
    r = subprocess.run([sys.executable, "-m", "planner", *argv], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, (argv, r.stderr[-2000:])
    wide = [ln for ln in r.stdout.splitlines() if len(ln) > 80]
    assert not wide, (argv, wide[:3])
    if argv[0] != "report":  # its excerpt names the README's --out folder, not tmp_path
        printed = {ln.rstrip() for ln in r.stdout.splitlines()}
        stale = [ln for ln in readme_excerpt(argv) if ln != "..." and ln not in printed]
        assert not stale, (argv, stale[:3])


def readme_excerpt(argv: list[str]) -> list[str]:
    """The lines of the fenced block the README shows under the command ``argv`` (none where
    the command is not on a line of its own, or no block follows it)."""
    line = "    llmplan " + " ".join(argv) + "\n"
    if line not in README:  # the set-up estimate, inside its venv line (checked above)
        return []
    rest = README.split(line, 1)[1]
    head = rest.lstrip("\n")
    if not head.startswith("```"):
        return []
    return head.split("\n", 1)[1].split("\n```", 1)[0].splitlines()


def test_readme_excerpts_are_found_under_their_commands():
    """The check above compares each README example's excerpt with what the command prints
    today; it must find them (a README reshuffle that hid them would make it pass vacuously)."""
    shown = {c[0]: readme_excerpt(c) for c in README_RUNS}
    for name in ("simulate", "plan", "check", "validate", "compare"):
        assert len(shown[name]) >= 3, name


def test_every_and_list_in_ci_fails_the_run_when_a_step_fails():
    """`set -e` does not stop inside an && list before its last command: a failed install
    there once skipped the tests and passed. Each such line ends `|| exit 1`, or the next
    line checks its status."""
    lines = [ln for ln in CI.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for i, ln in enumerate(lines):
        if "&&" not in ln or ln.startswith((" ", "(", "if ")):
            continue  # the apt-get blocks run in a subshell with || echo: allowed to fail
        checked = ln.rstrip().endswith("|| exit 1") or (
            i + 1 < len(lines) and lines[i + 1].startswith('status=$?; [ "$status" -eq 0 ]'))
        assert checked, ln
