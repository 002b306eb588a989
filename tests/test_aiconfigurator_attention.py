"""benchmarks/aiconfigurator_attention.py: the rate a measured decode attention reads its KV
cache at, by cache type, and the fp8 pace by architecture it implies (the wheel itself is not
in CI: tables of the same columns stand in for it)."""

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
    assert attn.arch_paces(per_gpu) == {"hopper": pytest.approx(1.95e12)}


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
    their median; every other GPU reads fp8 at the 16-bit share's rate: none. A wheel that
    lacks a table is one line and exit 2."""
    def rates(gpu):
        return (2700.0, 1900.0) if gpu == "h100-sxm" else (3600.0, 2000.0) if gpu == "h200" \
            else (600.0, 600.0)

    run = [sys.executable, str(ROOT / "benchmarks" / "aiconfigurator_attention.py"),
           str(_wheel(tmp_path, rates)), "--engine", "vllm"]
    p = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1].endswith(": hopper: 1950")
    h100 = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("h100-sxm ")]
    assert [r[3] for r in h100] == ["bfloat16", "fp8"] and h100[1][6] == "1900"
    other = subprocess.run([*run[:3], "--engine", "sglang"], capture_output=True, text=True,
                           cwd=ROOT)
    assert other.returncode == 2 and "cannot read the h100-sxm table" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1
