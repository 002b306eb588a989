"""`llmplan estimate`: memory, timing, utilisation and cost of one deployment."""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple, Optional

import typer

from planner.cli.calls import command_defaults
from planner.cli.options import (
    DEFAULT_BATCH,
    DEFAULT_CHUNK,
    DEFAULT_ENGINE,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_RESERVE_GIB,
    DEFAULT_UTIL,
    PP_NAMES,
    AcceptanceOpt,
    AsyncSchedulingOpt,
    Attention,
    AttentionOpt,
    BatchOpt,
    CalibrationOpt,
    ChunkOpt,
    ComputeOpt,
    CpuOffloadOpt,
    DraftOpt,
    DtypeOpt,
    EnforceEagerOpt,
    EngineOpt,
    ExpertImbalanceOpt,
    ExtensibleOpt,
    GpuOpt,
    GroupSizeOpt,
    JsonOpt,
    KvCacheDtypeOpt,
    KvMemoryOpt,
    KVOption,
    KvTokensOpt,
    LongerOpt,
    ModelOpt,
    OutputOpt,
    OverheadOpt,
    PriceOpt,
    PricesOpt,
    PromptOpt,
    QuantizationOpt,
    QuantizedLayers,
    QuantizedLayersOpt,
    ReserveOpt,
    SpeculativeOpt,
    SpeculativeTokensOpt,
    TimeModel,
    TimeModelOpt,
    TpOpt,
    UtilOpt,
    WeightsOption,
    band_fields,
    build_deployment,
    check_context,
    check_offload_speculation,
    duration_option,
    engine_precision,
    json_out,
    options_from,
    positive,
    render_bands,
    speculation_config,
    static_bands,
    stderr,
    stdout,
    weights_source_text,
    with_expert_imbalance,
    with_kv_pool,
)
from planner.core.specs import GIB, Workload


