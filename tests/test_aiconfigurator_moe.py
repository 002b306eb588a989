"""benchmarks/aiconfigurator_moe.py: llmplan's MoE layer beside a measured table's, as ratios
(the wheel itself is not in CI: a table of the same columns stands in for it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import aiconfigurator_moe as aic  # noqa: E402


def _table(latency_of) -> pd.DataFrame:
    """Rows as aiconfigurator's moe_perf.parquet has them: Qwen3-30B-A3B's shape in bf16 at
    TP 1 and 2, one skewed-routing row and one expert-parallel row that must be left out."""
    rows = []
    for tp in (1, 2):
        for n in (1, 8192):
            rows.append(dict(kernel_source="k", moe_dtype="bfloat16", num_tokens=n,
                             hidden_size=2048, inter_size=768, topk=8, num_experts=128,
                             moe_tp_size=tp, moe_ep_size=1, distribution="balanced",
                             latency=latency_of(tp, n)))
    rows.append({**rows[0], "distribution": "power_law_1.2", "latency": 99.0})
    rows.append({**rows[0], "moe_ep_size": 2, "latency": 99.0})
    return pd.DataFrame(rows)


def test_the_ratio_is_theirs_over_one_layer_of_ours():
    from planner.cli.compare import served_setup
    from planner.core.specs import DType
    from planner.io import catalog

    spec = catalog.load_engine_spec("vllm")
    ours = {tp: {n: aic.ours_ms(served_setup("qwen3-30b-a3b", "h100-sxm", spec, tp,
                                              DType.bf16, None), n) for n in (1, 8192)}
            for tp in (1, 2)}
    # one token costs far less than 8,192, and a TP-2 GPU holds half of each expert
    assert 0 < ours[1][1] < ours[1][8192] and ours[2][8192] < ours[1][8192]
    got = list(aic.rows(_table(lambda tp, n: 2.0 * ours[tp][n]), "vllm", "h100-sxm"))
    assert [(r[0], r[1], r[3]) for r in got] == [
        ("qwen3-30b-a3b", 1, 1), ("qwen3-30b-a3b", 1, 8192), ("qwen3-30b-a3b", 2, 1),
        ("qwen3-30b-a3b", 2, 8192)]
    assert [r[6] for r in got] == pytest.approx([2.0] * 4)  # the skewed and EP rows left out


@pytest.mark.parametrize("script", ["aiconfigurator_moe.py", "aiconfigurator_mla.py",
                                    "aiconfigurator_gemm.py", "aiconfigurator_attention.py",
                                    "aiconfigurator_allreduce.py"])
def test_a_wheel_that_cannot_be_read_is_one_line_and_exit_2(tmp_path, script):
    """A path that is no zip file, or none at all (the all-reduce script printed a traceback
    for both until 2026-12-07)."""
    bad = tmp_path / "not-a-wheel.whl"
    bad.write_text("no zip here")
    for wheel in (bad, tmp_path / "missing.whl"):
        p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script),
                            str(wheel)], capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 2
        assert p.stderr.count("\n") == 1 and "cannot read" in p.stderr and not p.stdout


def test_ours_with_16_bit_experts_prices_only_the_mxfp4_models_so():
    """An engine that upcasts MXFP4 at load streams 16-bit experts: --ours-weights bf16 makes
    our gpt-oss layer dearer at a decode size and leaves a bf16 model's as it was."""
    from planner.io import catalog

    oss = catalog.load_model("gpt-oss-20b").moe
    qwen = catalog.load_model("qwen3-30b-a3b").moe
    rows = []
    for hidden, e, dtype in ((2880, oss, "w4a16_mxfp4"), (2048, qwen, "bfloat16")):
        rows.append(dict(kernel_source="k", moe_dtype=dtype, num_tokens=128, hidden_size=hidden,
                         inter_size=e.expert_intermediate_size, topk=e.experts_per_token,
                         num_experts=e.num_experts, moe_tp_size=1, moe_ep_size=1,
                         distribution="balanced", latency=1.0))
    table = pd.DataFrame(rows)
    as_is = {r[0]: r[5] for r in aic.rows(table, "sglang", "h100-sxm")}
    upcast = {r[0]: r[5] for r in aic.rows(table, "sglang", "h100-sxm", "bf16")}
    assert set(as_is) == {"gpt-oss-20b", "qwen3-30b-a3b"}
    # 2 bytes a weight against MXFP4's 4.25 bits: well over twice the streaming time
    assert upcast["gpt-oss-20b"] > 2.5 * as_is["gpt-oss-20b"]
    assert upcast["qwen3-30b-a3b"] == as_is["qwen3-30b-a3b"]


