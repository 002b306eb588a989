"""`llmplan watch`: a live server's Prometheus metrics against the prediction."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from planner.cli.compare import server_setup
from planner.cli.options import (
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
    WeightsOption,
    json_out,
    positive,
    stderr,
    stdout,
)
from planner.core.errors import LlmplanError


def watch(
    url: Annotated[str, typer.Argument(help="The server's metrics page, e.g. "
                                            "http://localhost:8000/metrics.")],
    model: ModelOpt,
    gpu: GpuOpt,
    tp: TpOpt = 1,
    engine: EngineOpt = DEFAULT_ENGINE,
    weights: WeightsOption = None,
    kv_cache: KVOption = None,
    group_size: GroupSizeOpt = None,
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

    from planner.io.watch import Exporter, derive, now_s, parse, scrape, window

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
    s, _ = server_setup(model, gpu, engine, tp, weights, kv_cache, group_size, quantized_layers)

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
    from planner.io import fmt
    from planner.io.render import plain

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
