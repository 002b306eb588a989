"""The vectorized sweep agrees with the scalar estimator, keeps every row, and streams CSV."""

from __future__ import annotations

import csv
import json
import random

import numpy as np
import pandas as pd
import pytest

from planner.core.errors import UsageError
from planner.core.estimate import estimate
from planner.core.specs import DType, Options, Parallelism, Precision, Workload
from planner.io import catalog
from planner.search.sweep import Grid, iter_sweep, parse_int_list, sweep, write_csv

NUMERIC = ["params", "active_params", "weights_bytes", "kv_cache_bytes_per_token",
           "kv_cache_bytes", "activation_bytes", "total_memory_bytes", "memory_used_frac",
           "decode_flops_per_token", "prefill_flops", "ridge_flops_per_byte", "optimal_batch",
           "usable_optimal_batch", "max_batch", "ttft_s", "tpot_s", "latency_s",
           "throughput_tokens_per_s", "e2e_throughput_tokens_per_s", "mbu", "mfu",
           "prefill_mfu", "decode_comm_s", "cost_usd_per_million_output_tokens"]


@pytest.fixture(scope="module")
def grid():
    return Grid(
        models=[catalog.load_model(n) for n in ("llama-3.1-8b", "mixtral-8x7b", "deepseek-v3",
                                                "gpt2")],
        gpus=[catalog.load_hardware(n) for n in ("h100-sxm", "a100-sxm-80gb", "t4")],
        batches=[1, 3, 64, 300], prompt_tokens=[1, 700, 8192], output_tokens=[1, 128, 2000],
        weights=[DType.bf16, DType.fp8, DType.int4], kv_cache=[None, DType.fp8], tps=[1, 2, 8],
        options=Options(time_model="roofline"),
    )


@pytest.fixture(scope="module")
def frame(grid):
    return sweep(grid)


def test_every_configuration_is_a_row(grid, frame):
    assert len(frame) == grid.size == 4 * 3 * 4 * 3 * 3 * 3 * 2 * 3
    assert (~frame["fits"]).any() and frame["fits"].any()  # non-fitting rows are kept
    t4 = frame[(frame.gpu == "t4") & (frame.weights == "bf16") & (frame.tp == 1)]
    assert not t4["supported"].any() and t4["note"].str.contains("no bf16").all()


def test_random_rows_equal_scalar_estimate(frame):
    rows = frame[frame["supported"]].sample(60, random_state=7)
    for r in rows.to_dict(orient="records"):
        prec = Precision.of(r["weights"], r["kv_cache"])
        e = estimate(catalog.load_model(r["model"]), catalog.load_hardware(r["gpu"]),
                     precision=prec, parallelism=Parallelism(tp=r["tp"]),
                     workload=Workload(batch=r["batch"], prompt_tokens=r["prompt_tokens"],
                                       output_tokens=r["output_tokens"]))
        d = e.to_dict(operators=False)
        for k in NUMERIC:
            if d[k] is None:
                assert r[k] is None or r[k] != r[k], k
            else:
                assert r[k] == pytest.approx(d[k], rel=1e-12), (k, r)
        assert r["fits"] == d["fits"] and r["bound"] == d["bound"]
        assert r["compute"] == d["compute"]


def test_additive_time_model_rows_too():
    g = Grid(models=[catalog.load_model("llama-3.1-8b")],
             gpus=[catalog.load_hardware("l40s")], batches=[1, 77], prompt_tokens=[333],
             output_tokens=[44], options=Options(time_model="additive", attention="naive"))
    df = sweep(g)
    for r in df.to_dict(orient="records"):
        e = estimate(catalog.load_model("llama-3.1-8b"), catalog.load_hardware("l40s"),
                     workload=Workload(batch=r["batch"], prompt_tokens=333, output_tokens=44),
                     options=Options(time_model="additive", attention="naive"))
        assert r["tpot_s"] == pytest.approx(e.tpot_s, rel=1e-12)
        assert r["activation_bytes"] == pytest.approx(e.memory.activation_bytes, rel=1e-12)


def test_csv_round_trip(grid, frame, tmp_path):
    path = tmp_path / "s.csv"
    rows = write_csv(iter_sweep(grid, chunk_rows=50), path)
    back = pd.read_csv(path)
    assert rows == len(back) == len(frame)
    assert list(back.columns) == list(frame.columns)
    ok = frame["supported"].to_numpy()
    # byte counts exact, other figures to float32 precision
    assert np.array_equal(back["kv_cache_bytes"].to_numpy()[ok],
                          frame["kv_cache_bytes"].to_numpy()[ok])
    np.testing.assert_allclose(back["tpot_s"].to_numpy()[ok],
                               frame["tpot_s"].to_numpy(dtype=float)[ok], rtol=1e-6)
    assert (back["bound"][ok] == frame["bound"][ok]).all()


