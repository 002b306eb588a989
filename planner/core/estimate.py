"""Workload -> Estimate: memory, FLOPs, TTFT, TPOT, latency, throughput, MBU/MFU and cost.

Every timing figure is the engine's expected one (planner.core.engine: achievable ceilings, kernel
efficiencies, launch and per-step costs); ``Estimate.ideal`` holds the same figures for the
ideal roofline of the same deployment (datasheet peaks, no overheads, the engine's byte
accounting), which is the bound no engine beats.

- TTFT is the time of the prefill step over batch x prompt_tokens tokens (causal attention),
  plus the engine's fixed cost per prefill pass, one pass per chunk of prefill_chunk_tokens.
- TPOT is the time of one decode step at the mean context of the generation,
  prompt_tokens + output_tokens / 2: step time is linear in the context through the attention
  term, so this is the mean over the output's decode steps.
- latency = TTFT + TPOT x (output_tokens - 1); decode throughput = batch / TPOT tokens/s.
- End-to-end throughput counts the prefill too: batch x output_tokens / latency; cost per
  million output tokens = price per GPU-hour x GPUs / 3600 / end-to-end throughput x 1e6.
- MBU = (weight + KV bytes per decode step) / TPOT / datasheet bandwidth;
  MFU = FLOPs per step / step time / datasheet peak FLOP/s of the compute precision: a real
  engine's MBU is well below 1, the ideal roofline's close to 1.
- ridge point and optimal batch are properties of the GPU and the model, not of an engine:
  they use the reference ceilings (the datasheet, or a calibration when one is given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from planner.core.arith import vmax, vmin, vwhere
from planner.core.engine import IDEAL, Engine, prefill_graph_counts
from planner.core.errors import UsageError
from planner.core.headline import Headline
from planner.core.memory import MemoryPlan, kv_cache_bytes_per_token, memory_plan
from planner.core.ops import (
    SAMPLING_OPS,
    active_params,
    check_runs_on,
    check_tp,
    count_params,
    decode_ops,
    flops_per_token_2n,
    host_transfer_ops,
    prefill_ops,
    total_flops,
)
from planner.core.roofline import (
    Ceilings,
    StepTime,
    ceilings,
    mbu,
    mfu,
    op_time,
    optimal_batch,
    ridge_flops_per_byte,
    step_time,
)
from planner.core.specs import (
    Calibration,
    DType,
    HardwareSpec,
    ModelSpec,
    Options,
    Parallelism,
    Precision,
    Workload,
)


@dataclass(frozen=True)
class Measured:
    """Utilisation implied by a measured TTFT and / or TPOT for the same configuration."""

    tpot_s: float | None = None
    ttft_s: float | None = None
    achieved_bandwidth_bytes_per_s: float | None = None
    mbu: float | None = None
    mfu: float | None = None
    achieved_prefill_flops_per_s: float | None = None
    prefill_mfu: float | None = None


@dataclass(frozen=True)
class Estimate:
    model: ModelSpec
    hardware: HardwareSpec
    precision: Precision
    # numbers for one estimate, or equally shaped numpy arrays in a vectorized sweep
    batch: int
    prompt_tokens: int
    output_tokens: int
    tp: int
    options: Options
    ceilings: Ceilings
    memory: MemoryPlan
    params: int
    active_params: int
    kv_cache_bytes_per_token: float
    decode_context_tokens: float
    decode: StepTime
    prefill: StepTime
    decode_flops_per_token: float
    prefill_flops: float
    flops_per_token_2n: float
    price_usd_per_gpu_hour: float | None
    price_source: str | None
    measured: Measured | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    engine: Engine = IDEAL
    # the reference ceilings (datasheet, or a calibration): ridge point and optimal batch
    reference: Ceilings | None = None
    # the ideal roofline of the same deployment (None when this estimate is the ideal one)
    ideal: Estimate | None = None

    # ----- derived figures
    @property
    def ref(self) -> Ceilings:
        return self.reference or self.ceilings

    @property
    def bound_estimate(self) -> Estimate:
        """The ideal roofline's estimate of this deployment (itself for the ideal engine)."""
        return self.ideal or self

    @property
    def peak_flops_per_s(self) -> float:
        return self.ref.peak(self.precision.compute_dtype)

    @property
    def datasheet_peak_flops_per_s(self) -> float:
        return self.hardware.peak_flops_per_s(self.precision.compute_dtype)

    @property
    def ridge_flops_per_byte(self) -> float:
        return ridge_flops_per_byte(self.peak_flops_per_s, self.ref.bandwidth_bytes_per_s)

    @property
    def optimal_batch(self) -> float:
        """``optimal_batch``; for a mixture of experts the step reads every expert (each is
        touched once B x top-k passes the expert count) while a token computes with its
        active parameters alone, so the balance comes at params / active params times the
        dense figure (Qwen3-30B-A3B: about 9x; at the dense figure its experts are still
        memory-bound, each seeing B x top-k / experts tokens)."""
        b = optimal_batch(self.peak_flops_per_s, self.precision.quantized_bytes_per_param,
                          self.ref.bandwidth_bytes_per_s)
        return b * self.params / self.active_params if self.model.moe is not None else b

    @property
    def usable_optimal_batch(self) -> int:
        n = vmin(math.floor(self.optimal_batch), self.memory.max_batch)
        return int(n) if isinstance(n, (int, float)) else n

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def ttft_s(self) -> float:
        return self.prefill.time_s

    @property
    def tpot_s(self) -> float:
        return self.decode.time_s

    @property
    def headline(self) -> Headline:
        return Headline(self.ttft_s, self.tpot_s, self.batch, self.output_tokens, self.num_gpus,
                        self.price_usd_per_gpu_hour)

    @property
    def latency_s(self) -> float:
        return self.headline.latency_s

    @property
    def throughput_tokens_per_s(self) -> float:
        return self.headline.throughput_tokens_per_s

    @property
    def e2e_throughput_tokens_per_s(self) -> float:
        return self.headline.e2e_throughput_tokens_per_s

    @property
    def mbu(self) -> float:
        return mbu(self.decode.weight_and_kv_bytes, self.tpot_s,
                   self.hardware.memory_bandwidth_bytes_per_s)

    @property
    def mfu(self) -> float:
        return mfu(self.decode.flops, self.tpot_s, self.datasheet_peak_flops_per_s)

    @property
    def prefill_mfu(self) -> float:
        return mfu(self.prefill.flops, self.ttft_s, self.datasheet_peak_flops_per_s)

    @property
    def compute_bound(self) -> bool:
        """Decode step: total compute time exceeds total memory time (array-safe)."""
        return self.decode.compute_s > self.decode.memory_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_bound else "memory"

    @property
    def num_gpus(self) -> int:
        return self.tp

    @property
    def cost_usd_per_million_output_tokens(self) -> float | None:
        return self.headline.cost_usd_per_million_output_tokens

    def columns(self) -> dict:
        """The figures of this estimate keyed with their units: numbers, or arrays in a sweep.
        ``compute_bound`` is the raw flag; ``to_dict`` and the sweep turn it into ``bound``."""
        m = self.memory
        return {
            "batch": self.batch,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "params": self.params,
            "active_params": self.active_params,
            "weight_bytes_per_param": self.precision.quantized_bytes_per_param,
            "weights_bytes": m.weights_bytes,
            "cpu_offload_bytes": m.offloaded_weights_bytes,
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "kv_cache_bytes": m.kv_cache_bytes,
            "activation_bytes": m.activation_bytes,
            "reserve_bytes": m.reserve_bytes,
            "total_memory_bytes": m.total_bytes,
            "capacity_bytes": m.capacity_bytes,
            "usable_memory_bytes": m.usable_bytes,
            "memory_used_frac": m.used_frac,
            "fits": m.fits,
            "decode_flops_per_token": self.decode_flops_per_token,
            "flops_per_token_2n": self.flops_per_token_2n,
            "prefill_flops": self.prefill_flops,
            "peak_flops_per_s": self.peak_flops_per_s,
            "bandwidth_bytes_per_s": self.ref.bandwidth_bytes_per_s,
            "ridge_flops_per_byte": self.ridge_flops_per_byte,
            "optimal_batch": self.optimal_batch,
            "usable_optimal_batch": self.usable_optimal_batch,
            "max_batch": m.max_batch,
            "compute_bound": self.compute_bound,
            "decode_context_tokens": self.decode_context_tokens,
            **self.timing(),
            "decode_comm_s": self.decode.comm_s,
            "decode_overhead_s": self.decode.overhead_s,
            "price_usd_per_gpu_hour": self.price_usd_per_gpu_hour,
            **self.ideal_columns(),
        }

    def ideal_columns(self) -> dict:
        """The ideal roofline's headline timing beside the engine's (a sweep's columns)."""
        b = self.bound_estimate
        return {"ideal_ttft_s": b.ttft_s, "ideal_tpot_s": b.tpot_s,
                "ideal_latency_s": b.latency_s,
                "ideal_throughput_tokens_per_s": b.throughput_tokens_per_s, "ideal_mbu": b.mbu}

    def timing(self) -> dict:
        """The figures that depend on the engine's speed, keyed with their units."""
        return {
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "latency_s": self.latency_s,
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "e2e_throughput_tokens_per_s": self.e2e_throughput_tokens_per_s,
            "mbu": self.mbu,
            "mfu": self.mfu,
            "prefill_mfu": self.prefill_mfu,
            "cost_usd_per_million_output_tokens": self.cost_usd_per_million_output_tokens,
        }

    def engine_info(self) -> dict:
        e = self.engine
        return {"name": e.name, "display_name": e.display_name, "version": e.version,
                "release": e.release, "source": e.source, "ceilings": self.ceilings.source,
                "bandwidth_source": self.ceilings.bandwidth_source,
                "flops_source": self.ceilings.flops_source_of(self.precision.compute_dtype)}

    def kv_concurrency(self, *, max_model_len: int | None = None):
        """Requests of this workload's length the KV cache holds at once, paged (the engine's
        blocks) and contiguous (``max_model_len`` reserved each; default the model's
        context), with the share of the reservation holding tokens. The pool is sized as the
        simulator sizes it: the engine's ``max_num_seqs`` and a step of its
        ``max_num_batched_tokens`` (or the prefill chunk given), in whole blocks."""
        from planner.core.memory import kv_capacity_tokens, kv_concurrency, sliding_share

        e = self.engine
        chunk = self.options.prefill_chunk_tokens or e.max_num_batched_tokens
        cap = kv_capacity_tokens(self.model, self.hardware, self.precision, tp=self.tp,
                                 options=self.options, lm_head_sharded=e.lm_head_sharded,
                                 max_num_seqs=e.max_num_seqs, step_tokens=chunk, engine=e)
        cap = cap // e.block_size * e.block_size  # whole blocks, as the engine's pool
        return kv_concurrency(cap, prompt_tokens=int(self.prompt_tokens),
                              output_tokens=int(self.output_tokens), block_size=e.block_size,
                              max_model_len=max_model_len or self.model.max_position_embeddings,
                              sliding=sliding_share(self.model))

    def to_dict(self, *, operators: bool = True) -> dict:
        """A JSON-ready dict (what `--json` prints): values in SI base units, each key naming
        its unit (`weights_bytes`, `tpot_s`, `throughput_tokens_per_s`); a key without one is a
        count, a fraction (`mbu`, `mfu`), a label or a nested record. Scripts read these keys:
        rename none."""
        p = self.precision
        cols = self.columns()
        cols["bound"] = "compute" if cols.pop("compute_bound") else "memory"
        out = {
            "model": self.model.name,
            "gpu": self.hardware.name,
            "tp": self.tp,
            "num_gpus": self.num_gpus,
            "weights": p.weights.value,
            "quantized_layers": p.quantized_layers,
            "kv_cache": p.kv_cache.value,
            "compute": p.compute_dtype.value,
            "time_model": self.options.time_model,
            "attention": self.options.attention,
            "memory_utilization_frac": self.memory.utilization_frac,
            "memory_utilization_basis": self.memory.utilization_basis,
            # the KV cache given outright per GPU, and its token cap (None: not given)
            "kv_cache_memory_bytes": self.options.kv_cache_memory_bytes,
            "kv_cache_max_tokens": self.options.kv_cache_max_tokens,
            "ceilings_source": self.ceilings.source,
            # where a TP all-reduce's time comes from (None on one GPU)
            "allreduce_source": self.ceilings.allreduce_source(self.tp),
            **cols,
            "price_source": self.price_source,
            "notes": list(self.notes),
            "engine": self.engine_info(),
        }
        b = self.bound_estimate
        out["ideal"] = {**b.timing(), "bound": b.bound, "ceilings_source": b.ceilings.source}
        kc = self.kv_concurrency()
        out["kv_concurrency"] = {
            "kv_capacity_tokens": kc.capacity_tokens, "block_size": kc.block_size,
            "max_model_len": kc.max_model_len, "max_concurrency_paged": kc.paged,
            "max_concurrency_contiguous": kc.contiguous,
            "kv_used_frac_paged": kc.paged_used_frac,
            "kv_used_frac_contiguous": kc.contiguous_used_frac}
        for k in [k for k in out if k.startswith("ideal_")]:
            del out[k]
        if self.measured is not None:
            out["measured"] = dict(self.measured.__dict__)
        if operators:
            out["operators"] = {"decode": _op_rows(self.decode, self.ceilings),
                                "prefill": _op_rows(self.prefill, self.ceilings),
                                "decode_fixed_s": self.decode.fixed_s,
                                "prefill_fixed_s": self.prefill.fixed_s}
        return out