def estimate(
    model: ModelOpt,
    gpu: GpuOpt,
    engine: EngineOpt = DEFAULT_ENGINE,
    tp: TpOpt = 1,
    weights: WeightsOption = None,
    kv_cache: KVOption = None,
    quantization: QuantizationOpt = None,
    dtype: DtypeOpt = None,
    kv_cache_dtype: KvCacheDtypeOpt = None,
    enforce_eager: EnforceEagerOpt = False,
    async_scheduling: AsyncSchedulingOpt = None,
    batch: BatchOpt = DEFAULT_BATCH,
    prompt_tokens: PromptOpt = DEFAULT_PROMPT_TOKENS,
    output_tokens: OutputOpt = DEFAULT_OUTPUT_TOKENS,
    group_size: GroupSizeOpt = None,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    time_model: TimeModelOpt = TimeModel.roofline,
    attention: AttentionOpt = Attention.flash,
    kernel_overhead_us: OverheadOpt = None,
    reserve_gib: ReserveOpt = DEFAULT_RESERVE_GIB,
    memory_utilization: UtilOpt = DEFAULT_UTIL,
    prefill_chunk_tokens: ChunkOpt = DEFAULT_CHUNK,
    cpu_offload_gb: CpuOffloadOpt = 0.0,
    kv_cache_memory_bytes: KvMemoryOpt = None,
    kv_cache_tokens: KvTokensOpt = None,
    extensible_kv_cache: ExtensibleOpt = None,
    calibration: CalibrationOpt = None,
    price_per_hour: Annotated[Optional[float], typer.Option(
        help="USD per GPU-hour (default: the GPU's price in the --prices set).",
        metavar="USD")] = None,
    prices: PricesOpt = None,
    price: PriceOpt = None,
    measured_tpot: Annotated[Optional[float], duration_option(
        "--measured-tpot", help="A measured TPOT (14ms, 0.014): report its bandwidth, MBU and "
        "MFU.")] = None,
    measured_ttft: Annotated[Optional[float], duration_option(
        "--measured-ttft", help="A measured TTFT (800ms, 0.8): report its prefill FLOP/s and "
        "MFU.")] = None,
    explain: Annotated[bool, typer.Option(
        "--explain", help="Show the per-operator table behind the totals.")] = False,
    require_fit: Annotated[bool, typer.Option(
        "--require-fit", help="Exit 1 when the deployment does not fit in memory, or its "
        "engine would not start with it (vLLM checks at start-up that its KV cache holds one "
        "request of its max-model-len).")] = False,
    allow_longer_context: LongerOpt = False,
    compute: ComputeOpt = None,
    pp: Annotated[int, typer.Option(
        *PP_NAMES, help="Pipeline-parallel stages, each on --tp GPUs: adds the Pipeline section "
        "(memory per stage, TPOT with micro-batches in flight, TTFT, transfers).",
        metavar="N")] = 1,
    ep: Annotated[int, typer.Option(
        "--ep", help="Expert-parallel GPUs for a MoE model, each 1/N of the routed experts; "
        "attention TP over --tp of them in N / --tp data-parallel groups (--tp 1: "
        "data-parallel attention; --tp N: one TP group). Adds the Expert parallel section "
        "(TTFT, TPOT, load imbalance, all-to-all or all-reduce, memory per GPU).",
        metavar="N")] = 1,
    expert_imbalance: ExpertImbalanceOpt = None,
    speculative: SpeculativeOpt = None,
    draft_model: DraftOpt = None,
    num_speculative_tokens: SpeculativeTokensOpt = None,
    acceptance_rate: AcceptanceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Predict memory, timing, utilisation and cost of one deployment."""
    from planner.io import fmt
    from planner.io.gate import gate

    res, m, dep, applied, source, payload = estimate_run(locals())
    if as_json:
        json_out(payload)
    else:
        gate(payload, "estimate's tables")  # the figures the tables show
        _render(res, explain, source)
        for n in m.quantization.notes if dep.weights_source == "checkpoint" else ():
            stdout.print(f"[yellow]note:[/] {n}")
        render_bands(stdout, applied, {
            "ttft_s": ("TTFT", fmt.seconds), "tpot_s": ("TPOT", fmt.seconds),
            "latency_s": ("latency", fmt.seconds),
            "throughput_tokens_per_s": ("throughput", lambda v: f"{fmt.per_s(v)} tok/s")})
    # the reason goes to stderr under --json too: a CI gate reading the JSON sees the exit 1
    if require_fit and not res.fits:
        need = res.memory_needed_per_gpu_bytes
        usable = "" if res.pipeline or res.expert else \
            f", {res.estimate.memory.usable_bytes / GIB:.1f} GiB usable"
        stderr.print(f"does not fit: {need / GIB:.1f} GiB needed"
                     f"{' per GPU' if not usable else ''}{usable}")
        raise typer.Exit(1)
    if not require_fit or res.pipeline or res.expert:
        return
    from planner.core.estimate import startup_max_model_len

    start = startup_max_model_len(res.estimate)  # only asked for under --require-fit
    if start is not None:
        stderr.print(f"does not start: {dep.engine.display_name or dep.engine.name}'s KV cache "
                     f"holds one request of {start[1]:,} tokens, under its max-model-len of "
                     f"{start[0]:,}; serve it with a max-model-len of {start[1]:,} or less")
        raise typer.Exit(1)


class EstimateRun(NamedTuple):
    """What ``estimate`` computes: the result, the pieces its tables need, and ``payload``,
    the object ``--json`` prints."""

    res: Any
    model: Any
    deployment: Any
    bands: dict
    weights_source: str
    payload: dict


def estimate_run(a: dict) -> EstimateRun:
    """One deployment's estimate from ``estimate``'s parameters by name (``a``: the values
    typer hands the command; a name left out takes the command's default). The one place the
    figures of ``llmplan estimate`` and its ``--json`` object are made: the command renders
    them, the web page (planner/ui) serves them."""
    a = {**command_defaults(estimate), **a}
    (model, gpu, engine, tp, pp, ep, weights, kv_cache, quantization, dtype, kv_cache_dtype,
     enforce_eager, batch, prompt_tokens, output_tokens, group_size, quantized_layers,
     time_model, attention, kernel_overhead_us, reserve_gib, memory_utilization,
     prefill_chunk_tokens, cpu_offload_gb, calibration, price_per_hour, prices, price,
     measured_tpot, measured_ttft, allow_longer_context, compute, expert_imbalance,
     speculative, draft_model, num_speculative_tokens, acceptance_rate) = (a[k] for k in (
        "model", "gpu", "engine", "tp", "pp", "ep", "weights", "kv_cache", "quantization",
        "dtype", "kv_cache_dtype", "enforce_eager", "batch", "prompt_tokens", "output_tokens",
        "group_size", "quantized_layers", "time_model", "attention", "kernel_overhead_us",
        "reserve_gib", "memory_utilization", "prefill_chunk_tokens", "cpu_offload_gb",
        "calibration", "price_per_hour", "prices", "price", "measured_tpot", "measured_ttft",
        "allow_longer_context", "compute", "expert_imbalance", "speculative", "draft_model",
        "num_speculative_tokens", "acceptance_rate"))
    from planner.io import catalog
    from planner.layouts.deployment import estimate_deployment

    for name, v in (("--batch", batch), ("--prompt-tokens", prompt_tokens),
                    ("--output-tokens", output_tokens), ("--price-per-hour", price_per_hour),
                    ("--measured-tpot", measured_tpot), ("--measured-ttft", measured_ttft)):
        positive(name, v)
    opts = with_kv_pool(with_expert_imbalance(options_from(
        time_model, attention, kernel_overhead_us, reserve_gib, memory_utilization,
        prefill_chunk_tokens, cpu_offload_gb), expert_imbalance),
        a["kv_cache_memory_bytes"], a["kv_cache_tokens"])
    m = catalog.load_model(model)
    check_context(m, prompt_tokens, output_tokens, allow_longer_context)
    ckpt = m.quantization.weights if m.quantization is not None else None
    weights, kv_cache, compute = engine_precision(weights, quantization, dtype, kv_cache,
                                                  kv_cache_dtype, compute, checkpoint=ckpt)
    dep = build_deployment(m, gpu=gpu, engine=engine, tp=tp, pp=pp, ep=ep, weights=weights,
                           kv_cache=kv_cache, group_size=group_size,
                           quantized_layers=quantized_layers, compute=compute,
                           calibration=calibration, options=opts, prices=prices, price=price,
                           enforce_eager=enforce_eager, async_scheduling=a["async_scheduling"],
                           extensible_kv_cache=a["extensible_kv_cache"])
    spec = speculation_config(speculative, draft_model, num_speculative_tokens,
                              acceptance_rate, model=m)
    check_offload_speculation(opts, spec)
    res = estimate_deployment(dep, Workload(batch=batch, prompt_tokens=prompt_tokens,
                                            output_tokens=output_tokens),
                              speculation=spec, price_usd_per_gpu_hour=price_per_hour,
                              measured_tpot_s=measured_tpot, measured_ttft_s=measured_ttft)
    # the speculative figures when speculation is asked for
    applied = static_bands(dep, res.headline, batch)
    source = weights_source_text(m, dep.precision, dep.weights_source,
                                 group_size if dep.weights_source == "checkpoint" else None)
    payload = {**res.to_dict(), "weights_source_detail": source, **band_fields(applied),
               # a decode step's host work beside the step before's GPU work, in this
               # layout (not across pipeline stages), as simulate reports it
               "async_scheduling": dep.engine.overlaps_host(dep.layout.pp)}
    _impossible_measurements(payload.get("measured"))
    return EstimateRun(res, m, dep, applied, source, payload)


def _impossible_measurements(measured: dict | None) -> None:
    """A warning on stderr where a measured TPOT or TTFT means more than the GPU's datasheet
    bandwidth or FLOP rate: a unit slip (1us for 1ms) more often than a measurement. Not an
    error: a measurement that shares or skips work this prediction counts (speculative
    decoding, a cached prefix) can beat it."""
    if not measured:
        return
    import sys

    for key, flag, what in (("mbu", "--measured-tpot", "the datasheet bandwidth"),
                            ("mfu", "--measured-tpot", "the datasheet FLOP rate"),
                            ("prefill_mfu", "--measured-ttft", "the datasheet FLOP rate")):
        v = measured.get(key)
        if v is not None and v > 1:
            print(f"llmplan: warning: {flag} gives {v:.0%} of {what} ({key}): faster than "
                  "the GPU can go; check its unit", file=sys.stderr)


def _render(res, explain: bool, weights_source: str | None = None) -> None:
    from planner.io.render import (
        render_estimate,
        render_expert,
        render_pipeline,
        render_speculative,
    )

    est = res.estimate
    if res.layout_section is not None:  # the deployment's figures first, then one TP group's
        if res.pipeline is not None:
            render_pipeline(stdout, res.pipeline, est.batch, est.output_tokens,
                            est.price_usd_per_gpu_hour)
        if res.expert is not None:
            render_expert(stdout, res.expert, est.batch, est.output_tokens,
                          est.price_usd_per_gpu_hour)
        stdout.print(f"[dim]Below: one tensor-parallel group of this layout on its own (TP "
                     f"{est.tp}), the operators and roofline its figures above are built "
                     "from; its memory, timing and cost are not the deployment's.[/]")
    render_estimate(stdout, est, explain=explain, weights_source=weights_source,
                    speculation=res.speculation)
    if res.speculation is not None:
        render_speculative(stdout, res.speculation)