def test_parse_int_list():
    assert parse_int_list("1,2,4..256", "b") == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert parse_int_list("128..512+128", "p") == [128, 256, 384, 512]
    assert parse_int_list("3..20", "b") == [3, 6, 12]
    for bad in ("0", "-4", "8..2", "a", "1..8+0", ""):
        with pytest.raises(UsageError):
            parse_int_list(bad, "--batch")


def test_sweep_cli_json_and_csv(run_cli, tmp_path):
    code, out, err = run_cli("sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm,h200", "-b",
                             "1..64", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 14 and {r["gpu"] for r in rows} == {"h100-sxm", "h200"}
    csv = tmp_path / "x.csv"
    code, _, err = run_cli("sweep", "-m", "gpt2", "-g", "h100-sxm", "-b", "1..8", "-p", "512",
                           "--csv", str(csv))
    assert code == 0 and "wrote 4 rows" in err
    assert len(pd.read_csv(csv)) == 4


@pytest.mark.parametrize("args,needle", [
    (["-m", "gpt2", "-g", "h100-sxm", "-b", "0..4"], "--batch: '0..4'"),
    (["-m", "gpt2", "-g", "h100-sxm", "--weights", "fp4"], "--weights: 'fp4'"),
    (["-m", "gpt3", "-g", "h100-sxm"], "unknown model 'gpt3'"),
])
def test_sweep_bad_input(run_cli, args, needle):
    code, out, err = run_cli("sweep", *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_sweep_matches_estimate_at_random_points_hypothesis_free():
    # a second, seeded sample over a wider numeric grid in one group
    rng = random.Random(3)
    m, h = catalog.load_model("qwen2.5-72b"), catalog.load_hardware("mi300x")
    b = sorted(rng.sample(range(1, 2000), 20))
    p = sorted(rng.sample(range(1, 40000), 20))
    o = sorted(rng.sample(range(1, 9000), 10))
    df = sweep(Grid(models=[m], gpus=[h], batches=b, prompt_tokens=p, output_tokens=o,
                    tps=[4]), chunk_rows=777)
    assert len(df) == 4000
    for r in df.sample(25, random_state=1).to_dict(orient="records"):
        e = estimate(m, h, parallelism=Parallelism(tp=4),
                     workload=Workload(batch=r["batch"], prompt_tokens=r["prompt_tokens"],
                                       output_tokens=r["output_tokens"]))
        assert r["latency_s"] == pytest.approx(e.latency_s, rel=1e-12)
        assert r["max_batch"] == e.memory.max_batch


def test_csv_counts_are_exact_unquoted_integers(run_cli, tmp_path):
    import csv as csv_mod

    out = tmp_path / "s.csv"
    code, _, err = run_cli("sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "1,2",
                           "--csv", str(out))
    assert code == 0, err
    text = out.read_text()
    row = next(csv_mod.DictReader(text.splitlines()))
    for k in ("params", "weights_bytes", "decode_flops_per_token", "prefill_flops",
              "kv_cache_bytes_per_token", "flops_per_token_2n"):
        assert row[k].isdigit(), (k, row[k])
    assert row["params"] == "8030261248" and row["weights_bytes"] == "16060522496"
    assert float(row["weight_bytes_per_param"]) == 2.0  # a ratio stays a number
    line = text.splitlines()[1]
    assert '"8030261248"' not in line and ",8030261248," in line


def test_csv_writes_supported_as_a_boolean(run_cli, tmp_path):
    """Issue 26: the CSV wrote `supported` as the string "true" while `fits` was a boolean."""
    import pandas as pd

    path = tmp_path / "s.csv"
    code, _, err = run_cli("sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm,t4", "-b", "1,2",
                           "--weights", "bf16", "--csv", str(path))  # asked for: not on a T4
    assert code == 0, err
    assert '"true"' not in path.read_text()
    d = pd.read_csv(path)
    assert d["supported"].dtype == bool and d["fits"].dtype == bool
    assert d["supported"].tolist() == [True, True, False, False]


def test_sweep_says_when_it_sets_a_checkpoints_quantization_aside(run_cli):
    """sweep costs bf16 unless --weights is given, and says so where the model's checkpoint
    stores something else (gpt-oss-120b: MXFP4 experts), naming the flags for it as
    released; given --weights, nothing is said."""
    code, out, err = run_cli("sweep", "-m", "gpt-oss-120b", "-g", "h100-sxm", "-b", "1")
    assert code == 0, err
    flat = " ".join(err.split())
    assert "gpt-oss-120b's checkpoint stores MXFP4" in flat
    assert "--weights mxfp4 --quantized-layers experts" in flat
    code, out, err = run_cli("sweep", "-m", "gpt-oss-120b", "-g", "h100-sxm", "-b", "1",
                             "--weights", "mxfp4", "--quantized-layers", "experts")
    assert code == 0, err
    assert "checkpoint stores" not in err
    code, out, err = run_cli("sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "1")
    assert code == 0 and "checkpoint stores" not in err


def test_the_price_help_and_errors_name_commands_that_exist(run_cli):
    code, out, err = run_cli("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm,h200,a100-sxm-80gb,"
                             "l40s,l4,a10g,b200", "--ttft", "1s", "--tpot", "50ms", "--rps",
                             "1", "--price", "foo=1")
    assert code == 2
    assert "llmplan gpus" in err and "llmplan list" not in err
    code, out, err = run_cli("estimate", "--help")
    assert "llmplan list" not in " ".join(out.split())
    assert "llmplan prices" in " ".join(out.split())


def test_a_model_or_gpu_named_twice_is_swept_once(run_cli, tmp_path):
    """As the numeric axes are: `-m a,b,a -g x,y,x` gives the rows of `-m a,b -g x,y`, byte
    for byte, in the order first given."""
    twice, once = tmp_path / "twice.csv", tmp_path / "once.csv"
    for path, m, g in ((twice, "llama-3.1-8b,mixtral-8x7b,llama-3.1-8b",
                        "h100-sxm,a100-sxm-80gb,h100-sxm"),
                       (once, "llama-3.1-8b,mixtral-8x7b", "h100-sxm,a100-sxm-80gb")):
        code, _, err = run_cli("sweep", "-m", m, "-g", g, "-b", "1,8", "--csv", str(path))
        assert code == 0, err
    assert twice.read_bytes() == once.read_bytes()
    assert len(pd.read_csv(once)) == 2 * 2 * 2


def test_a_sweep_to_csv_never_imports_pandas(tmp_path):
    """pyarrow.array's first call imports pandas where installed (about 0.25 s of a sweep's
    start); the CSV writer builds its arrays from buffers and needs none of it."""
    import subprocess
    import sys

    out = tmp_path / "s.csv"
    code = ("import sys; from planner.cli.app import main; rc = main(['sweep', '-m', "
            "'llama-3.1-8b', '-g', 'h100-sxm', '-b', '1..8+1', '-p', '128,512', '-o', '64', "
            f"'--csv', {str(out)!r}]); sys.stderr.write(repr('pandas' in sys.modules)); "
            "sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().endswith("False")
    assert len(out.read_text().splitlines()) == 1 + 8 * 2


@pytest.mark.parametrize("values", [
    np.array([1.5, -2.25, 3e30], np.float32), np.array([0, 7, -9], np.int64),
    np.array([1, 0, 1, 1, 0, 0, 0, 1, 1], np.int8), np.array([True, False, True] * 5),
    np.arange(10, dtype=np.int64)[::3], ["memory", "compute"], ["", "a,b", "ünï"], [True],
    [3], [2.5],
])
def test_buffer_built_arrays_are_pyarrows_own(values):
    """Each array the CSV writer builds from buffers equals pyarrow.array's of the same values
    (strings, booleans packed a bit each, strided numpy views)."""
    import pyarrow as pa

    from planner.search.sweep import _arrow_array

    got = _arrow_array(values)
    got.validate(full=True)
    assert got.equals(pa.array(values))


def test_counts_past_int64_are_written_exactly(run_cli, run_json, tmp_path):
    """DeepSeek-V3's prefill of 100,000 tokens for 300 sequences counts 9.6e18 FLOPs, past
    int64's 9.22e18: the CSV had written it as -9223372036854775808 (the cast wrapping); it
    writes the count's exact digits, as JSON's number has them, and the rows beside it stay
    exact integers (found by the review of 2026-12-08)."""
    out = tmp_path / "big.csv"
    args = ["sweep", "-m", "deepseek-v3", "-g", "h200", "-b", "1,300", "-p", "100000",
            "-o", "1"]
    code, _, err = run_cli(*args, "--csv", str(out))
    assert code == 0 and "RuntimeWarning" not in err
    rows = list(csv.DictReader(out.open()))
    by_json = {r["batch"]: r["prefill_flops"] for r in run_json(*args)}
    assert by_json[300] > 2.0 ** 63
    for r in rows:
        assert r["prefill_flops"].isdigit()  # digits alone: no sign, exponent or point
        assert int(r["prefill_flops"]) == int(by_json[int(r["batch"])])


def test_decimal_counts_keep_their_digits_and_leave_a_missing_figure_empty():
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from planner.search.sweep import _decimal_ints

    a = np.array([73_277_734_912.0, 9.637975391224627e18, np.nan, 1e30, -5.0, np.inf])
    got = _decimal_ints(a)
    got.validate(full=True)
    buf = pa.BufferOutputStream()
    pacsv.write_csv(pa.table([got], names=["n"]), buf,
                    write_options=pacsv.WriteOptions(include_header=False))
    assert buf.getvalue().to_pybytes().decode().split("\n")[:6] == [
        "73277734912", "9637975391224627200", "", str(int(1e30)), "-5", ""]
