"""`llmplan plan`: the cheapest deployments that meet latency targets at a traffic level."""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.calls import command_defaults
from planner.cli.flags import KV_CACHE_DTYPES, QUANTIZATIONS
from planner.cli.options import (
    DEFAULT_ENGINE,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_RESERVE_GIB,
    DEFAULT_UTIL,
    KV_CHOICES,
    PP_NAMES,
    TP_NAMES,
    WEIGHT_CHOICES,
    AcceptanceOpt,
    AsyncSchedulingOpt,
    Attention,
    ComputeOpt,
    DraftOpt,
    EnforceEagerOpt,
    EngineOpt,
    ExpertImbalanceOpt,
    ExtensibleOpt,
    KvMemoryOpt,
    KvTokensOpt,
    LongerOpt,
    OutputOpt,
    PerformanceModeOpt,
    PriceOpt,
    PricesOpt,
    PromptOpt,
    QuantizedLayers,
    QuantizedLayersOpt,
    ReserveOpt,
    SpeculativeTokensOpt,
    TimeModel,
    UtilOpt,
    check_async_pipeline,
    check_context,
    check_offload_speculation,
    check_quantized_layers,
    engine_flags,
    extensible_kv,
    json_out,
    model_kind,
    options_from,
    output_path,
    parse_choices,
    positive,
    stderr,
    stdout,
    with_expert_imbalance,
    with_kv_pool,
)
from planner.core.errors import LlmplanError
from planner.io import fmt


class SizeAt(str, Enum):
    predicted = "predicted"
    high = "high"


