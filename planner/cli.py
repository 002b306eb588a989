"""The ``llmplan`` command line: parse, call the library, render (rich) or dump (--json).

Exit codes: 0 success; 1 a check failed; 2 bad input or usage; 3 a requested device is absent.
Every user error is one line on stderr, never a traceback. Commands live beside this module
(cli_sweep, ...) and are registered here.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from planner import __version__
from planner.cli_common import (
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
from planner.errors import Interrupted, LlmplanError
from planner.specs import GIB, Precision, Workload

app = typer.Typer(
    name="llmplan",
    help="Capacity planner and roofline calculator for LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _speculate(est, m, hw, prep, opts, tp, method, draft_model, k, a):
    """The speculative-decoding section of an estimate, from the CLI's flags."""
    from planner.speculative import speculate

    cfg = spec_config(method, draft_model, k, a)
    return speculate(m, hw, prep, opts, tp=tp, batch=est.batch,
                     prompt_tokens=est.prompt_tokens, output_tokens=est.output_tokens, cfg=cfg)


@app.command()
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
    from planner import catalog
    from planner.estimate import estimate as run_estimate
    from planner.render import render_estimate
    from planner.specs import Parallelism

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
        from planner.estimate import prepare

        prep = prepare(hw, prec, cal, opts, eng)  # the engine as the estimate ran it
        if ep > 1:
            from planner.expert import expert_parallel

            expert = expert_parallel(m, hw, prep, opts, ep=ep, batch=batch,
                                     prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        if pp > 1:
            from planner.pipeline import pipeline

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
            from planner.render import render_pipeline

            render_pipeline(stdout, pipe, batch, output_tokens, est.price_usd_per_gpu_hour)
        if expert is not None:
            from planner.render import render_expert

            render_expert(stdout, expert, batch)
        if spec is not None:
            from planner.render import render_speculative

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


@app.command()
def models(as_json: JsonOpt = False) -> None:
    """List the built-in models."""
    from planner import catalog
    from planner.ops import active_params, count_params
    from planner.render import table

    rows = []
    for name in catalog.model_names():
        m = catalog.load_model(name)
        rows.append({"name": name, "architecture": m.architecture, "params": count_params(m),
                     "active_params": active_params(m), "layers": m.num_layers,
                     "hidden_size": m.hidden_size, "attention_heads": m.num_attention_heads,
                     "kv_heads": m.num_kv_heads, "max_context_tokens": m.max_position_embeddings,
                     "moe": m.moe is not None, "mla": m.mla is not None, "source": m.source})
    if as_json:
        json_out(rows)
        return
    from planner import fmt
    from planner.render import plain
    stdout.print(table("Built-in models (--json for sources)",
                       ["name", "arch", "params", "active", "layers", "hidden", "heads",
                        "kv", "context"],
                       [[plain(r["name"]), plain(r["architecture"]), fmt.count(r["params"]),
                         fmt.count(r["active_params"]), r["layers"], r["hidden_size"],
                         r["attention_heads"], r["kv_heads"],
                         fmt.tokens_short(r["max_context_tokens"])]
                        for r in rows], left=2, compact=True))


@app.command()
def gpus(as_json: JsonOpt = False) -> None:
    """List the built-in GPUs."""
    from planner import catalog
    from planner.render import plain, table

    rows = []
    for name in catalog.gpu_names():
        h = catalog.load_hardware(name)
        rows.append({"name": name, "display_name": h.display_name, "vendor": h.vendor,
                     "memory_gib": h.memory_gib,
                     "memory_bandwidth_gb_per_s": h.memory_bandwidth_gb_per_s,
                     "peak_tflops": {k.value: v for k, v in h.peak_tflops.items()},
                     "interconnect": h.interconnect.kind,
                     "interconnect_gb_per_s": h.interconnect.bandwidth_gb_per_s,
                     "tdp_w": h.tdp_w,
                     "usd_per_gpu_hour": h.price.usd_per_gpu_hour if h.price else None,
                     "source": h.source})
    if as_json:
        json_out(rows)
        return
    stdout.print(table("Built-in GPUs (dense peak TFLOP/s; --json for sources)",
                       ["name", "mem\nGiB", "mem\nGB/s", "bf16", "fp16", "fp8", "int8",
                        "link", "link\nGB/s", "TDP\nW", "$/h"],
                       [[plain(r["name"]), f"{r['memory_gib']:g}",
                         f"{r['memory_bandwidth_gb_per_s']:,.0f}",
                         *[f"{r['peak_tflops'][k]:.0f}" if k in r["peak_tflops"] else "-"
                           for k in ("bf16", "fp16", "fp8", "int8")],
                         plain(r["interconnect"]), f"{r['interconnect_gb_per_s']:g}",
                         f"{r['tdp_w']:g}" if r["tdp_w"] else "-",
                         f"{r['usd_per_gpu_hour']:.2f}" if r["usd_per_gpu_hour"] else "-"]
                        for r in rows], compact=True))


@app.command()
def engines(as_json: JsonOpt = False) -> None:
    """List the engine profiles (engines_db) and their main figures."""
    from planner import catalog
    from planner.render import table

    rows = []
    for name in catalog.engine_names():
        spec = catalog.load_engine_spec(name)
        e = spec.model()
        rows.append({"name": name, "display_name": spec.display_name,
                     "engine_version": spec.engine_version, "ceilings": spec.ceilings,
                     "step_overhead_us": spec.step_overhead_us.value,
                     "cuda_graphs": e.cuda_graphs, "kernel_gap_us": spec.kernel_gap_us.value,
                     "gemm_bandwidth_frac": e.gemm_bandwidth_frac,
                     "attention_bandwidth_frac": e.attention_bandwidth_frac,
                     "allreduce_latency_us": spec.allreduce_latency_us.value,
                     "fitted_rows": sorted(spec.fitted_rows()), "source": spec.source})
    if as_json:
        json_out(rows)
        return
    stdout.print(table("Engine profiles (engines_db; --json for versions and sources)",
                       ["name", "ceilings", "step", "graphs", "kernel", "GEMM BW", "attn BW",
                        "all-reduce", "fitted on"],
                       [[r["name"], r["ceilings"], f"{r['step_overhead_us']:g} us",
                         "yes" if r["cuda_graphs"] else "no", f"{r['kernel_gap_us']:g} us",
                         f"{r['gemm_bandwidth_frac']:.0%}",
                         f"{r['attention_bandwidth_frac']:.0%}",
                         f"{r['allreduce_latency_us']:g} us", f"{len(r['fitted_rows'])} rows"]
                        for r in rows], left=2, compact=True))


BUILTIN = ("estimate", "models", "gpus", "engines", "sweep", "report", "check", "plan",
           "validate", "simulate", "compare", "calibrate", "watch")


def _register() -> None:
    from planner import cli_check, cli_servers, cli_simulate, cli_sweep, cli_validate

    app.command()(cli_sweep.sweep)
    app.command()(cli_sweep.report)
    app.command()(cli_check.check)
    app.command()(cli_check.plan)
    app.command()(cli_validate.validate)
    app.command()(cli_simulate.simulate)
    app.command()(cli_servers.compare)
    app.command()(cli_servers.calibrate)
    app.command()(cli_servers.watch)


def _register_plugins(argv: list[str]) -> None:
    """Commands from other packages (``llmplan.commands`` entry points), such as the
    harness's ``measure``: looked up only when a built-in command is not what was asked for,
    so ``llmplan estimate`` starts without scanning installed packages."""
    first = next((a for a in argv if not a.startswith("-")), None)
    if first in BUILTIN:
        return
    from importlib.metadata import entry_points

    for ep in entry_points(group="llmplan.commands"):
        try:
            app.command(name=ep.name)(ep.load())
        except ImportError as err:  # a plugin whose extras are missing: say so when asked
            stderr.print(f"[dim]llmplan {ep.name} unavailable: {err}[/]")


_register()


def _print_version(value: bool) -> None:
    if value:
        print(f"llmplan {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version.", is_eager=True,
                                          callback=_print_version)] = False,
) -> None:
    """Capacity planner and roofline calculator for LLM inference."""


