"""Achievable ceilings: the memory bandwidth and matmul rates real kernels reach on a GPU.

A datasheet's bandwidth and tensor-core peak are not reached by any kernel: a large device copy
reaches 85-93% of the HBM figure, and the best dense GEMM of any shape (mamf-finder's "maximum
achievable matmul FLOPS") 70-93% of the dense peak, depending on the memory technology and the
tensor-core generation. hardware_db states, for each GPU, the published measurements
(``achievable:`` with source and date) and, where none is published, the fraction below times
the datasheet figure, marked ``estimated: true``. A GPU file without an ``achievable`` block (a
user's own) gets the same fractions here, with a note.

The fractions are medians of the measured GPUs of the same technology in hardware_db (the
sources are in those files); tests/test_databases.py recomputes them from the database and
checks that every estimated figure equals datasheet x fraction.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.specs import DType, HardwareSpec

# Copy bandwidth / datasheet bandwidth, by memory technology.
BANDWIDTH_FRAC: dict[str, float] = {
    "HBM2": 0.90,
    "HBM2e": 0.90,
    "HBM3": 0.90,
    "HBM3e": 0.90,
    "GDDR6": 0.90,
    "GDDR6X": 0.90,
}
# Best dense GEMM / datasheet dense peak, by tensor-core generation (all precisions).
MATMUL_FRAC: dict[str, float] = {
    "volta": 0.80,
    "turing": 0.80,
    "ampere": 0.80,
    "ada": 0.80,
    "hopper": 0.80,
    "blackwell": 0.80,
    "cdna3": 0.55,
}
# For a GPU whose technology is not listed: the lowest fractions above, so an unknown GPU is
# never predicted faster than a known one of the same datasheet.
DEFAULT_BANDWIDTH_FRAC = min(BANDWIDTH_FRAC.values())
DEFAULT_MATMUL_FRAC = min(MATMUL_FRAC.values())


def bandwidth_frac(hw: HardwareSpec) -> float:
    return BANDWIDTH_FRAC.get(hw.memory_type or "", DEFAULT_BANDWIDTH_FRAC)


def matmul_frac(hw: HardwareSpec) -> float:
    return MATMUL_FRAC.get(hw.architecture or "", DEFAULT_MATMUL_FRAC)


@dataclass(frozen=True)
class AchievableCeilings:
    bandwidth_bytes_per_s: float
    bandwidth_source: str
    flops: dict[DType, tuple[float, str]]  # FLOP/s and where the figure came from
    notes: tuple[str, ...] = ()


def achievable(hw: HardwareSpec) -> AchievableCeilings:
    """The GPU's achievable ceilings: hardware_db's figures, completed by the fractions."""
    notes: list[str] = []
    a = hw.achievable
    if a is not None:
        bw = a.memory_bandwidth_gb_per_s.value * 1e9
        bw_src = "estimated" if a.memory_bandwidth_gb_per_s.estimated else "achievable"
    else:
        f = bandwidth_frac(hw)
        bw, bw_src = hw.memory_bandwidth_bytes_per_s * f, "estimated"
        notes.append(f"{hw.name} has no achievable figures: {f:.0%} of the datasheet bandwidth "
                     f"and {matmul_frac(hw):.0%} of its peak FLOP/s assumed")
    flops: dict[DType, tuple[float, str]] = {}
    for dt, peak in hw.peak_tflops.items():
        fig = a.matmul_tflops.get(dt) if a is not None else None
        if fig is not None:
            flops[dt] = (fig.value * 1e12, "estimated" if fig.estimated else "achievable")
        else:
            flops[dt] = (peak * 1e12 * matmul_frac(hw), "estimated")
    return AchievableCeilings(bw, bw_src, flops, tuple(notes))