def _qwen3_30b_rows(dtypes=("bfloat16",)) -> list[dict]:
    """Table rows of Qwen3-30B-A3B's MoE shape at TP 1 and 2 and the derivation's token
    counts, in each ``moe_dtype`` of ``dtypes``, latency to be filled in."""
    from planner.io import catalog

    shape = catalog.load_model("qwen3-30b-a3b").moe
    return [dict(kernel_source="k", moe_dtype=dt, num_tokens=n, hidden_size=2048,
                 inter_size=shape.expert_intermediate_size, topk=shape.experts_per_token,
                 num_experts=shape.num_experts, moe_tp_size=tp, moe_ep_size=1,
                 distribution="balanced", latency=0.0)
            for dt in dtypes for tp in (1, 2) for n in aic.COMPUTE_TOKENS]


def test_the_fused_moe_factor_is_the_one_that_reproduces_the_table():
    """--derive-experts-compute: a table timed as our layer would be with the experts at half
    their compute rate on the A100 (Ampere) gives back 0.5 there; the factor is the
    architecture's, replacing the profile's own rather than compounding it."""
    from planner.core.engine import ArchFracs
    from planner.io import catalog

    spec = catalog.load_engine_spec("vllm")
    half = spec.model_copy(update={"experts_compute_frac": ArchFracs(
        source="test", value={"ampere": 0.5})})
    rows = _qwen3_30b_rows()
    table = pd.DataFrame(rows)
    ours_half = {(r[1], r[3]): r[5] for r in aic.rows(table, "vllm", "a100-sxm-80gb",
                                                       spec=half, tokens=aic.COMPUTE_TOKENS)}
    table["latency"] = [ours_half[(r["moe_tp_size"], r["num_tokens"])] for r in rows]
    f, n = aic.derive_experts_compute(table, "vllm", "a100-sxm-80gb")
    assert n == 6 and f == pytest.approx(0.5, abs=0.01)
    own = {(r[1], r[3]): r[5] for r in aic.rows(table, "vllm", "a100-sxm-80gb",
                                                 tokens=aic.COMPUTE_TOKENS)}
    assert all(ours_half[k] > own[k] for k in own)  # 0.5 is slower than the profile's 0.68


def test_the_derived_factor_is_the_kernels_not_divided_by_the_served_share():
    """The tables time the kernel alone: a table timed as our layer would be at a kernel
    factor of 0.5 with no served share gives back 0.5 for SGLang too, whose profile's
    served_compute_frac (0.674) multiplies every matmul in its served steps. Left in, it
    would give 0.5 / 0.674 = 0.74, the error SGLang's L40S and B200 figures carried."""
    from planner.core.engine import ArchFracs
    from planner.io import catalog

    spec = catalog.load_engine_spec("sglang")
    assert spec.served_compute_frac is not None and spec.served_compute_frac.value < 0.9
    kernel = spec.model_copy(update={"experts_compute_frac": ArchFracs(
        source="test", value={"ada": 0.5}), "served_compute_frac": None})
    rows = _qwen3_30b_rows()
    table = pd.DataFrame(rows)
    timed = {(r[1], r[3]): r[5] for r in aic.rows(table, "sglang", "l40s", spec=kernel,
                                                   tokens=aic.COMPUTE_TOKENS)}
    table["latency"] = [timed[(r["moe_tp_size"], r["num_tokens"])] for r in rows]
    f, _ = aic.derive_experts_compute(table, "sglang", "l40s")
    assert f == pytest.approx(0.5, abs=0.01)


