"""benchmarks/aiconfigurator_attention.py: the rate a measured decode attention reads its KV
cache at, by cache type, and the fp8 pace by architecture it implies (the wheel itself is not
in CI: tables of the same columns stand in for it)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import aiconfigurator_attention as attn  # noqa: E402
from benchmarks import aiconfigurator_moe as moe  # noqa: E402


def _table(bf16_gb_per_s: float, fp8_gb_per_s: float) -> pd.DataFrame:
    """Rows as aiconfigurator's generation_attention_perf.parquet has them, each cache read
    at the rate given (latency in ms): two shapes of 256 MiB and more in 16 bits, and rows
    that must be left out: a 2 MiB cache (an L2 holds it), a sliding window, and the fp8
    cache timed by a second kernel with fewer rows (not the default)."""
    rows = []
    shapes = ((64, 8191, 32, 8, 128, 0), (256, 4095, 64, 8, 128, 0), (1, 1023, 32, 8, 128, 0),
              (64, 8191, 32, 8, 128, 1024))
    for b, step, h, kv, d, window in shapes:
        for dtype, rate, per, kernel in (("bfloat16", bf16_gb_per_s, 2, "fa3"),
                                         ("fp8", fp8_gb_per_s, 1, "fa3")):
            cache = b * (step + 1) * kv * d * 2 * per
            fast = window or cache * 2 / per < attn.MIN_CACHE_BYTES
            rows.append(dict(kernel_source=kernel, batch_size=b, isl=1, num_heads=h,
                             num_key_value_heads=kv, head_dim=d, kv_cache_dtype=dtype,
                             step=step, window_size=window,
                             latency=1e-9 if fast else cache / (rate * 1e9) * 1e3))
    rows.append(dict(rows[-1], kernel_source="other", window_size=0, latency=1e-9))
    return pd.DataFrame(rows)


def test_the_rate_is_the_caches_bytes_over_the_latency_with_the_default_kernel():
    got = attn.cache_rates(_table(2700.0, 1900.0))
    assert set(got) == {"bfloat16", "fp8"}
    assert got["bfloat16"] == ("fa3", pytest.approx(2700e9), 2)
    assert got["fp8"] == ("fa3", pytest.approx(1900e9), 2)


def test_an_architecture_is_paced_where_its_fp8_share_falls_under_0_9_of_the_16_bit_one():
    def gpu(arch, bf16, fp8):
        return arch, {"bfloat16": ("k", bf16, 1), "fp8": ("k", fp8, 1)}, 3e12

    per_gpu = {"h100": gpu("hopper", 2.7e12, 1.9e12), "h200": gpu("hopper", 3.6e12, 2.0e12),
               "l40s": gpu("ada", 675e9, 660e9), "a100": ("ampere", {"bfloat16": ("k", 1.4e12, 1)},
                                                        2e12)}
    # in the profile's terms: its 16-bit rate there (3e12 each here) x fp8 / 16-bit
    assert attn.arch_paces(per_gpu) == {"hopper": pytest.approx(
        (3e12 * 1.9 / 2.7 + 3e12 * 2.0 / 3.6) / 2)}


def _wheel(tmp_path: Path, rates_of) -> Path:
    wheel = tmp_path / "aic.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for gpu, system in moe.SYSTEMS.items():
            buf = io.BytesIO()
            _table(*rates_of(gpu)).to_parquet(buf)
            release = moe.RELEASES["vllm"][system]
            z.writestr(f"aiconfigurator_core/systems/data/{system}/attention/vllm/{release}/"
                       "generation_attention_perf.parquet", buf.getvalue())
    return wheel


def test_the_script_prints_each_gpus_rates_and_the_paces(tmp_path):
    """Hopper GPUs read fp8 at 1,900 and 2,000 GB/s against 16-bit rates far above: paced at
    the median of the profile's 16-bit rate there times fp8 / 16-bit (the H100's 2,900 GB/s x
    1,900 / 2,700, the H200's 4,010 x 2,000 / 3,600); every other GPU reads fp8 at the 16-bit
    share's rate: none. A wheel that lacks a table is one line and exit 2."""
    from planner.io import catalog

    def ours(gpu):
        return catalog.load_hardware(gpu).achievable.memory_bandwidth_gb_per_s.value
    pace = (ours("h100-sxm") * 1900 / 2700 + ours("h200") * 2000 / 3600) / 2
    def rates(gpu):
        return (2700.0, 1900.0) if gpu == "h100-sxm" else (3600.0, 2000.0) if gpu == "h200" \
            else (600.0, 600.0)

    run = [sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_attention.py"),
           str(_wheel(tmp_path, rates)), "--engine", "vllm"]
    p = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1].endswith(f": hopper: {pace:.0f}")
    h100 = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("h100-sxm ")]
    assert [r[3] for r in h100] == ["bfloat16", "fp8"] and h100[1][6] == "1900"
    other = subprocess.run([*run[:3], "--engine", "sglang"], capture_output=True, text=True,
                           cwd=ROOT)
    assert other.returncode == 2 and "cannot read the h100-sxm table" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1


