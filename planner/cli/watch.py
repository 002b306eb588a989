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
    duration_option,
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
    interval: Annotated[float, duration_option(
        "--interval", help="Time between scrapes (5s, 500ms): the window rates and latencies "
        "are taken over.")] = 5.0,
    model_name: Annotated[Optional[str], typer.Option(
        help="Only the series whose model_name label is this (a server with several).",
        metavar="NAME")] =
    None,
    once: Annotated[bool, typer.Option(
        "--once", help="Scrape twice, one interval apart, print the window and exit.")] = False,
    count: Annotated[Optional[int], typer.Option(
        help="Stop after this many windows (default: until Ctrl-C).", metavar="N")] = None,
    serve_metrics: Annotated[Optional[int], typer.Option(
        "--serve-metrics", help="Serve the derived figures as Prometheus gauges "
        "(llmplan_mbu, llmplan_mfu, llmplan_predicted_tpot_seconds, ...) on this port.",
        metavar="PORT")] =
    None,
    bind: Annotated[str, typer.Option(
        "--bind", metavar="HOST", help="The address --serve-metrics listens on: this machine "
        "only by default; 0.0.0.0 (or ::) to listen on every interface.")] = "127.0.0.1",
    timeout: Annotated[float, duration_option(
        "--timeout", help="How long a whole scrape may take (5s): connect, every read, every "
        "redirect.")] = 5.0,
    follow_redirects: Annotated[bool, typer.Option(
        "--follow-redirects", help="Follow a redirect to the same host (another host is "
        "refused). By default a redirect is an error naming where it points.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Scrape a running vLLM or SGLang server's Prometheus metrics and show, per window:
    running and waiting requests, token throughput, TTFT and TPOT, KV cache use, and the
    achieved bandwidth, MBU and MFU against the GPUs' ceilings, beside llmplan's TPOT for the
    running concurrency. A figure that cannot be true (a negative or NaN count, KV cache use
    or MBU above 100%) is shown as implausible, with why, instead of as a number. A page
    over 16 MiB is refused."""
    import time

    from planner.io.render import plain
    from planner.io.watch import Exporter, derive, now_s, parse, scrape, window

    positive("--interval", interval)
    positive("--timeout", timeout)
    if interval > 3600:
        raise LlmplanError(f"--interval: at most 3600 seconds, got {interval:g}")
    if timeout > 600:
        raise LlmplanError(f"--timeout: at most 600 seconds, got {timeout:g}")
    positive("--count", count)
    if not bind.strip():  # the empty address would mean every interface
        raise LlmplanError("--bind: a host name or address (0.0.0.0 for every interface)")
    if serve_metrics is not None and not 0 < serve_metrics < 65536:
        raise LlmplanError(f"--serve-metrics: a port in 1..65535, got {serve_metrics}")
    if as_json and not once and count is None:
        raise LlmplanError("--json prints one window: give --once or --count")
    s, _ = server_setup(model, gpu, engine, tp, weights, kv_cache, group_size, quantized_layers)

    def snap():
        t = now_s()
        text = scrape(url, timeout_s=timeout, follow_redirects=follow_redirects)
        try:
            return parse(text, model_name=model_name, t_s=t)
        except LlmplanError as err:
            raise LlmplanError(f"{url}: {err}") from None

    exporter = None
    if serve_metrics is not None:
        exporter = Exporter(serve_metrics, {"model": s.model.name, "gpu": s.hardware.name},
                            addr=bind)
        host = f"[{bind}]" if ":" in bind else bind
        stderr.print(f"serving llmplan_* gauges on http://{plain(host)}:{serve_metrics}/metrics")
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
                from planner.io.gate import gate

                _print_window(gate(figs, "watch's lines"), s, url)
    finally:
        if exporter is not None:
            exporter.close()


def _print_window(f: dict, s, url: str) -> None:
    """Two lines of figures and a third for the MBU; a figure the server reported but that
    cannot be true reads "implausible", and a last line says why (text from the server has
    had its control characters removed by planner.io.watch)."""
    from planner.io import fmt
    from planner.io.render import plain

    bad = f.get("implausible", {})

    def num(key: str, show) -> str:
        if key in bad:
            return "[red]implausible[/]"
        return "-" if f.get(key) is None else show(f[key])

    def t(key: str) -> str:
        return num(key, fmt.seconds)

    def pct(key: str) -> str:
        return num(key, fmt.pct)

    bw = f.get("achieved_bandwidth_bytes_per_s")
    stdout.print(
        f"[bold]{plain(url)}[/] ({f['server']}, {f['window_s']:.1f} s): "
        f"{num('running_requests', '{:.0f}'.format)} running, "
        f"{num('waiting_requests', '{:.0f}'.format)} waiting, KV "
        f"{pct('kv_cache_used_frac')}; {num('output_tokens_per_s', '{:,.0f}'.format)} out "
        f"tok/s, {num('prompt_tokens_per_s', '{:,.0f}'.format)} prompt tok/s\n"
        f"  TTFT mean {t('mean_ttft_s')} p99 {t('p99_ttft_s')}; TPOT mean "
        f"{t('mean_tpot_s')} p99 {t('p99_tpot_s')}; llmplan's TPOT at this "
        f"concurrency {t('predicted_tpot_s')}\n"
        f"  MBU {pct('mbu')}" + (f" ({bw / 1e9:,.0f} GB/s)" if bw else "")
        + f", MFU {pct('mfu')} of {s.tp} x {plain(s.hardware.name)}")
    reasons = dict.fromkeys(bad.values())  # one figure's reason may cover several keys
    if reasons:
        stdout.print("  [red]implausible[/]: " + "; ".join(plain(r) for r in reasons))
