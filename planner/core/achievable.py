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

from planner.core.specs import DType, HardwareSpec

# Copy bandwidth / datasheet bandwidth, by memory technology: the typical fraction over the
# published copy / stream benchmarks of GPUs of that technology (sources in hardware_db):
# HBM2 V100 0.90, A100-40GB 0.89 (and 0.82-0.88 with other methods); HBM2e A100-80GB 0.79-0.85,
# H100 PCIe 0.82-0.85; HBM3 H100 SXM 0.87 (MI300X 0.78, measured directly); HBM3e H200 0.84,
# B200 0.83 (read); GDDR6 L40 0.93, A10 / L4 / T4 0.75-0.78; GDDR6X RTX 4090 0.91.
BANDWIDTH_FRAC: dict[str, float] = {
    "HBM2": 0.87,
    "HBM2e": 0.82,
    "HBM3": 0.87,
    "HBM3e": 0.83,
    "GDDR6": 0.80,
    "GDDR6X": 0.91,
}
# Best dense GEMM / dense peak, by tensor-core generation and precision: mamf-finder's table
# (stas00/ml-engineering, compute/accelerator/README.md) and square torch.mm sweeps: Volta
# V100 0.76 (fp16); Turing T4 0.66; Ampere A100 0.81-0.87; Ada L40S 0.74 (L4 0.59 at 72 W);
# Hopper H100 SXM bf16 0.80, fp8 0.71 (H200 0.73); Blackwell B200 bf16 0.78, fp8 0.76; CDNA3
# MI300X bf16 0.51-0.54, fp8 0.49. int8 has no published GEMM ceiling for any of these GPUs:
# it takes the generation's fp8 fraction where there is one, else the 16-bit one (a guess).
MATMUL_FRAC: dict[str, dict[str, float]] = {
    "volta": {"16bit": 0.76},
    "turing": {"16bit": 0.66},
    "ampere": {"16bit": 0.85},
    "ada": {"16bit": 0.74},
    "hopper": {"16bit": 0.80, "8bit": 0.71},
    "blackwell": {"16bit": 0.78, "8bit": 0.76},
    "cdna3": {"16bit": 0.54, "8bit": 0.49},
}
# Pinned host-to-device copy / the link's one-way datasheet figure: published copies over PCIe
# reach about 0.78 of it (protocol and DMA overheads): nvbandwidth's host_to_device_memcpy_ce
# on A100 SXM4 80GB, Gen4 x16, 24.8 of 32 GB/s (0.775; https://forums.developer.nvidia.com/t/
# asymmetric-pcie-bandwidth-in-bidirectional-transfers-h2d-drops-56-while-d2h-maintains-
# performance/352186); CUDA's bandwidthTest pinned H2D on a P100 PCIe, Gen3 x16, 12.15 of 16
# GB/s (0.76; https://github.com/mpicbg-scicomp/gearshifft/pull/82, 2017-03-27); nvbandwidth on
# H100, Gen5 x16, 52.8 of 64 GB/s device-to-host (0.82; https://github.com/NVIDIA/nvbandwidth/
# issues/24, 2024-09-11: host-to-device by SM copies reached only 35.2 there).
HOST_LINK_FRAC = 0.78
# The all-reduce a real engine falls back to on GPUs joined only by PCIe. vLLM's and SGLang's
# custom all-reduce runs on such GPUs only for two of them ("Custom allreduce is disabled because
# it's not supported on more than two PCIe-only GPUs": vllm/distributed/device_communicators/
# custom_all_reduce.py, quoted in https://github.com/vllm-project/vllm/issues/56128, 2026-09-09;
# FlashInfer's copy of the kernel dispatches nothing else without NVLink, https://github.com/
# flashinfer-ai/flashinfer/pull/4393, 2026-08-07), so 3 or more GPUs use NCCL, whose small-message
# all-reduce is latency-bound: a ring of N GPUs takes 2 (N - 1) hops. Measured per all-reduce:
# 4 GPUs behind one PCIe switch, inside a CUDA graph, 19.4 us at 4 KB and 24.2 us at 32 KB
# (https://github.com/haohervchb/sglang-V100/pull/2, 2026-09-12); 8 GPUs, nccl-tests at 8 bytes,
# 42.6 us on RTX 4090s (https://github.com/NVIDIA/nccl/issues/1530) and 54.2 us on RTX 3090s
# (https://github.com/NVIDIA/nccl/issues/1439, 2024-09-11). 3.2 us a hop gives 19.2 and 44.8 us.
PCIE_NCCL_HOP_S = 3.2e-6
# the largest group an engine's own all-reduce still serves over PCIe alone
PCIE_CUSTOM_ALLREDUCE_MAX_GPUS = 2
# For a GPU whose technology is not listed: the lowest fractions above, so an unknown GPU is
# never predicted faster than a known one of the same datasheet.
DEFAULT_BANDWIDTH_FRAC = min(BANDWIDTH_FRAC.values())
DEFAULT_MATMUL_FRAC = min(f for g in MATMUL_FRAC.values() for f in g.values())


def pcie_allreduce_latency_s(gpus: int) -> float:
    """The latency of NCCL's all-reduce over ``gpus`` GPUs joined only by PCIe, where an
    engine's own all-reduce does not run (more than two GPUs); 0 where it does."""
    if gpus <= PCIE_CUSTOM_ALLREDUCE_MAX_GPUS:
        return 0.0
    return 2 * (gpus - 1) * PCIE_NCCL_HOP_S


def bandwidth_frac(hw: HardwareSpec) -> float:
    return BANDWIDTH_FRAC.get(hw.memory_type or "", DEFAULT_BANDWIDTH_FRAC)


def matmul_frac_for(architecture: str | None, dtype: DType | str) -> float:
    """The documented GEMM fraction of a tensor-core generation for one precision."""
    g = MATMUL_FRAC.get(architecture or "")
    if g is None:
        return DEFAULT_MATMUL_FRAC
    eight = DType(dtype) in (DType.fp8, DType.int8)
    return g.get("8bit", g["16bit"]) if eight else g["16bit"]


@dataclass(frozen=True)
class AchievableCeilings:
    bandwidth_bytes_per_s: float
    bandwidth_source: str
    flops: dict[DType, tuple[float, str]]  # FLOP/s and where the figure came from
    notes: tuple[str, ...] = ()


def host_link_bytes_per_s(hw: HardwareSpec, achievable_figure: bool) -> float | None:
    """One direction of the GPU's link to host memory: the datasheet's figure, or (for an
    engine on achievable ceilings) the published or estimated copy rate, else the datasheet's
    x ``HOST_LINK_FRAC``; None when hardware_db states no host link."""
    h = hw.host_link
    if h is None:
        return None
    if not achievable_figure:
        return h.bandwidth_bytes_per_s
    if h.achievable is not None:
        return h.achievable.value * 1e9
    return h.bandwidth_bytes_per_s * HOST_LINK_FRAC


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
                     "and a documented fraction of its peak FLOP/s assumed "
                     "(planner/core/achievable.py)")
    flops: dict[DType, tuple[float, str]] = {}
    for dt, peak in hw.peak_tflops.items():
        fig = a.matmul_tflops.get(dt) if a is not None else None
        if fig is not None:
            flops[dt] = (fig.value * 1e12, "estimated" if fig.estimated else "achievable")
        else:
            flops[dt] = (peak * 1e12 * matmul_frac_for(hw.architecture, dt), "estimated")
    return AchievableCeilings(bw, bw_src, flops, tuple(notes))