def _op_rows(step: StepTime, c: Ceilings) -> list[dict]:
    return [{
        "name": t.op.name,
        "kind": t.op.kind,
        "count": t.op.count,
        "dtype": t.op.dtype.value,
        "flops": t.op.flops * t.op.count,
        "bytes": t.op.bytes * t.op.count,
        "weight_bytes": t.op.weight_bytes * t.op.count,
        "kv_bytes": t.op.kv_bytes * t.op.count,
        "act_bytes": t.op.act_bytes * t.op.count,
        "comm_bytes": t.op.comm_bytes * t.op.count,
        "intensity_flops_per_byte": (t.op.flops / t.op.bytes) if t.op.bytes else None,
        "compute_s": t.compute_s,
        "memory_s": t.memory_s,
        "comm_s": t.comm_s,
        "time_s": t.time_s,
        "bound": t.bound,
        "kernels": t.kernels,
        "overhead_s": t.overhead_s,
        "operator_fixed_s": t.fixed_s,
        "bandwidth_frac": t.bandwidth_frac,
        "compute_frac": t.compute_frac,
        "bandwidth_source": c.bandwidth_source,
        "flops_source": c.flops_source_of(t.op.dtype),
    } for t in step.ops]


def estimate(
    model: ModelSpec,
    hardware: HardwareSpec,
    *,
    precision: Precision | None = None,
    workload: Workload | None = None,
    parallelism: Parallelism | None = None,
    options: Options | None = None,
    calibration: Calibration | None = None,
    price_usd_per_gpu_hour: float | None = None,
    measured_tpot_s: float | None = None,
    measured_ttft_s: float | None = None,
    engine: Engine = IDEAL,
) -> Estimate:
    """Predict one deployment: ``model`` on ``parallelism.tp`` GPUs of ``hardware``, served
    by ``engine`` (the ideal roofline unless one is given)."""
    o = options or Options()
    tp = (parallelism or Parallelism()).tp
    check_tp(model, tp)
    prep = prepare(hardware, precision or Precision(), calibration, o, engine)
    return estimate_prepared(model, hardware, prep, o, tp=tp, workload=workload or Workload(),
                             calibration=calibration,
                             price_usd_per_gpu_hour=price_usd_per_gpu_hour,
                             measured_tpot_s=measured_tpot_s, measured_ttft_s=measured_ttft_s)


