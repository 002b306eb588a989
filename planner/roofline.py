"""Per-operator roofline: operator time, step time, ridge point, optimal batch, MBU and MFU.

Roofline (Williams, Waterman & Patterson, CACM 2009): an operator doing F FLOPs on B bytes takes
    t = max(F / peak_flops_per_s, B / bandwidth_bytes_per_s)      (time_model="roofline")
or, in the background notes' additive form,
    t = F / peak_flops_per_s + B / bandwidth_bytes_per_s           (time_model="additive")
plus an optional fixed per-kernel overhead. A step's time is the sum over its operators.
A ring all-reduce of S bytes over N GPUs moves 2 (N - 1) / N x S bytes through each GPU's link:
    t = 2 (N - 1) / N x S / link_bytes_per_s + latency_s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.arith import vmax
from planner.ops import Op
from planner.specs import Calibration, DType, HardwareSpec, Options


@dataclass(frozen=True)
class Ceilings:
    """The rates the model divides by: the datasheet's, or measured ones from a calibration."""

    bandwidth_bytes_per_s: float
    flops_per_s: dict[DType, float]
    link_bytes_per_s: float  # one direction, per GPU
    kernel_overhead_s: float = 0.0
    source: str = "datasheet"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def peak(self, dtype: DType) -> float:
        return self.flops_per_s[dtype]


def ceilings(hw: HardwareSpec, calibration: Calibration | None = None,
             options: Options | None = None) -> Ceilings:
    """Datasheet peaks, with any measured ones from ``calibration`` taking their place."""
    o = options or Options()
    flops = {dt: v * 1e12 for dt, v in hw.peak_tflops.items()}
    bw = hw.memory_bandwidth_bytes_per_s
    overhead = o.kernel_overhead_s
    source, notes = "datasheet", []
    if calibration is not None:
        source = f"calibration ({calibration.device})"
        bw = calibration.memory_bandwidth_gb_per_s * 1e9
        for dt, v in calibration.matmul_tflops.items():
            flops[dt] = v * 1e12
        missing = sorted(d.value for d in hw.peak_tflops if d not in calibration.matmul_tflops)
        if missing:
            notes.append(f"no measured matmul rate for {', '.join(missing)}: datasheet used")
        if overhead == 0.0:
            overhead = calibration.kernel_overhead_us * 1e-6
    return Ceilings(bandwidth_bytes_per_s=bw, flops_per_s=flops,
                    link_bytes_per_s=hw.interconnect.unidirectional_bytes_per_s,
                    kernel_overhead_s=overhead, source=source, notes=tuple(notes))


@dataclass(frozen=True)
class OpTime:
    """One operator's timing per step (all its instances)."""

    op: Op
    compute_s: float
    memory_s: float
    comm_s: float
    time_s: float

    @property
    def bound(self) -> str:
        if self.op.kind == "allreduce":
            return "comm"
        return "compute" if self.compute_s > self.memory_s else "memory"


def op_time(op: Op, c: Ceilings, *, tp: int = 1, options: Options | None = None) -> OpTime:
    o = options or Options()
    n = op.count
    if op.kind == "allreduce":
        comm = (2 * (tp - 1) / tp * op.comm_bytes / c.link_bytes_per_s
                + o.allreduce_latency_s) if tp > 1 else 0.0
        return OpTime(op, 0.0, 0.0, comm * n, comm * n)
    compute = op.flops / c.peak(op.dtype)
    memory = op.bytes / c.bandwidth_bytes_per_s
    t = vmax(compute, memory) if o.time_model == "roofline" else compute + memory
    return OpTime(op, compute * n, memory * n, 0.0, (t + c.kernel_overhead_s) * n)


@dataclass(frozen=True)
class StepTime:
    """A forward step: its operators' timings and totals."""

    ops: tuple[OpTime, ...]

    @property
    def time_s(self) -> float:
        return sum(t.time_s for t in self.ops)

    @property
    def flops(self) -> float:
        return sum(t.op.flops * t.op.count for t in self.ops)

    @property
    def bytes(self) -> float:
        return sum(t.op.bytes * t.op.count for t in self.ops)

    @property
    def weight_and_kv_bytes(self) -> float:
        """The bytes MBU counts: weights read plus KV cache read and written."""
        return sum((t.op.weight_bytes + t.op.kv_bytes) * t.op.count for t in self.ops)

    @property
    def compute_s(self) -> float:
        return sum(t.compute_s for t in self.ops)

    @property
    def memory_s(self) -> float:
        return sum(t.memory_s for t in self.ops)

    @property
    def comm_s(self) -> float:
        return sum(t.comm_s for t in self.ops)

    @property
    def bound(self) -> str:
        """Which of the step's total compute and memory times is larger."""
        return "compute" if self.compute_s > self.memory_s else "memory"


def step_time(ops: list[Op], c: Ceilings, *, tp: int = 1,
              options: Options | None = None) -> StepTime:
    return StepTime(tuple(op_time(op, c, tp=tp, options=options) for op in ops))


def ridge_flops_per_byte(peak_flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """Arithmetic intensity where the compute roof meets the memory slope."""
    return peak_flops_per_s / bandwidth_bytes_per_s


def optimal_batch(peak_flops_per_s: float, bytes_per_param: float,
                  bandwidth_bytes_per_s: float) -> float:
    """Batch at which a decode step's compute time equals its weight-read time.

    2 N B / peak = N bytes_per_param / bandwidth  =>  B = peak x bytes_per_param / (2 bandwidth)
    (background notes, "The optimal batch size"). H100 SXM, 16-bit: 989.4e12 x 2 / (2 x 3.35e12)
    = 295; A100 40GB: 312e12 x 2 / (2 x 1.555e12) = 201. The KV cache is left out, as the
    notes do; the usable optimum is capped by the largest batch that fits.
    """
    return peak_flops_per_s * bytes_per_param / (2 * bandwidth_bytes_per_s)


def mbu(bytes_moved: float, time_s: float, bandwidth_bytes_per_s: float) -> float:
    """Model bandwidth utilization: achieved bytes/s over peak bytes/s.

    A 7B model in 16-bit (14 GB) at a 14 ms TPOT moves 1 TB/s: MBU 0.5 on a 2 TB/s GPU.
    """
    return bytes_moved / time_s / bandwidth_bytes_per_s


def mfu(flops: float, time_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilization (PaLM, Chowdhery et al. 2022, appendix B)."""
    return flops / time_s / peak_flops_per_s
