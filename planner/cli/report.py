"""`llmplan report`: PNG roofline, throughput, memory and serving reports with their CSVs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.options import (
    DEFAULT_CHUNK,
    DEFAULT_ENGINE,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_RESERVE_GIB,
    DEFAULT_UTIL,
    WEIGHT_CHOICES,
    Attention,
    AttentionOpt,
    CalibrationOpt,
    ChunkOpt,
    ComputeOpt,
    EngineOpt,
    EpOpt,
    LongerOpt,
    OutputOpt,
    OverheadOpt,
    PpOpt,
    PriceOpt,
    PricesOpt,
    PromptOpt,
    QuantizedLayers,
    QuantizedLayersOpt,
    ReserveOpt,
    TimeModel,
    TimeModelOpt,
    UtilOpt,
    check_context,
    check_layout,
    check_quantized_layers,
    once_by_name,
    options_from,
    parse_choices,
    positive,
    stdout,
)
from planner.core.errors import LlmplanError


def report(
    model: Annotated[str, typer.Option("--model", "-m",
                                       help="Built-in model, YAML or config.json.",
                                       metavar="MODEL")],
    gpu: Annotated[str, typer.Option("--gpu", "-g", help="GPUs, comma-separated.",
        metavar="GPU,...")],
    engine: EngineOpt = DEFAULT_ENGINE,
    weights: Annotated[str, typer.Option(help="Weight precisions, comma-separated.",
        metavar="PRECISION,...")] = "bf16",
    kv_cache: Annotated[Optional[str], typer.Option(
        help="KV precision (default: the weights' 16-bit type).", metavar="PRECISION")] = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel GPUs.", metavar="N")] = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    batch: Annotated[int, typer.Option(
        "--batch", "-b", help="Batch at which operators are placed on the roofline.",
        metavar="N")] = 16,
    prompt_tokens: PromptOpt = DEFAULT_PROMPT_TOKENS,
    output_tokens: OutputOpt = DEFAULT_OUTPUT_TOKENS,
    time_model: TimeModelOpt = TimeModel.roofline,
    attention: AttentionOpt = Attention.flash,
    kernel_overhead_us: OverheadOpt = None,
    reserve_gib: ReserveOpt = DEFAULT_RESERVE_GIB,
    memory_utilization: UtilOpt = DEFAULT_UTIL,
    prefill_chunk_tokens: ChunkOpt = DEFAULT_CHUNK,
    calibration: CalibrationOpt = None,
    measured: Annotated[Optional[Path], typer.Option(
        help="JSONL from `llmplan measure`: draw its points over the roofline and a "
             "predicted-vs-measured chart.", metavar="JSONL")] = None,
    out: Annotated[Path, typer.Option("--out", help="Directory for PNGs and CSVs.",
        metavar="DIR")] = Path(
        "reports"),
    serving_requests: Annotated[int, typer.Option(
        help="Requests simulated per point of the serving chart (request rate against "
             "throughput, TTFT and TPOT); 0 leaves it out.", metavar="N")] = 300,
    compute: ComputeOpt = None,
    allow_longer_context: LongerOpt = False,
    prices: PricesOpt = None,
    price: PriceOpt = None,
) -> None:
    """Roofline, throughput-vs-latency, memory and serving PNGs, each with the CSV it plots.
    With --pp or --ep the throughput, memory (the fullest GPU) and serving charts are the
    layout's; the roofline shows one TP group's operators."""
    from planner.io import catalog
    from planner.search.sweep import parse_str_list

    for name, v in (("--tp", tp), ("--batch", batch), ("--prompt-tokens", prompt_tokens),
                    ("--output-tokens", output_tokens)):
        positive(name, v)
    if out.exists() and not out.is_dir():
        raise LlmplanError(f"--out: {out} is a file; give a directory")
    if not parse_str_list(gpu):
        raise LlmplanError("--gpu: no value given")
    opts = options_from(time_model, attention, kernel_overhead_us, reserve_gib,
                        memory_utilization, prefill_chunk_tokens)
    m = catalog.load_model(model)
    check_context(m, prompt_tokens, output_tokens, allow_longer_context)
    eng = catalog.load_engine(engine)
    cal = catalog.load_calibration(calibration) if calibration else None
    from planner.io.report import Case, write_reports
    from planner.layouts.deployment import Deployment

    layout = check_layout(m, tp, pp, ep)
    cases = []
    overrides = catalog.parse_price_overrides(price)
    catalog.check_price_names(overrides, [catalog.load_hardware(g).name
                                          for g in parse_str_list(gpu)])
    # each GPU and precision once, in the order given (a name given twice is drawn once)
    for hw in once_by_name(catalog.load_hardware(g, prices, overrides)
                           for g in parse_str_list(gpu)):
        for w in dict.fromkeys(parse_choices(weights, WEIGHT_CHOICES, "--weights")):
            prec = m.precision_of(w, kv_cache, compute=compute.value if compute else None,
                                  quantized_layers=check_quantized_layers(m, quantized_layers))
            dep = Deployment.build(m, hw, engine=eng, precision=prec, layout=layout,
                                   options=opts,
                                   calibration=cal if cal and cal.device == hw.name else None)
            cases.append(Case(dep, prompt_tokens, output_tokens))
    meas, meas_ceil, records = None, None, None
    if measured is not None:
        from planner.cli.options import stderr
        from planner.io.report import load_measured, measured_roofline_points, plot_accuracy

        records = load_measured(measured, noisy_only_ok=True) or None
        if records is None:  # every point was timed on a busy machine
            stderr.print(f"[yellow]warning:[/] {measured}: every measured point is noisy "
                         "(timed on a busy machine); the report is drawn without them")
        else:
            meas, meas_ceil = measured_roofline_points(records)
            dev = records[0]["env"]["device"]
            name, kind = dev.get("name") or dev.get("kind"), dev.get("kind")
            gpus = ", ".join(c.hw.name for c in cases)
            if kind == "cpu" or not any(_same_device(name, c.hw) for c in cases):
                stderr.print(f"[yellow]note:[/] {measured} was measured on {name} ({kind}), "
                             f"not on {gpus}: its points are drawn against its own measured "
                             "ceilings beside that roofline, not as that GPU's performance")
    if not 0 <= serving_requests <= 100_000:
        raise LlmplanError(f"--serving-requests: must be 0 to 100,000, got {serving_requests}")
    _say_what_does_not_fit(cases, batch)
    paths = write_reports(cases, out, batch=batch, measured=meas, measured_ceilings=meas_ceil,
                          serving_requests=serving_requests)
    if records is not None:
        paths += plot_accuracy(records, out, f"{measured.stem}_predicted_vs_measured")
    for p in paths:
        stdout.print(str(p))


def _say_what_does_not_fit(cases: list, batch: int) -> None:
    """On stderr: a GPU that cannot hold the model at batch 1 (``write_reports`` draws its
    memory chart only: the roofline's decode ladder, the throughput curve and the serving
    runs need a batch that fits), and a --batch above what one holds (its roofline is drawn
    at it)."""
    from planner.cli.options import stderr

    for c in cases:
        most = c.max_batch()
        if most < 1:
            stderr.print(f"[yellow]warning:[/] {c.label}: {c.model.name} does not fit at batch "
                         "1; only its memory chart is drawn")
        elif batch > most:
            stderr.print(f"[yellow]warning:[/] {c.label}: --batch {batch} does not fit (at "
                         f"most {most:,}); its roofline is drawn at {batch} all the "
                         "same, its memory chart marks the limit")


def _same_device(name: str | None, hw) -> bool:
    """Whether a device name a measurement recorded (torch's "NVIDIA H100 80GB HBM3") is the
    GPU of hardware_db ``hw``: its name's words ("h100", "sxm") all in it."""
    if not name:
        return False
    text = name.casefold()
    return all(w in text for w in hw.name.casefold().split("-")[:1])
