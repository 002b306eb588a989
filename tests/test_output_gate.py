"""The output gate (planner/io/gate.py): every figure a command prints, as JSON or in a table,
is finite and physically possible, or the command refuses in one line with exit code 2.

Generated outputs with a NaN, an infinity, a negative time / size / rate / count or a
fraction above 1 hidden at any depth are refused, naming the JSON path; the same outputs
without the bad figure pass. Every command's real output over the built-in databases passes
(no false alarms), and a command whose figures go bad (monkeypatched) refuses on both its
--json and its table path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.io.gate import MAY_EXCEED_ONE, FigureError, gate, gate_columns, violation

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "tests" / "fixtures" / "servers"
MEASURE = ROOT / "tests" / "fixtures" / "measure"

# key names by the unit they carry; none of them may be negative
UNSIGNED = ["ttft_s", "tpot_s", "latency_s", "mean_ttft_ms", "p99_itl_ms", "weights_bytes",
            "kv_cache_bytes", "prefill_flops", "throughput_tokens_per_s", "bandwidth_bytes_per_s",
            "params", "batch", "replicas", "completed", "usd_per_hour", "ttft_s_high",
            "decode_flops_per_token", "simulated", "measured", "steady_state", "duration"]
FRACTIONS = ["kv_cache_used_frac_peak", "mbu", "mfu", "prefill_mfu", "prefix_cache_hit_rate",
             "api_server_stream_bound_frac", "bandwidth_frac", "frac", "ideal_mbu",
             "acceptance_rate"]
SIGNED = ["error", "ideal_error", "median_error", "steady_state_error", "margin_frac",
          "error_frac", "memory_headroom_frac"]
NEUTRAL = ["model", "gpu", "runs", "metrics", "ideal", "operators", "pipeline", "stages"]

finite_ok = st.floats(min_value=0, max_value=1e15, allow_nan=False)
unit_frac = st.floats(min_value=0, max_value=1, allow_nan=False)


@st.composite
def clean_output(draw, depth: int = 0):
    """A nested output whose every figure is possible."""
    out: dict = {}
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["unsigned", "frac", "signed", "text", "null", "nest",
                                     "list"] if depth < 3 else ["unsigned", "frac", "null"]))
        if kind == "unsigned":
            out[draw(st.sampled_from(UNSIGNED))] = draw(finite_ok | st.integers(0, 10**12))
        elif kind == "frac":
            out[draw(st.sampled_from(FRACTIONS))] = draw(unit_frac)
        elif kind == "signed":
            out[draw(st.sampled_from(SIGNED))] = draw(st.floats(-1e3, 1e3))
        elif kind == "text":
            out[draw(st.sampled_from(NEUTRAL))] = draw(st.text(max_size=5))
        elif kind == "null":
            out[draw(st.sampled_from(UNSIGNED + FRACTIONS))] = None
        elif kind == "nest":
            out[draw(st.sampled_from(NEUTRAL))] = draw(clean_output(depth + 1))
        else:
            out[draw(st.sampled_from(NEUTRAL))] = draw(
                st.lists(clean_output(depth + 1), min_size=1, max_size=3))
    return out


def _dicts(obj, path=()):
    """Every dict inside ``obj`` with its path."""
    if isinstance(obj, dict):
        yield obj, path
        for k, v in obj.items():
            yield from _dicts(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _dicts(v, (*path, i))


def _bad_value(draw, key: str):
    if key in FRACTIONS:
        return draw(st.sampled_from([math.nan, math.inf, -math.inf, -0.01, 1.0001, 2.0, 1e9]))
    if key in SIGNED:
        return draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    return draw(st.sampled_from([math.nan, math.inf, -math.inf, -1e-9, -1.0, -1e20, -1]))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_bad_figure_anywhere_is_refused_by_path(data):
    out = data.draw(clean_output())
    gate(out)  # without the bad figure: passes
    holders = list(_dicts(out))
    holder, path = holders[data.draw(st.integers(0, len(holders) - 1))]
    key = data.draw(st.sampled_from(UNSIGNED + FRACTIONS + SIGNED))
    # under an error (or a margin), everything may be signed: not a spot for a negative
    assume_signed = any(isinstance(p, str) and ("error" in p) for p in path)
    bad = _bad_value(data.draw, key)
    if assume_signed and math.isfinite(bad):
        bad = math.nan
    # a measured figure the gate lets exceed 1 under any of its ancestors (runs.mbu, and so
    # runs.model.mbu too: planner.io.gate._may_exceed_one): not a spot for one above 1
    allowed = ("*", key) in MAY_EXCEED_ONE or any(
        (p, key) in MAY_EXCEED_ONE for p in path if isinstance(p, str))
    if allowed and math.isfinite(bad) and bad > 1:
        bad = math.nan
    holder[key] = bad
    with pytest.raises(FigureError) as err:
        gate(out)
    msg = str(err.value)
    assert "\n" not in msg and "output refused" in msg
    assert repr(bad) in msg or (isinstance(bad, float) and math.isnan(bad) and "nan" in msg)
    # the path printed leads to a bad figure
    printed = msg.split("output refused: ", 1)[1].split(" = ", 1)[0]
    node = out
    for part in printed.replace("]", "").replace("[", ".").split("."):
        if part:
            node = node[int(part)] if isinstance(node, list) else node[part]
    assert violation([printed.rsplit(".", 1)[-1]], float(node)) is not None or \
        not math.isfinite(node)


@settings(max_examples=200, deadline=None)
@given(clean_output())
def test_possible_figures_pass(out):
    assert gate(out) is out


@pytest.mark.parametrize("key", FRACTIONS)
def test_fractions_are_bounded_by_one(key):
    gate({key: 1.0})
    with pytest.raises(FigureError, match=key):
        gate({"x": [{key: 1.5}]})


@pytest.mark.parametrize("parent,leaf", [k for k in MAY_EXCEED_ONE])
def test_the_listed_fractions_may_exceed_one(parent, leaf):
    obj = {leaf: 3.5} if parent == "*" else {parent: {leaf: 3.5}}
    gate(obj)
    with pytest.raises(FigureError):  # but not be NaN
        gate({leaf: math.nan} if parent == "*" else {parent: {leaf: math.nan}})


def test_abs_errors_are_not_signed():
    gate({"median_error": -0.5, "errors": [{"before": -0.9, "held_out": -2.0}]})
    for key in ("median_abs_error", "p90_abs_error", "ideal_median_abs_error"):
        with pytest.raises(FigureError, match=key):
            gate({"summary": [{key: -0.1}]})


def test_numpy_scalars_and_huge_ints():
    gate({"batch": np.int64(3), "ttft_s": np.float64(0.1), "params": 10**400})
    with pytest.raises(FigureError, match=r"tpot_s"):
        gate({"tpot_s": np.float64("nan")})
    with pytest.raises(FigureError, match=r"count"):
        gate({"count": -(10**400)})


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_columns_refuse_a_bad_row_by_number(data):
    n = data.draw(st.integers(1, 50))
    key = data.draw(st.sampled_from(UNSIGNED + FRACTIONS))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    col = rng.uniform(0, 1, n)
    gate_columns({key: col, "note": np.array(["x"] * n, dtype=object)}, first_row=100)
    col_nan = col.copy()
    col_nan[data.draw(st.integers(0, n - 1))] = np.nan  # a missing figure: allowed
    gate_columns({key: col_nan})
    row = data.draw(st.integers(0, n - 1))
    col[row] = _bad_value(data.draw, key)
    if np.isnan(col[row]):
        col[row] = -np.inf
    with pytest.raises(FigureError) as err:
        gate_columns({key: col}, "sweep", first_row=100)
    assert f"[{100 + row}].{key} of sweep" in str(err.value)


def test_mixed_columns_keep_missing_cells_missing():
    """A column of words and NaN (a plan's `bound`), or of numbers and None, is not a
    column of impossible figures: NaN and None are missing cells."""
    gate_columns({"bound": np.array(["memory", np.nan, None], dtype=object),
                  "cost_usd_per_million_output_tokens": np.array([1.0, None, np.nan],
                                                                 dtype=object),
                  "params": np.array([10**400, 3], dtype=object)})
    with pytest.raises(FigureError, match=r"\[1\]\.ttft_s"):
        gate_columns({"ttft_s": np.array([0.1, -(10**400), None], dtype=object)})


# -- real commands: no false alarms ----------------------------------------------------------

COMMANDS = [
    ["estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm"],
    ["estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "2", "--pp", "2"],
    ["estimate", "-m", "qwen3-30b-a3b", "-g", "h100-sxm", "--ep", "2"],
    ["estimate", "-m", "deepseek-v3", "-g", "h200", "--tp", "8", "--weights", "fp8"],
    ["estimate", "-m", "llama-3.1-405b", "-g", "l4", "--measured-tpot", "0.00001"],
    ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "60", "--request-rate", "4",
     "--ttft-slo", "0.5", "--tpot-slo", "0.05"],
    ["plan", "-m", "llama-3.1-8b", "--ttft", "2s", "--tpot", "50ms", "--rps", "10"],
    ["estimate", "-m", "deepseek-v3", "-g", "h200", "--tp", "8", "--ep", "8", "--weights", "fp8"],
    ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "60", "--request-rate", "5",
     "--prefill-instances", "2", "--decode-instances", "1"],  # disaggregated
    ["sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm,t4", "--batch", "1,64"],
    ["check", str(ROOT / "examples" / "budget-failing.yaml")],
    ["compare", str(SERVERS / "vllm_bench_serve.json"), "-m", "llama-3.1-8b", "-g", "h100-sxm"],
    ["compare", str(MEASURE / "cpu-results.jsonl"), "-m", "tiny-llama-test", "-g", "h100-sxm",
     "--engine", "ideal"],
    # one source: most targets have no figure (null, once NaN in the JSON)
    ["validate", "--source", "gpt-fast-blog", "--no-served"],
    ["models"], ["gpus"], ["engines"],
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c[:3]))
def test_real_outputs_pass_the_gate(run_cli, cmd):
    code, out, err = run_cli(*cmd, "--json")
    assert code in (0, 1), err  # 1: the failing budget
    gate(json.loads(out))
    code, out, err = run_cli(*cmd)  # the table path
    assert code in (0, 1) and "refused" not in err, err


def test_every_model_estimates_within_the_gate(run_cli):
    """Every built-in model on GPUs of each generation, at a long context and a large batch."""
    for m in sorted(p.stem for p in (ROOT / "models_db").glob("*.yaml")):
        for g in ("h100-sxm", "a10g", "mi300x"):
            code, out, err = run_cli("estimate", "-m", m, "-g", g, "--batch", "64", "--json")
            assert "refused" not in err, (m, g, err)
            if code == 0:
                gate(json.loads(out))


# -- a command whose figures go bad refuses on both paths ------------------------------------

@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.002])
@pytest.mark.parametrize("as_json", [True, False])
def test_estimate_refuses_an_impossible_figure(run_cli, monkeypatch, bad, as_json):
    from planner.layouts.deployment import DeploymentEstimate

    real = DeploymentEstimate.to_dict

    def broken(self):
        d = real(self)
        d["ideal"]["tpot_s"] = bad
        return d

    monkeypatch.setattr(DeploymentEstimate, "to_dict", broken)
    code, out, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                             *(["--json"] if as_json else []))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "ideal.tpot_s" in err and "Traceback" not in err


@pytest.mark.parametrize("as_json", [True, False])
def test_sweep_refuses_a_bad_row_before_printing_it(run_cli, monkeypatch, as_json, tmp_path):
    import planner.search.sweep as sw

    real = sw.iter_sweep

    def broken(*a, **k):
        for c in real(*a, **k):
            if "tpot_s" in c.arrays:
                c.arrays["tpot_s"] = c.arrays["tpot_s"].copy()
                c.arrays["tpot_s"][-1] = -1.0
            yield c

    monkeypatch.setattr(sw, "iter_sweep", broken)
    code, out, err = run_cli("sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--batch",
                             "1,2,4", *(["--json"] if as_json else []))
    assert code == 2 and out == "" and "[2].tpot_s of sweep = -1.0" in err
    code, _, err = run_cli("sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--batch", "1,2",
                           "--csv", str(tmp_path / "s.csv"))
    assert code == 2 and "tpot_s" in err


# -- output contracts of sweep and simulate ---------------------------------------------------

SWEEP_GRIDS = [
    ["-m", "llama-3.1-8b,gpt-oss-20b", "-g", "t4,h100-sxm", "-b", "1,8", "--weights",
     "int4,bf16"],  # unsupported groups (no bf16 on a T4) before and between supported ones
    ["-m", "qwen3-30b-a3b", "-g", "h100-sxm", "--ep", "1,4", "--tp", "1,2", "-b", "16"],
    ["-m", "llama-3.1-70b", "-g", "h100-sxm", "--pp", "1,2", "-b", "1,32", "-p", "1,4096"],
]


@pytest.mark.parametrize("grid", SWEEP_GRIDS, ids=lambda g: g[1])
def test_sweep_json_is_the_frame_streamed(run_cli, monkeypatch, grid):
    """Row for row and value for value what the whole-frame JSON was (a column only later
    groups have is absent from earlier rows instead of null): the chunks the command
    computed are kept and framed after it."""
    import planner.search.sweep as sw

    real, kept = sw.iter_sweep, []

    def keeping(*a, **k):
        for c in real(*a, **k):
            kept.append(c)
            yield c
    monkeypatch.setattr(sw, "iter_sweep", keeping)
    code, out, err = run_cli("sweep", *grid, "--json")
    assert code == 0, err
    rows = json.loads(out)
    df = sw.to_frame(kept)
    ref = df.astype(object).where(df.notna(), None).to_dict(orient="records")
    assert len(rows) == len(ref) > 0
    for want, got in zip(ref, rows, strict=True):
        assert {k: v for k, v in want.items() if k in got} == \
            {k: v for k, v in got.items() if k in want}
        assert all(want[k] is None for k in want if k not in got)


def test_sweep_json_writes_each_chunk_before_computing_the_next():
    import io

    from planner.io import catalog
    from planner.search.sweep import Grid, iter_sweep, write_json

    g = Grid(models=[catalog.load_model("llama-3.1-8b")],
             gpus=[catalog.load_hardware("h100-sxm")], batches=list(range(1, 31)),
             prompt_tokens=list(range(1, 101)), output_tokens=[16])
    buf = io.StringIO()
    seen = []

    def chunks():
        for c in iter_sweep(g, chunk_rows=500):
            seen.append(buf.tell())  # what was written before this chunk was handed over
            yield c
    assert write_json(chunks(), buf) == 3000
    assert len(seen) == 6 and seen[0] == 0
    assert all(b > a for a, b in zip(seen, seen[1:], strict=False))
    assert len(json.loads(buf.getvalue())) == 3000


def test_sweep_json_with_csv_writes_both(run_cli, tmp_path):
    import pandas as pd

    csv = tmp_path / "s.csv"
    code, out, err = run_cli("sweep", *SWEEP_GRIDS[0], "--json", "--csv", str(csv))
    assert code == 0, err
    rows, df = json.loads(out), pd.read_csv(csv)
    assert len(rows) == len(df) == 16 and "wrote 16 rows" in err
    assert [(r["model"], r["gpu"], r["weights"], r["batch"]) for r in rows] == \
        list(df[["model", "gpu", "weights", "batch"]].itertuples(index=False, name=None))
    ok = df["supported"].to_numpy()
    got = np.array([r["tpot_s"] if r["supported"] else np.nan for r in rows])
    assert np.allclose(got[ok], df["tpot_s"].to_numpy()[ok], rtol=1e-6)  # float32 in the CSV


def test_step_progress_reports_and_changes_nothing():
    """The simulator priced through StepProgress gives the same result, and the callback
    sees a fraction that rises, stays under 1, and counts the steps."""
    from planner.cli.options import build_deployment
    from planner.cli.progress import EVERY_STEPS, StepProgress
    from planner.io import catalog
    from planner.serving import run
    from planner.serving.metrics import summary
    from planner.serving.traffic import synthetic

    dep = build_deployment(catalog.load_model("llama-3.1-8b"), gpu="h100-sxm", engine="vllm")
    reqs = synthetic(1200, prompt_tokens=300, output_tokens=800, request_rate=math.inf, seed=1)
    seen = []
    wrapped = StepProgress(run.coster(dep), sum(r.output_tokens for r in reqs),
                           lambda f, s: seen.append((f, s)))
    with_bar = summary(run.run(dep, reqs, step_coster=wrapped))
    plain = summary(run.run(dep, reqs))
    assert json.dumps(with_bar, sort_keys=True) == json.dumps(plain, sort_keys=True)
    assert len(seen) == wrapped.steps // EVERY_STEPS >= 2
    fracs = [f for f, _ in seen]
    assert fracs == sorted(fracs) and 0 < fracs[-1] <= 0.99
    assert [s for _, s in seen] == [EVERY_STEPS * (i + 1) for i in range(len(seen))]


def test_simulate_shows_progress_on_a_terminal_only(on_a_terminal):
    sim = ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "60000"]
    code, out, err = on_a_terminal(sim)
    assert code == 0 and b"simulating 60,000 requests" in err and b"about" in err
    assert b"simulating" not in out and b"Serving" in out  # the table on stdout, clean
    code, out, err = on_a_terminal([*sim, "--json"])
    assert code == 0 and b"simulating" not in err and json.loads(out)["completed"] == 60000
    code, out, err = on_a_terminal([*sim[:-1], "50"])  # too short to show one
    assert code == 0 and b"simulating" not in err


def test_step_progress_counts_every_step_of_the_simulation():
    """Decode steps priced from their amounts and a multi-step block's later steps (vllm-v0,
    --num-scheduler-steps) count toward the bar as the others do: every step is counted."""
    from planner.cli.options import build_deployment
    from planner.cli.progress import StepProgress
    from planner.io import catalog
    from planner.serving import run
    from planner.serving.traffic import synthetic

    for engine, steps in (("vllm", 1), ("vllm-v0", 8)):
        dep = build_deployment(catalog.load_model("llama-3.1-8b"), gpu="h100-sxm",
                               engine=engine)
        reqs = synthetic(300, prompt_tokens=300, output_tokens=200, request_rate=20.0, seed=1)
        wrapped = StepProgress(run.coster(dep), sum(r.output_tokens for r in reqs),
                               lambda f, s: None)
        cfg = run.scheduler(dep, scheduler_steps=steps)
        res = run.run(dep, reqs, cfg, step_coster=wrapped)
        assert wrapped.steps == res.steps, engine
        assert wrapped.sequences >= sum(r.output_tokens for r in reqs) - len(reqs)
