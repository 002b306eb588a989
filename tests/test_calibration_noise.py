"""The calibration step's own noise check (issue 27: on a busy machine its timings spread 8x
and were saved as the device's ceilings): the spread of every timing and the drift of the
copy timed again are recorded; past ``--max-spread`` / ``--max-drift`` the profile is marked
noisy, a warning names the load average and suggests --threads, and measure does not reuse
it. The clock is injected, so the machine's real load cannot decide the tests."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from harness import bench  # noqa: E402
from harness import calibrate as cal_mod  # noqa: E402
from harness.device import detect  # noqa: E402


def _details(spread: float = 1.1, drift: float = 1.0) -> dict:
    def t(median_s: float, p90_ratio: float = 1.1) -> dict:
        return {"median_s": median_s, "p90_s": median_s * p90_ratio, "reps": 20}

    return {"bandwidth": {"copy": t(1e-3), "read": t(1e-3)},
            "bandwidth_repeat": {"copy": t(1e-3 * drift), "read": t(1e-3)},
            "matmul": [{"dtype": "bf16", "m": 256, "k": 256, "n": 256,
                        "timing": t(2e-4, spread)}],
            "launch": {"timing": t(5e-6)}}


def test_noise_names_the_worst_timing_and_the_drift():
    clean = cal_mod.noise(_details())
    assert not clean["noisy"] and clean["reason"] is None
    assert clean["worst_spread"] == pytest.approx(1.1) and clean["drift"] == pytest.approx(1.0)
    spread = cal_mod.noise(_details(spread=8.0))
    assert spread["noisy"] and spread["worst"] == "bf16 matmul 256x256x256"
    assert "p90 is 8.0x the median over 20 repeats (limit 2x)" in spread["reason"]
    drift = cal_mod.noise(_details(drift=3.0))
    assert drift["noisy"] and "3.0x slower (limit 1.5x)" in drift["reason"]
    assert not cal_mod.noise(_details(spread=8.0), max_spread=10)["noisy"]
    assert not cal_mod.noise(_details(drift=3.0), max_drift=4)["noisy"]


def _clock(spike_every: int | None):
    """A perf_counter that advances 1 ms a call, and 50 ms every ``spike_every``-th call
    (another process taking the core)."""
    now = [0.0]
    calls = itertools.count(1)

    def perf_counter() -> float:
        k = next(calls)
        now[0] += 0.05 if spike_every and k % spike_every == 0 else 0.001
        return now[0]
    return perf_counter


@pytest.mark.parametrize("spike_every, noisy", [(None, False), (7, True)])
def test_a_busy_clock_marks_the_calibration_noisy_and_warns(monkeypatch, spike_every, noisy):
    monkeypatch.setattr(bench.time, "perf_counter", _clock(spike_every))
    warnings: list[str] = []
    prof = cal_mod.calibrate(detect("cpu", threads=1), dtypes=("bf16",), quick=True,
                             warn=warnings.append)
    n = prof["details"]["noise"]
    assert n["noisy"] is noisy
    if noisy:
        assert n["worst_spread"] > 2 and len(warnings) == 1
        assert "load average" in warnings[0] and "--threads" in warnings[0]
        assert "not reused" in warnings[0]
    else:
        assert n["worst_spread"] == pytest.approx(1.0) and n["drift"] == pytest.approx(1.0)
        assert warnings == []


def test_a_noisy_saved_calibration_is_not_reused(tmp_path, monkeypatch):
    from harness.cli import _reusable

    info = detect("cpu", threads=1)
    monkeypatch.setattr(bench.time, "perf_counter", _clock(None))
    prof = cal_mod.calibrate(info, dtypes=("bf16",), quick=True)
    path = cal_mod.save(prof, tmp_path / "cal.yaml")
    assert _reusable(path, info, ("bf16",)) is not None
    prof["details"]["noise"]["noisy"] = True
    cal_mod.save(prof, path)
    assert _reusable(path, info, ("bf16",)) is None
