"""`llmplan sweep`: a grid of estimates, vectorized, as a table, CSV or JSON."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.options import (
    DEFAULT_BATCH,
    DEFAULT_CHUNK,
    DEFAULT_ENGINE,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_RESERVE_GIB,
    DEFAULT_UTIL,
    KV_CHOICES,
    WEIGHT_CHOICES,
    Attention,
    AttentionOpt,
    CalibrationOpt,
    ChunkOpt,
    ComputeOpt,
    EngineOpt,
    JsonOpt,
    LongerOpt,
    OverheadOpt,
    PriceOpt,
    PricesOpt,
    QuantizedLayers,
    QuantizedLayersOpt,
    ReserveOpt,
    TimeModel,
    TimeModelOpt,
    UtilOpt,
    check_context,
    once_by_name,
    options_from,
    output_path,
    parse_choices,
    positive,
    stderr,
    stdout,
)
from planner.core.errors import LlmplanError
from planner.core.specs import DEFAULT_GROUP_SIZE

# A table or JSON holds the whole grid in memory; a CSV is streamed.
MAX_TABLE_ROWS = 2_000_000
MAX_CSV_ROWS = 200_000_000
LIST_HELP = "Comma-separated; numbers take ranges: 4..256 doubles, 128..1024+128 steps."


def build_grid(model: str, gpu: str, batch: str, prompt_tokens: str, output_tokens: str,
               weights: str, kv_cache: str | None, tp: str, group_size: int, options,
               engine: str = DEFAULT_ENGINE, compute: str | None = None, pp: str = "1",
               ep: str = "1", quantized_layers: str = "all", prices: str | None = None,
               price: list[str] | None = None, auto_dtype: bool = False):
    """Parse the list options into a Grid (shared by sweep and report); ``auto_dtype``: the
    weights were not asked for (``Grid.auto_dtype``)."""
    from planner.core.specs import DType
    from planner.io import catalog
    from planner.search.sweep import Grid, parse_int_list, parse_str_list

    positive("--group-size", group_size)

    def names(text: str, flag: str) -> list[str]:
        out = parse_str_list(text)
        if not out:
            raise LlmplanError(f"{flag}: no value given")
        return out

    if kv_cache is not None and not parse_str_list(kv_cache):
        raise LlmplanError("--kv-cache: no value given")
    names(weights, "--weights")
    overrides = catalog.parse_price_overrides(price)
    # each GPU and model once, in the order given, as the numeric axes are (a name given
    # twice, or a GPU's alias beside its name, is swept once)
    gpus = once_by_name(catalog.load_hardware(x, prices, overrides) for x in names(gpu, "--gpu"))
    catalog.check_price_names(overrides, [g.name for g in gpus])
    return Grid(
        models=once_by_name(catalog.load_model(x) for x in names(model, "--model")),
        gpus=gpus,
        batches=parse_int_list(batch, "--batch"),
        prompt_tokens=parse_int_list(prompt_tokens, "--prompt-tokens"),
        output_tokens=parse_int_list(output_tokens, "--output-tokens"),
        weights=[DType(w) for w in parse_choices(weights, WEIGHT_CHOICES, "--weights")],
        kv_cache=[DType(k) for k in parse_choices(kv_cache, KV_CHOICES, "--kv-cache")]
        if kv_cache else [None],
        tps=parse_int_list(tp, "--tp"),
        pps=parse_int_list(pp, "--pp"),
        eps=parse_int_list(ep, "--ep"),
        group_size=group_size,
        options=options,
        engine=catalog.load_engine(engine),
        compute=DType(compute) if compute else None,
        quantized_layers=quantized_layers,
        auto_dtype=auto_dtype,
    )


def sweep(
    model: Annotated[str, typer.Option("--model", "-m", help="Models, comma-separated.",
        metavar="MODEL,...")],
    gpu: Annotated[str, typer.Option("--gpu", "-g", help="GPUs, comma-separated.",
        metavar="GPU,...")],
    engine: EngineOpt = DEFAULT_ENGINE,
    batch: Annotated[str, typer.Option("--batch", "-b", help=LIST_HELP,
        metavar="N,...")] = str(DEFAULT_BATCH),
    prompt_tokens: Annotated[str, typer.Option("--prompt-tokens", "-p", help=LIST_HELP,
        metavar="TOKENS,...")] = str(DEFAULT_PROMPT_TOKENS),
    output_tokens: Annotated[str, typer.Option("--output-tokens", "-o", help=LIST_HELP,
        metavar="TOKENS,...")] = str(DEFAULT_OUTPUT_TOKENS),
    weights: Annotated[Optional[str], typer.Option(
        help="Weight precisions, comma-separated (default bf16: unlike estimate, sweep does "
             "not take a checkpoint's quantization_config, and says so on stderr where a "
             "model has one).", metavar="PRECISION,...")] = None,
    kv_cache: Annotated[Optional[str], typer.Option(
        help="KV precisions (default: the weights' 16-bit type).", metavar="PRECISION,...")] = None,
    tp: Annotated[str, typer.Option(help="Tensor-parallel sizes. " + LIST_HELP,
        metavar="N,...")] = "1",
    pp: Annotated[str, typer.Option(
        help="Pipeline-parallel stages, each of --tp GPUs. " + LIST_HELP, metavar="N,...")] = "1",
    ep: Annotated[str, typer.Option(
        help="Expert-parallel GPUs (MoE models; attention TP over --tp of them, so a multiple "
             "of --tp; rows that are not, or with --pp above 1, are marked unsupported). "
             + LIST_HELP, metavar="N,...")] = "1",
    group_size: Annotated[int, typer.Option(
        help="Weights per scale for int8/int4.", metavar="N")] = DEFAULT_GROUP_SIZE,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    time_model: TimeModelOpt = TimeModel.roofline,
    attention: AttentionOpt = Attention.flash,
    kernel_overhead_us: OverheadOpt = None,
    reserve_gib: ReserveOpt = DEFAULT_RESERVE_GIB,
    memory_utilization: UtilOpt = DEFAULT_UTIL,
    prefill_chunk_tokens: ChunkOpt = DEFAULT_CHUNK,
    calibration: CalibrationOpt = None,
    price_per_hour: Annotated[Optional[float], typer.Option(
        help="USD per GPU-hour for every GPU (default: each GPU's price in the --prices "
        "set).", metavar="USD")] = None,
    prices: PricesOpt = None,
    price: PriceOpt = None,
    csv: Annotated[Optional[Path], typer.Option(
        "--csv", help="Write every row to this CSV (streamed).", metavar="CSV")] = None,
    limit: Annotated[int, typer.Option(help="Rows shown in the table.", metavar="N")] = 40,
    compute: ComputeOpt = None,
    allow_longer_context: LongerOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a grid of configurations (vectorized); rows that do not fit are kept. Rows
    with --pp or --ep above 1 carry the layout's timing, its largest per-GPU memory and its
    cost over all its GPUs (no operator-level columns)."""
    from planner.io import catalog
    from planner.search.sweep import JsonArray, iter_sweep, to_frame, write_csv, write_json

    positive("--price-per-hour", price_per_hour)
    positive("--limit", limit)
    opts = options_from(time_model, attention, kernel_overhead_us, reserve_gib,
                        memory_utilization, prefill_chunk_tokens)
    output_path(csv, "--csv")
    grid = build_grid(model, gpu, batch, prompt_tokens, output_tokens,
                      "bf16" if weights is None else weights,
                      kv_cache, tp, group_size, opts, engine,
                      compute.value if compute else None, pp, ep, quantized_layers.value,
                      prices, price, auto_dtype=weights is None and compute is None)
    for m in grid.models if weights is None else ():
        q = m.quantization
        if q is not None and q.problem is None:
            layers = q.precision(None).quantized_layers
            experts = f" --quantized-layers {layers}" if layers != "all" else ""
            scales = ("; its block scales are not swept: estimate or plan without --weights "
                      "cost them" if q.fp8_blocks else "")
            stderr.print(f"[yellow]note:[/] {m.name}'s checkpoint stores {q.label} "
                         f"({q.file}); sweep costs --weights bf16 unless given (as released: "
                         f"--weights {q.weights.value}{experts}{scales})")
    for m in grid.models:  # the longest sequence of the grid must fit every model
        check_context(m, max(grid.prompt_tokens), max(grid.output_tokens), allow_longer_context,
                      "--prompt-tokens + --output-tokens (largest)")
    # the CSV and the JSON are streamed, a chunk at a time; the table holds every row
    limit_rows = MAX_CSV_ROWS if csv is not None or as_json else MAX_TABLE_ROWS
    if grid.size > limit_rows:
        where = "to a CSV or JSON" if csv or as_json else \
            f"in a table (--csv or --json stream up to {MAX_CSV_ROWS:,})"
        raise LlmplanError(f"the grid has {grid.size:,} configurations; at most "
                           f"{limit_rows:,} {where}")
    cal = catalog.load_calibration(calibration) if calibration else None
    chunks = gated(iter_sweep(grid, calibration=cal, price_usd_per_gpu_hour=price_per_hour))
    # --json and --csv stream their rows as they are computed; given both, each row goes to
    # both (the JSON array on stdout, the CSV to the file)
    if csv is not None:
        arr = JsonArray(sys.stdout) if as_json else None
        rows = write_csv(chunks, csv, also=None if arr is None else arr.write)
        if arr is not None:
            arr.close()
        stderr.print(f"wrote {rows:,} rows to {csv}")
    elif as_json:
        write_json(chunks, sys.stdout)
    else:
        render_sweep(to_frame(chunks), limit)


