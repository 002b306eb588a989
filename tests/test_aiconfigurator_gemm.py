"""benchmarks/aiconfigurator_gemm.py: the share of the copy ceiling a measured decode GEMM
reaches, and the factor by architecture against the H100's (the wheel itself is not in CI:
tables of the same columns stand in for it)."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import aiconfigurator_gemm as gemm  # noqa: E402
from benchmarks import aiconfigurator_moe as moe  # noqa: E402

MIB = 2**20


def _table(gb_per_s: float) -> pd.DataFrame:
    """Rows as aiconfigurator's gemm_perf.parquet has them, every one timed at ``gb_per_s``
    (latency in ms): two decode shapes of 256 MiB and more, and rows that must be left out:
    a prefill (M 4096), a 64 MiB matrix (an L2 could hold part of it), an fp8 GEMM."""
    rows = []
    for m, n, k, dtype in ((1, 16384, 8192, "bfloat16"), (16, 32768, 8192, "bfloat16"),
                           (4096, 16384, 8192, "bfloat16"), (1, 4096, 8192, "bfloat16"),
                           (1, 16384, 8192, "fp8")):
        moved = 2.0 * (m * k + n * k + m * n)
        rows.append(dict(framework="VLLM", version="0.24.0", device="d", op_name="gemm",
                         kernel_source="k", gemm_dtype=dtype, m=m, n=n, k=k,
                         latency=moved / (gb_per_s * 1e9) * 1e3))
    return pd.DataFrame(rows)


def test_the_share_is_the_bytes_over_the_latency_against_the_ceiling():
    t = _table(1500.0)
    t.loc[2:, "latency"] = 1e-9  # the rows left out would be impossibly fast
    got = gemm.decode_shares(t, ceiling_gb_per_s=2000.0)
    assert set(got) == {(1, 16384, 8192), (16, 32768, 8192)}  # 256 MiB and 512 MiB of bf16
    assert list(got.values()) == pytest.approx([0.75, 0.75])
    # the size floor: a 64 MiB matrix counts once it is lowered to that
    assert (1, 4096, 8192) in gemm.decode_shares(t, 2000.0, min_weight_bytes=64 * MIB)


def test_the_factor_is_the_share_against_the_references_shape_by_shape():
    h100 = gemm.decode_shares(_table(2900.0), 2900.0)  # the whole ceiling
    a100 = gemm.decode_shares(_table(1400.0), 1750.0)  # 0.8 of it
    f, lo, hi, n = gemm.arch_factor(a100, h100)
    assert (f, lo, hi, n) == (pytest.approx(0.8), pytest.approx(0.8), pytest.approx(0.8), 2)
    with pytest.raises(ValueError, match="no decode GEMM shape"):
        gemm.arch_factor({(1, 1, 1): 0.5}, h100)


def _wheel(tmp_path: Path, engine: str, gb_per_s_of) -> Path:
    """A wheel holding a stand-in table where aiconfigurator keeps each system's."""
    wheel = tmp_path / "aic.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for gpu, system in moe.SYSTEMS.items():
            buf = io.BytesIO()
            _table(gb_per_s_of(gpu)).to_parquet(buf)
            release = moe.RELEASES[engine][system]
            z.writestr(f"aiconfigurator_core/systems/data/{system}/gemm/{engine}/{release}/"
                       "gemm_perf.parquet", buf.getvalue())
    return wheel


def test_the_script_prints_each_gpus_factor_from_its_own_table(tmp_path):
    """Each GPU timed at 0.9 of its hardware_db ceiling, the H100 at all of it: 0.9 for
    every other GPU; and a wheel that lacks a table is one line and exit 2."""
    from planner.io import catalog

    def rate(gpu):
        ceiling = catalog.load_hardware(gpu).achievable.memory_bandwidth_gb_per_s.value
        return ceiling * (1.0 if gpu == "h100-sxm" else 0.9)

    run = [sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_gemm.py"),
           str(_wheel(tmp_path, "vllm", rate)), "--engine", "vllm"]
    p = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = {ln.split()[0]: ln.split() for ln in p.stdout.splitlines()[2:]}
    assert set(lines) == set(moe.SYSTEMS)
    assert lines["a100-sxm-80gb"][1:3] == ["ampere", "0.14.0"]
    assert [float(lines[g][6]) for g in ("h100-sxm", "a100-sxm-80gb", "l40s", "b200")] == \
        [1.0, 0.9, 0.9, 0.9]
    other = subprocess.run([*run[:3], "--engine", "sglang"], capture_output=True, text=True,
                           cwd=ROOT)
    assert other.returncode == 2 and "cannot read the h100-sxm table" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1


