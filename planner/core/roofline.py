"""Per-operator roofline: operator time, step time, ridge point, optimal batch, MBU and MFU.

Roofline (Williams, Waterman & Patterson, CACM 2009): an operator doing F FLOPs on B bytes takes
    t = max(F / peak_flops_per_s, B / bandwidth_bytes_per_s)      (time_model="roofline")
or, in the background notes' additive form,
    t = F / peak_flops_per_s + B / bandwidth_bytes_per_s           (time_model="additive")
plus a fixed cost per kernel. A step's time is the sum over its operators plus a fixed cost.
A ring all-reduce of S bytes over N GPUs moves 2 (N - 1) / N x S bytes through each GPU's link:
    t = 2 (N - 1) / N x S / link_bytes_per_s + latency_s.
When the N GPUs span servers (N above hardware_db's ``node.gpus_per_node``), the link is the
inter-node network's share per GPU (``node.inter_node``): a hierarchical all-reduce is as slow
as its slowest hop, so TP 16 over two 8-GPU H100 servers runs its all-reduces at 50 GB/s a GPU
(EFA), not NVLink's 450.
Where the GPU's hardware file times the engine's own all-reduce (``allreduce_measured``: NVIDIA
aiconfigurator's tables, per message size and GPU count, replayed from a CUDA graph or launched
eagerly), those times replace the formula within a server: mid-size messages (a prefill's
megabytes) reach well under the link's large-message bandwidth, and an eager launch costs tens
of microseconds however small the message.
The ideal engine uses the datasheet's rates and no costs; a real engine (planner.core.engine) runs
each operator at a fraction of the GPU's achievable rates and pays its costs.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import cached_property

from planner.core.achievable import achievable, host_link_bytes_per_s, pcie_allreduce_latency_s
from planner.core.arith import vmax, vmin
from planner.core.engine import IDEAL, Engine
from planner.core.errors import UsageError
from planner.core.ops import Op
from planner.core.specs import Calibration, DType, HardwareSpec, MeasuredAllreduce, Options

# the operator an eager pass's per-MoE-layer host time (``Engine.moe_layer_host_s``) is charged
# to: one instance a MoE layer, gated or not (planner.core.ops builds it for every routed-expert
# model)
MOE_HOST_OP = "experts_down_proj"


@dataclass(frozen=True)
class Ceilings:
    """The rates the model divides by, and where each came from: the datasheet, the GPU's
    published achievable figures, or a calibration measured by ``llmplan measure``."""

    bandwidth_bytes_per_s: float
    flops_per_s: dict[DType, float]
    link_bytes_per_s: float  # one direction, per GPU
    kernel_overhead_s: float | None = None  # per-kernel cost that overrides the engine's
    # a calibration's measured fixed cost of a memory-bound matmul and of a decode attention
    # kernel (None: kernel_overhead_s, or the engine's, applies to them too)
    matmul_overhead_s: float | None = None
    attention_overhead_s: float | None = None
    source: str = "datasheet"
    notes: tuple[str, ...] = field(default_factory=tuple)
    bandwidth_source: str = "datasheet"
    flops_source: tuple[tuple[DType, str], ...] = ()
    # a measured all-reduce (calibration): replaces the link x engine fraction and latency
    allreduce_bus_bytes_per_s: float | None = None
    allreduce_latency_s: float | None = None
    # the server the GPUs sit in (hardware_db ``node``): a TP group larger than a node runs
    # its all-reduce over the inter-node network, one NIC's share per GPU
    gpus_per_node: int | None = None
    inter_node_bytes_per_s: float | None = None
    inter_node_latency_s: float | None = None
    # one direction of the GPU's link to host memory (hardware_db ``host_link``); None: unknown
    host_link_bytes_per_s: float | None = None
    # GPUs joined only by PCIe, under a real engine: groups of more than two run NCCL's
    # all-reduce, not the engine's own (planner.core.achievable.pcie_allreduce_latency_s)
    pcie_only: bool = False
    # the engine's own all-reduce timed on this GPU (hardware_db allreduce_measured):
    # ((gpus, graphed, message bytes, seconds), ...), each time the least of its size's and
    # every larger size's (``measured_allreduce``)
    allreduce_table: tuple = ()
    # whose timing the table is and where it was published, for the output
    allreduce_timed_by: str = ""
    allreduce_timed_source: str = ""

    def _timed_curve(self, gpus: int, graphed: bool) -> tuple | None:
        """(sizes, seconds) the table holds for ``gpus`` GPUs in this mode; None where it
        holds none, or they span servers."""
        if self.gpus_per_node and gpus > self.gpus_per_node:
            return None
        for n, g, sizes, secs in self.allreduce_table:
            if n == gpus and g == graphed:
                return sizes, secs
        return None

    def measured_allreduce_s(self, gpus: int, graphed: bool, message_bytes: float
                             ) -> float | None:
        """Seconds of one all-reduce of ``message_bytes`` over ``gpus`` GPUs as the engine's
        own timing on this GPU gives it: log-log interpolation between the sizes timed, the
        smallest size's time below them, the largest's bandwidth above; None where no timing
        covers ``gpus`` GPUs in this mode, or they span servers."""
        curve = self._timed_curve(gpus, graphed)
        return None if curve is None else interpolate_loglog(*curve, message_bytes)

    def allreduce_origin(self, gpus: int) -> tuple[str, str] | None:
        """(kind, what) of a TP all-reduce over ``gpus`` GPUs (None on one GPU): a
        calibration's measurement, the engine's own timing on this GPU ("measured", whose),
        or the link formula."""
        if gpus <= 1:
            return None
        if self.allreduce_bus_bytes_per_s:
            return "calibration", "the measured bus bandwidth and latency"
        if self._timed_curve(gpus, True) is not None:
            return "measured", self.allreduce_timed_by
        return ("link formula",
                "2 (N - 1) / N x bytes / (link x the engine's fraction) + latency")

    def allreduce_source(self, gpus: int) -> str | None:
        """``allreduce_origin`` in one line, with the timing's source (``--json``)."""
        origin = self.allreduce_origin(gpus)
        if origin is None:
            return None
        kind, what = origin
        if kind == "measured":
            return f"{what} (hardware_db allreduce_measured: {self.allreduce_timed_source})"
        return f"{kind}: {what}"

    def group_allreduce_latency_s(self, engine_latency_s: float, gpus: int) -> float:
        """An all-reduce's fixed cost over ``gpus`` GPUs within a server: the engine's own,
        or NCCL's over PCIe where the engine's own does not run there."""
        if not self.pcie_only:
            return engine_latency_s
        return max(engine_latency_s, pcie_allreduce_latency_s(gpus))

    def link(self, across_nodes: bool) -> tuple[float, float]:
        """(bytes/s one way per GPU, extra latency) of a transfer within a server, or between
        servers (the slower of the two links, and the network's latency); within a server
        when hardware_db has no inter-node figure."""
        if across_nodes and self.inter_node_bytes_per_s:
            return (min(self.link_bytes_per_s, self.inter_node_bytes_per_s),
                    self.inter_node_latency_s or 0.0)
        return self.link_bytes_per_s, 0.0

    def link_for(self, gpus: int) -> tuple[float, float]:
        """``link`` for a collective over ``gpus`` GPUs: across servers when they are more
        than one server holds (a hierarchical all-reduce is as slow as its slowest hop)."""
        return self.link(bool(self.gpus_per_node) and gpus > self.gpus_per_node)

    def peak(self, dtype: DType) -> float:
        return self.flops_per_s[dtype]

    def kernel_cost_s(self, kind: str, engine: Engine) -> float:
        """The fixed cost of one kernel of an operator of this kind: a calibration's measured
        matmul or attention kernel, else the per-kernel cost that overrides the engine's
        (``kernel_overhead_s``), else the engine's own (``kernel_gap_s``). Any other kind
        (``"plain"``) gets the last two."""
        own = {"matmul": self.matmul_overhead_s,
               "attention": self.attention_overhead_s}.get(kind)
        if own is not None:
            return own
        return self.kernel_overhead_s if self.kernel_overhead_s is not None else \
            engine.kernel_gap_s

    def flops_source_of(self, dtype: DType) -> str:
        return dict(self.flops_source).get(dtype, self.source)


