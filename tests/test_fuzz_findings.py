"""Classes of failure the 10,000-case fuzz of issue 27 found (benchmarks/fuzz.py --seed 2027),
each generated here over its class rather than the one case found:

- a rate so small that the stream's arrival times overflow (``--request-rate 1e-320``: the
  next request at t = inf, an internal error; 1e-300: a run of 1e301 s);
- ``llmplan-check``'s own errors (a ``--junit-dir`` that cannot be made: a traceback) and an
  option every file refuses alike (the same error once per file: several lines).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
BASE = ["-m", "llama-3.1-8b", "-g", "h100-sxm"]
tiny = st.floats(min_value=5e-324, max_value=9.9e-7, allow_subnormal=True)


def _one_line(code: int, err: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rate=tiny, flag=st.sampled_from(["--request-rate", "--burstiness"]))
def test_a_rate_below_its_bound_is_one_line(run_cli, rate, flag):
    code, _, err = run_cli("simulate", *BASE, "-n", "5", flag, repr(rate))
    _one_line(code, err)
    assert "below the limit" in err


@pytest.mark.parametrize("rate", ["1e-320", "5e-324", "1e-300", "1e-7"])
def test_plan_refuses_a_vanishing_rate(run_cli, rate):
    code, _, err = run_cli("plan", *BASE, "--ttft", "2s", "--tpot", "50ms", "--scheduler",
                           "static", "--rps", rate)
    _one_line(code, err)


def test_the_smallest_rate_allowed_still_simulates(run_json):
    d = run_json("simulate", *BASE, "-n", "3", "--request-rate", "1e-6", "--burstiness",
                 "1e-6")
    assert d["completed"] == 3 and math.isfinite(d["duration"])


def test_arrival_times_out_of_range_are_refused_by_the_simulator():
    from planner.core.errors import UsageError
    from planner.core.estimate import prepare
    from planner.core.specs import Options, Precision
    from planner.io import catalog
    from planner.serving.cost import StepCoster
    from planner.serving.sim import SchedulerConfig, simulate
    from planner.serving.traffic import Request

    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("vllm")
    c = StepCoster(m, hw, prepare(hw, Precision(), None, Options(), eng), Options())
    for t in (math.inf, math.nan):
        with pytest.raises(UsageError, match="arrival times are out of range"):
            simulate([Request(0, 0.0, 100, 10), Request(1, t, 100, 10)], c,
                     SchedulerConfig())


def _check(*args: str, cwd: Path) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "planner.cli.budgets", *args],
                       capture_output=True, text=True, cwd=cwd, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return p.returncode, p.stdout, p.stderr


BUDGETS = [str(ROOT / "examples" / n) for n in ("budget.yaml", "budget-failing.yaml",
                                                "budget.yaml")]


@pytest.mark.slow
@pytest.mark.parametrize("option", [["--price", "h100-sxm=nan"], ["--price", "1e999"],
                                    ["--expert-imbalance", "nan"]])
def test_an_option_every_file_refuses_is_said_once(tmp_path, option):
    code, out, err = _check(*BUDGETS, *option, cwd=tmp_path)
    _one_line(code, err)
    assert out.count("== ") == 1  # it stopped at the first file


@pytest.mark.slow
@pytest.mark.parametrize("option", [["--prices", "nosuch"], ["--engine", "nosuch"]])
def test_an_unknown_price_set_or_engine_is_the_options_fault_said_once(tmp_path, option):
    """check loads --prices and --engine before any deployment: an unknown one is the
    option's fault, said once (it had been told per file, at a deployment's line, as if the
    file named it)."""
    code, out, err = _check(*BUDGETS, *option, cwd=tmp_path)
    _one_line(code, err)
    assert err.startswith(f"llmplan: error: {option[0]}: unknown"), err
    assert out.count("== ") == 1  # it stopped at the first file


@pytest.mark.slow
def test_a_junit_dir_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    for bad in ("9" * 400, "file", "file/sub"):
        code, _, err = _check(BUDGETS[0], "--junit-dir", bad, cwd=tmp_path)
        _one_line(code, err)
        assert err.startswith("llmplan-check: error: ")


@pytest.mark.slow
def test_a_bad_file_among_good_ones_is_still_checked_per_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments: [\n")
    code, out, err = _check(str(bad), BUDGETS[0], cwd=tmp_path)
    assert code == 2 and out.count("\n== ") == 1  # a file's own error stops nothing
    assert "bad.yaml" in err


# --- watch: a metrics page whose numbers are beyond a float (the parser keeps 400 digits as
# an int: float() of it overflowed, an internal error), or whose bucket bound is no number

PAGE_NAMES = ["vllm:num_requests_running", "vllm:kv_cache_usage_perc",
              "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
              "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count"]
huge = st.integers(1, 400).map(lambda n: ("-" if n % 2 else "") + "9" * (310 + n))
le_label = st.sampled_from(["0.1", "+Inf", "abc", "", "9" * 400, "-" + "9" * 400, "NaN"])


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.tuples(st.sampled_from(PAGE_NAMES), huge | st.just("1"), le_label),
                      min_size=1, max_size=6))
def test_a_page_of_numbers_beyond_a_float_is_flagged_or_refused_in_one_line(lines):
    from planner.core.errors import LlmplanError
    from planner.io.watch import implausible, parse, window

    text = "".join(f'{n}{{le="{le}",model_name="m"}} {v}\n' if n.endswith("_bucket") else
                   f'{n}{{model_name="m"}} {v}\n' for n, v, le in lines)
    try:
        a, b = parse(text, t_s=0.0), parse(text, t_s=1.0)
    except LlmplanError as err:
        assert len(str(err).splitlines()) == 1
        return
    implausible(a)
    w = window(a, b)
    for k, v in vars(w).items():  # every figure it passes on is finite, or withheld
        if isinstance(v, float) and k not in ("implausible",):
            assert math.isfinite(v) or v is None, (k, v)


@pytest.mark.parametrize("command", [
    ["estimate", "-m", "qwen3-30b-a3b", "-g", "h100-sxm", "--tp", "2", "--ep", "4"],
    ["simulate", "-m", "qwen3-30b-a3b", "-g", "h100-sxm", "-n", "5", "--tp", "2", "--ep", "4"],
    ["check", str(ROOT / "examples" / "budget.yaml")]])
@pytest.mark.parametrize("value", ["1025", "1e30", "1e308"])
def test_an_expert_imbalance_no_layout_can_have_is_refused(run_cli, command, value):
    """max / mean load over N GPUs is at most N (fuzz: 1e30 was accepted and capped)."""
    code, _, err = run_cli(*command, "--expert-imbalance", value)
    _one_line(code, err)
    assert "above the limit of 1024" in err


@settings(max_examples=60, deadline=None)
@example(doc={"_": 0, 'q"}{[,:': {"_": 0}})  # an escaped key: the path holds it unescaped
@given(doc=st.recursive(
    st.integers(0, 99),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.from_regex(r"[a-z_]{1,6}", fullmatch=True) | st.just('q"}{[,:'), inner,
        max_size=3),
    max_leaves=12))
def test_a_mutated_numbers_section_is_its_enclosing_keys(doc):
    """A config's number mutated in a section nothing reads (Gemma-3's vision_config repeats
    hidden_size, num_hidden_layers, ...) was flagged as a suspect acceptance: the fuzzer knew
    the key's name, not where it sat. json_parent names the enclosing objects' keys, as a
    walk of the parsed document does."""
    import json

    sys.path.insert(0, str(ROOT))
    from benchmarks.fuzz import NUMERIC_JSON, json_parent

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, int):
                    yield ".".join(path), k
                yield from walk(v, [*path, k])
        elif isinstance(node, list):
            for v in node:
                yield from walk(v, path)

    text = json.dumps({"top": doc, "n": 1})
    expected = [(p, k) for p, k in walk({"top": doc, "n": 1}, [])
                if NUMERIC_JSON.fullmatch(f'"{k}": 0')]
    got = [(json_parent(text, m.start()), json.loads(m.group(1).rstrip().rstrip(":")))
           for m in NUMERIC_JSON.finditer(text)]
    assert got == expected


def test_only_the_sections_the_planner_reads_make_a_suspect(tmp_path):
    sys.path.insert(0, str(ROOT))
    from benchmarks.fuzz import HF_SECTIONS_READ, json_parent

    text = (ROOT / "tests/fixtures/hf/gemma-3-27b.json").read_text()
    at = {json_parent(text, text.index(f'"{k}"', text.index(f'"{s}"'))): s
          for s, k in (("text_config", "hidden_size"), ("vision_config", "hidden_size"))}
    assert set(at) == {"text_config", "vision_config"}
    assert "text_config" in HF_SECTIONS_READ and "vision_config" not in HF_SECTIONS_READ
