"""`llmplan compare` and `llmplan calibrate`: real servers' benchmark results against the
prediction, and an engine profile fitted to them."""

from __future__ import annotations

import json
import math
from datetime import date as _date
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli_common import (
    DEFAULT_ENGINE,
    EngineOpt,
    GpuOpt,
    GroupSizeOpt,
    JsonOpt,
    KVOption,
    ModelOpt,
    QuantizedLayers,
    QuantizedLayersOpt,
    TpOpt,
    WeightsOpt,
    WeightsOption,
    check_quantized_layers,
    json_out,
    output_path,
    positive,
    stderr,
    stdout,
)
from planner.errors import LlmplanError

FilesArg = Annotated[list[Path], typer.Argument(
    help="Result files: vLLM `bench serve` JSON, SGLang `bench_serving` JSONL, guidellm "
         "report JSON, genai-perf profile export JSON, or `llmplan measure` JSONL.")]
MAX_FILE_BYTES = 200 * 1024 * 1024


def read_result_file(path: Path):
    """The runs of one result file, whatever its format."""
    from planner import catalog
    from planner.servers.formats import read_runs

    if path.is_dir():
        raise LlmplanError(f"{path}: is a directory; give a result file")
    if not path.is_file():
        raise LlmplanError(f"{path}: no such file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise LlmplanError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB")
    text = catalog.read_text(path)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        data = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                raise LlmplanError(f"{path}:{i}: neither a JSON document nor JSON Lines"
                                   ) from None
            data.append(obj)
    except ValueError as err:  # a number of 5,000 digits
        raise LlmplanError(f"{path}: {err}") from None
    return read_runs(data, str(path))


def served_setup(model: str, gpu: str, spec, tp: int, weights, kv_cache,
                 group_size: int = 128, quantized_layers="all"):
    """The deployment a served run was measured on, resolved for prediction: the engine's
    scheduler budget is the prefill chunk."""
    from planner import catalog
    from planner.estimate import prepare
    from planner.ops import check_tp
    from planner.servers.compare import Setup
    from planner.specs import Options, Precision

    positive("--tp", tp)
    positive("--group-size", group_size)
    m = catalog.load_model(model)
    hw = catalog.load_hardware(gpu)
    check_tp(m, tp)
    eng = spec.model()
    opts = Options(prefill_chunk_tokens=eng.max_num_batched_tokens)
    value = lambda v: getattr(v, "value", v)  # noqa: E731 (an enum or its value)
    prep = prepare(hw, Precision.of(value(weights), value(kv_cache) if kv_cache else None,
                                    group_size,
                                    quantized_layers=check_quantized_layers(m, quantized_layers)),
                   None, opts, eng)
    return Setup(m, hw, prep, opts, tp=tp)


def _setup(model: str, gpu: str, engine: str, tp: int, weights, kv_cache, group_size: int,
           quantized_layers=QuantizedLayers.all):
    from planner import catalog

    spec = catalog.load_engine_spec(engine)
    return served_setup(model, gpu, spec, tp, weights, kv_cache, group_size,
                        quantized_layers), spec


def _runs(files: list[Path]):
    runs = []
    for f in files:
        runs += read_result_file(f)
    return runs


def _fmt_metric(metric: str, v: float | None) -> str:
    from planner import fmt

    if v is None:
        return "-"
    return fmt.seconds(v) if metric.endswith("_s") else f"{v:,.4g}"