def estimate_prepared(model: ModelSpec, hardware: HardwareSpec, prep: Prepared, o: Options, *,
                      tp: int, workload: Workload, calibration: Calibration | None = None,
                      price_usd_per_gpu_hour: float | None = None,
                      measured_tpot_s: float | None = None,
                      measured_ttft_s: float | None = None) -> Estimate:
    """``estimate`` of a deployment whose engine and precision are already prepared (a
    ``planner.layouts.deployment.Deployment`` carries them)."""
    w = workload
    check_runs_on(model, hardware)
    price, price_source = resolve_price(hardware, price_usd_per_gpu_hour)
    notes = list(prep.notes)
    if model.sparse_topk is not None:
        notes.append(f"sparse attention: each query attends to the {model.sparse_topk:,} "
                     "cached tokens its indexer picks; the indexer scores every cached token "
                     "(fp8), and its keys are cached beside the latents")
    if calibration is not None and calibration.device != hardware.name:
        notes.append(f"the calibration was measured on {calibration.device}, not on "
                     f"{hardware.name}: its ceilings stand in for this GPU's")
    if tp > model.num_kv_heads and model.mla is None:
        notes.append(f"tp {tp} > {model.num_kv_heads} KV heads: KV heads replicated")
    if model.vision_uncounted:
        notes.append("its vision (or other) encoder is not counted: the weights are its "
                     "language model's alone, and the requests are text")
    if model.vision_params:
        notes.append(f"the vision encoder's {model.vision_params / 1e9:.2f}B parameters are "
                     "in the weights (16-bit); the requests are text, which never run it, and "
                     "the engine's encoder cache and image profiling are not reserved")
    est = assemble(model, hardware, prep, o, tp=tp, batch=w.batch,
                   prompt_tokens=w.prompt_tokens, output_tokens=w.output_tokens,
                   price_usd_per_gpu_hour=price, price_source=price_source, notes=notes)
    e, name, said = prep.engine, prep.engine.display_name or prep.engine.name, []
    if e.refuses_prompt(w.prompt_tokens):
        said.append(f"{name} refuses this prompt with its defaults: {int(w.prompt_tokens):,} "
                    f"tokens are above its step's token budget of {e.max_num_batched_tokens:,} "
                    "with chunked prefill off (simulate refuses such requests); the TTFT here "
                    "is its prefill's, were it admitted")
    if e.name != "ideal" and bool(est.memory.fits) and w.batch > 1:
        kc = est.kv_concurrency()
        if kc.paged < w.batch:  # the static plan's KV fits; the engine's pool holds fewer
            chunk = o.prefill_chunk_tokens or e.max_num_batched_tokens
            said.append(f"served, {name}'s KV pool holds {kc.paged:,} requests of these "
                        f"lengths, not {w.batch:,}: it sizes the pool after the activations of "
                        f"a step of {chunk:,} tokens and its scheduler's limits, so a batch "
                        "this large is preempted (simulate)")
    start = startup_max_model_len(est)
    if start is not None and start[1] > 0:  # none at all: the memory table says it
        said.append(f"{name} would not start: its KV cache holds one request of about "
                    f"{start[1]:,} tokens, under its max-model-len of {start[0]:,} (the "
                    "model's context unless set; it checks at start-up); serve it with a "
                    f"max-model-len of {start[1]:,} or less")
    if said:
        est = replace(est, notes=(*est.notes, *said))
    if measured_tpot_s is None and measured_ttft_s is None:
        return est
    return _with_measured(est, measured_tpot_s, measured_ttft_s)