def gated(chunks):
    """The sweep's chunks, each through the output gate (planner.io.gate) as it is computed:
    a row with an impossible figure stops the CSV, JSON or table there, naming the row."""
    from planner.io.gate import gate_columns

    row = 0
    for c in chunks:
        gate_columns({**c.constants, **c.arrays}, "sweep", first_row=row)
        row += c.n
        yield c


def render_sweep(df, limit: int) -> None:
    """The varying axes and the key figures of the first ``limit`` rows."""
    from planner.core.specs import GIB
    from planner.io import fmt
    from planner.io.render import table

    axes = [("model", "model"), ("gpu", "gpu"), ("tp", "tp"), ("pp", "pp"), ("ep", "ep"),
            ("weights", "w"),
            ("kv_cache", "kv"), ("batch", "batch"), ("prompt_tokens", "prompt"),
            ("output_tokens", "out")]
    shown = [(k, h) for k, h in axes if df[k].nunique() > 1] or axes[:2]
    cols = [h for _, h in shown] + ["fits", "GiB", "TTFT ms", "TPOT ms", "tok/s", "MBU",
                                    "bound", "$/1M"]
    rows = []
    for d in df.head(limit).to_dict(orient="records"):
        key = [d[k] for k, _ in shown]
        if not d.get("supported", True):
            rows.append(key + ["-", "-", "-", "-", "-", "-", "n/a", "-"])
            continue
        cost = d.get("cost_usd_per_million_output_tokens")
        mbu = d.get("mbu")
        rows.append(key + ["yes" if d["fits"] else "NO", f"{d['total_memory_bytes'] / GIB:,.1f}",
                           f"{fmt.sig(d['ttft_s'] * 1e3, 4)}", f"{fmt.sig(d['tpot_s'] * 1e3, 4)}",
                           f"{d['throughput_tokens_per_s']:,.0f}",
                           fmt.pct(mbu) if mbu == mbu and mbu is not None else "-",
                           d["bound"] if isinstance(d.get("bound"), str) else "-",
                           f"{cost:,.3f}" if cost == cost and cost is not None else "n/a"])
    stdout.print(table(f"Sweep: {len(df):,} configurations", cols, rows,
                       left=sum(1 for k, _ in shown if k in ("model", "gpu", "weights",
                                                              "kv_cache")), compact=True))
    unsupported = df[~df["supported"].astype(bool)]
    for note in unsupported["note"].unique()[:5]:
        stderr.print(f"[yellow]not supported:[/] {note}")
    if len(df) > limit:
        stdout.print(f"[dim]{len(df) - limit:,} more rows: --limit N, --csv PATH or --json[/]")