def _err(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


SHORT = {"request_throughput": "req/s", "output_throughput": "out tok/s",
         "total_token_throughput": "tok/s"}


def compare(
    files: FilesArg,
    model: ModelOpt,
    gpu: GpuOpt,
    tp: TpOpt = 1,
    engine: EngineOpt = DEFAULT_ENGINE,
    weights: WeightsOption = WeightsOpt.bf16,
    kv_cache: KVOption = None,
    group_size: GroupSizeOpt = 128,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="PNG of predicted vs measured, one point per run and figure.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Measured serving runs against llmplan's prediction for the same traffic (the
    simulator's, and the steady-state estimate at the concurrency the server held), with the
    signed error and the measured MBU and MFU."""
    from planner import fmt
    from planner.render import plain, table
    from planner.servers.compare import compare_run

    output_path(plot, "--plot", ".png")
    s, _ = _setup(model, gpu, engine, tp, weights, kv_cache, group_size, quantized_layers)
    comps = [compare_run(r, s) for r in _runs(files)]
    if plot is not None:
        from planner.report import plot_served

        plot_served(comps, plot, title=f"{s.model.label} on {tp} x {s.hardware.display_name}, "
                                       f"engine {s.engine.name}: predicted vs measured")
        stderr.print(f"wrote {plot}")
    if as_json:
        json_out({"model": s.model.name, "gpu": s.hardware.name, "tp": tp,
                  "engine": s.engine.name, "weights": s.prep.precision.weights.value,
                  "quantized_layers": s.prep.precision.quantized_layers,
                  "runs": [c.as_dict() for c in comps]})
        return
    stdout.print(f"[bold]{plain(s.model.label)}[/] on {tp} x {plain(s.hardware.display_name)}, "
                 f"engine {plain(s.engine.name)}, weights {s.prep.precision.weights.value}")
    for c in comps:
        r = c.run
        util = (f"MBU {fmt.pct(c.mbu)} ({c.achieved_bandwidth_bytes_per_s / 1e9:,.0f} GB/s at "
                f"{c.concurrency:,.1f} decoding)" if c.mbu is not None else "MBU -")
        util += f", MFU {fmt.pct(c.mfu)}" if c.mfu is not None else ", MFU -"
        rows = [[SHORT.get(m.metric, m.metric.removesuffix("_s")),
                 _fmt_metric(m.metric, m.measured), _fmt_metric(m.metric, m.simulated),
                 _err(m.error), _fmt_metric(m.metric, m.steady), _err(m.steady_error)]
                for m in c.rows]
        stdout.print(f"\n[bold]{plain(r.source)}[/]: {plain(r.label)} ({r.tool}); {r.traffic}, "
                     f"{r.completed:,} requests of {r.mean_input_tokens:,.0f} + "
                     f"{r.mean_output_tokens:,.0f} tokens")
        stdout.print(f"  measured {util}")
        stdout.print(table(None, ["figure", "measured", "simulated", "error", "steady\nstate",
                                  "error"], rows, left=1, compact=True))
        for n in r.notes + c.notes:
            stdout.print(f"  [dim]{plain(n)}[/]")


def calibrate(
    files: FilesArg,
    model: ModelOpt,
    gpu: GpuOpt,
    out: Annotated[Path, typer.Option("--out", "-o", help="Engine profile YAML to write.")],
    tp: TpOpt = 1,
    base_engine: Annotated[str, typer.Option(
        "--base-engine", help="Engine profile whose other parameters the fit keeps.")] =
    DEFAULT_ENGINE,
    name: Annotated[Optional[str], typer.Option(
        help="Name of the new profile (default: the output file's stem).")] = None,
    weights: WeightsOption = WeightsOpt.bf16,
    kv_cache: KVOption = None,
    group_size: GroupSizeOpt = 128,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    leave_one_out: Annotated[bool, typer.Option(
        "--leave-one-out/--no-leave-one-out",
        help="Also fit once per run without it, to show the held-out error.")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Fit an engine profile's per-step cost, decode bandwidth efficiency, prefill compute
    efficiency and (with TP) all-reduce latency to measured serving runs; write it as a
    profile every command takes with --engine PATH."""
    from planner import fmt
    from planner.render import plain, table
    from planner.servers.calibrate import calibrate as fit

    output_path(out, "--out")
    if out.suffix.lower() not in (".yaml", ".yml"):
        raise LlmplanError(f"--out: {out} must end in .yaml")
    name = name or out.stem
    if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise LlmplanError(f"--name: '{name}' must be letters, digits, '-', '_' or '.'")
    s, spec = _setup(model, gpu, base_engine, tp, weights, kv_cache, group_size,
                      quantized_layers)
    runs = _runs(files)
    try:
        res = fit(runs, s, spec, name=name, date=_date.today().isoformat(),
                  leave_one_out=leave_one_out)
    except ValueError as err:
        raise LlmplanError(f"calibrate: {err}") from None
    _write_profile(res, out, spec.name)
    if as_json:
        json_out({"profile": str(out), "base_engine": spec.name, "values": res.values,
                  "unidentified": res.unidentified, "runs": list(res.runs),
                  "errors": [e.__dict__ for e in res.errors]})
        return
    stdout.print(f"[bold]fitted[/] {len(res.runs)} run(s) of {plain(s.model.name)} on {tp} x "
                 f"{plain(s.hardware.name)}, from {plain(spec.name)}; wrote {plain(out)}")
    rows = [[p, f"{spec.parameters()[p].value:g}", f"{v:g}"] for p, v in res.values.items()]
    rows += [[p, f"{spec.parameters()[p].value:g}", f"kept: {why}"]
             for p, why in res.unidentified.items()]
    stdout.print(table("Parameters", ["parameter", "base", "fitted"], rows, left=1,
                       compact=True, fold=(2,)))
    stdout.print(table("Error per run and figure (predicted / measured - 1)",
                       ["run", "figure", "measured", "base", "in-sample", "held out"],
                       [[e.run, e.metric.removesuffix("_s"), _fmt_metric(e.metric, e.measured),
                         _err(e.before), _err(e.in_sample), _err(e.held_out)]
                        for e in res.errors], left=2, compact=True, fold=(0,)))
    med = _median_abs([e.in_sample for e in res.errors])
    held = _median_abs([e.held_out for e in res.errors])
    stdout.print(f"median |error|: base {fmt.pct(_median_abs([e.before for e in res.errors]))}"
                 f", in-sample {fmt.pct(med)}"
                 + (f", leave-one-out {fmt.pct(held)}" if not math.isnan(held) else ""))


def _median_abs(v: list[float | None]) -> float:
    from planner.validate import quantile

    return quantile([abs(x) for x in v if x is not None], 0.5)


def _write_profile(res, out: Path, base: str) -> None:
    import yaml

    data = res.engine.model_dump(mode="json", exclude_none=True)
    head = (f"# Engine profile fitted by `llmplan calibrate` from {base} on "
            f"{_date.today().isoformat()}.\n# Fitted on: {', '.join(res.runs)}\n"
            f"# Parameters fitted: {', '.join(res.values) or 'none'}; kept at {base}'s values:"
            f" {', '.join(res.unidentified) or 'none'}.\n")
    out.write_text(head + yaml.safe_dump(data, sort_keys=False, width=100))


def watch(
    url: Annotated[str, typer.Argument(help="The server's metrics page, e.g. "
                                            "http://localhost:8000/metrics.")],
    model: ModelOpt,
    gpu: GpuOpt,
    tp: TpOpt = 1,
    engine: EngineOpt = DEFAULT_ENGINE,
    weights: WeightsOption = WeightsOpt.bf16,
    kv_cache: KVOption = None,
    group_size: GroupSizeOpt = 128,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    interval: Annotated[float, typer.Option(
        help="Seconds between scrapes: the window rates and latencies are taken over.")] = 5.0,
    model_name: Annotated[Optional[str], typer.Option(
        help="Only the series whose model_name label is this (a server with several).")] =
    None,
    once: Annotated[bool, typer.Option(
        "--once", help="Scrape twice, one interval apart, print the window and exit.")] = False,
    count: Annotated[Optional[int], typer.Option(
        help="Stop after this many windows (default: until Ctrl-C).")] = None,
    serve_metrics: Annotated[Optional[int], typer.Option(
        "--serve-metrics", help="Serve the derived figures as Prometheus gauges "
        "(llmplan_mbu, llmplan_mfu, llmplan_predicted_tpot_seconds, ...) on this port.")] =
    None,
    timeout: Annotated[float, typer.Option(help="Seconds a scrape may take.")] = 5.0,
    as_json: JsonOpt = False,
) -> None:
    """Scrape a running vLLM or SGLang server's Prometheus metrics and show, per window:
    running and waiting requests, token throughput, TTFT and TPOT, KV cache use, and the
    achieved bandwidth, MBU and MFU against the GPUs' ceilings, beside llmplan's TPOT for the
    running concurrency."""
    import time

    from planner.servers.watch import Exporter, derive, now_s, parse, scrape, window

    positive("--interval", interval)
    positive("--timeout", timeout)
    if interval > 3600:
        raise LlmplanError(f"--interval: at most 3600 seconds, got {interval:g}")
    if timeout > 600:
        raise LlmplanError(f"--timeout: at most 600 seconds, got {timeout:g}")
    positive("--count", count)
    if serve_metrics is not None and not 0 < serve_metrics < 65536:
        raise LlmplanError(f"--serve-metrics: a port in 1..65535, got {serve_metrics}")
    if as_json and not once and count is None:
        raise LlmplanError("--json prints one window: give --once or --count")
    s, _ = _setup(model, gpu, engine, tp, weights, kv_cache, group_size, quantized_layers)

    def snap():
        t = now_s()
        text = scrape(url, timeout_s=timeout)
        try:
            return parse(text, model_name=model_name, t_s=t)
        except LlmplanError as err:
            raise LlmplanError(f"{url}: {err}") from None

    exporter = None
    if serve_metrics is not None:
        exporter = Exporter(serve_metrics, {"model": s.model.name, "gpu": s.hardware.name})
        stderr.print(f"serving llmplan_* gauges on :{serve_metrics}/metrics")
    windows = 1 if once else count
    done = 0
    try:
        old = snap()
        while windows is None or done < windows:
            time.sleep(interval)
            new = snap()
            figs = derive(window(old, new), s)
            old = new
            done += 1
            if exporter is not None:
                exporter.update(figs)
            if as_json:
                if windows is None or done == windows:
                    json_out({"url": url, "model": s.model.name, "gpu": s.hardware.name,
                              "tp": tp, "engine": s.engine.name, "metric_names": new.names,
                              **figs})
            else:
                _print_window(figs, s, url)
    finally:
        if exporter is not None:
            exporter.close()


def _print_window(f: dict, s, url: str) -> None:
    from planner import fmt
    from planner.render import plain

    def t(v):
        return "-" if v is None else fmt.seconds(v)

    def pct(v):
        return "-" if v is None else fmt.pct(v)

    bw = f.get("achieved_bandwidth_bytes_per_s")
    stdout.print(
        f"[bold]{plain(url)}[/] ({f['server']}, {f['window_s']:.1f} s): "
        f"{f['running_requests']:.0f} running, {f['waiting_requests']:.0f} waiting, KV "
        f"{pct(f['kv_cache_used_frac'])}; {f['output_tokens_per_s']:,.0f} out tok/s, "
        f"{f['prompt_tokens_per_s']:,.0f} prompt tok/s\n"
        f"  TTFT mean {t(f['mean_ttft_s'])} p99 {t(f['p99_ttft_s'])}; TPOT mean "
        f"{t(f['mean_tpot_s'])} p99 {t(f['p99_tpot_s'])}; llmplan's TPOT at this "
        f"concurrency {t(f['predicted_tpot_s'])}\n"
        f"  MBU {pct(f['mbu'])}" + (f" ({bw / 1e9:,.0f} GB/s)" if bw else "")
        + f", MFU {pct(f['mfu'])} of {s.tp} x {plain(s.hardware.name)}")
