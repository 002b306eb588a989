"""`llmplan estimate`: memory, timing, utilisation and cost of one deployment."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from planner.cli.options import (
    _W,
    DEFAULT_CHUNK,
    DEFAULT_ENGINE,
    DEFAULT_RESERVE_GIB,
    DEFAULT_UTIL,
    AcceptanceOpt,
    Attention,
    AttentionOpt,
    BatchOpt,
    CalibrationOpt,
    ChunkOpt,
    ComputeOpt,
    DraftOpt,
    EngineOpt,
    GpuOpt,
    GroupSizeOpt,
    JsonOpt,
    KVOption,
    LongerOpt,
    ModelOpt,
    OutputOpt,
    OverheadOpt,
    PromptOpt,
    QuantizedLayers,
    QuantizedLayersOpt,
    ReserveOpt,
    SpecOpt,
    SpecTokensOpt,
    TimeModel,
    TimeModelOpt,
    TpOpt,
    UtilOpt,
    WeightsOpt,
    WeightsOption,
    check_context,
    check_layout,
    check_quantized_layers,
    json_out,
    options_from,
    positive,
    spec_config,
    stderr,
    stdout,
)
from planner.core.specs import GIB, Precision, Workload


def _speculate(est, m, hw, prep, opts, tp, method, draft_model, k, a):
    """The speculative-decoding section of an estimate, from the CLI's flags."""
    from planner.layouts.speculation import speculate

    cfg = spec_config(method, draft_model, k, a)
    return speculate(m, hw, prep, opts, tp=tp, batch=est.batch,
                     prompt_tokens=est.prompt_tokens, output_tokens=est.output_tokens, cfg=cfg)