def interpolate_loglog(sizes: tuple, secs: tuple, x: float) -> float:
    """``secs`` at ``x`` on the curve through (``sizes``, ``secs``), straight in log-log
    between points; flat below the first, proportional to ``x`` beyond the last. ``x`` may
    be a numpy array (a vectorized sweep)."""
    if hasattr(x, "clip"):  # an array: element by element, into a copy of its own type
        out = x.astype(float)  # a new array
        flat = out.reshape(-1)
        for i, v in enumerate(flat.tolist()):
            flat[i] = interpolate_loglog(sizes, secs, v)
        return out
    if x <= sizes[0]:
        return secs[0]
    if x >= sizes[-1]:
        return secs[-1] * x / sizes[-1]
    i = bisect.bisect_right(sizes, x)
    x0, x1, y0, y1 = sizes[i - 1], sizes[i], secs[i - 1], secs[i]
    f = math.log(x / x0) / math.log(x1 / x0)
    return y0 * (y1 / y0) ** f


def allreduce_table(m: MeasuredAllreduce) -> tuple:
    """A GPU's measured all-reduce as ``Ceilings.allreduce_table`` holds it: seconds per
    (GPU count, graphed), each size's time the least of its own and every larger size's (a
    larger message cannot take less time: a slower point is a timing run's noise, not the
    kernel's). Eager launches take the graph's times where none were taken."""
    sizes = tuple(float(b) for b in m.message_bytes)
    out = []
    for graphed, rows in ((True, m.graph_us), (False, m.eager_us or m.graph_us)):
        for gpus, us in sorted(rows.items()):
            secs, low = [], math.inf
            for v in reversed(us):
                low = min(low, v * 1e-6)
                secs.append(low)
            out.append((gpus, graphed, sizes, tuple(reversed(secs))))
    return tuple(out)