def plan(
    model: Annotated[str, typer.Option("--model", "-m", help="Model to serve.", metavar="MODEL")],
    ttft: Annotated[str, typer.Option(help="TTFT target, e.g. 2s or 800ms.", metavar="DURATION")],
    tpot: Annotated[str, typer.Option(help="TPOT target, e.g. 50ms.", metavar="DURATION")],
    engine: EngineOpt = DEFAULT_ENGINE,
    prompt_tokens: PromptOpt = DEFAULT_PROMPT_TOKENS,
    output_tokens: OutputOpt = DEFAULT_OUTPUT_TOKENS,
    rps: Annotated[Optional[float], typer.Option(
        "--rps", "--request-rate", help="Traffic: requests per second (--request-rate, as "
        "simulate and vLLM's bench name it).", metavar="RATE")] = None,
    tokens_per_s: Annotated[Optional[float], typer.Option(
        help="Traffic: output tokens per second (instead of --rps).", metavar="RATE")] = None,
    gpu: Annotated[Optional[str], typer.Option(
        "--gpu", "-g", help="GPUs to consider (default: all of hardware_db).",
        metavar="GPU,...")] = None,
    tp: Annotated[str, typer.Option(
        *TP_NAMES, help="Tensor-parallel GPUs per replica (or per stage).",
        metavar="N,...")] = "1,2,4,8",
    pp: Annotated[str, typer.Option(
        *PP_NAMES, help="Pipeline stages per replica, each of --tp GPUs.",
        metavar="N,...")] = "1,2",
    ep: Annotated[str, typer.Option(
        help="Expert-parallel GPUs per replica (MoE models; no PP): the routed experts over "
             "them, attention TP over each --tp dividing it (TP 1: data-parallel attention; "
             "TP = EP: one TP group). auto: 1 and the powers of two up to 16 that divide the "
             "experts.", metavar="N,...")] = "auto",
    expert_imbalance: ExpertImbalanceOpt = None,
    weights: Annotated[Optional[str], typer.Option(
        help=f"Weight precisions (default {DEFAULT_WEIGHTS}; for an HF config with a "
        "quantization_config, the checkpoint's own).", metavar="PRECISION,...")] = None,
    kv_cache: Annotated[Optional[str], typer.Option(
        help=f"KV precisions, 16 = the weights' 16-bit (default {DEFAULT_KV}).",
        metavar="PRECISION,...")] = None,
    quantization: Annotated[Optional[str], typer.Option(
        help="vLLM's --quantization names for --weights, comma-separated: fp8; awq, gptq (and "
        "their _marlin kernels): int4; mxfp4.", metavar="NAME,...")] = None,
    kv_cache_dtype: Annotated[Optional[str], typer.Option(
        help="vLLM's --kv-cache-dtype names for --kv-cache, comma-separated: auto (16), "
        "bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2.", metavar="NAME,...")] = None,
    enforce_eager: EnforceEagerOpt = False,
    async_scheduling: AsyncSchedulingOpt = None,
    price_per_hour: Annotated[Optional[float], typer.Option(
        help="USD per GPU-hour for every GPU (default: each GPU's price in the --prices set; "
             "GPUs it does not sell are left out and named).", metavar="USD")] = None,
    prices: PricesOpt = None,
    price: PriceOpt = None,
    calibration: Annotated[Optional[Path], typer.Option(help="Measured ceilings.",
        metavar="FILE")] = None,
    top: Annotated[int, typer.Option(help="Rows shown.", metavar="N")] = 10,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="All rows to CSV.",
        metavar="CSV")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="PNG of cost vs latency with the Pareto front.", metavar="PNG")] = None,
    scheduler: Annotated[str, typer.Option(
        help="continuous: size replicas by simulating continuous batching (vLLM-style); "
             "static: a batch every end-to-end latency.",
             metavar="continuous|static")] = "continuous",
    percentile: Annotated[int, typer.Option(
        help="With continuous sizing, the TTFT / TPOT percentile held to the targets "
             "(50, 90 or 99).", metavar="50|90|99")] = 90,
    sim_requests: Annotated[int, typer.Option(
        help="Requests measured per candidate replica count, at least: those arriving in "
             "the run's steady state (from one request lifetime at the targets after the "
             "start, for at least two more lifetimes, and not in the last one), the run "
             "simulating every request from the start (up to 5,000).", metavar="N")] = 200,
    range_ratio: Annotated[float, typer.Option(
        help="Simulated lengths uniform within +-this fraction.", metavar="FRACTION")] = 0.0,
    compute: ComputeOpt = None,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    memory_utilization: UtilOpt = DEFAULT_UTIL,
    reserve_gib: ReserveOpt = DEFAULT_RESERVE_GIB,
    kv_cache_memory_bytes: KvMemoryOpt = None,
    kv_cache_tokens: KvTokensOpt = None,
    extensible_kv_cache: ExtensibleOpt = None,
    allow_longer_context: LongerOpt = False,
    size_at: Annotated[SizeAt, typer.Option(
        "--size-at", help="Size replicas at the predicted TTFT / TPOT, or at the high end "
        "of the engine's error bands (p90 of measured / predicted on held-out served runs: "
        "planner/data/bands.yaml), so that a server as slow as the slowest tenth of those "
        "measurements still meets the targets: each simulated step takes the TPOT band's "
        "high end times its predicted time (a replica near saturation queues as a slower "
        "server would), and TTFT is held at the TTFT band's high end at least. Continuous "
        "sizing only.")] = SizeAt.predicted,
    performance_mode: PerformanceModeOpt = None,
    speculative: Annotated[Optional[str], typer.Option(
        "--speculative", help="Size each tensor-parallel configuration with and without "
        "speculative decoding and keep it only where it lowers the cost at the targets (the "
        "spec column). auto: every method the model can run (mtp where it ships MTP layers, "
        "draft-model with --draft-model, eagle / eagle3 where planner/data/speculation.yaml "
        "has its family, ngram with --acceptance-rate); or one of draft-model, mtp, eagle, "
        "eagle3, ngram. Continuous sizing only.", metavar="METHOD,...")] = None,
    draft_model: DraftOpt = None,
    num_speculative_tokens: SpeculativeTokensOpt = None,
    acceptance_rate: AcceptanceOpt = None,
    disaggregated: Annotated[str, typer.Option(
        "--disaggregated", metavar="both|off|only",
        help="Also size disaggregated layouts (P prefill + D decode instances, each side its "
        "own TP and weights, the KV sent between them over NVLink or the inter-node "
        "network) and rank them with the aggregated ones (layout 6P1D TP1/2); off: "
        "aggregated only; only: disaggregated only. Continuous sizing only.")] = "both",
    jobs: Annotated[Optional[int], typer.Option(
        "--jobs", "-j", metavar="N", min=1,
        help="Processes screening and sizing configurations side by side (default: the "
             "machine's CPUs; the rows do not depend on it).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="All rows as JSON.")] = False,
) -> None:
    """Find the cheapest configurations that meet TTFT and TPOT targets at a traffic level:
    each sized by simulating continuous batching (or, with --scheduler static, static
    batches)."""
    plan_run(locals(), emit=True)


def _layouts_allowed(m, flag: str, values: list[int], quiet: bool) -> list[int]:
    """The sizes of ``flag`` the model allows (TP dividing its attention heads, no more
    stages than layers, EP dividing its experts), the others said on stderr; none allowed is
    a bad command (exit 2), not a search that finds nothing."""
    from planner.core.errors import UsageError
    from planner.core.ops import check_tp
    from planner.layouts.expert import check_ep
    from planner.layouts.pipeline import stage_layers

    check = {"--tp": lambda n: check_tp(m, n),
             "--pp": lambda n: stage_layers(m.num_layers, n),
             "--ep": lambda n: check_ep(m, n) if n > 1 else None}[flag]
    ok, why = [], {}
    for n in values:
        try:
            check(n)
            ok.append(n)
        except UsageError as e:
            why[n] = str(e)
    if not ok:
        raise LlmplanError(f"{flag}: {why[values[0]]}" if len(values) == 1 else
                           f"{flag}: none of {', '.join(map(str, values))} runs {m.name}: "
                           + "; ".join(why.values()))
    if why and not quiet:
        stderr.print(f"[yellow]left out:[/] {flag} " + "; ".join(
            f"{n} ({w})" for n, w in why.items()))
    return ok


def plan_run(a: dict, *, emit: bool = False):
    """``plan``'s search from its parameters by name (``a``: the values typer hands the
    command; a name left out takes the command's default): every configuration sized and
    ranked, the frame whose rows ``--json`` prints (``plan_records``). With ``emit``, the
    command's output too (the table, or the JSON, CSV and plot asked for); the web page
    (planner/ui) takes the frame alone."""
    a = {**command_defaults(plan), **a}
    (model, ttft, tpot, engine, prompt_tokens, output_tokens, rps, tokens_per_s, gpu, tp, pp,
     ep, expert_imbalance, weights, kv_cache, quantization, kv_cache_dtype, enforce_eager,
     price_per_hour, prices, price, calibration, top, csv, plot, scheduler, percentile,
     sim_requests, range_ratio, compute, quantized_layers, memory_utilization, reserve_gib,
     allow_longer_context, size_at, performance_mode, speculative, draft_model,
     num_speculative_tokens, acceptance_rate, disaggregated, as_json) = (a[k] for k in (
        "model", "ttft", "tpot", "engine", "prompt_tokens", "output_tokens", "rps",
        "tokens_per_s", "gpu", "tp", "pp", "ep", "expert_imbalance", "weights", "kv_cache",
        "quantization", "kv_cache_dtype", "enforce_eager", "price_per_hour", "prices",
        "price", "calibration", "top", "csv", "plot", "scheduler", "percentile",
        "sim_requests", "range_ratio", "compute", "quantized_layers", "memory_utilization",
        "reserve_gib", "allow_longer_context", "size_at", "performance_mode", "speculative",
        "draft_model", "num_speculative_tokens", "acceptance_rate", "disaggregated",
        "as_json"))
    import os

    from planner.core.specs import DType
    from planner.io import catalog, fmt

    # the command's own process forks its workers; the web page (planner/ui) serves from
    # threads, where a fork is unsafe, and sizes in one process
    jobs = a.get("jobs") or ((os.cpu_count() or 1) if emit else 1)
    from planner.search.plan import SimSettings, Targets, default_eps, search
    from planner.search.sweep import parse_int_list, parse_str_list

    t_ttft, t_tpot = _check_targets(a)
    # a bare number (seconds) is shown with its unit in the titles, as the flags give it else
    ttft, tpot = (fmt.seconds(t) if not any(ch.isalpha() for ch in str(given)) else given
                  for t, given in ((t_ttft, ttft), (t_tpot, tpot)))
    opts = with_kv_pool(with_expert_imbalance(options_from(
        TimeModel.roofline, Attention.flash, None, reserve_gib, memory_utilization),
        expert_imbalance), a["kv_cache_memory_bytes"], a["kv_cache_tokens"])
    req = rps if rps is not None else tokens_per_s / output_tokens
    m = catalog.load_model(model)
    tps, pps = parse_int_list(tp, "--tp"), parse_int_list(pp, "--pp")
    eps = default_eps(m) if ep.strip() == "auto" else parse_int_list(ep, "--ep")
    ql = check_quantized_layers(m, quantized_layers)
    if max(eps) > 1 and m.moe is None:
        raise LlmplanError(f"--ep: {m.name} has no experts (not a mixture-of-experts model)")
    tps, pps, eps = (_layouts_allowed(m, flag, values, as_json)
                     for flag, values in (("--tp", tps), ("--pp", pps), ("--ep", eps)))
    if max(eps) > 1 and not as_json:
        from planner.layouts.expert import expert_imbalance as imbalance_of

        factor, source = imbalance_of(opts)
        stderr.print(f"expert imbalance {factor:.2f}x ({source['from']}) for the EP layouts")
    check_context(m, prompt_tokens, output_tokens, allow_longer_context)
    overrides = catalog.parse_price_overrides(price)
    gpus = [catalog.load_hardware(g, prices, overrides) for g in (parse_str_list(gpu) if gpu
                                                                  else catalog.gpu_names())]
    catalog.check_price_names(overrides, [g.name for g in gpus])
    price_set = "--price-per-hour" if price_per_hour is not None else \
        catalog.price_set(prices).name
    q = m.quantization
    released = weights is None and quantization is None and q is not None and q.problem is None
    if released:
        # a quantized checkpoint runs as it ships: its precision, not a search over others
        wl = [q.weights]
        if q.quantized_layers != "all":
            ql = q.quantized_layers
        stderr.print(f"weights: {q.weights.value} ({q.label}, from {q.file} "
                     "quantization_config; --weights searches others)")
    else:
        wl = [DType(w) for w in _choices_or_alias(weights, WEIGHT_CHOICES, "--weights",
                                                  quantization, QUANTIZATIONS,
                                                  "--quantization", DEFAULT_WEIGHTS)]
    kvl = [None if k == "16" else DType(k)
           for k in _choices_or_alias(kv_cache, ("16", *KV_CHOICES), "--kv-cache",
                                      kv_cache_dtype, {k: v or "16" for k, v in
                                                       KV_CACHE_DTYPES.items()},
                                      "--kv-cache-dtype", DEFAULT_KV)]
    specs = _speculations(m, speculative, draft_model, num_speculative_tokens,
                          acceptance_rate, scheduler)
    for s_ in specs:
        check_offload_speculation(opts, s_)
    cal = catalog.load_calibration(calibration) if calibration else None
    eng = catalog.load_engine(engine)
    if performance_mode is not None:
        if scheduler != "continuous":
            raise LlmplanError("--performance-mode: sized with --scheduler continuous only")
        eng.in_mode(performance_mode)  # refused here, in one line, where the engine has none
    eng = engine_flags(eng, enforce_eager=enforce_eager, async_scheduling=a["async_scheduling"])
    for g in gpus:  # refused, in one line, on a GPU vLLM does not run it on
        extensible_kv(eng, a["extensible_kv_cache"], opts, g)
    eng = extensible_kv(eng, a["extensible_kv_cache"], opts)
    kept = check_async_pipeline(eng, pps, a["async_scheduling"])
    if kept != list(pps):
        if not as_json:
            stderr.print(f"[yellow]left out, --pp {','.join(str(p) for p in pps if p > 1)}:[/] "
                         f"vLLM ({eng.label}) refuses --async-scheduling under pipeline "
                         "parallelism before 0.15")
        pps = kept
    for p_ in (csv, plot):
        output_path(p_, "--csv" if p_ is csv else "--plot", None if p_ is csv else ".png")
    # a GPU with no price cannot be costed: say which are left out, before any search
    unpriced = [g for g in gpus if g.price is None] if price_per_hour is None else []
    if unpriced and len(unpriced) == len(gpus):
        raise LlmplanError(f"no price for {', '.join(g.name for g in unpriced)} in price set "
                           f"{price_set}: the plan ranks by cost; give --prices another set, "
                           "--price GPU=USD or --price-per-hour")
    if unpriced and not as_json:
        stderr.print(f"[yellow]left out, not sold in price set {price_set}:[/] "
                     + ", ".join(g.name for g in unpriced)
                     + f" (why: llmplan prices {price_set}; --prices another set or --price "
                     "GPU=USD to include them)")
    cdt = DType(compute.value) if compute else None
    # no weights asked for: the 16-bit type is the engine's (vLLM's bf16 runs fp16 on a T4)
    auto = weights is None and quantization is None and cdt is None
    _some_precision_runs(gpus, wl, cdt, cal, eng, auto)
    if scheduler == "continuous":
        return _plan_continuous(m, gpus, prompt_tokens=prompt_tokens,
                                output_tokens=output_tokens,
                                targets=Targets(t_ttft, t_tpot, req), tps=tps, pps=pps, eps=eps,
                                weights=wl, kv_cache=kvl, calibration=cal,
                                price_per_hour=price_per_hour, engine=eng,
                                settings=SimSettings(percentile=percentile,
                                                     num_requests=sim_requests,
                                                     range_ratio=range_ratio,
                                                     performance_mode=performance_mode,
                                                     **_size_factors(eng.name, size_at, gpus)),
                                top=top, csv=csv, plot=plot, as_json=as_json,
                                label=(ttft, tpot, req), compute=cdt, quantized_layers=ql,
                                options=opts, speculations=specs, disaggregated=disaggregated,
                                price_set=price_set, emit=emit, jobs=jobs,
                                auto_dtype=auto, released=released)
    targets = Targets(t_ttft, t_tpot, req)
    df = search(m, gpus, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                targets=targets, tps=tps, pps=pps, eps=eps,
                weights=wl, kv_cache=kvl, calibration=cal, price_usd_per_gpu_hour=price_per_hour,
                engine=eng, compute=cdt, quantized_layers=ql, options=opts, auto_dtype=auto,
                released=released)
    df["price_set"] = price_set
    # the KV cache given each GPU, as the continuous rows carry it
    for key in ("kv_cache_memory_bytes", "kv_cache_max_tokens"):
        if getattr(opts, key) is not None:
            df[key] = getattr(opts, key)
    if not emit:
        return df
    _show_static(df, m, prompt_tokens=prompt_tokens, output_tokens=output_tokens, top=top,
                 csv=csv, plot=plot, as_json=as_json, label=(ttft, tpot, req),
                 targets=targets, engine_name=eng.name, price_set=price_set,
                 kv_given=_kv_given(opts))
    return df


def plan_records(df) -> list[dict]:
    """The rows ``plan --json`` prints: every column, a missing value as null."""
    return df.astype(object).where(df.notna(), None).to_dict(orient="records")


DEFAULT_WEIGHTS = "bf16,fp8,int8,int4"
DEFAULT_KV = "16,fp8"


def _choices_or_alias(ours: str | None, allowed: tuple[str, ...], flag: str,
                      alias: str | None, table: dict, alias_flag: str,
                      default: str) -> list[str]:
    """A comma-separated list of ours, or of vLLM's names for the same choices (each mapped
    through ``table``, planner/cli/flags.py); the two given together must name the same."""
    mine = parse_choices(ours, allowed, flag) if ours is not None else None
    if alias is None:
        return mine if mine is not None else parse_choices(default, allowed, flag)
    theirs = list(dict.fromkeys(table[v] for v in parse_choices(alias, tuple(table),
                                                                 alias_flag)))
    if mine is not None and set(mine) != set(theirs):
        raise LlmplanError(f"{flag} {ours} and {alias_flag} {alias} disagree: give one")
    return theirs


def _check_targets(a: dict) -> tuple[float, float]:
    """The numeric flags in bounds; the TTFT and TPOT targets in seconds."""
    from planner.evidence.budget import parse_quantity

    for name in ("prompt_tokens", "output_tokens", "rps", "tokens_per_s", "price_per_hour",
                 "top"):
        positive("--" + name.replace("_", "-"), a[name])
    if (a["rps"] is None) == (a["tokens_per_s"] is None):
        raise LlmplanError("give exactly one of --rps or --tokens-per-s")
    times = {}
    for name in ("ttft", "tpot"):
        try:
            times[name] = parse_quantity(a[name], "time")
        except ValueError as err:
            raise LlmplanError(f"--{name}: {err}") from None
        if not times[name] > 0:  # said as given, with its unit, not in seconds
            raise LlmplanError(f"--{name}: must be positive, got {a[name]}")
    t_ttft, t_tpot = times["ttft"], times["tpot"]
    for name, v in (("--ttft", t_ttft), ("--tpot", t_tpot), ("--rps", a["rps"]),
                    ("--tokens-per-s", a["tokens_per_s"]),
                    ("--price-per-hour", a["price_per_hour"])):
        if v is not None and not math.isfinite(v):
            raise LlmplanError(f"{name}: must be a finite number, got {v:g}")
    if a["scheduler"] not in ("continuous", "static"):
        raise LlmplanError(f"--scheduler: '{a['scheduler']}' is not one of continuous, static")
    if a["disaggregated"] not in ("both", "off", "only"):
        raise LlmplanError(f"--disaggregated: must be both, off or only, got "
                           f"{a['disaggregated']!r}")
    if a["disaggregated"] == "only" and a["scheduler"] != "continuous":
        raise LlmplanError("--disaggregated only: sized with --scheduler continuous only")
    if a["percentile"] not in (50, 90, 99):
        raise LlmplanError(f"--percentile: must be 50, 90 or 99, got {a['percentile']}")
    positive("--sim-requests", a["sim_requests"])
    if a["sim_requests"] > 100_000:
        raise LlmplanError(f"--sim-requests: at most 100,000, got {a['sim_requests']}")
    if not 0 <= a["range_ratio"] < 1:
        raise LlmplanError(f"--range-ratio: must be in [0, 1), got {a['range_ratio']:g}")
    return t_ttft, t_tpot


def _show_static(df, m, *, prompt_tokens, output_tokens, top, csv, plot, as_json,
                 label, targets, engine_name: str, price_set: str = "",
                 kv_given: str = "") -> None:
    """The static-batching plan's rows: CSV, plot, JSON or the table of the cheapest
    (``targets``: what they were searched against, in seconds; ``kv_given``: the KV cache
    the command gave each GPU, ``_kv_given``)."""
    from planner.io.render import plain, table
    from planner.io.report import plot_pareto
    from planner.layouts.deployment import Layout

    ttft, tpot, req = label
    feas = df[df["meets_targets"]]
    bands_note = _static_band_columns(df, engine_name, targets, top) if len(df) else ""
    from planner.io.gate import gate_frame

    gate_frame(df, "plan")  # every row, before the CSV, JSON or table
    if csv:
        df.to_csv(csv, index=False)
        stderr.print(f"wrote {len(df):,} rows to {csv}")
    if plot and len(feas):
        plot_pareto(df, plot, title=f"{m.label}: prompt {prompt_tokens} / output "
                    f"{output_tokens}, TTFT <= {ttft}, TPOT <= {tpot}, {req:g} req/s")
        stderr.print(f"wrote {plot}")
    if as_json:
        json_out(plan_records(df))
    if not len(feas):
        from planner.search.plan import nearest_miss

        # exit 1 under --json too (its rows printed, the reason on stderr): a CI step that
        # reads the JSON must not take "nothing meets the targets" for a pass
        (stderr if as_json else stdout).print(
            f"no configuration of {len(df):,} meets TTFT <= {ttft} and TPOT <= {tpot}: "
            + nearest_miss(df, targets))
        raise typer.Exit(1)
    if as_json:
        return
    rows = []
    for r in feas.head(top).itertuples():
        rows.append([int(r.rank), r.gpu, Layout(r.tp, r.pp, r.ep).label, r.weights,
                     r.kv_cache, r.batch, int(r.replicas), int(r.total_gpus),
                     f"{r.ttft_s * 1e3:,.0f}", f"{r.tpot_s * 1e3:,.1f}",
                     f"{r.memory_headroom_frac:.0%}",
                     r.bound if isinstance(r.bound, str) else "-",
                     f"{r.usd_per_hour:,.2f}",
                     f"{r.cost_usd_per_million_output_tokens_at_traffic:,.3f}"])
    stdout.print(table(f"{plain(m.label)}: {len(feas):,} of {len(df):,} configurations meet "
                       f"TTFT <= {ttft}, TPOT <= {tpot} at {req:g} req/s{kv_given}; "
                       f"prices: {plain(price_set)}",
                       ["#", "gpu", "layout", "w", "kv", "batch", "rep-\nlicas", "GPUs",
                        "TTFT\nms", "TPOT\nms", "free\nmem", "bound", "$/h", "$/1M\nout"],
                       rows, left=5, compact=True))
    if bands_note:
        stdout.print(bands_note)


def _static_band_columns(df, engine_name: str, targets, top: int) -> str:
    """The static plan's rows with the error bands of a static batch's figures (estimate's:
    prefill for TTFT, decode for TPOT, batch 1 or batched by the row's batch) as
    ``ttft_s_low`` ... ``tpot_s_high`` and ``band_evidence``; the line the table prints:
    the bands, and the feasible rows shown whose slow end misses a target."""
    import pandas as pd

    from planner.evidence.bands import static_regime

    used = _add_bands(df, engine_name, {"ttft": ("ttft_s", "prefill"),
                                        "tpot": ("tpot_s", "decode")},
                      df["batch"].map(static_regime), pd.Series(True, index=df.index))
    if used is None:
        return ""
    said = [f"{metric.upper()} {r} x{b.low_ratio:.2f}-{b.high_ratio:.2f} ({b.n} figures"
            f"{', of every regime' if b.regime == 'all' else ''})"
            for metric, got in used.items() for r, b in sorted(got.items())]
    shown = df["rank"].isin(df.loc[df["meets_targets"], "rank"].head(top))
    slow = _slow_ranks(df, "ttft_s", "tpot_s", shown, targets)
    line = ("error bands (p10-p90 of measured / predicted on held-out published static rows; "
            f"--json: *_low, *_high): {', '.join(said)}; ")
    if slow:
        line += (f"at the slow end, rank{'s' if len(slow) > 1 else ''} "
                 f"{', '.join(map(str, slow))} miss the targets")
    else:
        line += "the rows shown meet the targets at the slow end too"
    return line


def _add_bands(df, engine_name: str, metrics: dict[str, tuple[str, str]], regimes, rows):
    """Each of ``metrics`` (name -> (column, phase)) with the engine's error band of its
    phase in each row's regime (``regimes``, a Series), as ``<column>_low`` / ``_high`` on
    the rows of the mask ``rows`` (None elsewhere), and ``band_evidence``; returns the bands
    used, {name: {regime: Band}}, or None where a phase has no band."""
    from planner.evidence.bands import pick
    from planner.io import catalog

    bands = catalog.load_bands()
    used: dict = {}
    evidence: dict[str, list[str]] = {r: [] for r in set(regimes)}
    for metric, (col, phase) in metrics.items():
        got = {r: pick(bands, engine_name, phase, r) for r in set(regimes)}
        if any(b is None for b in got.values()):
            return None
        used[metric] = got
        df[f"{col}_low"] = (df[col] * regimes.map(lambda r, g=got: g[r].low_ratio)).where(rows)
        df[f"{col}_high"] = (df[col] * regimes.map(lambda r, g=got: g[r].high_ratio)).where(rows)
        for r, b in got.items():
            who = "all engines" if b.engine == "all" else b.engine
            evidence[r].append(f"{metric.upper()} {who} {b.phase}, "
                               f"{'every regime' if b.regime == 'all' else b.regime}: "
                               f"{b.n} held-out figures from {b.sources} sources")
    df["band_evidence"] = ["; ".join(evidence[r]) if keep else None
                           for r, keep in zip(regimes, rows, strict=True)]
    return used


def _slow_ranks(df, ttft_col: str, tpot_col: str, shown, targets) -> list[int]:
    """The ranks of the rows ``shown`` (a mask) whose band's slow end misses a target."""
    slow = shown & ((df[f"{ttft_col}_high"] > targets.ttft_s)
                    | (df[f"{tpot_col}_high"] > targets.tpot_s))
    return [int(r) for r in df.loc[slow, "rank"]]


def _speculations(m, speculative, draft_model, k, a, scheduler) -> tuple:
    """The speculative configurations to size beside each configuration: none without
    --speculative; auto: every method the model can run with a known acceptance."""
    from planner.cli.options import SpeculativeMethod, speculation_config

    if speculative is None:
        if any(v is not None for v in (draft_model, k, a)):
            raise LlmplanError("--draft-model, --num-speculative-tokens and --acceptance-rate "
                               "go with --speculative")
        return ()
    if scheduler != "continuous":
        raise LlmplanError("--speculative: sized with --scheduler continuous only")
    names = [x.value for x in SpeculativeMethod]
    if speculative != "auto" and speculative not in names:
        raise LlmplanError(f"--speculative: '{speculative}' is not auto or one of "
                           f"{', '.join(names)}")
    if speculative != "auto":
        return (speculation_config(SpeculativeMethod(speculative), draft_model, k, a, model=m),)
    out = []
    for method in SpeculativeMethod:
        if (method == SpeculativeMethod.draft_model) != (draft_model is not None):
            continue
        try:
            out.append(speculation_config(method, draft_model, k, a, model=m))
        except LlmplanError:
            continue  # no MTP layer, no published acceptance: not a method this model has
    if not out:
        raise LlmplanError(f"--speculative auto: no method for {m.name} has a known acceptance "
                           "(planner/data/speculation.yaml); give --acceptance-rate with "
                           "--num-speculative-tokens for ngram, or --draft-model")
    stderr.print("speculation tried: " + "; ".join(
        f"{c.method} k = {c.k}, acceptance {c.acceptance:.3g}" for c in out))
    return tuple(out)


def _spec_cell(r) -> str:
    """The speculative method a row keeps, or "-"."""
    v = r.get("speculative")
    return v if isinstance(v, str) else "-"


def _prompts_refused(engine, gpus, prompt_tokens: int) -> str | None:
    """Why every configuration's replica refuses the stream's requests, where the engine's
    own defaults do on every GPU searched (``Engine.refuses_prompt``: a prompt above the
    token budget of a step with chunked prefill off, TensorRT-LLM's max_num_tokens 8,192, is
    refused on arrival, as the simulator refuses it); the static estimates would otherwise
    call the traffic the bind."""
    limits = set()
    for hw in gpus:
        e = engine.for_gpu(hw.memory_bytes, hw.name, hw.architecture, hw.vendor)
        if not e.refuses_prompt(prompt_tokens):
            return None
        limits.add(e.max_num_batched_tokens)
    if not limits:
        return None
    return (f"{engine.display_name or engine.name} refuses every request with its defaults: a "
            f"{prompt_tokens:,}-token prompt is above its step's token budget "
            f"({', '.join(f'{n:,}' for n in sorted(limits))}) with chunked prefill off. To "
            "plan with chunked prefill, give --engine a copy of its profile with "
            "serving.chunked_prefill.value: true (simulate takes --chunked-prefill or a "
            "larger --max-num-batched-tokens)")


def _some_precision_runs(gpus, weights, compute, cal, eng, auto: bool = False) -> None:
    """At least one GPU runs at least one of the weight precisions asked for; otherwise the
    reason (a T4 has no bf16) is the error, not "no configuration meets the targets"."""
    from planner.core.errors import UsageError
    from planner.core.estimate import prepare
    from planner.core.specs import Options, Precision

    why = None
    for hw in gpus:
        for w in weights:
            try:
                prepare(hw, Precision.of(w, compute=compute, auto=auto), cal, Options(), eng)
                return
            except UsageError as err:
                why = why or str(err)
    raise LlmplanError(f"no GPU asked for runs these weights: {why}")


def _band_columns(df, engine_name: str, name: str, targets, top: int, kind: str = "") -> str:
    """Each aggregated row's {name} TTFT and TPOT with the engine's served error bands
    (p10-p90 of measured / predicted on held-out published runs of replicas that keep up,
    ``planner/data/bands.yaml``) as ``*_low`` / ``*_high`` columns, the evidence beside them;
    disaggregated rows get none (no published disaggregated run is held out). Returns the
    line the table prints: the bands, and the shown rows whose slow end misses a target."""
    import pandas as pd

    from planner.evidence.bands import kind_note
    from planner.io import catalog

    agg = ~df["disaggregated"].astype(bool)
    ttft_col, tpot_col = f"{name}_ttft_s", f"{name}_tpot_s"
    used = _add_bands(df, engine_name, {"ttft": (ttft_col, "served TTFT"),
                                        "tpot": (tpot_col, "served TPOT")},
                      pd.Series("unsaturated", index=df.index), agg)
    if used is None:
        return ""
    t, d = used["ttft"]["unsaturated"], used["tpot"]["unsaturated"]
    shown = agg & (df["rank"] <= top)
    missed = _slow_ranks(df, ttft_col, tpot_col, shown, targets)
    line = (f"error bands (p10-p90 of measured / predicted on held-out served runs; "
            f"--json: *_low, *_high): TTFT x{t.low_ratio:.2f}-{t.high_ratio:.2f}, TPOT "
            f"x{d.low_ratio:.2f}-{d.high_ratio:.2f} ({t.n} and {d.n} figures); ")
    if missed:
        line += (f"at the slow end, rank{'s' if len(missed) > 1 else ''} "
                 f"{', '.join(map(str, missed))} miss the targets: --size-at high sizes "
                 "replicas so that the slow end meets them")
    elif shown.any():
        line += "the aggregated rows shown meet the targets at the slow end too"
    else:
        line += "no aggregated row is among those shown"
    note = kind_note(catalog.load_bands(), engine_name, "served TPOT", "unsaturated", kind)
    if note:
        line += f"; TPOT of {note}"
    if (~agg).any():
        line += "; disaggregated rows: no band (no published disaggregated run is held out)"
    return line


def _size_factors(engine_name: str, size_at: SizeAt, gpus=()) -> dict:
    """``SimSettings``' factors: none, or the high end of the engine's served TPOT and TTFT
    bands (``planner.evidence.bands.served_band_factors``), saying which and naming the GPUs of
    a class the bands' figures were not measured on."""
    if size_at == SizeAt.predicted:
        return {}
    from planner.evidence.bands import served_band_factors
    from planner.io import catalog

    try:
        factors, used = served_band_factors(catalog.load_bands(), engine_name)
    except LlmplanError as err:
        raise LlmplanError(f"--size-at high: {err} ({catalog.BANDS_FILE})") from None
    for phase, b in used.items():
        what = "every step" if phase == "served TPOT" else "TTFT at least"
        stderr.print(f"sizing at the high end of the {phase} band: {what} "
                     f"x{b.high_ratio:.2f} ({b.engine if b.engine != 'all' else 'all engines'}, "
                     f"{b.n} held-out figures from {b.sources} sources)")
        unmeasured = sorted(g.name for g in gpus if b.measured_on(g.architecture) is False)
        if unmeasured:
            stderr.print(f"  none of those figures on a GPU of the class of "
                         f"{', '.join(unmeasured)}: their band is other GPUs' evidence")
    return factors


def _kv_given(o) -> str:
    """The KV cache the command gave each GPU, for the table's title ("" where none)."""
    if o is None:
        return ""
    out = ""
    if o.kv_cache_memory_bytes is not None:
        out += f", KV cache {fmt.gib(o.kv_cache_memory_bytes)} a GPU"
    if o.kv_cache_max_tokens is not None:
        out += f", KV cache at most {o.kv_cache_max_tokens:,} tokens a GPU"
    return out


def _plan_continuous(m, gpus, *, prompt_tokens, output_tokens, targets, tps, weights, kv_cache,
                     calibration, price_per_hour, engine, settings, top, csv, plot, as_json,
                     label, compute=None, pps=(1,), eps=(1,), quantized_layers="all",
                     options=None, speculations=(), disaggregated="off", jobs=1,
                     price_set: str = "", emit: bool = True, auto_dtype: bool = False,
                     released: bool = False):
    from functools import partial

    import numpy as np
    import pandas as pd

    from planner.evidence.workers import forked_map, prefetched
    from planner.io.render import plain, table
    from planner.io.report import plot_pareto
    from planner.layouts.deployment import Layout
    from planner.search.disagg import pd_label, search_disaggregated
    from planner.search.plan import percentile_name, search_continuous

    kw = dict(prompt_tokens=prompt_tokens, output_tokens=output_tokens, targets=targets,
              tps=tps, weights=weights, kv_cache=kv_cache, calibration=calibration,
              price_usd_per_gpu_hour=price_per_hour, engine=engine, settings=settings,
              top=top, compute=compute, quantized_layers=quantized_layers, options=options,
              prefetch=partial(prefetched, jobs=jobs) if jobs > 1 else None,
              auto_dtype=auto_dtype, released=released)
    frames = []
    from planner.search.plan import screen

    screened = screen(m, gpus, pps=pps if disaggregated != "only" else (1,),
                      eps=eps if disaggregated != "only" else (1,),
                      map_gpus=partial(forked_map, jobs=jobs) if jobs > 1 else None,
                      **{k: v for k, v in kw.items() if k not in ("settings", "top",
                                                                  "prefetch")})
    from planner.cli.progress import task_progress

    with task_progress("sizing configurations", enabled=not as_json) as advance:
        if disaggregated != "only":
            frames.append(search_continuous(m, gpus, pps=pps, eps=eps,
                                            speculations=speculations, screened=screened,
                                            advance=advance, **kw)
                          .assign(disaggregated=False))
        if disaggregated != "off":
            frames.append(search_disaggregated(m, gpus, screened=screened, advance=advance,
                                               **kw))
    frames = [f for f in frames if len(f)]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(df):
        df = df.drop(columns=["rank"], errors="ignore").sort_values(
            ["usd_per_hour", "total_gpus"]).reset_index(drop=True)
        df.insert(0, "rank", np.arange(1, len(df) + 1))
        df["price_set"] = price_set
        for col in ("prefill_instances", "prefill_tp", "decode_instances", "decode_tp",
                    "replicas", "total_gpus", "num_gpus", "tp", "pp", "ep", "batch"):
            if col in df:  # counts stay whole numbers where the other kind of row has none
                df[col] = df[col].astype("Int64")
    ttft, tpot, req = label
    p = settings.percentile
    name = percentile_name(p)
    bands_note = _band_columns(df, engine.name, name, targets, top, model_kind(m)) \
        if settings.sizes_at_prediction and len(df) else None
    from planner.io.gate import gate_frame

    gate_frame(df, "plan")  # every row, before the CSV, JSON or table
    if not emit:
        return df
    if csv:
        df.to_csv(csv, index=False)
        stderr.print(f"wrote {len(df):,} rows to {csv}")
    if plot and len(df):
        plot_pareto(df, plot, title=f"{m.label}: prompt {prompt_tokens} / output "
                    f"{output_tokens}, {name} TTFT <= {ttft} and TPOT <= {tpot}, {req:g} req/s "
                    "(continuous batching, simulated)")
        stderr.print(f"wrote {plot}")
    if as_json:
        json_out(plan_records(df))
    if not len(df):
        from planner.search.plan import nearest_miss, search

        static = search(m, gpus, pps=pps, eps=eps,
                        batches=[1, 2, 4, 8, 16, 32, 64, 128, 192, 256],
                        **{k: v for k, v in kw.items() if k not in ("settings", "top",
                                                                    "prefetch")})
        why = _prompts_refused(engine, gpus, prompt_tokens) or nearest_miss(static, targets)
        (stderr if as_json else stdout).print(
            f"no configuration meets {name} TTFT <= {ttft} and TPOT <= {tpot} at "
            f"{req:g} req/s: " + why)
        raise typer.Exit(1)
    if as_json:
        return df
    rows = []
    for r in df.head(top).to_dict("records"):
        pd_row = bool(r.get("disaggregated"))
        rows.append([int(r["rank"]), r["gpu"],
                     pd_label(r) if pd_row else Layout(r["tp"], r["pp"], r["ep"]).label,
                     r["weights"], r["kv_cache"], f"{fmt.sig(r['rate_per_replica'])}",
                     f"{r[f'{name}_ttft_s'] * 1e3:,.0f}", f"{r[f'{name}_tpot_s'] * 1e3:,.1f}",
                     f"{int(r['prefill_instances'])}+{int(r['decode_instances'])}" if pd_row
                     else int(r["replicas"]),
                     int(r["total_gpus"]), f"{r['usd_per_hour']:,.2f}",
                     f"{r['cost_usd_per_million_output_tokens_at_traffic']:,.3f}"]
                    + ([_spec_cell(r)] if speculations else []))
    stdout.print(table(f"{plain(m.label)}: {name} TTFT <= {plain(ttft)} and TPOT <= "
                       f"{plain(tpot)} at {req:g} "
                       f"req/s; {len(df)} configurations simulated (continuous batching, "
                       f"engine {engine.label}"
                       + (f", --performance-mode {settings.performance_mode}"
                          if settings.performance_mode else "")
                       + _kv_given(options)
                       + "), each replica sized for the rate shown; "
                       f"prices: {plain(price_set)}",
                       ["#", "gpu", "layout", "w", "kv", "req/s\neach", f"{name}\nTTFT\nms",
                        f"{name}\nTPOT\nms", "rep-\nlicas", "GPUs", "$/h", "$/1M\nout",
                        *(["spec"] if speculations else [])], rows,
                       left=5, compact=True))
    if len(df) and df["disaggregated"].astype(bool).head(top).any():
        stdout.print("<n>P<m>D TP<a>/<b>: disaggregated, n prefill instances of TP a and m "
                     "decode instances of TP b (replicas n+m; req/s each: per decode "
                     "instance; w: prefill/decode where they differ), the KV sent between "
                     "them (--json: kv_link, kv_transfer_mean_s)")
    if speculations:
        stdout.print("spec: the speculative method a row keeps because it lowers the cost "
                     "at the targets; -: it does not (--json: baseline_usd_per_hour)")
    if bands_note:
        stdout.print(bands_note)
    if not settings.sizes_at_prediction:
        stdout.print(f"sized at the high end of the error bands: a replica whose every step "
                     f"takes x{settings.step_factor:.2f} its predicted time, its TTFT times "
                     f"x{settings.ttft_factor:.2f} more (x"
                     f"{settings.step_factor * settings.ttft_factor:.2f} in all at least) and "
                     f"TPOT x{settings.tpot_factor:.2f} held to the targets (the table shows "
                     "the predicted figures; --json: *_high)")
    return df