def test_the_fp8_moe_factor_is_derived_from_the_block_scaled_lane():
    """--fp8 --derive-experts-compute: a table whose fp8_block rows are timed as our layer
    with fp8 experts at 0.4 of their compute rate on the H100 gives back 0.4 for
    experts_fp8_compute_frac; its 16-bit rows (timed at 9x ours) do not enter it, and the
    16-bit derivation does not read the fp8 rows."""
    from planner.core.engine import ArchFracs
    from planner.io import catalog

    spec = catalog.load_engine_spec("vllm")
    slow = spec.model_copy(update={"experts_fp8_compute_frac": ArchFracs(
        source="test", value={"hopper": 0.4})})
    rows = _qwen3_30b_rows(("fp8_block", "bfloat16"))
    table = pd.DataFrame(rows)
    timed = {(r[1], r[3]): r[5] for r in aic.rows(table, "vllm", "h100-sxm", spec=slow,
                                                   tokens=aic.COMPUTE_TOKENS,
                                                   lanes=aic.FP8_LANES["block"])}
    bf16 = {(r[1], r[3]): r[5] for r in aic.rows(table, "vllm", "h100-sxm",
                                                  tokens=aic.COMPUTE_TOKENS)}
    table["latency"] = [timed[(r["moe_tp_size"], r["num_tokens"])] if r["moe_dtype"] ==
                        "fp8_block" else 9 * bf16[(r["moe_tp_size"], r["num_tokens"])]
                        for r in rows]
    f, n = aic.derive_experts_compute(table, "vllm", "h100-sxm", weights="fp8")
    assert n == 6 and f == pytest.approx(0.4, abs=0.01)
    f16, _ = aic.derive_experts_compute(table, "vllm", "h100-sxm")
    assert f16 < 0.2  # the 16-bit rows alone: 9x ours
    # the per-tensor lane reads the table's fp8 rows, of which this one has none
    f, n = aic.derive_experts_compute(table, "vllm", "h100-sxm", weights="fp8",
                                      fp8_lane="tensor")
    assert n == 0 and f != f


def _wheel(tmp_path, system: str, engine: str, release: str) -> Path:
    """A wheel holding the stand-in table where aiconfigurator keeps that system's table."""
    import io
    import zipfile

    buf = io.BytesIO()
    _table(lambda tp, n: 1.0).to_parquet(buf)
    wheel = tmp_path / "aic.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"aiconfigurator_core/systems/data/{system}/moe/{engine}/{release}/"
                   "moe_perf.parquet", buf.getvalue())
    return wheel


@pytest.mark.parametrize("gpu,system,engine,release", [
    ("l40s", "l40s", "vllm", "0.24.0"), ("b200", "b200_sxm", "sglang", "0.5.14")])
def test_the_l40s_and_b200_tables_are_read_from_their_systems(tmp_path, gpu, system, engine,
                                                               release):
    """Ada's and Blackwell's factors (engines_db experts_compute_frac) come from these tables:
    --gpu l40s / b200 read the L40S's and the B200's own, not another GPU's."""
    run = [sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_moe.py"),
           str(_wheel(tmp_path, system, engine, release)), "--gpu", gpu, "--engine", engine]
    ok = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and f"# {gpu}, {engine} {release}" in ok.stdout, ok.stderr
    assert "qwen3-30b-a3b" in ok.stdout
    other = subprocess.run([*run[:3], "--gpu", "h100-sxm", "--engine", engine],
                           capture_output=True, text=True, cwd=ROOT)
    assert other.returncode == 2 and "cannot read" in other.stderr