def startup_max_model_len(est: Estimate) -> tuple[int, int] | None:
    """(max-model-len, the longest that starts) where the engine checks at start-up that its
    KV cache holds one request of its max-model-len (vLLM's check_enough_kv_cache_memory,
    ``Engine.startup_kv_check``) and this deployment's does not; None where it starts (or
    the engine does not check). The pool is the simulator's (``Estimate.kv_concurrency``).
    Models with sliding-window layers are not checked: vLLM counts those layers' window plus
    a step's tokens, which the pool's accounting does not."""
    e = est.engine
    if not e.startup_kv_check or est.model.num_sliding_layers:
        return None
    need = e.max_model_len or est.model.max_position_embeddings
    # the pool is whole blocks: one request of n tokens fits while its blocks do, up to cap
    cap = est.kv_concurrency().capacity_tokens
    return None if need <= cap else (need, cap)


@dataclass(frozen=True)
class Prepared:
    """What an engine needs before the arithmetic: the precision as it will run with the
    engine's byte accounting, the engine's ceilings and the reference (ideal) ones."""

    engine: Engine
    precision: Precision
    ceilings: Ceilings
    reference: Ceilings
    notes: tuple[str, ...]


def prepare(hw: HardwareSpec, p: Precision, calibration: Calibration | None, o: Options,
            engine: Engine = IDEAL) -> Prepared:
    """Resolve the engine's ceilings and byte accounting for ``hw`` and ``p``; raises a
    ``UsageError`` when the GPU cannot run the precision."""
    engine = engine.for_gpu(hw.memory_bytes, hw.name, hw.architecture, hw.vendor)
    why = engine.refusal(p.weights.value, p.quantized_layers, hw.architecture)
    if why is not None:
        which = {"experts": " (routed experts)", "mlp": " (MLP layers)"}.get(
            p.quantized_layers, "")
        raise UsageError(f"{engine.display_name or engine.name} does not run "
                         f"{p.weights.value}{which} weights on {hw.name} "
                         f"({hw.architecture}): {why}; --weights or --engine for another")
    c = ceilings(hw, calibration, o, engine)
    ref = c if engine.ceilings == "datasheet" else ceilings(hw, calibration, o, IDEAL)
    if not p.from_checkpoint:  # a checkpoint's own scales and lm_head are what load
        p = p.model_copy(update={"zero_point_bytes": engine.zero_point_bytes_per_group,
                                 "lm_head_quantized": engine.lm_head_quantized})
    # the engine's own layout of MXFP4 experts, whatever the checkpoint
    p = p.model_copy(update={"expert_pad": engine.mxfp4_expert_pad
                             if p.weights is DType.mxfp4 else None})
    p, fell_back = auto_dtype(hw, p, engine)
    p, notes = resolve_precision(hw, p, c)
    return Prepared(engine, p, c, ref, tuple(notes) + fell_back)


