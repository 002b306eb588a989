"""`llmplan simulate`: one replica serving a request stream, step by step."""

from __future__ import annotations

import csv as csv_mod
import json
import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.options import (
    DEFAULT_ENGINE,
    DEFAULT_RESERVE_GIB,
    DEFAULT_UTIL,
    AcceptanceOpt,
    Attention,
    DraftOpt,
    EngineOpt,
    EpOpt,
    GpuOpt,
    GroupSizeOpt,
    JsonOpt,
    KVOption,
    ModelOpt,
    PpOpt,
    QuantizedLayers,
    QuantizedLayersOpt,
    ReserveOpt,
    SpecOpt,
    SpecTokensOpt,
    TimeModel,
    TpOpt,
    UtilOpt,
    WeightsOpt,
    WeightsOption,
    check_layout,
    check_quantized_layers,
    json_out,
    options_from,
    output_path,
    positive,
    spec_config,
    stderr,
    stdout,
)
from planner.core.errors import LlmplanError


class Scheduler(str, Enum):
    continuous = "continuous"
    static = "static"
    dynamic = "dynamic"


class KVLayout(str, Enum):
    paged = "paged"
    contiguous = "contiguous"


MAX_TRACE_TOKENS = 10_000_000  # per request: beyond any model's context


def _token_count(v: object) -> int:
    """A whole number of tokens: 12, 12.0 or "12"; not true, 2.5 or "abc"."""
    if isinstance(v, bool):
        raise TypeError(v)
    if isinstance(v, float):
        if not v.is_integer():
            raise ValueError(v)
        return int(v)
    return int(v)


def read_trace(path: Path) -> list[tuple[int, int, float | None]]:
    """(prompt_tokens, output_tokens, arrival_s or None) rows of a JSONL or CSV trace."""
    from planner.io.catalog import read_text

    rows: list[dict] = []
    text = read_text(path)
    if path.suffix.lower() == ".csv":
        rows = list(csv_mod.DictReader(text.splitlines()))
    else:
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                raise LlmplanError(f"{path}:{i}: not a JSON object") from None
            if not isinstance(obj, dict):
                raise LlmplanError(f"{path}:{i}: not a JSON object")
            rows.append(obj)
    out = []
    for i, r in enumerate(rows, 1):
        try:
            p, o = _token_count(r["prompt_tokens"]), _token_count(r["output_tokens"])
            a = r.get("arrival_s")
            if isinstance(a, bool):
                raise TypeError(a)
            a = None if a in (None, "") else float(a)
        except KeyError as err:
            raise LlmplanError(f"{path}: row {i}: missing {err.args[0]}") from None
        except (TypeError, ValueError, OverflowError):
            raise LlmplanError(f"{path}: row {i}: prompt_tokens and output_tokens must be "
                               "integers, arrival_s a number") from None
        if not (0 < p <= MAX_TRACE_TOKENS and 0 < o <= MAX_TRACE_TOKENS) or (
                a is not None and not (a >= 0 and math.isfinite(a))):
            raise LlmplanError(f"{path}: row {i}: token counts must be in 1..{MAX_TRACE_TOKENS:,} "
                               "and arrival_s a finite number >= 0")
        out.append((p, o, a))
    if not out:
        raise LlmplanError(f"{path}: no requests")
    return out