def ceilings(hw: HardwareSpec, calibration: Calibration | None = None,
             options: Options | None = None, engine: Engine = IDEAL) -> Ceilings:
    """The ceilings ``engine`` runs against: the datasheet's peaks (ideal), or the GPU's
    achievable figures (published copy and GEMM benchmarks in hardware_db; a documented
    fraction of the datasheet where none is published). A calibration's measured figures take
    the place of either."""
    o = options or Options()
    flops = {dt: v * 1e12 for dt, v in hw.peak_tflops.items()}
    src = {dt: "datasheet" for dt in flops}
    bw, bw_src = hw.memory_bandwidth_bytes_per_s, "datasheet"
    source, notes = "datasheet", []
    if engine.ceilings == "achievable":
        ach = achievable(hw)
        bw, bw_src = ach.bandwidth_bytes_per_s, ach.bandwidth_source
        for dt, (v, s) in ach.flops.items():
            flops[dt], src[dt] = v, s
        source = "achievable"
        notes += ach.notes
    # --kernel-overhead-us replaces an engine's fixed cost per kernel; the ideal bound has none
    overhead = None if engine.name == IDEAL.name else o.kernel_overhead_s
    mm_over = attn_over = None
    if calibration is not None:
        source = f"calibration ({calibration.device})"
        bw, bw_src = calibration.memory_bandwidth_gb_per_s * 1e9, source
        for dt, v in calibration.matmul_tflops.items():
            flops[dt], src[dt] = v * 1e12, source
        missing = sorted(d.value for d in hw.peak_tflops if d not in calibration.matmul_tflops)
        if missing:
            notes.append(f"no measured matmul rate for {', '.join(missing)}: "
                         f"{'achievable' if engine.ceilings == 'achievable' else 'datasheet'}"
                         " figure used")
        if overhead is None and calibration.kernel_overhead_us:
            overhead = calibration.kernel_overhead_us * 1e-6
        if o.kernel_overhead_s is None or engine.name == IDEAL.name:
            # --kernel-overhead-us is one cost for every kernel: it replaces these too
            if calibration.matmul_overhead_us is not None:
                mm_over = calibration.matmul_overhead_us * 1e-6
            if calibration.attention_overhead_us is not None:
                attn_over = calibration.attention_overhead_us * 1e-6
    ar_bus = ar_lat = None
    ar_table: tuple = ()
    ar_by = ar_src = ""
    if calibration is not None and calibration.allreduce_bus_gb_per_s:
        ar_bus = calibration.allreduce_bus_gb_per_s * 1e9
        ar_lat = (calibration.allreduce_latency_us or 0.0) * 1e-6
    elif engine.family is not None and engine.family in hw.allreduce_measured:
        m = hw.allreduce_measured[engine.family]
        ar_table = allreduce_table(m)
        ar_by, ar_src = f"{m.engine_version}'s own, timed on {m.device or hw.name}", m.source
    node = hw.node
    inter = node.inter_node if node is not None else None
    return Ceilings(bandwidth_bytes_per_s=bw, flops_per_s=flops,
                    link_bytes_per_s=hw.interconnect.unidirectional_bytes_per_s,
                    gpus_per_node=node.gpus_per_node if node is not None else None,
                    inter_node_bytes_per_s=inter.bandwidth_gb_per_s * 1e9 if inter else None,
                    inter_node_latency_s=(inter.latency_us or 0.0) * 1e-6 if inter else None,
                    host_link_bytes_per_s=host_link_bytes_per_s(
                        hw, engine.ceilings == "achievable"),
                    pcie_only=(engine.ceilings == "achievable"
                               and hw.interconnect.kind.lower().startswith("pcie")),
                    kernel_overhead_s=overhead, matmul_overhead_s=mm_over,
                    attention_overhead_s=attn_over, source=source, notes=tuple(notes),
                    bandwidth_source=bw_src, flops_source=tuple(src.items()),
                    allreduce_bus_bytes_per_s=ar_bus, allreduce_latency_s=ar_lat,
                    allreduce_table=ar_table, allreduce_timed_by=ar_by,
                    allreduce_timed_source=ar_src)