def auto_dtype(hw: HardwareSpec, p: Precision, engine: Engine) -> tuple[Precision, tuple]:
    """``p`` with its 16-bit parts in the engine's fallback type where the type was left to
    the engine (``Precision.auto``), the GPU has no bf16 tensor-core rate but has the
    fallback's, and the engine falls back rather than refuse (vLLM 0.9+ serves a bf16
    checkpoint in fp16 on a T4 or V100); and the note saying so."""
    fb = engine.auto_dtype_fallback
    if not (p.auto and fb and p.half_dtype is DType.bf16
            and DType.bf16 not in hw.peak_tflops and DType(fb) in hw.peak_tflops):
        return p, ()
    half = DType(fb)
    update: dict = {"kv_cache": half} if p.kv_cache is DType.bf16 else {}
    if p.weights is DType.bf16:
        update["weights"] = half
    elif p.compute is None:  # quantized weights: their matmuls run in the 16-bit type
        update["compute"] = half
    return p.model_copy(update=update), (
        f"{hw.name} has no bf16 tensor cores: {engine.display_name or engine.name} runs the "
        f"model in {half.value} (its --dtype auto falls back; --weights or --dtype to choose)",)


def resolve_precision(hw: HardwareSpec, p: Precision,
                      c: Ceilings) -> tuple[Precision, list[str]]:
    """The precision as it will run on ``hw``, and notes on what changed; a ``UsageError``
    when the GPU has no tensor-core rate for it (bf16 on a T4)."""
    notes = list(c.notes)
    if p.compute is None and p.compute_dtype not in c.flops_per_s and p.weights == DType.fp8:
        # no fp8 tensor cores (Ampere, Turing): fp8 weights run weight-only, dequantized to
        # 16-bit in the matmul (vLLM's FP8 Marlin path)
        p = p.model_copy(update={"compute": p.half_dtype})
        notes.append(f"{hw.name} has no fp8 tensor cores: fp8 weights run weight-only, "
                     f"computing in {p.half_dtype.value}")
    for dt in (p.compute_dtype, p.half_dtype):
        if dt not in c.flops_per_s:
            hw.peak_flops_per_s(dt)  # raises a UsageError naming what the datasheet has
    return p, notes