def _click_exceptions() -> dict[str, tuple[type[BaseException], ...]]:
    """Typer >= 0.29 carries its own copy of click (and raises its own Exit and Abort, from
    typer.exceptions); older ones use click itself."""
    mods = []
    for name in ("typer.exceptions", "typer._click.exceptions", "click.exceptions"):
        try:
            mods.append(__import__(name, fromlist=["UsageError"]))
        except ImportError:
            pass
    return {k: tuple(getattr(m, k) for m in mods if hasattr(m, k))
            for k in ("NoArgsIsHelpError", "UsageError", "Abort", "Exit")}


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and turns every user error into one line and exit code 2."""
    exc = _click_exceptions()
    _register_plugins(sys.argv[1:] if argv is None else argv)
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="llmplan")
    except exc["NoArgsIsHelpError"] as err:
        print(err.ctx.get_help() if err.ctx else str(err))
        return 0
    except exc["UsageError"] as err:
        ctx = err.ctx
        where = f"llmplan {ctx.info_name}" if ctx and ctx.info_name != "llmplan" else "llmplan"
        msg = err.format_message().replace("Value error, ", "")
        print(f"{where}: error: {msg}", file=sys.stderr)
        return 2
    except exc["Abort"]:
        print("llmplan: interrupted", file=sys.stderr)
        return 130
    except exc["Exit"] as err:
        return err.exit_code
    except KeyboardInterrupt:
        print("llmplan: interrupted", file=sys.stderr)
        return 130
    except Interrupted as err:
        print(f"llmplan: interrupted: {err}", file=sys.stderr)
        return 130
    except LlmplanError as err:
        print(f"llmplan: error: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 2)
    except BrokenPipeError:
        return 0
    except OSError as err:  # a path the OS refuses (name too long, permission, disk full)
        name = f"{str(err.filename)[:120]}: " if err.filename is not None else ""
        print(f"llmplan: error: {name}{err.strerror or err}", file=sys.stderr)
        return 2
    except ValueError as err:  # a pydantic check that no edge check caught: still user input
        if type(err).__name__ != "ValidationError":
            raise
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or err.title
        print(f"llmplan: error: {where}: {first['msg']}", file=sys.stderr)
        return 2
    if rv == 130:  # typer turns a Ctrl-C inside a command into a silent exit code 130
        print("llmplan: interrupted", file=sys.stderr)
    return rv if isinstance(rv, int) else 0