def simulate(
    model: ModelOpt,
    gpu: GpuOpt,
    engine: EngineOpt = DEFAULT_ENGINE,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    weights: WeightsOption = WeightsOpt.bf16,
    kv_cache: KVOption = None,
    group_size: GroupSizeOpt = 128,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    request_rate: Annotated[float, typer.Option(
        help="Requests per second (gamma arrivals; inf: all at t = 0).")] = math.inf,
    burstiness: Annotated[float, typer.Option(
        help="Gamma shape of the arrival gaps: 1 Poisson, < 1 burstier (as vLLM's).")] = 1.0,
    max_concurrency: Annotated[Optional[int], typer.Option(
        help="A closed loop of this many clients instead of an arrival rate.")] = None,
    num_requests: Annotated[int, typer.Option("--num-requests", "-n")] = 1000,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", "-p")] = 1024,
    output_tokens: Annotated[int, typer.Option("--output-tokens", "-o")] = 256,
    range_ratio: Annotated[float, typer.Option(
        help="Lengths uniform within +-this fraction (vLLM's random dataset).")] = 0.0,
    dataset: Annotated[Optional[Path], typer.Option(
        help="JSONL or CSV of prompt_tokens, output_tokens and optional arrival_s.")] = None,
    seed: Annotated[int, typer.Option(help="Random seed of lengths and arrivals.")] = 0,
    scheduler: Annotated[Scheduler, typer.Option(
        help="continuous (vLLM-style iteration-level), static batches, or dynamic batches "
             "(static, waiting up to --max-wait for a batch to fill).")] =
    Scheduler.continuous,
    max_wait: Annotated[float, typer.Option(
        help="Dynamic batching: seconds a batch waits for more requests.")] = 0.05,
    max_num_seqs: Annotated[Optional[int], typer.Option(
        help="Running requests at most (default: the engine's).")] = None,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option(
        help="Tokens per step at most, prefill chunks and decodes (default: the engine's).")
    ] = None,
    chunked_prefill: Annotated[Optional[bool], typer.Option(
        "--chunked-prefill/--no-chunked-prefill",
        help="Split long prompts into chunks of the step budget (default: the engine's).")
    ] = None,
    kv_layout: Annotated[KVLayout, typer.Option(
        help="paged: blocks on demand; contiguous: max-model-len reserved per request.")] =
    KVLayout.paged,
    block_size: Annotated[Optional[int], typer.Option(
        help="Tokens per KV block (default: the engine's).")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(
        help="Reservation per request of a contiguous cache (default: the model's context).")
    ] = None,
    memory_utilization: UtilOpt = DEFAULT_UTIL,
    reserve_gib: ReserveOpt = DEFAULT_RESERVE_GIB,
    ttft_slo: Annotated[Optional[float], typer.Option(
        help="TTFT target in seconds: report the goodput.")] = None,
    tpot_slo: Annotated[Optional[float], typer.Option(
        help="TPOT target in seconds: report the goodput.")] = None,
    trace: Annotated[Optional[Path], typer.Option(
        help="Write one row per request (CSV, or JSONL for .jsonl).")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="PNG over time (running, queue, KV) and the TTFT / TPOT "
        "distributions; its time series as a CSV beside it.")] = None,
    speculative: SpecOpt = None,
    draft_model: DraftOpt = None,
    num_speculative_tokens: SpecTokensOpt = None,
    acceptance_rate: AcceptanceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Simulate one replica serving a request stream: continuous or static batching, paged or
    contiguous KV, each step costed by the estimate's operator and engine model. A replica is
    --tp GPUs, --tp x --pp over pipeline stages, or --ep expert-parallel GPUs. --speculative
    decodes 1 + k tokens per request and step, keeping the expected (1 - a^(k+1)) / (1 - a)."""
    from planner.core.estimate import prepare
    from planner.core.specs import Precision
    from planner.io import catalog
    from planner.serving.layouts import layout_coster
    from planner.serving.metrics import summary
    from planner.serving.sim import SchedulerConfig
    from planner.serving.sim import simulate as run
    from planner.serving.traffic import replay, synthetic

    for name, v in (("--tp", tp), ("--num-requests", num_requests),
                    ("--max-num-seqs", max_num_seqs),
                    ("--max-num-batched-tokens", max_num_batched_tokens),
                    ("--block-size", block_size), ("--max-model-len", max_model_len),
                    ("--prompt-tokens", prompt_tokens), ("--output-tokens", output_tokens),
                    ("--group-size", group_size), ("--max-concurrency", max_concurrency)):
        positive(name, v)
    positive("--request-rate", request_rate, allow_inf=True)
    positive("--burstiness", burstiness)
    positive("--max-wait", max_wait, allow_zero=True)
    if not 0 <= seed < 2**64:
        raise LlmplanError(f"--seed: must be an integer in [0, 2^64), got {seed}")
    positive("--ttft-slo", ttft_slo)
    positive("--tpot-slo", tpot_slo)
    if not (0 <= range_ratio < 1):
        raise LlmplanError(f"--range-ratio: must be in [0, 1), got {range_ratio:g}")
    opts = options_from(TimeModel.roofline, Attention.flash, 0.0, reserve_gib,
                        memory_utilization)  # the checks every command shares
    if num_requests > 10_000_000:
        raise LlmplanError("--num-requests: at most 10,000,000")
    output_path(trace, "--trace")
    output_path(plot, "--plot", ".png")
    m = catalog.load_model(model)
    hw = catalog.load_hardware(gpu)
    eng = catalog.load_engine(engine)
    check_layout(m, tp, pp, ep)
    max_num_seqs = max_num_seqs or eng.max_num_seqs
    max_num_batched_tokens = max_num_batched_tokens or eng.max_num_batched_tokens
    block_size = block_size or eng.block_size
    chunked_prefill = eng.chunked_prefill if chunked_prefill is None else chunked_prefill
    opts = opts.model_copy(update={"prefill_chunk_tokens": max_num_batched_tokens})
    prep = prepare(hw, Precision.of(weights.value, kv_cache.value if kv_cache else None,
                                    group_size,
                                    quantized_layers=check_quantized_layers(m, quantized_layers)),
                   None, opts, eng)
    cfg = SchedulerConfig(kind=scheduler.value, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens,
                          chunked_prefill=chunked_prefill, kv_layout=kv_layout.value,
                          block_size=block_size,
                          max_model_len=max_model_len or m.max_position_embeddings,
                          max_concurrency=max_concurrency,
                          max_wait_s=max_wait if scheduler == Scheduler.dynamic else 0.0)
    cfg.check()
    if dataset is not None:
        reqs = replay(read_trace(dataset))
    else:
        reqs = synthetic(num_requests, prompt_tokens=prompt_tokens,
                         output_tokens=output_tokens, range_ratio=range_ratio,
                         request_rate=request_rate, burstiness=burstiness,
                         closed_loop=max_concurrency is not None, seed=seed)
    coster = layout_coster(m, hw, prep, opts, tp=tp, pp=pp, ep=ep)
    spec = None
    if any(v is not None for v in (speculative, draft_model, num_speculative_tokens,
                                   acceptance_rate)):
        from planner.serving.speculation import spec_serving

        if pp > 1 or ep > 1:
            raise LlmplanError("--speculative is simulated on a TP replica only (--pp 1 --ep 1)")
        if scheduler != Scheduler.continuous:
            raise LlmplanError("--speculative is simulated with --scheduler continuous only")
        spec = spec_serving(m, hw, prep, opts, tp=tp, cfg=spec_config(
            speculative, draft_model, num_speculative_tokens, acceptance_rate))
    res = run(reqs, coster, cfg, sample_every_s=0.0 if plot else None, spec=spec)
    d = summary(res, ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo)
    if spec is not None:
        c = spec.config
        d["speculative"] = {"method": c.method, "num_speculative_tokens": c.k,
                            "acceptance_rate": c.acceptance,
                            "draft_model": c.draft.name if c.draft else None,
                            "tokens_per_step": spec.tokens_per_step,
                            "draft_weight_bytes": spec.draft_weight_bytes,
                            "draft_kv_bytes_per_token": spec.draft_kv_bytes_per_token}
    d = {"model": m.name, "gpu": hw.name, "tp": tp, "pp": pp, "ep": ep,
         "num_gpus": tp * pp * ep, "engine": eng.name,
         "weights": prep.precision.weights.value,
         "quantized_layers": prep.precision.quantized_layers,
         "kv_cache": prep.precision.kv_cache.value,
         "scheduler": cfg.kind, "kv_layout": cfg.kv_layout,
         # as vLLM's result file writes it: a number, or "inf"
         "request_rate": None if max_concurrency is not None else
         (request_rate if math.isfinite(request_rate) else "inf"),
         "burstiness": burstiness, "max_concurrency": max_concurrency,
         "num_prompts": len(reqs), **d}
    if trace is not None:
        _write_trace(trace, res)
        stderr.print(f"wrote {len(res.requests):,} requests to {trace}")
    if plot is not None:
        from planner.io.report import plot_simulation

        rate = f"closed loop of {max_concurrency}" if max_concurrency else \
            f"{request_rate:g} req/s"
        csv_path = plot_simulation(res, plot, title=(
            f"{m.label} on {_layout(tp, pp, ep)} x {hw.display_name}, engine {eng.name}, "
            f"{cfg.kind} batching, "
            f"{cfg.kv_layout} KV: {len(reqs):,} requests at {rate}"))
        stderr.print(f"wrote {plot} and {csv_path}")
    if as_json:
        json_out({k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                  for k, v in d.items()})
        return
    _render(d)


def _layout(tp: int, pp: int, ep: int) -> str:
    """"4", "8 (TP 4 x PP 2)", "16 (EP)": the GPUs of one replica."""
    if ep > 1:
        return f"{ep} (EP)"
    return f"{tp * pp} (TP {tp} x PP {pp})" if pp > 1 else str(tp)


def _write_trace(path: Path, res) -> None:
    cols = ["id", "arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
            "ttft_s", "tpot_s", "e2e_s", "preemptions"]
    rows = [{c: getattr(r, c) for c in cols} for r in res.requests]
    with path.open("w", newline="") as f:
        if path.suffix.lower() == ".jsonl":
            for r in rows:
                f.write(json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v)
                                        else v) for k, v in r.items()}) + "\n")
        else:
            w = csv_mod.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)


def _spec_line(sp: dict) -> str:
    from planner.io import fmt

    who = f"draft {sp['draft_model']}" if sp["draft_model"] else sp["method"]
    mem = (f"; drafter {fmt.gib(sp['draft_weight_bytes'])} of weights in the KV pool's memory"
           if sp["draft_weight_bytes"] else "")
    return (f"{who}, k = {sp['num_speculative_tokens']}, acceptance "
            f"{sp['acceptance_rate']:g}: {sp['tokens_per_step']:.2f} tokens per step and "
            f"request{mem}")


def _render(d: dict) -> None:
    from planner.io import fmt
    from planner.io.render import table

    rate = f"closed loop of {d['max_concurrency']} clients" if d["max_concurrency"] else \
        f"{d['request_rate']} req/s"
    from planner.io.render import plain

    stdout.print(f"[bold]{plain(d['model'])}[/] on {_layout(d['tp'], d['pp'], d['ep'])} x "
                 f"{plain(d['gpu'])}, engine "
                 f"{plain(d['engine'])}, "
                 f"{d['scheduler']} batching, {d['kv_layout']} KV; {d['num_prompts']:,} "
                 f"requests at {rate}")
    stdout.print(table("Serving", ["what", "value"], [
        ["completed", f"{d['completed']:,} in {d['duration']:,.2f} s"],
        ["request throughput", f"{d['request_throughput']:,.3g} req/s"],
        ["output throughput", f"{d['output_throughput']:,.0f} tok/s"],
        ["total token throughput", f"{d['total_token_throughput']:,.0f} tok/s"],
        *([["goodput", f"{d['request_goodput']:,.3g} req/s"]] if "request_goodput" in d
          else []),
        ["running requests", f"mean {d['mean_running_requests']:,.1f}, max "
                             f"{d['max_running_requests']:,}"],
        *([["speculative decoding", _spec_line(d["speculative"])]] if d.get("speculative")
          else []),
        ["KV cache", f"{d['kv_capacity_tokens']:,} tokens; holding "
                     f"{fmt.pct(d['kv_cache_used_frac_mean'])} mean, "
                     f"{fmt.pct(d['kv_cache_used_frac_peak'])} peak; reserved "
                     f"{fmt.pct(d['kv_cache_reserved_frac_peak'])} peak"],
        ["preemptions", f"{d['preemptions']:,}"],
    ], left=2))
    rows = []
    for name, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"),
                      ("end-to-end", "e2el")):
        vals = [d.get(f"{s}_{key}_ms") for s in ("mean", "median", "p90", "p99")]
        rows.append([name, *("-" if v is None else f"{v:,.1f}" for v in vals)])
    stdout.print(table("Latency (ms)", ["", "mean", "median", "p90", "p99"], rows, left=1))