def resolve_price(hw: HardwareSpec, override: float | None) -> tuple[float | None, str | None]:
    """USD per GPU-hour and where it comes from: the override, hardware_db, or none."""
    if override is not None:
        return override, "--price-per-hour"
    p = hw.price
    if p is not None:
        if p.price_set:
            return p.usd_per_gpu_hour, f"price set {p.price_set}: {p.label} ({p.date}), " \
                f"{p.source}"
        return p.usd_per_gpu_hour, f"{p.source} ({p.date})"
    return None, None


def _with_measured(est: Estimate, tpot_s: float | None, ttft_s: float | None) -> Estimate:
    m = Measured(tpot_s=tpot_s, ttft_s=ttft_s)
    if tpot_s is not None:
        bw = est.decode.weight_and_kv_bytes / tpot_s
        m = replace(m, achieved_bandwidth_bytes_per_s=bw,
                    mbu=mbu(est.decode.weight_and_kv_bytes, tpot_s,
                            est.hardware.memory_bandwidth_bytes_per_s),
                    mfu=mfu(est.decode.flops, tpot_s, est.datasheet_peak_flops_per_s))
    if ttft_s is not None:
        m = replace(m, achieved_prefill_flops_per_s=est.prefill.flops / ttft_s,
                    prefill_mfu=mfu(est.prefill.flops, ttft_s, est.datasheet_peak_flops_per_s))
    return replace(est, measured=m)