def test_a_routing_the_table_lacks_is_one_line_and_exit_2(tmp_path):
    """--distribution names what the table holds; a typo is refused, not an empty table."""
    wheel = _wheel(tmp_path, "h100_sxm", "vllm", "0.24.0")
    run = [sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_moe.py"), str(wheel)]
    ok = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "qwen3-30b-a3b" in ok.stdout, ok.stderr
    p = subprocess.run([*run, "--distribution", "power_law_9"], capture_output=True, text=True,
                       cwd=ROOT)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and not p.stdout
    assert "holds no 'power_law_9'" in p.stderr and "balanced" in p.stderr


def _shapes_rows(moe_dtype: str = "bfloat16") -> list[dict]:
    """Table rows of three MoE shapes whose expert widths differ fourfold and more (Qwen3-30B-
    A3B's, a Qwen3-235B-A22B-like and a Mixtral-like), at TP 1 and 4 and the derivation's
    token counts, 16-bit, latency to be filled in; none of them need be a models_db model."""
    return [dict(kernel_source="k", moe_dtype=moe_dtype, num_tokens=n, hidden_size=h,
                 inter_size=inter, topk=k, num_experts=e, moe_tp_size=tp, moe_ep_size=1,
                 distribution="balanced", latency=0.0)
            for h, inter, e, k in ((2048, 768, 128, 8), (4096, 1536, 128, 8),
                                   (4096, 14336, 8, 2))
            for tp in (1, 4) for n in aic.COMPUTE_TOKENS]


def _timed_as_ours(spec, gpu="h100-sxm", lane=None) -> pd.DataFrame:
    rows = _shapes_rows(aic.TABLE_LANES[lane][1])
    table = pd.DataFrame(rows)
    timed = {(r[0], r[1], r[3]): r[5] for r in aic.table_rows(
        table, "vllm", gpu, spec=spec, tokens=aic.COMPUTE_TOKENS, lane=lane)}
    table["latency"] = [timed[(f"{r['hidden_size']}x{r['inter_size']}/{r['num_experts']}top"
                               f"{r['topk']}", r["moe_tp_size"], r["num_tokens"])]
                        for r in rows]
    return table


def test_the_depth_and_factor_are_the_ones_that_reproduce_the_table():
    """--derive-experts-k-half: a table of three shapes timed as our layer would be with a
    depth of 300 and a factor of 0.9 on the H100 gives back 300 (ratio 1 on every row there,
    the least spread of the grid) and 0.9; a depth of none leaves a spread the factor cannot
    remove, the narrow experts' rows slower than ours and the wide ones' faster."""
    from planner.core.engine import ArchDepths, ArchFracs
    from planner.io import catalog

    spec = catalog.load_engine_spec("vllm").model_copy(update={
        "experts_compute_frac": ArchFracs(source="test", value={"hopper": 0.9}),
        "experts_k_half": ArchDepths(source="test", value={"hopper": 300}),
        "served_compute_frac": None})
    table = _timed_as_ours(spec)
    grid, best = aic.derive_experts_k_half(table, "vllm", "h100-sxm",
                                           grid=(0, 100, 200, 300, 400, 500))
    assert [g[0] for g in grid] == [0, 100, 200, 300, 400, 500]
    assert best[0] == 300 and best[1] == pytest.approx(0.9, abs=0.01) and best[2] == 18
    assert best[3] < 0.01 and best[5] == 1.0
    none = grid[0]
    assert none[3] > 0.05 and none[3] > best[3]
    # with the depth the profile states instead (500 on Hopper) the factor comes out other
    f, n = aic.derive_experts_compute(table, "vllm", "h100-sxm", shapes="table")
    assert n == 18 and f > 0.95


def test_the_fp8_lane_derives_its_own_depth():
    """--fp8 --derive-experts-k-half: block-scaled rows timed as our layer with the fp8 lane's
    own depth of 700 and its factor 0.6 give back 700 and 0.6 (experts_fp8_k_half), whatever
    the 16-bit lane's depth (the profile's 500 stands beside it); a depth of none there is
    none for the fp8 lane, not the 16-bit lane's."""
    from planner.core.engine import ArchDepths, ArchFracs
    from planner.io import catalog

    spec = catalog.load_engine_spec("vllm").model_copy(update={
        "experts_fp8_compute_frac": ArchFracs(source="test", value={"hopper": 0.6}),
        "experts_fp8_k_half": ArchDepths(source="test", value={"hopper": 700}),
        "served_compute_frac": None})
    assert spec.experts_k_half.value["hopper"] == 500
    table = _timed_as_ours(spec, lane="block")
    grid, best = aic.derive_experts_k_half(table, "vllm", "h100-sxm", weights="fp8",
                                           grid=(0, 500, 700, 900))
    assert best[0] == 700 and best[1] == pytest.approx(0.6, abs=0.01) and best[3] < 0.01
    assert grid[1][3] > 0.01 and grid[0][3] > grid[1][3]  # 500 (the 16-bit lane's) and none


def test_a_depth_that_needs_a_kernel_above_the_achievable_rate_is_not_chosen():
    """The table timed at a depth of 300 with the factor 1.15 (the kernel at 1.035x the
    achievable rate as K grows, gemm_compute_frac 0.9): the grid finds the spread least
    there, but refuses it; a depth whose factor stays at or under 1 / 0.9 is chosen (none:
    0, whose factor is under 1), or none where no depth's does (the factor 1.5)."""
    from planner.core.engine import ArchDepths, ArchFracs
    from planner.io import catalog

    spec = catalog.load_engine_spec("vllm").model_copy(update={
        "experts_compute_frac": ArchFracs(source="test", value={"hopper": 1.15}),
        "experts_k_half": ArchDepths(source="test", value={"hopper": 300}),
        "served_compute_frac": None})
    grid, best = aic.derive_experts_k_half(_timed_as_ours(spec), "vllm", "h100-sxm",
                                           grid=(0, 300))
    assert grid[1][3] < grid[0][3] and grid[1][1] == pytest.approx(1.15, abs=0.01)
    assert best[0] == 0 and best[1] * 0.9 <= 1
    faster = spec.model_copy(update={"experts_compute_frac": ArchFracs(
        source="test", value={"hopper": 1.5})})
    grid, best = aic.derive_experts_k_half(_timed_as_ours(faster), "vllm", "h100-sxm",
                                           grid=(0, 300))
    assert best is None and all(g[1] * 0.9 > 1 for g in grid)


def test_the_depth_grid_is_printed_from_the_command_line(tmp_path):
    """--derive-experts-k-half on a wheel's table: a row per depth of the grid and the choice,
    over every shape the table times (--shapes table lists them); a lane the table does not
    time is one line and exit 2."""
    import io
    import zipfile

    wheel = _wheel(tmp_path, "h100_sxm", "vllm", "0.24.0")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_moe.py"),
                        str(wheel), "--derive-experts-k-half", "--fp8"], capture_output=True,
                       text=True, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and not p.stdout
    assert "times no fp8 row at 2048, 4096, 8192 tokens" in p.stderr
    rows = [dict(r, latency=1.0) for r in _shapes_rows()]
    buf = io.BytesIO()
    pd.DataFrame(rows).to_parquet(buf)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("aiconfigurator_core/systems/data/h100_sxm/moe/vllm/0.24.0/moe_perf.parquet",
                   buf.getvalue())
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_moe.py"),
                        str(wheel), "--derive-experts-k-half"], capture_output=True, text=True,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len([ln for ln in lines if ln.split() and ln.split()[0].isdigit()]) == len(
        aic.K_HALF_GRID)
    assert lines[-1].startswith("experts_k_half: ") or lines[-1].startswith("no depth")
    shown = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_moe.py"),
                            str(wheel), "--shapes", "table"], capture_output=True, text=True,
                           cwd=ROOT)
    assert shown.returncode == 0 and "4096x14336/8top2" in shown.stdout
    # --spread: the three models' shapes among them, each model's median ratio and the mean
    # |log ratio| over all 18 rows; a lane the table does not time is one line and exit 2
    base = [sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_moe.py"), str(wheel),
            "--spread"]
    sp = subprocess.run(base, capture_output=True, text=True, cwd=ROOT)
    assert sp.returncode == 0, sp.stderr
    names = [ln.split()[0] for ln in sp.stdout.splitlines() if "median ratio" in ln]
    assert sorted(names) == ["mixtral-8x7b", "qwen3-235b-a22b", "qwen3-30b-a3b"]
    assert sp.stdout.splitlines()[-1].startswith("mean |log ratio| ") and "over 18 rows" in \
        sp.stdout.splitlines()[-1]
    none = subprocess.run([*base, "--fp8"], capture_output=True, text=True, cwd=ROOT)
    assert none.returncode == 2 and none.stderr.count("\n") == 1 and not none.stdout