def _spec_with_fp8_compute(spec, f: float):
    q = spec.quantized["fp8"]
    return spec.model_copy(update={"quantized": {**spec.quantized, "fp8": q.model_copy(
        update={"compute_frac": q.compute_frac.model_copy(update={"value": f})})}})


def test_the_fp8_compute_share_is_the_one_that_reproduces_the_table():
    """--derive-fp8-compute: a table whose 16-bit GEMMs take what ours do and whose fp8 GEMMs
    take what ours would with an fp8 compute_frac of 0.4 gives back 0.4; rows under M 1,024
    (here impossibly fast) are not counted."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType
    from planner.io import catalog

    spec = catalog.load_engine_spec("vllm")
    slow = _spec_with_fp8_compute(spec, 0.4)
    rows = []
    for wt, dtype, s in (("bf16", "bfloat16", spec), ("fp8", "fp8", slow)):
        dep = served_setup("qwen3-8b", "h100-sxm", s, 1, DType(wt), None)
        for m, n, k in ((1024, 4096, 4096), (4096, 12288, 4096), (2048, 4096, 12288),
                        (16, 4096, 4096)):
            latency = gemm.ours_gemm_s(m, n, k, wt, dep) * 1e3 if m >= 1024 else 1e-9
            rows.append(dict(gemm_dtype=dtype, m=m, n=n, k=k, latency=latency))
    f, target, got, n = gemm.derive_fp8_compute(pd.DataFrame(rows), "h100-sxm", spec)
    assert n == 3 and target == pytest.approx(1.0)
    assert f == pytest.approx(0.4, abs=0.01) and got == pytest.approx(1.0, abs=0.02)


def test_vllm_fp8_compute_share_names_the_derived_one_not_yet_applied():
    from planner.io import catalog

    fp8 = catalog.load_engine_spec("vllm").quantized["fp8"].compute_frac
    assert fp8.value == 0.9 and "--derive-fp8-compute" in fp8.note and "0.655" in fp8.note


def test_a_wheel_without_prefill_fp8_rows_is_one_line_and_exit_2(tmp_path):
    """The stand-in tables hold one fp8 GEMM, at M 1 (and a 16-bit one at M 4,096): nothing
    to derive the share from."""
    run = [sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_gemm.py"),
           str(_wheel(tmp_path, "vllm", lambda gpu: 2000.0)), "--engine", "vllm",
           "--derive-fp8-compute"]
    p = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "no fp8 GEMM with M >= 1,024" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


MS = (16, 17, 64, 65, 128, 129, 256, 257, 512, 513, 768, 769, 1024, 1025)


def _fp8_steps_table(spec, gpu: str) -> pd.DataFrame:
    """W8A8 fp8 rows timed as ours with ``spec``'s row tiles (and 16-bit ones growing with M
    alone), at M on both sides of each bound, N = K = 4,096."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType

    dep = served_setup("qwen3-8b", gpu, spec, 1, DType.fp8, None)
    rows = []
    for m in MS:
        rows.append(dict(gemm_dtype="fp8", m=m, n=4096, k=4096,
                         latency=gemm.ours_gemm_s(m, 4096, 4096, "fp8", dep) * 1e3))
        rows.append(dict(gemm_dtype="bfloat16", m=m, n=4096, k=4096, latency=1e-3 * m))
    return pd.DataFrame(rows)


def test_the_steps_are_the_tables_time_one_row_past_each_bound():
    """A table whose fp8 GEMMs take time in proportion to the rows the Hopper tiles compute
    (256 at 129, 512 at 257) and whose 16-bit ones in proportion to M: fp8 doubles one row
    past 128 and 256, 16-bit grows by a row; a bound the table does not time is left out."""
    from planner.core.roofline import tiled_rows

    tiles = ((16.0, 16.0), (64.0, 64.0), (128.0, 128.0), (float("inf"), 256.0))
    t = pd.DataFrame([dict(gemm_dtype=d, m=m, n=4096, k=4096,
                           latency=1e-3 * (tiled_rows(m, tiles) if d == "fp8" else m))
                      for m in MS for d in ("fp8", "bfloat16")]
                     + [dict(gemm_dtype="fp8", m=129, n=1024, k=1024, latency=1.0)])  # N < 4,096
    steps = {b: (m, r, n) for b, m, r, n in gemm.edge_steps(t, [64, 128, 256, 4096])}
    assert set(steps) == {64, 128, 256}
    assert steps[64] == (65, pytest.approx(2.0), 1) and steps[128] == (129, 2.0, 1)
    assert steps[256][1] == pytest.approx(2.0)
    assert gemm.edge_steps(t, [128], "bfloat16")[0][2] == pytest.approx(129 / 128)