def _prefill_graph_counts(model: ModelSpec, e: Engine, o: Options, weights: str):
    """The prefill token counts the engine replays from piecewise CUDA graphs at the
    estimate's chunk budget (``planner.core.engine.PrefillCounts``; the simulator's through
    ``SchedulerConfig.for_engine``); None where it has none: no chunking (no budget: MLA's
    largest only), weights kept in host memory (SGLang turns them off), or a MoE model in
    ``weights`` whose default MoE runner on this GPU takes them away
    (``Engine.prefill_graphs_for``), or a model with sparse attention (SGLang's
    ``_handle_piecewise_cuda_graph`` turns them off for DeepSeek-V3.2)."""
    if not (e.cuda_graphs and e.prefill_graph_rule is not None
            and e.prefill_graphs_for(model.architecture, weights)) or o.cpu_offload_bytes \
            or model.sparse_topk is not None:
        return None
    budget = o.prefill_chunk_tokens if e.chunked_prefill and o.prefill_chunk_tokens else 0
    return prefill_graph_counts(e.prefill_graph_rule, budget, mla=model.mla is not None,
                                max_tokens=e.prefill_graph_max_tokens,
                                context_tokens=e.max_model_len, model_name=model.name)


def _padded_tokens(tokens, counts):
    """The smallest captured count at or above ``tokens`` (the largest where none is; 0
    for 0 tokens), element-wise for arrays."""
    if not hasattr(tokens, "clip"):
        if tokens <= 0:
            return 0
        got = counts.padded(tokens)
        return counts.largest if got is None else got
    out = tokens * 0 + counts.largest
    for start, step, last in reversed(counts.segments()):
        # the next count of the range at or above the tokens: start + ceil((t - start) /
        # step) x step, written with floor division so arrays take it too
        up = vmax(start - ((start - tokens) // step) * step, start)
        out = vwhere(tokens <= last, up, out)
    for size in reversed(counts.sizes):
        out = vwhere(tokens <= size, size, out)
    return vwhere(tokens <= 0, 0, out)


_OPTIME_NUMBERS = ("compute_s", "memory_s", "comm_s", "time_s", "bandwidth_frac",
                   "compute_frac", "kernels", "overhead_s", "fixed_s", "host_floor_s")


def _graphed_prefill(model: ModelSpec, p: Precision, o: Options, e: Engine, c: Ceilings,
                     eager: StepTime, *, tp: int, batch, prompt_tokens, counts) -> StepTime:
    """The batch's prefill where every pass of it replays piecewise CUDA graphs: each chunk
    of the budget (and the last, shorter one) no larger than the largest captured count,
    padded to the next (the padding's rows computed by every operator in the graphs, none
    of them launched by the host), its attention unpadded and launched eagerly, and its
    sampling after the graphs, as the simulator prices each such step
    (``planner.serving.cost.StepCoster.prefill_graph_s``); otherwise the eager passes.
    Element-wise for a sweep's arrays."""
    tokens = batch * prompt_tokens
    chunk = o.prefill_chunk_tokens if e.chunked_prefill and o.prefill_chunk_tokens else None
    if chunk is None:
        full, rest, full_padded = 0, tokens, 0
    else:
        full = tokens // chunk
        rest = tokens - full * chunk
        full_padded = counts.padded(chunk) or 0  # 0: a full chunk is above the largest
    within = ((full == 0) | (full_padded > 0)) & (rest <= counts.largest)
    if not hasattr(within, "clip") and not within:
        return eager
    padded = full * full_padded + _padded_tokens(rest, counts)
    graphed_ops = prefill_ops(model, p, batch=1, prompt_tokens=vwhere(within, padded, tokens),
                              tp=tp, attention=o.attention, lm_head_sharded=e.lm_head_sharded)
    by_name = {op.name: op for op in graphed_ops}
    ops = []
    for t in eager.ops:
        op = by_name.get(t.op.name)
        # outside the graphs: the attention between the pieces, and the sampling after the
        # decoder stack
        if op is None or t.op.kind in ("attention", "host_transfer") or \
                t.op.name in SAMPLING_OPS:
            ops.append(t)
            continue
        g = op_time(op, c, tp=tp, options=o, engine=e, graphed=True)
        ops.append(replace(t, **{f: vwhere(within, getattr(g, f), getattr(t, f))
                                 for f in _OPTIME_NUMBERS}))
    return replace(eager, ops=tuple(ops))


def assemble(model: ModelSpec, hardware: HardwareSpec, prep: Prepared, o: Options, *,
             tp: int, batch, prompt_tokens, output_tokens,
             price_usd_per_gpu_hour: float | None = None, price_source: str | None = None,
             notes: list[str] | tuple[str, ...] = (), with_ideal: bool = True,
             memory: MemoryPlan | None = None) -> Estimate:
    """The prediction itself, without input checks. ``batch``, ``prompt_tokens`` and
    ``output_tokens`` are numbers, or numpy arrays of one shape: the sweep evaluates a whole
    grid with these same formulas. Unless the engine is the ideal one, the ideal roofline of
    the same deployment is assembled too (``Estimate.ideal``)."""
    e, p, c = prep.engine, prep.precision, prep.ceilings
    ctx = prompt_tokens + output_tokens / 2
    sharded = e.lm_head_sharded
    offload = o.cpu_offload_bytes
    decode = step_time(decode_ops(model, p, batch=batch, context_tokens=ctx, tp=tp,
                                  attention=o.attention, lm_head_sharded=sharded)
                       + host_transfer_ops(offload), c, tp=tp,
                       options=o, engine=e, graphed=e.cuda_graphs,
                       fixed_s=e.step_overhead_s + e.per_sequence_overhead_s * batch,
                       serial_s=e.worker_s(tp), stream=True)
    # one prefill pass per chunk of the batch's prompt tokens
    chunks = 1 if o.prefill_chunk_tokens is None else \
        -(-(batch * prompt_tokens) // o.prefill_chunk_tokens)
    prefill = step_time(prefill_ops(model, p, batch=batch, prompt_tokens=prompt_tokens,
                                    tp=tp, attention=o.attention, lm_head_sharded=sharded)
                        + host_transfer_ops(offload, chunks), c,
                        tp=tp, options=o, engine=e, graphed=False,
                        fixed_s=e.prefill_step_overhead_s * chunks
                        + e.per_sequence_overhead_s * batch,
                        serial_s=e.worker_s(tp) * chunks)
    counts = _prefill_graph_counts(model, e, o, p.weights.value)
    if counts is not None:
        prefill = _graphed_prefill(model, p, o, e, c, prefill, tp=tp, batch=batch,
                                   prompt_tokens=prompt_tokens, counts=counts)
    if memory is None:
        memory = memory_plan(model, hardware, p, batch=batch, prompt_tokens=prompt_tokens,
                             output_tokens=output_tokens, tp=tp, options=o,
                             lm_head_sharded=sharded, engine=e)
    ideal = None
    if with_ideal and not e.is_ideal:
        # the same deployment (precision, byte accounting, memory) on the ideal time model
        bound = Prepared(e.ideal_bound(), p, prep.reference, prep.reference, prep.notes)
        ideal = assemble(model, hardware, bound, o, tp=tp, batch=batch,
                         prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                         price_usd_per_gpu_hour=price_usd_per_gpu_hour,
                         price_source=price_source, notes=notes, with_ideal=False,
                         memory=memory)
    # model-level FLOPs (one GPU's share times tp would double count replicated layers)
    decode_flops = total_flops(decode_ops(model, p, batch=1, context_tokens=ctx))
    prefill_flops = total_flops(prefill_ops(model, p, batch=batch, prompt_tokens=prompt_tokens))
    return Estimate(
        model=model, hardware=hardware, precision=p, batch=batch, prompt_tokens=prompt_tokens,
        output_tokens=output_tokens, tp=tp, options=o, ceilings=c,
        memory=memory,
        params=count_params(model), active_params=active_params(model),
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(model, p, tp=tp),
        decode_context_tokens=ctx, decode=decode, prefill=prefill,
        decode_flops_per_token=decode_flops, prefill_flops=prefill_flops,
        flops_per_token_2n=flops_per_token_2n(model),
        price_usd_per_gpu_hour=price_usd_per_gpu_hour, price_source=price_source,
        notes=tuple(notes), engine=e, reference=prep.reference, ideal=ideal,
    )