def test_the_mxfp4_fixed_cost_is_what_the_one_token_rows_take_beyond_ours():
    """--derive-mxfp4-fixed: gpt-oss rows timed as our layer with 30 us of fixed work a layer
    (and ours with the profile's own 20, which the derivation leaves out) give back 30, the
    median of theirs - ours at one token over both models and TPs; rows at other token counts,
    of other weight types or skewed routing do not enter; a table without MXFP4 rows gives
    none (NaN)."""
    from planner.cli.compare import served_setup
    from planner.core.engine import ArchMicros
    from planner.core.specs import DType
    from planner.io import catalog

    spec = catalog.load_engine_spec("vllm")
    assert spec.mxfp4_moe_fixed_us.value == {"hopper": 20}
    planted = spec.model_copy(update={"mxfp4_moe_fixed_us": ArchMicros(
        source="test", value={"hopper": 30})})
    rows = []
    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        m = catalog.load_model(name)
        for tp in (1, 2):
            dep = served_setup(name, "h100-sxm", planted, tp, DType.mxfp4, None,
                               quantized_layers="experts")
            for n in (1, 8):
                rows.append(dict(kernel_source="k", moe_dtype="w4a16_mxfp4", num_tokens=n,
                                 hidden_size=m.hidden_size,
                                 inter_size=m.moe.expert_intermediate_size,
                                 topk=m.moe.experts_per_token,
                                 num_experts=m.moe.num_experts, moe_tp_size=tp,
                                 moe_ep_size=1, distribution="balanced",
                                 latency=aic.ours_ms(dep, n) + (1.0 if n == 8 else 0.0)))
    rows.append({**rows[0], "distribution": "power_law_1.2", "latency": 9.0})
    rows.append({**rows[0], "moe_dtype": "bfloat16", "latency": 9.0})
    us, found = aic.derive_mxfp4_fixed(pd.DataFrame(rows), "vllm", "h100-sxm")
    assert len(found) == 4 and {r[3] for r in found} == {1}
    assert us == pytest.approx(30.0, abs=0.01)
    for *_, theirs, ours, _r in found:  # each row: 30 us beyond ours without the figure
        assert (theirs - ours) * 1e3 == pytest.approx(30.0, abs=0.01)
    none, found = aic.derive_mxfp4_fixed(_table(lambda tp, n: 1.0), "vllm", "h100-sxm")
    assert not found and none != none