def estimate(
    model: ModelOpt,
    gpu: GpuOpt,
    engine: EngineOpt = DEFAULT_ENGINE,
    tp: TpOpt = 1,
    weights: WeightsOption = WeightsOpt.bf16,
    kv_cache: KVOption = None,
    batch: BatchOpt = _W["batch"].default,
    prompt_tokens: PromptOpt = _W["prompt_tokens"].default,
    output_tokens: OutputOpt = _W["output_tokens"].default,
    group_size: GroupSizeOpt = 128,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    time_model: TimeModelOpt = TimeModel.roofline,
    attention: AttentionOpt = Attention.flash,
    kernel_overhead_us: OverheadOpt = 0.0,
    reserve_gib: ReserveOpt = DEFAULT_RESERVE_GIB,
    memory_utilization: UtilOpt = DEFAULT_UTIL,
    prefill_chunk_tokens: ChunkOpt = DEFAULT_CHUNK,
    calibration: CalibrationOpt = None,
    price_per_hour: Annotated[Optional[float], typer.Option(
        help="USD per GPU-hour (default: hardware_db's price, if any).")] = None,
    measured_tpot: Annotated[Optional[float], typer.Option(
        help="A measured TPOT in seconds: report its bandwidth, MBU and MFU.")] = None,
    measured_ttft: Annotated[Optional[float], typer.Option(
        help="A measured TTFT in seconds: report its prefill FLOP/s and MFU.")] = None,
    explain: Annotated[bool, typer.Option(
        "--explain", help="Show the per-operator table behind the totals.")] = False,
    require_fit: Annotated[bool, typer.Option(
        "--require-fit", help="Exit 1 when the deployment does not fit in memory.")] = False,
    allow_longer_context: LongerOpt = False,
    compute: ComputeOpt = None,
    pp: Annotated[int, typer.Option(
        "--pp", help="Pipeline-parallel stages, each on --tp GPUs: adds the Pipeline section "
        "(memory per stage, TPOT with micro-batches in flight, TTFT, transfers).")] = 1,
    ep: Annotated[int, typer.Option(
        "--ep", help="Expert-parallel GPUs for a MoE model (attention data-parallel, each GPU "
        "1/N of the experts and of the batch): adds the Expert parallel section (TTFT, TPOT, "
        "load imbalance, all-to-all, memory).")] = 1,
    speculative: SpecOpt = None,
    draft_model: DraftOpt = None,
    num_speculative_tokens: SpecTokensOpt = None,
    acceptance_rate: AcceptanceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Predict memory, timing, utilisation and cost of one deployment."""
    from planner.core.estimate import estimate as run_estimate
    from planner.core.specs import Parallelism
    from planner.io import catalog
    from planner.io.render import render_estimate

    for name, v in (("--batch", batch), ("--prompt-tokens", prompt_tokens),
                    ("--output-tokens", output_tokens), ("--tp", tp),
                    ("--group-size", group_size), ("--price-per-hour", price_per_hour),
                    ("--measured-tpot", measured_tpot), ("--measured-ttft", measured_ttft)):
        positive(name, v)
    opts = options_from(time_model, attention, kernel_overhead_us, reserve_gib,
                        memory_utilization, prefill_chunk_tokens)
    m = catalog.load_model(model)
    check_context(m, prompt_tokens, output_tokens, allow_longer_context)
    hw = catalog.load_hardware(gpu)
    eng = catalog.load_engine(engine)
    cal = catalog.load_calibration(calibration) if calibration else None
    prec = Precision.of(weights.value, kv_cache.value if kv_cache else None, group_size,
                        compute.value if compute else None,
                        check_quantized_layers(m, quantized_layers))
    est = run_estimate(m, hw, engine=eng, precision=prec,
                       workload=Workload(batch=batch, prompt_tokens=prompt_tokens,
                                         output_tokens=output_tokens),
                       parallelism=Parallelism(tp=tp), options=opts, calibration=cal,
                       price_usd_per_gpu_hour=price_per_hour, measured_tpot_s=measured_tpot,
                       measured_ttft_s=measured_ttft)
    check_layout(m, tp, pp, ep)
    wants_spec = any(v is not None for v in (speculative, draft_model, num_speculative_tokens,
                                             acceptance_rate))
    expert = pipe = spec = None
    if ep > 1 or pp > 1 or wants_spec:
        from planner.core.estimate import prepare

        prep = prepare(hw, prec, cal, opts, eng)  # the engine as the estimate ran it
        if ep > 1:
            from planner.layouts.expert import expert_parallel

            expert = expert_parallel(m, hw, prep, opts, ep=ep, batch=batch,
                                     prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        if pp > 1:
            from planner.layouts.pipeline import pipeline

            pipe = pipeline(m, hw, prep, opts, tp=tp, pp=pp, batch=batch,
                            prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        if wants_spec:
            spec = _speculate(est, m, hw, prep, opts, tp, speculative, draft_model,
                              num_speculative_tokens, acceptance_rate)
    if as_json:
        d = est.to_dict(operators=True)
        if spec is not None:
            d["speculative"] = spec.as_dict()
        if pipe is not None:
            d["pipeline"] = pipe.as_dict(batch, output_tokens, est.price_usd_per_gpu_hour)
        if expert is not None:
            d["expert_parallel"] = expert.as_dict(batch)
        json_out(d)
    else:
        render_estimate(stdout, est, explain=explain)
        if pipe is not None:
            from planner.io.render import render_pipeline

            render_pipeline(stdout, pipe, batch, output_tokens, est.price_usd_per_gpu_hour)
        if expert is not None:
            from planner.io.render import render_expert

            render_expert(stdout, expert, batch)
        if spec is not None:
            from planner.io.render import render_speculative

            render_speculative(stdout, spec)
    fits = pipe.fits if pipe is not None else expert.fits if expert is not None else \
        est.memory.fits
    if require_fit and not fits:
        if pipe is not None or expert is not None:
            need = pipe.max_memory_per_gpu_bytes if pipe is not None else expert.total_bytes
            if not as_json:
                stderr.print(f"does not fit: {need / GIB:.1f} GiB needed per GPU")
            raise typer.Exit(1)
        if not as_json:
            stderr.print(f"does not fit: {est.memory.total_bytes / GIB:.1f} GiB needed, "
                         f"{est.memory.usable_bytes / GIB:.1f} GiB usable")
        raise typer.Exit(1)