@dataclass(frozen=True)
class OpTime:
    """One operator's timing per step (all its instances). ``compute_s`` and ``memory_s``
    are at the engine's efficiencies; ``overhead_s`` is its kernels' fixed cost and any the
    engine adds to the operator (``Engine.fixed_for``, ``moe_fixed_s``,
    ``attention_fixed_s``)."""

    op: Op
    compute_s: float
    memory_s: float
    comm_s: float
    time_s: float
    bandwidth_frac: float = 1.0
    compute_frac: float = 1.0
    kernels: float = 1.0
    overhead_s: float = 0.0
    # the part of overhead_s the engine adds to the operator: by name (``Engine.fixed_for``),
    # a MoE layer's kernel path's (``moe_fixed_s``) and an attention call's
    # (``attention_fixed_s``)
    fixed_s: float = 0.0
    host_floor_s: float = 0.0  # outside a CUDA graph: the host's launches (and MoE set-up)

    @property
    def bound(self) -> str:
        """What sets the operator's time: its arithmetic (compute), its bytes (memory), its
        kernels' fixed costs where they outweigh both (latency: kernels too small to reach
        either roof, as at batch 1), or outside a CUDA graph the host launching them (host);
        comm and host link for transfers."""
        if self.op.kind == "allreduce":
            return "comm"
        if self.op.kind == "host_transfer":
            return "host link"
        if self.host_floor_s > 0 and self.host_floor_s >= self.time_s:
            return "host"
        if self.overhead_s > max(self.compute_s, self.memory_s):
            return "latency"
        return "compute" if self.compute_s > self.memory_s else "memory"


