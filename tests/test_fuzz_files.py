"""Corrupted versions of every database, budget, calibration and results file, run in-process.

The contract (DESIGN: bad input): exit 0, 1 or 2, never a traceback; on exit 2 one line on
stderr. Where a number the planner reads in a model or GPU file is made NaN, infinite,
negative or a bool, the command must refuse it (exit 2): a silent acceptance fails the test.
benchmarks/fuzz.py runs the same idea at scale, a forked process a case (10,000 cases); this suite
keeps a bounded sample in CI.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
BASE = ["-m", "llama-3.1-8b", "-g", "h100-sxm"]
NUMERIC_YAML = re.compile(r"^(\s*(?:- )?[A-Za-z_][\w.]*:\s+)(-?[0-9][0-9_.eE+-]*)(\s*(#.*)?)$")
BAD_VALUES = [".nan", ".inf", "-.inf", "-1", "true", "1e30", "100000000000000000000000",
              "'abc'", "[]", "{}", "null", "-0.5", "9" * 400]
REFUSED = {".nan", ".inf", "-.inf", "-1", "true", "'abc'", "[]", "{}", "-0.5", "9" * 400}
# Numeric keys of models_db / hardware_db files that are records, not inputs: a corrupt
# value there changes no estimate (the source's date, an official count kept for display).
INFORMATIONAL = {"date", "year", "official_params", "official_active_params"}

NUMERIC_JSON = re.compile(r'("[\w]+":\s*)(-?[0-9][0-9.eE+-]*)')
BAD_JSON = ["NaN", "Infinity", "-1", "true", "1e999", '"x"', "null", "[]", "9" * 400]
# A real CPU calibration and a real `llmplan measure` results file (tiny-llama-test, batch
# 1-2, context 32-64, measured on this project's 2-core CI machine on 2026-11-22).
FIXTURES = ROOT / "tests" / "fixtures" / "measure"


def _targets() -> list[tuple[str, str, list[str]]]:
    """(kind, original text, command with FILE as the placeholder)."""
    out = []
    for p in sorted((ROOT / "models_db").glob("*.yaml")):
        out.append(("model", p.read_text(), ["estimate", "-m", "FILE", "-g", "h100-sxm"]))
    for p in sorted((ROOT / "hardware_db").glob("*.yaml")):
        out.append(("gpu", p.read_text(), ["estimate", "-m", "llama-3.1-8b", "-g", "FILE"]))
    for p in sorted((ROOT / "engines_db").glob("*.yaml")):
        out.append(("engine", p.read_text(), ["estimate", *BASE, "--engine", "FILE"]))
    for p in sorted((ROOT / "examples").glob("budget*.yaml")):
        out.append(("budget", p.read_text(), ["check", "FILE"]))
    for p in sorted((ROOT / "planner" / "data" / "validation").glob("*.yaml"))[:3]:
        out.append(("validation", p.read_text(), ["validate", "--dataset", "FILE", "--no-rows"]))
    out.append(("calibration", (FIXTURES / "cpu-calibration.yaml").read_text(),
                ["estimate", *BASE, "--calibration", "FILE"]))
    out.append(("results", (FIXTURES / "cpu-results.jsonl").read_text(),
                ["report", "-m", "tiny-llama-test", "-g", "h100-sxm", "--measured", "FILE",
                 "--out", "OUTDIR"]))
    served = ROOT / "tests" / "fixtures" / "servers"
    for kind, name in (("served-vllm", "vllm_bench_serve.json"),
                       ("served-sglang", "sglang_bench_serving.jsonl"),
                       ("served-guidellm", "guidellm_report.json")):
        out.append((kind, (served / name).read_text(), ["compare", "FILE", "-m", "llama-3.1-8b",
                                                       "-g", "h100-sxm"]))
    return out


TARGETS = _targets()
SUFFIX = {"results": ".jsonl", "served-vllm": ".json", "served-sglang": ".jsonl",
          "served-guidellm": ".json"}


@st.composite
def corrupted(draw):
    kind, text, cmd = draw(st.sampled_from(TARGETS))
    lines = text.splitlines(keepends=True)
    how = draw(st.sampled_from(["value", "value", "value", "byte", "truncate", "drop-line"]))
    strict = False
    if how == "value" and (kind == "results" or kind.startswith("served")):
        spots = list(NUMERIC_JSON.finditer(text))
        m = draw(st.sampled_from(spots))
        bad = draw(st.sampled_from(BAD_JSON))
        return (kind, (text[:m.start(2)] + bad + text[m.end(2):]).encode(), cmd, False,
                f"{m.group(1).strip()} {bad}")
    if how == "value":
        spots = [i for i, ln in enumerate(lines) if NUMERIC_YAML.match(ln.rstrip("\n"))]
        if spots:
            i = draw(st.sampled_from(spots))
            m = NUMERIC_YAML.match(lines[i].rstrip("\n"))
            bad = draw(st.sampled_from(BAD_VALUES))
            lines[i] = f"{m.group(1)}{bad}{m.group(3)}\n"
            key = m.group(1).strip(" -:").split(".")[-1]
            strict = kind in ("model", "gpu") and bad in REFUSED and key not in INFORMATIONAL
            return kind, "".join(lines).encode(), cmd, strict, f"{key}: {bad}"
        how = "byte"
    data = text.encode()
    pos = draw(st.integers(0, len(data)))
    if how == "byte":
        b = draw(st.sampled_from([0xFF, 0xFE, 0xC3, 0x80, 0x00]))
        return kind, data[:pos] + bytes([b]) + data[pos:], cmd, False, f"byte {b:#x} at {pos}"
    if how == "truncate":
        return kind, data[:pos], cmd, False, f"truncated at {pos}"
    i = draw(st.integers(0, max(len(lines) - 1, 0)))
    return kind, "".join(lines[:i] + lines[i + 1:]).encode(), cmd, False, f"line {i + 1} gone"


# LLMPLAN_FUZZ_EXAMPLES=2000 LLMPLAN_FUZZ_RANDOM=1 explores further than CI's fixed sample.
@pytest.mark.slow
@settings(max_examples=int(os.environ.get("LLMPLAN_FUZZ_EXAMPLES", "150")), deadline=None,
          derandomize=not os.environ.get("LLMPLAN_FUZZ_RANDOM"),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(corrupted())
def test_a_corrupted_file_is_refused_in_one_line_or_used(run_cli, tmp_path_factory, case):
    kind, content, cmd, strict, what = case
    d = tmp_path_factory.mktemp("fuzz")
    f = d / f"input{SUFFIX.get(kind, '.yaml')}"
    f.write_bytes(content)
    args = [str(f) if a == "FILE" else str(d / "out") if a == "OUTDIR" else a for a in cmd]
    code, _, err = run_cli(*args)  # an exception here is a traceback: the test fails
    assert code in (0, 1, 2), (what, code, err)
    assert "Traceback" not in err, what
    if code == 2:
        assert len(err.strip().splitlines()) == 1, (what, err)
    if strict:
        assert code == 2, f"{kind} file with {what} was accepted"


@pytest.mark.parametrize("kind", sorted({t[0] for t in TARGETS}))
def test_every_fuzzed_file_kind_runs_clean_before_corruption(run_cli, tmp_path, kind):
    """The originals pass, so that a refusal above is the corruption's doing."""
    _, text, cmd = next(t for t in TARGETS if t[0] == kind)
    f = tmp_path / f"input{SUFFIX.get(kind, '.yaml')}"
    f.write_text(text)
    args = [str(f) if a == "FILE" else str(tmp_path / "out") if a == "OUTDIR" else a
            for a in cmd]
    code, _, err = run_cli(*args)
    assert code in (0, 1), err  # budget-failing.yaml exits 1 by design