@pytest.mark.parametrize("script", ["aiconfigurator_compare.py", "aiconfigurator_deepseek.py"])
@pytest.mark.parametrize("content", [None, b"\xff\xfe", b"a,b\n1,2\n"])
def test_a_recorded_csv_that_cannot_be_read_is_one_line_and_exit_2(tmp_path, script, content):
    """--from-csv on a missing file, one that is not UTF-8, or one without the columns the
    script writes: one line naming the file, exit 2 (a traceback before)."""
    path = tmp_path / "rows.csv"
    if content is not None:
        path.write_bytes(content)
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--from-csv",
                        "--csv", str(path)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and str(path) in p.stderr and not p.stdout


def test_the_recorded_deepseek_rows_read_back():
    """The committed CSV is one the script reads: its summary line per backend."""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_deepseek.py"),
                        "--from-csv"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "sglang: TPOT ours / theirs median" in p.stdout


def test_gpt_oss_is_compared_as_it_ships():
    """aiconfigurator_compare.py's gpt-oss cases: MXFP4 routed experts against their
    w4a16_mxfp4 MoE rows and bf16 GEMMs, ours on the checkpoint's own weights (quantized
    layers: the experts), not --weights mxfp4, which quantizes every layer and is 11% faster
    at batch 1 on an H100; and the recorded rows read back."""
    from benchmarks import aiconfigurator_compare as cmp

    cases = cmp.grid(["vllm"], ["h100-sxm"], ["gpt-oss-20b"], quick=False)
    assert len(cases) == 16 and {c.weights for c in cases} == {"mxfp4"}
    assert (cmp.AIC_QUANT["mxfp4"], cmp.AIC_MOE_QUANT["mxfp4"]) == ("bfloat16", "w4a16_mxfp4")
    case = cmp.Case("vllm", "gpt-oss-20b", "h100-sxm", 1, "mxfp4", 1, 1024, 256)
    mine = cmp.ours(case)
    every = cmp.ours(cmp.Case("vllm", "gpt-oss-20b", "h100-sxm", 1, "bf16", 1, 1024, 256))
    assert mine["our_error"] == "" and every["our_error"] == ""
    recorded = [r for r in cmp.read_csv(ROOT / "benchmarks" / "results"
                                        / "aiconfigurator_compare_gptoss.csv")
                if (r["backend"], r["model"], r["gpu"], r["tp"], r["batch"], r["isl"],
                    r["osl"]) == ("vllm", "gpt-oss-20b", "h100-sxm", 1, 1, 1024, 256)]
    assert len(recorded) == 1
    assert recorded[0]["our_tpot_s"] == pytest.approx(mine["our_tpot_s"], rel=1e-4)
    assert every["our_tpot_s"] > mine["our_tpot_s"]  # bf16 experts: four times the bytes