def test_theirs_over_ours_by_range_is_one_where_the_table_is_timed_as_the_tiles_price_it():
    from planner.io import catalog

    spec = catalog.load_engine_spec("vllm")
    t = _fp8_steps_table(spec, "h100-sxm")
    tiled = gemm.fp8_ratios_by_range(t, "h100-sxm", spec)
    assert all(v == pytest.approx([1.0] * len(v)) for v in tiled.values())
    assert [len(v) for v in tiled.values()] == [2, 2, 2, 2, 5]  # 17-64 ... 513-4,096
    flat = gemm.fp8_ratios_by_range(t, "h100-sxm", spec.model_copy(
        update={"fp8_gemm_row_tiles": None}))
    assert max(flat[(257, 512)]) > 1.1  # 257 rows: 512 computed, 272 without the tiles


def test_the_script_prints_the_steps_and_ranges_on_hopper_and_refuses_an_engine_without_tiles(
        tmp_path):
    from planner.io import catalog

    spec = catalog.load_engine_spec("vllm")
    wheel = tmp_path / "aic.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for gpu, system in moe.SYSTEMS.items():
            for engine in ("vllm", "trtllm"):
                buf = io.BytesIO()
                # the script reads the Hopper tables only: the others stand in as the H100's
                _fp8_steps_table(spec, gpu if gpu in gemm.HOPPER_GPUS else "h100-sxm"
                                 ).to_parquet(buf)
                release = moe.RELEASES[engine][system]
                z.writestr(f"aiconfigurator_core/systems/data/{system}/gemm/{engine}/"
                           f"{release}/gemm_perf.parquet", buf.getvalue())
    run = [sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_gemm.py"), str(wheel),
           "--engine", "vllm", "--fp8-row-tiles"]
    p = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "h100-sxm (vllm 0.24.0)" in p.stdout and "h200 (vllm 0.24.0)" in p.stdout
    assert p.stdout.count("t(129)/t(128)") == 4  # fp8 and 16-bit, on each GPU
    ranges = [ln.split() for ln in p.stdout.splitlines() if ln.strip().startswith("257-512")]
    assert len(ranges) == 2 and all(float(r[2]) == pytest.approx(1.0, abs=0.01)
                                    and float(r[3]) > 1.1 for r in ranges)
    other = subprocess.run([*run[:3], "--engine", "trtllm", "--fp8-row-tiles"],
                           capture_output=True, text=True, cwd=ROOT)
    assert other.returncode == 2 and "states no Hopper fp8 row tiles" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1


# decode shapes, (n, k): 16-bit weights of 24, 48 and 112 MiB, where the fixed costs show, and
# of 256 and 448 MiB, where the streaming sets the time
DECODE_SHAPES = ((3072, 4096), (6144, 4096), (4096, 14336), (16384, 8192), (28672, 8192))


def _fp8_decode_table(spec, gpu: str, bandwidth_frac: float, kernels: int,
                      lane: str = "tensor") -> pd.DataFrame:
    """Decode GEMMs at M 1, 8 and 16: the 16-bit ones timed as ours under ``spec``, the fp8
    ones of the ``lane`` as ours would be with the fp8 path's ``bandwidth_frac`` and
    ``kernels`` beside each GEMM; and a 4 MiB shape in both types that must be left out."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType

    slow = gemm.with_fp8_decode(spec, bandwidth_frac, kernels, lane)
    rows = []
    for wt, dtype, s in (("bf16", "bfloat16", spec), ("fp8", gemm.FP8_LANES[lane], slow)):
        dep = served_setup("qwen3-8b", gpu, s, 1, DType(wt), None)
        for m in (1, 8, 16):
            for n, k in (*DECODE_SHAPES, (1024, 2048)):
                latency = gemm.ours_gemm_s(m, n, k, wt, dep, lane == "block") * 1e3 \
                    if n * k * 2 >= 16 * MIB else 1e-9
                rows.append(dict(gemm_dtype=dtype, m=m, n=n, k=k, latency=latency))
    return pd.DataFrame(rows)


def test_the_fp8_decode_kernels_and_bandwidth_are_the_ones_that_reproduce_the_table():
    """--derive-fp8-decode: a table whose fp8 decode GEMMs take what ours would with 3 kernels
    beside each and 0.7 of the bandwidth gives back 3 and 0.7 with no spread left; with
    fewer kernels the small shapes come out too slow in the table, with more too fast, and
    the bandwidth that holds the large shapes' median moves the other way."""
    from planner.io import catalog

    spec = catalog.load_engine_spec("trtllm")
    rows = gemm.derive_fp8_decode(_fp8_decode_table(spec, "h100-sxm", 0.7, 3), "h100-sxm",
                                  spec)
    assert [r[0] for r in rows] == list(range(gemm.MAX_FP8_KERNELS + 1))
    best = min(rows, key=lambda r: r[2])
    assert best[:2] == (3, pytest.approx(0.7, abs=0.01)) and best[2] < 0.005
    assert best[4] == 15  # 5 shapes x 3 M; the 4 MiB shape left out
    fracs = [r[1] for r in rows]
    assert fracs == sorted(fracs) and fracs[0] < 0.7 < fracs[-1]
    assert all(r[3] == pytest.approx(1.0, abs=0.02) for r in rows)
    assert rows[0][2] > 0.05 and rows[-1][2] > 0.05


