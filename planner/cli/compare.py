"""`llmplan compare`: real servers' benchmark results against the simulated prediction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

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
    WeightsOpt,
    WeightsOption,
    json_out,
    output_path,
    positive,
    precision_of,
    stderr,
    stdout,
)
from planner.core.errors import LlmplanError
from planner.core.specs import DEFAULT_GROUP_SIZE

FilesArg = Annotated[list[Path], typer.Argument(
    help="Result files: vLLM `bench serve` JSON, SGLang `bench_serving` JSONL, guidellm "
         "report JSON, genai-perf profile export JSON, or `llmplan measure` JSONL.")]
MAX_FILE_BYTES = 200 * 1024 * 1024


def read_result_file(path: Path):
    """The runs of one result file, whatever its format."""
    from planner.evidence.formats import PRINTED_MARK, read_printed, read_runs
    from planner.io import catalog

    if path.is_dir():
        raise LlmplanError(f"{path}: is a directory; give a result file")
    if not path.is_file():
        raise LlmplanError(f"{path}: no such file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise LlmplanError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB")
    text = catalog.read_text(path)
    if PRINTED_MARK in text and not text.lstrip().startswith(("{", "[")):
        return read_printed(text, str(path))
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


def server_overrides(command: str | None) -> dict:
    """What a server command (vLLM's, SGLang's or trtllm-serve's flag names) sets, keyed by
    our option (planner/cli/flags.py, the table the CLI's vLLM names come from too)."""
    from planner.cli.flags import server_flags

    return server_flags(command)


# our scheduler options a server command sets, and the Engine field each is
ENGINE_FIELDS = {"--max-num-seqs": "max_num_seqs",
                 "--max-num-batched-tokens": "max_num_batched_tokens",
                 "--block-size": "block_size", "--chunked-prefill": "chunked_prefill",
                 "--prefix-cache": "prefix_caching", "--mixed-batches": "mixed_batches",
                 "--api-server-count": "api_servers"}


def _agree(ours: str, theirs, given, what: str) -> None:
    if theirs is not None and given is not None and _plain(given) != theirs:
        raise LlmplanError(f"the server command's {ours} {theirs} and the run's {what} "
                           f"{_plain(given)} disagree")


def _plain(v):
    return getattr(v, "value", v)


def served_setup(model: str, gpu: str, spec, tp: int, weights, kv_cache,
                 group_size: int = DEFAULT_GROUP_SIZE, quantized_layers="all",
                 server: dict | None = None):
    """The deployment a served run was measured on (``planner.layouts.deployment``), ready
    for prediction: the engine's scheduler budget is the prefill chunk. ``server``: what its
    server command set (``server_overrides``): the scheduler's limits, chunking, CUDA graphs
    (--enforce-eager), the memory fraction, weights in host memory, pipeline stages; its TP,
    weights and KV cache must be the run's."""
    from dataclasses import replace

    from planner.core.specs import GIB, Options
    from planner.io import catalog
    from planner.layouts.deployment import Deployment, Layout

    s = dict(server or {})
    positive("--tp", tp)
    positive("--group-size", group_size)
    _agree("--tp", s.get("--tp"), tp, "TP")
    _agree("--quantization", s.get("--weights"), weights, "weights")
    kv_cache = kv_cache if kv_cache is not None or s.get("--kv-cache") is None else \
        s["--kv-cache"]
    _agree("--kv-cache-dtype", s.get("--kv-cache"), kv_cache, "KV cache")
    m = catalog.load_model(model)
    hw = catalog.load_hardware(gpu)
    eng = spec.model().for_gpu(hw.memory_bytes, hw.name)
    eng = replace(eng, **{f: s[o] for o, f in ENGINE_FIELDS.items() if o in s})
    if s.get("--enforce-eager"):
        eng = replace(eng, cuda_graphs=False)
    prec = precision_of(m, weights, kv_cache, group_size, quantized_layers=quantized_layers)
    dtype = s.get("--dtype")
    if dtype is not None and dtype != prec.half_dtype.value:
        raise LlmplanError(f"the server command's --dtype {dtype} and the run's 16-bit type "
                           f"{prec.half_dtype.value} disagree")
    opts = Options(prefill_chunk_tokens=eng.max_num_batched_tokens,
                   memory_utilization_frac=s.get("--memory-utilization"),
                   cpu_offload_bytes=s.get("--cpu-offload-gb", 0.0) * GIB)
    return Deployment.build(m, hw, engine=eng, precision=prec,
                            layout=Layout(tp=tp, pp=s.get("--pp", 1)), options=opts)


def server_setup(model: str, gpu: str, engine: str, tp: int, weights, kv_cache, group_size: int,
           quantized_layers=QuantizedLayers.all):
    from planner.io import catalog

    spec = catalog.load_engine_spec(engine)
    return served_setup(model, gpu, spec, tp, weights, kv_cache, group_size,
                        quantized_layers), spec


def read_result_files(files: list[Path]):
    runs = []
    for f in files:
        runs += read_result_file(f)
    return runs


def fmt_metric(metric: str, v: float | None) -> str:
    from planner.io import fmt

    if v is None:
        return "-"
    return fmt.seconds(v) if metric.endswith("_s") else f"{v:,.4g}"


def fmt_error(v: float | None) -> str:
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
    group_size: GroupSizeOpt = DEFAULT_GROUP_SIZE,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="PNG of predicted vs measured, one point per run and figure.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Measured serving runs against llmplan's prediction for the same traffic (the
    simulator's, and the steady-state estimate at the concurrency the server held), with the
    signed error and the measured MBU and MFU."""
    from planner.evidence.compare import compare_run
    from planner.io import fmt
    from planner.io.render import plain, table

    output_path(plot, "--plot", ".png")
    s, _ = server_setup(model, gpu, engine, tp, weights, kv_cache, group_size, quantized_layers)
    comps = [compare_run(r, s) for r in read_result_files(files)]
    if plot is not None:
        from planner.io.report import plot_served

        plot_served(comps, plot, title=f"{s.model.label} on {tp} x {s.hardware.display_name}, "
                                       f"engine {s.engine.name}: predicted vs measured")
        stderr.print(f"wrote {plot}")
    if as_json:
        json_out({"model": s.model.name, "gpu": s.hardware.name, "tp": tp,
                  "engine": s.engine.name, "weights": s.precision.weights.value,
                  "quantized_layers": s.precision.quantized_layers,
                  "runs": [c.as_dict() for c in comps]})
        return
    stdout.print(f"[bold]{plain(s.model.label)}[/] on {tp} x {plain(s.hardware.display_name)}, "
                 f"engine {plain(s.engine.name)}, weights {s.precision.weights.value}")
    for c in comps:
        r = c.run
        util = (f"MBU {fmt.pct(c.mbu)} ({c.achieved_bandwidth_bytes_per_s / 1e9:,.0f} GB/s at "
                f"{c.concurrency:,.1f} decoding)" if c.mbu is not None else "MBU -")
        util += f", MFU {fmt.pct(c.mfu)}" if c.mfu is not None else ", MFU -"
        rows = [[SHORT.get(m.metric, m.metric.removesuffix("_s")),
                 fmt_metric(m.metric, m.measured), fmt_metric(m.metric, m.simulated),
                 fmt_error(m.error), fmt_metric(m.metric, m.steady), fmt_error(m.steady_error)]
                for m in c.rows]
        stdout.print(f"\n[bold]{plain(r.source)}[/]: {plain(r.label)} ({r.tool}); {r.traffic}, "
                     f"{r.completed:,} requests of {r.mean_input_tokens:,.0f} + "
                     f"{r.mean_output_tokens:,.0f} tokens")
        stdout.print(f"  measured {util}")
        stdout.print(table(None, ["figure", "measured", "simulated", "error", "steady\nstate",
                                  "error"], rows, left=1, compact=True))
        for n in r.notes + c.notes:
            stdout.print(f"  [dim]{plain(n)}[/]")