@pytest.mark.parametrize("body,code,err", [
    ("return 2", 2, ""), ("return 0", 0, ""), ("raise SystemExit(2)", 2, ""),
    ("raise SystemExit('no table')", 1, "no table\n"), ("raise SystemExit(None)", 0, ""),
    ("raise KeyboardInterrupt", 130, "-c: interrupted\n")])
def test_the_scripts_leave_with_their_code_and_without_the_teardown(body, code, err):
    """``leave`` ends a script with main's code and its output flushed, skipping the
    interpreter's teardown where Arrow's threads could abort it (-6): an atexit handler, part of
    that teardown, does not run."""
    script = ("import atexit, sys\n"
              "from benchmarks.aiconfigurator_moe import leave\n"
              "atexit.register(lambda: print('teardown ran'))\n"
              "def main():\n"
              "    print('table', end='')\n"
              f"    {body}\n"
              "leave(main)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert (p.returncode, p.stdout, p.stderr) == (code, "table", err)


def test_a_script_that_crashes_prints_its_traceback_and_leaves_with_1():
    """An exception main does not handle is printed as the interpreter prints it, and the
    script still leaves without the teardown (no atexit handler runs)."""
    script = ("import atexit\n"
              "from benchmarks.aiconfigurator_moe import leave\n"
              "atexit.register(lambda: print('teardown ran'))\n"
              "def main():\n"
              "    raise ValueError('boom')\n"
              "leave(main)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("Traceback") and p.stderr.endswith("ValueError: boom\n")