def test_the_16_bit_factor_is_the_share_against_the_h100s_shape_by_shape():
    h100 = {k: v / 2900e9 for k, v in attn.shape_rates(_table(2900.0, 1900.0)).items()}
    a100 = {k: v / 2000e9 for k, v in attn.shape_rates(_table(1600.0, 1600.0)).items()}
    assert len(h100) == 2 and set(a100) == set(h100)
    f, lo, hi, n = attn.arch_factor(a100, h100)
    assert (f, lo, hi, n) == (pytest.approx(0.8), pytest.approx(0.8), pytest.approx(0.8), 2)
    with pytest.raises(ValueError, match="no 16-bit attention shape"):
        attn.arch_factor({(1, 1, 1, 1, 1): 0.5}, h100)


def test_the_script_prints_each_gpus_16_bit_factor(tmp_path):
    """Each GPU's 16-bit cache read at 0.9 of its hardware_db ceiling, the H100's at all of
    it: 0.9 for every other GPU."""
    from planner.io import catalog

    def rates(gpu):
        ceiling = catalog.load_hardware(gpu).achievable.memory_bandwidth_gb_per_s.value
        return ceiling * (1.0 if gpu == "h100-sxm" else 0.9), 100.0

    run = [sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_attention.py"),
           str(_wheel(tmp_path, rates)), "--engine", "vllm"]
    p = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split("(attention_bandwidth_arch_frac):\n", 1)[1].split(
        "prefill attention", 1)[0].splitlines()
    got = {ln.split()[0]: float(ln.split()[2]) for ln in lines if ln.startswith("  ")}
    assert got == {"h100-sxm": 1.0, "h200": 0.9, "a100-sxm-80gb": 0.9, "l40s": 0.9, "b200": 0.9}


def test_the_prefill_ratio_is_the_fp8_time_over_the_16_bit_time_shape_by_shape():
    """Two shapes timed 1.2x and 1.0x slower over fp8, and a sliding-window row and a
    second kernel's row that must be left out: the median of the two, 1.1."""
    rows = []
    for i, (b16, f8) in enumerate(((1.0, 1.2), (2.0, 2.0))):
        for dtype, lat in (("bfloat16", b16), ("fp8", f8)):
            rows.append(dict(kernel_source="fa3", batch_size=1 + i, isl=4096, num_heads=32,
                             num_key_value_heads=8, head_dim=128, step=0, window_size=0,
                             kv_cache_dtype=dtype, latency=lat))
    rows.append(dict(rows[-1], window_size=1024, latency=100.0))
    rows.append(dict(rows[-1], window_size=0, kernel_source="other", latency=100.0))
    assert attn.prefill_fp8_ratio(pd.DataFrame(rows)) == (pytest.approx(1.1), 2)
    only16 = pd.DataFrame([r for r in rows if r["kv_cache_dtype"] == "bfloat16"])
    assert attn.prefill_fp8_ratio(only16) is None


def test_a_file_that_is_no_wheel_is_one_line_naming_it_and_exit_2(tmp_path):
    bad = tmp_path / "x.whl"
    bad.write_text("not a zip")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_attention.py"),
                        str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"aiconfigurator_attention.py: {bad}: cannot read it: File is not a zip file"]


def test_the_fixed_time_is_what_brings_the_median_ratio_to_1_by_hand():
    """theirs / (ours + X) over three shapes: 10 / (4 + X), 12 / (5 + X), 9 / (3 + X); their
    median is 1 where the middle one is, 10 / (4 + 6) (12 / 11 above it, 9 / 9 at it)."""
    assert attn.derive_fixed([(10.0, 4.0), (12.0, 5.0), (9.0, 3.0)]) == pytest.approx(6.0,
                                                                                       abs=0.05)
    assert attn.derive_fixed([(3.0, 4.0), (2.0, 5.0), (4.0, 4.0)]) == 0.0  # ours the slower