def tiled_rows(m, tiles: tuple[tuple[float, float], ...]):
    """The rows a GEMM of ``m`` rows computes under ``tiles`` ((bound on M, rows at a time),
    ...; the first bound ``m`` is within applies, the last is inf: ``Engine.fp8_gemm_row_tiles``,
    or the one tile height ``gemm_tile_m`` for every M): ``m`` rounded up to whole tiles of
    that configuration. ``m``: a number or an array (a sweep's)."""
    if hasattr(m, "clip"):  # element-wise, without importing numpy here
        out, below = 0.0 * m, None
        for bound, rows in tiles:
            here = (m <= bound) if below is None else (m <= bound) & ~below
            out = out + here * (-(-m // rows) * rows)
            below = m <= bound
        return out
    for bound, rows in tiles:
        if m <= bound:
            return -(-m // rows) * rows  # as the array branch rounds
    return m  # not reached: the last bound is inf


def _weight_path(op: Op) -> DType:
    """The weight type whose kernel path a matmul takes: fp8 weights computed in 16 bits
    take the int8 path's (see ``op_efficiency``)."""
    wdt = op.weight_dtype
    return DType.int8 if wdt == DType.fp8 and op.dtype != DType.fp8 else wdt


def fp8_kernels(op: Op, e: Engine) -> float:
    """The kernels of the plain cost beside a W8A8 fp8 matmul under engine ``e``: its
    input's quantization, or the GEMM's fixed cost counted in kernels
    (``Engine.fp8_quant_kernels``; ``fp8_block_quant_kernels`` for block-scaled weights; none
    for a routed expert's where the engine's fused MoE kernel quantizes inside itself,
    ``fp8_quant_dense_only``); 0 for any other operator."""
    if op.kind != "matmul" or op.dtype != DType.fp8:
        return 0.0
    if e.fp8_quant_dense_only and op.name.startswith("experts_"):
        return 0.0
    return e.fp8_block_quant_kernels if op.fp8_blocks else e.fp8_quant_kernels


def fp8_input_quant_s(op: Op, c: Ceilings, e: Engine):
    """The pass that quantizes a W8A8 fp8 matmul's 16-bit input before the GEMM, one
    instance: it reads the input ``Engine.fp8_input_reads`` times (with one scale for the
    whole input found at run time, ``fp8_dynamic_tensor_reads``: its maximum first) and writes
    its fp8 copy, at the engine's elementwise share of the bandwidth. The GEMM cannot start
    before it, so nothing hides it. A routed expert's matmul covers its layer's rows
    (``Op.quant_rows``: the tokens before gate_up, their routed copies before down), none
    where the fused MoE kernel quantizes inside itself (``fp8_quant_dense_only``). Charged
    with the kernels beside the GEMM (``op_time``: none where ``fp8_kernels`` is 0); 0 where
    the engine states no reads and for any other operator."""
    if not fp8_kernels(op, e):  # not a W8A8 matmul the engine quantizes the input of
        return 0.0
    reads = e.fp8_dynamic_tensor_reads if op.fp8_dynamic_tensor else e.fp8_input_reads
    if not reads:
        return 0.0
    scalar_zero = isinstance(op.quant_rows, (int, float)) and op.quant_rows == 0
    rows = op.m_rows if scalar_zero else op.quant_rows  # a sweep's are arrays
    moved = rows * op.k_dim * (2.0 * reads + 1.0)  # 16-bit in, 1-byte fp8 out
    return moved / (c.bandwidth_bytes_per_s * e.elementwise_bandwidth_frac)


def experts_compute_factor(op: Op, e: Engine) -> tuple[float, str]:
    """The engine's fused-MoE factor on a routed expert's compute efficiency on this GPU, and
    the profile field it comes from: ``experts_fp8_compute_frac`` for fp8 weights in fp8
    arithmetic, ``experts_compute_frac`` for experts on no quantized path (16-bit); (1, "")
    for other quantized experts, whose kernels differ, and for any other operator."""
    if op.kind != "matmul" or not op.name.startswith("experts_"):
        return 1.0, ""
    wdt = _weight_path(op)
    if wdt == DType.fp8:
        return e.experts_fp8_compute_frac, "experts_fp8_compute_frac"
    if e.quant_fracs(wdt) is None:
        return e.experts_compute_frac, "experts_compute_frac"
    return 1.0, ""


def experts_depth_factor(op: Op, e: Engine) -> float:
    """The share of its rate a routed expert's GEMM of depth K (``Op.k_dim``) keeps in the
    engine's fused MoE kernel on this GPU: K / (K + ``Engine.experts_k_half``; for fp8
    experts ``experts_fp8_k_half``), each output tile's fixed work (loading its rows'
    routing, writing the tile out) weighed against the K it sums over. 1 where the profile
    states no such depth for this GPU and lane, for operators that are not a routed
    expert's matmul, and for experts whose kernels have no fused-MoE factor
    (``experts_compute_factor``: 1, quantized paths other than fp8)."""
    if not op.k_dim or not (e.experts_k_half or e.experts_fp8_k_half):
        return 1.0
    field = experts_compute_factor(op, e)[1]
    k_half = (e.experts_fp8_k_half if field == "experts_fp8_compute_frac"
              else e.experts_k_half if field else 0.0)
    return op.k_dim / (op.k_dim + k_half) if k_half else 1.0


def op_efficiency(op: Op, e: Engine) -> tuple[float, float]:
    """(bandwidth, compute) efficiency of ``op`` under engine ``e``. fp8 weights computed in
    16 bits (a GPU without fp8 tensor cores: A100, A10) take the int8 path's: vLLM runs them
    through FP8 Marlin, "based on existing 8-bit integer support in GPTQ Marlin kernel"
    (https://github.com/vllm-project/vllm/pull/5975, 2024-07-03). A matmul's compute
    efficiency, plain or quantized, is its kernel's times the share of it the engine's served
    steps attain (``Engine.served_compute_frac``); a routed expert's in 16 bits also times the
    engine's fused-MoE factor on this GPU (``Engine.experts_compute_frac``: derived from
    16-bit MoE kernels only), and one in fp8 arithmetic its fused fp8 MoE kernel's
    (``Engine.experts_fp8_compute_frac``), either times the kernel's share at the GEMM's
    depth (``experts_depth_factor``). A 16-bit GEMM's bandwidth efficiency is the
    engine's times its factor for this GPU's architecture (``Engine.gemm_bandwidth_arch_frac``:
    derived from the engine's plain GEMMs, so not the routed experts'); attention's, the
    engine's times its factor for the architecture (``Engine.attention_bandwidth_arch_frac``),
    and its compute efficiency over an fp8 cache times
    ``Engine.fp8_kv_attention_compute_frac``."""
    if op.kind == "matmul":
        q = e.quant_fracs(_weight_path(op))
        bw, comp = q or (e.gemm_bandwidth_frac, e.gemm_compute_frac)
        if op.name.startswith("experts_"):
            # the fused MoE kernel's, at this GEMM's depth
            comp *= experts_compute_factor(op, e)[0] * experts_depth_factor(op, e)
        elif q is None:
            bw *= e.gemm_bandwidth_arch_frac  # the engine's 16-bit GEMM on this architecture
        return bw, comp * e.served_compute_frac
    if op.kind == "attention":  # the engine's attention on this architecture
        fp8 = e.fp8_kv_attention_compute_frac if op.kv_dtype == DType.fp8 else 1.0
        return e.attention_bandwidth_frac * e.attention_bandwidth_arch_frac, \
            e.attention_compute_frac * fp8
    return e.elementwise_bandwidth_frac, 1.0


def combine(compute: float, memory: float, e: Engine, o: Options, *, kernels: float,
            per_kernel_s: float, graphed: bool, fixed_s: float = 0.0,
            host_s: float = 0.0) -> float:
    """One operator instance's time from its compute and memory times under engine ``e``:
    the roofline's max (less the engine's lost overlap) or the additive form, its kernels'
    fixed costs and any device time the engine's profile adds to the operator (``fixed_s``,
    ``Engine.fixed_for``, ``moe_fixed_s`` and ``attention_fixed_s``), and the host's launch
    floor when nothing is replayed from a CUDA graph: its launches and any host time the
    engine spends on the operator beyond them (``host_s``: ``Engine.moe_layer_host_s`` on a
    MoE layer's expert down-projection)."""
    if o.time_model == "additive":
        t = compute + memory
    elif e.overlap_frac == 1.0:
        t = vmax(compute, memory)
    else:  # only part of the shorter time hides under the longer
        t = compute + memory - e.overlap_frac * vmin(compute, memory)
    t = t + kernels * per_kernel_s + fixed_s
    if not graphed and (e.host_launch_s or host_s):
        t = vmax(t, kernels * e.host_launch_s + host_s)  # the host cannot go faster than this
    return t


def moe_fixed_s(op: Op, e: Engine) -> float:
    """Device time a MoE layer's kernel path adds beyond its operators, charged on the
    layer's expert down-projection (one per layer): MXFP4 routed experts' on this GPU
    (``Engine.mxfp4_moe_fixed_s``); 0 for any other operator or weight type."""
    if op.name == MOE_HOST_OP and op.weight_dtype == DType.mxfp4:
        return e.mxfp4_moe_fixed_s
    return 0.0


def attention_fixed_s(op: Op, e: Engine) -> float:
    """Device time a GQA / MHA attention layer's call takes beyond its kernels' on this GPU
    (``Engine.attention_fixed_s``); 0 for MLA's attention (its cache has no ``kv_dtype``:
    the MLA block's own, ``operator_fixed_us.mla_kv_up_proj``) and every other operator."""
    if op.kind == "attention" and op.kv_dtype is not None:
        return e.attention_fixed_s
    return 0.0


def operator_device_fixed_s(op: Op, e: Engine) -> float:
    """Device time one instance of ``op`` takes beyond its kernels' under ``e``: the
    profile's by name (``Engine.fixed_for``), a MoE layer's kernel path's (``moe_fixed_s``)
    and an attention call's (``attention_fixed_s``). What ``op_time`` charges, and the
    simulator's attention path (``planner.serving.cost``) with it."""
    return e.fixed_for(op.name) + moe_fixed_s(op, e) + attention_fixed_s(op, e)


def sparse_padded_heads(heads: float, multiple: float) -> float:
    """A GPU's ``heads`` query heads as a kernel built for a multiple of ``multiple`` runs them:
    rounded up to it."""
    return math.ceil(heads / multiple - 1e-9) * multiple


def op_time(op: Op, c: Ceilings, *, tp: int = 1, options: Options | None = None,
            engine: Engine = IDEAL, graphed: bool = True) -> OpTime:
    """One operator's time under ``engine`` (see planner.core.engine for the equation).
    ``graphed``: the step is replayed from a CUDA graph, so no host launch cost applies."""
    o = options or Options()
    e = engine
    n = op.count
    if op.kind == "allreduce":
        if c.allreduce_bus_bytes_per_s:  # measured: nccl-tests' bus bandwidth and latency
            bus, lat = c.allreduce_bus_bytes_per_s, c.allreduce_latency_s or 0.0
            frac = bus / c.link_bytes_per_s
        else:
            measured = c.measured_allreduce_s(tp, graphed, op.comm_bytes) if tp > 1 else None
            if measured is not None:  # the engine's own, timed on this GPU
                # never under the ideal ring (NVLink SHARP's in-switch reduction beats it by
                # up to 4% at the largest messages timed, 0.5-1 GiB over 8 GPUs): the bound
                # stays a bound
                ring = 2 * (tp - 1) / tp * op.comm_bytes / c.link_bytes_per_s
                measured = vmax(measured, ring + IDEAL.allreduce_latency_s)
                frac = ring / measured
                return OpTime(op, 0.0, 0.0, measured * n, measured * n, frac, 1.0, kernels=n)
            frac = e.allreduce_bandwidth_frac
            link, extra = c.link_for(tp)
            bus, lat = link * frac, c.group_allreduce_latency_s(e.allreduce_latency_s, tp) + extra
        comm = (2 * (tp - 1) / tp * op.comm_bytes / bus + lat) if tp > 1 else 0.0
        # one all-reduce kernel per instance (a layer's), launched as any other outside a graph
        return OpTime(op, 0.0, 0.0, comm * n, comm * n, frac, 1.0, kernels=n)
    if op.kind == "host_transfer":
        if not c.host_link_bytes_per_s:
            raise UsageError("weights kept in host memory need the GPU's host link: its "
                             "hardware file states no host_link", fields=("cpu_offload_gb",))
        t = op.comm_bytes / c.host_link_bytes_per_s
        return OpTime(op, 0.0, 0.0, t * n, t * n, kernels=0.0)
    bw_frac, c_frac = op_efficiency(op, e)
    flops = op.flops
    scalar_zero = isinstance(op.m_rows, (int, float)) and op.m_rows == 0
    if op.kind == "matmul" and not scalar_zero:
        # tile quantization: M rows are computed in whole tiles, of the height the fp8
        # kernel's configuration for this M has (W8A8 GEMMs: fp8 weights and arithmetic, not
        # the routed experts' fused kernel) where the engine states them, else gemm_tile_m
        tiles = (e.fp8_gemm_row_tiles if op.dtype == DType.fp8
                 and op.weight_dtype == DType.fp8 and not op.name.startswith("experts_")
                 else ()) or (((math.inf, e.gemm_tile_m),) if e.gemm_tile_m > 1 else ())
        if tiles:
            flops = flops * (tiled_rows(op.m_rows, tiles) / op.m_rows)
    if op.name == "attention_sparse" and e.sparse_mla_heads and op.heads:
        # the sparse MLA kernel computes the GPU's heads padded to its multiple (FlashMLA's
        # sparse kernels take 64 or 128 query heads): 16 a GPU at TP 8 compute as 64
        flops = flops * sparse_padded_heads(op.heads, e.sparse_mla_heads) / op.heads
    compute = flops / (c.peak(op.dtype) * c_frac)
    moved = op.bytes
    if op.kind == "attention" and not e.gqa_kv_reuse:
        moved = moved + op.kv_bytes * (op.kv_group - 1)  # K and V read once per query head
    if e.kv_cache_concat:
        moved = moved + 2 * op.kv_cache_bytes  # the old cache read and written anew
    memory = moved / (c.bandwidth_bytes_per_s * bw_frac)
    if (op.kind == "attention" and op.kv_dtype == DType.fp8
            and e.fp8_kv_attention_bytes_per_s):
        # the kernel converts each fp8 value of the cache it reads: the cache comes in no
        # faster than that pace on this GPU, and never slower than the same cache in 16 bits
        # would (the queries and outputs at the bandwidth's share)
        paced = vmax(e.fp8_kv_attention_bytes_per_s / c.bandwidth_bytes_per_s, 0.5 * bw_frac)
        if paced < bw_frac:
            kv = moved - op.act_bytes
            memory = memory + kv / c.bandwidth_bytes_per_s * (1.0 / paced - 1.0 / bw_frac)
            # the share reported: of all its bytes (the queries and outputs outweigh the
            # cache in a prefill); the cache's where a sweep passes arrays
            bw_frac = (moved / (memory * c.bandwidth_bytes_per_s)
                       if isinstance(memory, float) and memory > 0 else paced)
    k = e.kernels_for(op.name, op.kind)
    per_kernel = c.kernel_cost_s(op.kind, e)
    q = fp8_kernels(op, e)
    if q:  # W8A8: the activations are quantized first, by kernels of the plain cost
        per_kernel = (k * per_kernel + q * c.kernel_cost_s("plain", e)) / (k + q)
        k = k + q
    fixed = operator_device_fixed_s(op, e)
    host = e.moe_layer_host_s if op.name == MOE_HOST_OP else 0.0
    # W8A8: the input's quantization pass runs before the GEMM, its bytes in series
    quant = fp8_input_quant_s(op, c, e) if q else 0.0
    t = combine(compute, memory, e, o, kernels=k, per_kernel_s=per_kernel, graphed=graphed,
                fixed_s=fixed + quant, host_s=host)
    memory = memory + quant
    floor = 0.0 if graphed or not (e.host_launch_s or host) else k * e.host_launch_s + host
    return OpTime(op, compute * n, memory * n, 0.0, t * n, bw_frac, c_frac, k * n,
                  (k * per_kernel + fixed) * n, fixed * n, floor * n)


@dataclass(frozen=True)
class StepTime:
    """A forward step: its operators' timings, the engine's fixed cost, and totals."""

    ops: tuple[OpTime, ...]
    fixed_s: float = 0.0  # the engine's CPU cost of the step
    overlapped: bool = False  # async scheduling: that cost runs beside the GPU's work
    serial_s: float = 0.0  # a host cost on the step's path that nothing hides (``Engine.worker_s``)
    launch_s: float = 0.0  # overlapped outside a CUDA graph: the host launches the step first

    @cached_property
    def time_s(self) -> float:
        return with_host(sum(t.time_s for t in self.ops), self.fixed_s, self.overlapped,
                         self.launch_s) + self.serial_s

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
    def overhead_s(self) -> float:
        """Kernel costs plus the step's fixed cost, as much of it as is exposed."""
        ops = sum(t.overhead_s for t in self.ops)
        if not self.overlapped:
            return ops + self.fixed_s + self.serial_s
        return ops + self.time_s - sum(t.time_s for t in self.ops)

    @property
    def exposed_host_s(self) -> float:
        """The part of the step's host work (its fixed cost, and under async scheduling an
        eager step's launches) that the step waits for: all of the fixed cost, or, with that
        work beside the GPU's (``overlapped``), only what outlasts the GPU's work."""
        if not self.overlapped:
            return self.fixed_s
        exposed = self.time_s - self.serial_s - sum(t.time_s for t in self.ops)
        return exposed if exposed > 1e-9 else 0.0  # below a nanosecond: rounding's residue

    @property
    def kernels(self) -> float:
        return sum(t.kernels for t in self.ops)

    @property
    def operator_fixed_s(self) -> float:
        """Device time the engine adds to operators beyond their kernels (``Engine.fixed_for``,
        ``moe_fixed_s``, ``attention_fixed_s``), part of ``overhead_s``."""
        return sum(t.fixed_s for t in self.ops)

    @property
    def bound(self) -> str:
        """Which of the step's total compute and memory times is larger."""
        return "compute" if self.compute_s > self.memory_s else "memory"

    @property
    def limiter(self) -> str:
        """What takes most of the step's time: its operators' time summed by what sets each
        (``OpTime.bound``), beside the host's work the step waits for (cpu)."""
        by: dict[str, float] = {"cpu": self.exposed_host_s + self.serial_s}
        for t in self.ops:
            by[t.bound] = by.get(t.bound, 0.0) + t.time_s
        return max(by, key=by.__getitem__)


def with_host(gpu_s, host_s, overlapped: bool, launch_s=0.0):
    """A step's time from its GPU work and the engine's host work for it: their sum, or,
    with async scheduling (``overlapped``: the host prepares the next step while the GPU
    runs this one), the longer of the GPU's work and the host's, which is the step's kernel
    launches (``launch_s``: none for a step replayed from a CUDA graph) and then that work.
    Numbers or numpy arrays."""
    if not overlapped:
        return gpu_s + host_s
    host_s = host_s + launch_s
    return (gpu_s + host_s + abs(gpu_s - host_s)) / 2


def launch_time_s(times, e: Engine) -> float:
    """The host's time launching these operators' kernels one by one, outside a CUDA graph
    (``OpTime.kernels`` at the engine's ``host_launch_s`` each), and the time it spends on each
    MoE layer beyond them (``Engine.moe_layer_host_s``)."""
    kernels = sum(t.kernels for t in times)
    moe = sum(t.op.count for t in times if t.op.name == MOE_HOST_OP)
    return kernels * e.host_launch_s + moe * e.moe_layer_host_s


def step_time(ops: list[Op], c: Ceilings, *, tp: int = 1, options: Options | None = None,
              engine: Engine = IDEAL, graphed: bool = True, fixed_s: float = 0.0,
              serial_s: float = 0.0, stream: bool = False) -> StepTime:
    """``stream``: a step that follows another (a decode step), whose host work runs beside
    that one's GPU work under async scheduling, graphed or not (``Engine.overlaps_host``; an
    eager step's launches first); otherwise (a lone prefill) only a graphed step's does."""
    times = tuple(op_time(op, c, tp=tp, options=options, engine=engine, graphed=graphed)
                  for op in ops)
    if not stream:
        return StepTime(times, fixed_s, engine.hides_host(graphed), serial_s)
    launch = 0.0 if graphed else launch_time_s(times, engine)
    return StepTime(times, fixed_s, engine.overlaps_host(), serial_s, launch)


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