def test_the_block_lane_derives_its_own_kernels_beside_the_per_tensor_ones():
    """--derive-fp8-decode block: the table's fp8_block rows against ours with block-scaled
    weights, the count set in fp8_quant_kernels.block; the per-tensor rows (here 3 kernels)
    do not enter it, and the per-tensor derivation does not read the block rows."""
    from planner.io import catalog

    spec = catalog.load_engine_spec("trtllm")
    t = pd.concat([_fp8_decode_table(spec, "h100-sxm", 0.75, 1, "block"),
                   _fp8_decode_table(spec, "h100-sxm", 0.6, 3)])
    t = t.drop_duplicates(subset=["gemm_dtype", "m", "n", "k"])
    block = min(gemm.derive_fp8_decode(t, "h100-sxm", spec, lane="block"), key=lambda r: r[2])
    assert block[:2] == (1, pytest.approx(0.75, abs=0.01)) and block[2] < 0.005
    tensor = min(gemm.derive_fp8_decode(t, "h100-sxm", spec), key=lambda r: r[2])
    assert tensor[:2] == (3, pytest.approx(0.6, abs=0.01)) and tensor[2] < 0.005
    assert gemm.with_fp8_decode(spec, 0.75, 2, "block").fp8_quant_kernels.block == 2
    assert gemm.with_fp8_decode(spec, 0.75, 2, "block").fp8_quant_kernels.value == 3


def test_the_script_prints_the_fp8_decode_grid_and_refuses_a_table_without_fp8_decode_rows(
        tmp_path):
    """The H100's least is shown beside its grid, and the other GPUs at that count (one
    whose table lacks the lane is said to be untimed); tables of 16-bit GEMMs alone: one
    line and exit 2."""
    from planner.io import catalog

    spec = catalog.load_engine_spec("trtllm")
    wheel = tmp_path / "aic.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for gpu, system in moe.SYSTEMS.items():
            buf = io.BytesIO()
            t = _fp8_decode_table(spec, gpu if gpu in gemm.FP8_GPUS else "h100-sxm", 0.8, 2)
            if gpu == "l40s":  # a table that does not time the lane: said, not fatal
                t = t[t.gemm_dtype == "bfloat16"]
            t.to_parquet(buf)
            release = moe.RELEASES["trtllm"][system]
            z.writestr(f"aiconfigurator_core/systems/data/{system}/gemm/trtllm/{release}/"
                       "gemm_perf.parquet", buf.getvalue())
    run = [sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_gemm.py"), str(wheel),
           "--engine", "trtllm", "--derive-fp8-decode"]
    p = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    rows = [ln.split() for ln in p.stdout.splitlines()[2:]]
    h100 = [r for r in rows if r[0] == "h100-sxm"]
    assert len(h100) == gemm.MAX_FP8_KERNELS + 1
    assert [r[2:4] for r in h100 if r[-1] == "least"] == [["2", "0.80"]]
    others = [r for r in rows if r[0] != "h100-sxm"]
    assert [r[0] for r in others] == ["h200", "l40s", "b200"]
    assert all(r[2:4] == ["2", "0.80"] for r in others if r[0] != "l40s")
    assert "(not timed: no GEMM" in " ".join(others[1])
    with zipfile.ZipFile(wheel, "w") as z:  # 16-bit decode rows alone
        for system in moe.SYSTEMS.values():
            buf = io.BytesIO()
            t = _table(2000.0)
            t[t.gemm_dtype == "bfloat16"].to_parquet(buf)
            release = moe.RELEASES["trtllm"][system]
            z.writestr(f"aiconfigurator_core/systems/data/{system}/gemm/trtllm/{release}/"
                       "gemm_perf.parquet", buf.getvalue())
    bad = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "timed in 16 bits and fp8" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