def _fixed_table(gpu: str, extra_us: float) -> pd.DataFrame:
    """A decode table at the rows --derive-fixed reads (one shape, Llama-3.1-8B's heads), each
    timed at what the vllm profile prices it plus ``extra_us``; and a row it must leave out
    (a sliding window) timed far slower."""
    from planner.io import catalog

    rows = [dict(kernel_source="fa3", batch_size=b, isl=1, num_heads=32, num_key_value_heads=8,
                 head_dim=128, kv_cache_dtype="bfloat16", step=st, window_size=0, latency=1.0)
            for b in attn.FIXED_BATCHES for st in attn.FIXED_STEPS]
    t = pd.DataFrame(rows)
    ours = [o for _, o in attn.fixed_rows(t, gpu, catalog.load_engine_spec("vllm"))]
    t["latency"] = [(o + extra_us) / 1e3 for o in ours]  # in ms, as the tables hold it
    slow = dict(rows[0], window_size=128, latency=1.0)
    return pd.concat([t, pd.DataFrame([slow])], ignore_index=True)


def _run_on_vllm_tables(tmp_path, table_of, flag: str):
    """The script with ``flag`` on a wheel whose vLLM decode attention table for each GPU is
    ``table_of(gpu)``."""
    wheel = tmp_path / "aic.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for gpu, system in moe.SYSTEMS.items():
            buf = io.BytesIO()
            table_of(gpu).to_parquet(buf)
            release = moe.RELEASES["vllm"][system]
            z.writestr(f"aiconfigurator_core/systems/data/{system}/attention/vllm/{release}/"
                       "generation_attention_perf.parquet", buf.getvalue())
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" /
                                               "aiconfigurator_attention.py"),
                           str(wheel), "--engine", "vllm", flag],
                          capture_output=True, text=True, cwd=ROOT)


def test_the_script_derives_each_architectures_fixed_time(tmp_path):
    """Tables timed at the profile's price plus 7 us on Hopper and 3 us elsewhere: 7.0 for
    Hopper (the H100's and H200's rows together), 3.0 for the rest, each GPU's line too."""
    p = _run_on_vllm_tables(tmp_path, lambda gpu: _fixed_table(
        gpu, 7.0 if gpu in ("h100-sxm", "h200") else 3.0), "--derive-fixed")
    assert p.returncode == 0, p.stderr
    last = p.stdout.strip().splitlines()[-1]
    n = len(attn.FIXED_BATCHES) * len(attn.FIXED_STEPS)
    got = dict(re.findall(r"(\w+): ([\d.]+) \((\d+) shapes", last)[i][:2]
               for i in range(4))
    assert got == {"ada": "3.0", "ampere": "3.0", "blackwell": "3.0", "hopper": "7.0"}, last
    assert f"hopper: 7.0 ({2 * n} shapes; above the floor 7.0 on " in last
    h100 = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("h100-sxm ")]
    assert len(h100) == 1 and "fixed   7.0 us" in h100[0]


def test_the_cells_show_the_profiles_fixed_time_bringing_each_cell_to_1(tmp_path):
    """--fixed-cells on an H100 table timed at the vllm profile's price plus its own 8.2 us
    (Hopper) at every cell of the wider grid: each cell's ratio comes to 1.00 with the fixed
    time and stands above 1 without it, the mean |log ratio| goes to 0; another GPU's table is
    not read."""
    from planner.io import catalog

    rows = [dict(kernel_source="fa3", batch_size=b, isl=1, num_heads=32, num_key_value_heads=8,
                 head_dim=128, kv_cache_dtype="bfloat16", step=st, window_size=0, latency=1.0)
            for b in attn.CELL_BATCHES for st in attn.CELL_STEPS]
    t = pd.DataFrame(rows)
    ours = [r[3] for r in attn.cell_rows(t, "h100-sxm", catalog.load_engine_spec("vllm"),
                                         attn.CELL_BATCHES, attn.CELL_STEPS)]
    t["latency"] = [(o + 8.2) / 1e3 for o in ours]
    p = _run_on_vllm_tables(
        tmp_path, lambda gpu: t if gpu == "h100-sxm" else t.assign(latency=1.0), "--fixed-cells")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert "with its 8.2 us" in lines[0]
    cells = [ln for ln in lines if ln.strip().startswith("batch")]
    assert len(cells) == len(attn.CELL_BATCHES) * len(attn.CELL_STEPS)
    for ln in cells:
        before, after = re.search(r"ratio\s+([\d.]+) -> ([\d.]+)", ln).groups()
        assert after == "1.00" and float(before) > 1.0, ln
    n = len(cells)
    assert re.search(rf"mean \|log ratio\| over {n} rows: [\d.]+ -> 0\.000$", lines[-1]), lines[-1]
