"""`llmplan simulate`: one replica serving a request stream, step by step."""

from __future__ import annotations

import csv as csv_mod
import json
import math
from contextlib import contextmanager
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.calls import command_defaults
from planner.cli.options import (
    DEFAULT_ENGINE,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_RESERVE_GIB,
    DEFAULT_UTIL,
    AcceptanceOpt,
    AsyncSchedulingOpt,
    Attention,
    AttentionOpt,
    CalibrationOpt,
    ComputeOpt,
    CpuOffloadOpt,
    DraftOpt,
    DtypeOpt,
    EnforceEagerOpt,
    EngineOpt,
    EpOpt,
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
    OverheadOpt,
    PerformanceModeOpt,
    PpOpt,
    QuantizationOpt,
    QuantizedLayers,
    QuantizedLayersOpt,
    ReserveOpt,
    SpeculativeOpt,
    SpeculativeTokensOpt,
    StreamOutputOpt,
    StreamPromptOpt,
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
    figure_bands,
    json_out,
    model_kind,
    options_from,
    output_path,
    positive,
    render_bands,
    speculation_config,
    stderr,
    stdout,
    with_expert_imbalance,
    with_kv_pool,
)
from planner.core.errors import LlmplanError, UsageError, said_as
from planner.io import fmt


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


def _prefix(path: Path, i: int, r: dict, prompt: int) -> tuple[int, int]:
    """A trace row's shared prefix: any prefix_id (a name or number; rows with the same one
    share their first prefix_tokens tokens) and its prefix_tokens, within the prompt."""
    pid = r.get("prefix_id")
    if pid in (None, ""):
        if r.get("prefix_tokens") not in (None, "", 0, "0"):
            raise LlmplanError(f"{path}: row {i}: prefix_tokens without a prefix_id")
        return -1, 0
    try:
        n = _token_count(r.get("prefix_tokens"))
    except (TypeError, ValueError, OverflowError):
        raise LlmplanError(f"{path}: row {i}: prefix_tokens must be an integer beside "
                           "prefix_id") from None
    if not 0 < n <= prompt:
        raise LlmplanError(f"{path}: row {i}: prefix_tokens must be in 1..prompt_tokens "
                           f"({prompt:,}), got {n:,}")
    return _PREFIX_IDS.setdefault((path, str(pid)), len(_PREFIX_IDS)), n


_PREFIX_IDS: dict[tuple[Path, str], int] = {}  # a trace's prefix names, as numbers


def read_trace(path: Path) -> list[tuple]:
    """(prompt_tokens, output_tokens, arrival_s or None, prefix_id, prefix_tokens) rows of a
    JSONL or CSV trace; a row without a prefix_id shares no prefix (-1, 0)."""
    from planner.io import boundary

    rows: list[dict] = []
    text = boundary.read_text(path, what="dataset (JSONL or CSV)",
                              max_bytes=boundary.RESULT_BYTES)
    if path.suffix.lower() == ".csv":
        rows = list(csv_mod.DictReader(text.splitlines()))
    else:
        boundary.check_json_depth(text, str(path))
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = boundary.loads_json(line, f"{path}:{i}", checked=True)
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
        for name, v in (("prompt_tokens", p), ("output_tokens", o)):
            if not 0 < v <= MAX_TRACE_TOKENS:
                raise LlmplanError(f"{path}: row {i}: {name}: must be in "
                                   f"1..{MAX_TRACE_TOKENS:,}, got {v:,}")
        if a is not None and not (a >= 0 and math.isfinite(a)):
            raise LlmplanError(f"{path}: row {i}: arrival_s: must be a finite number >= 0, "
                               f"got {a:g}")
        out.append((p, o, a, *_prefix(path, i, r, p)))
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
    expert_imbalance: ExpertImbalanceOpt = None,
    weights: WeightsOption = None,
    kv_cache: KVOption = None,
    quantization: QuantizationOpt = None,
    dtype: DtypeOpt = None,
    kv_cache_dtype: KvCacheDtypeOpt = None,
    enforce_eager: EnforceEagerOpt = False,
    group_size: GroupSizeOpt = None,
    quantized_layers: QuantizedLayersOpt = QuantizedLayers.all,
    compute: ComputeOpt = None,
    calibration: CalibrationOpt = None,
    time_model: TimeModelOpt = TimeModel.roofline,
    attention: AttentionOpt = Attention.flash,
    kernel_overhead_us: OverheadOpt = None,
    request_rate: Annotated[float, typer.Option(
        help="Requests per second (gamma arrivals; inf: all at t = 0).",
        metavar="RATE")] = math.inf,
    burstiness: Annotated[float, typer.Option(
        help="Gamma shape of the arrival gaps: 1 Poisson, < 1 burstier (as vLLM's).",
        metavar="SHAPE")] = 1.0,
    max_concurrency: Annotated[Optional[int], typer.Option(
        help="At most this many requests in flight: a closed loop of N clients, each sending "
        "its next request when it has its last (vllm bench serve --max-concurrency); with "
        "--request-rate too, a request goes out at its arrival time or when a client is free, "
        "whichever is later.", metavar="N")] = None,
    num_requests: Annotated[Optional[int], typer.Option(
        "--num-requests", "-n", "--num-prompts",
        help="Requests in the stream (vLLM bench's --num-prompts; default 1,000, or every "
        "row of a --dataset, whose first N rows it takes when given).",
        metavar="N")] = None,
    prompt_tokens: StreamPromptOpt = None,
    output_tokens: StreamOutputOpt = None,
    range_ratio: Annotated[float, typer.Option(
        "--range-ratio", "--random-range-ratio",
        help="Lengths uniform within +-this fraction (vLLM's random dataset, "
        "--random-range-ratio); with --dataset-name sglang-random, from this fraction of -p "
        "/ -o up to them, as SGLang's.", metavar="FRACTION")] = 0.0,
    prefix_tokens: Annotated[int, typer.Option(
        "--prefix-tokens", "--random-prefix-len",
        help="The same first tokens before every prompt (vLLM's --random-prefix-len): a "
        "prompt is this many plus its -p tokens, and a prefix cache computes them once.",
        metavar="TOKENS")
    ] = 0,
    prefix_cache: Annotated[Optional[str], typer.Option(
        "--prefix-cache", metavar="on|off",
        help="Automatic prefix caching: requests sharing a prefix (--prefix-tokens, a "
        "--dataset's prefix_id) find it computed. Default: the engine's (on for vllm, "
        "sglang, trtllm; off for vllm-v0).")] = None,
    enable_prefix_caching: Annotated[Optional[bool], typer.Option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        help="vLLM's names for --prefix-cache on / off.")] = None,
    dataset: Annotated[Optional[Path], typer.Option(
        help="JSONL or CSV of prompt_tokens, output_tokens and optional arrival_s, "
        "prefix_id and prefix_tokens (rows with the same prefix_id share their first "
        "prefix_tokens).", metavar="FILE")] = None,
    dataset_name: Annotated[str, typer.Option(
        "--dataset-name", metavar="random|sharegpt|sonnet|sglang-random",
        help="Lengths as vLLM's bench serve draws them: random (uniform within "
        "--range-ratio of -p / -o), sharegpt (the published ShareGPT length distribution, "
        "planner/data/lengths: 500 requests' prompt and output tokens, means 206 and 215, "
        "scaled so its means are -p and -o where given) or sonnet (prompts of -p "
        "tokens whose first --prefix-tokens, 200 unless given, are the same in every "
        "request, as vLLM's sonnet dataset builds them); or as SGLang's bench_serving "
        "draws its random dataset: sglang-random (uniform from --range-ratio x -p / -o up "
        "to -p / -o, with numpy seeded by --seed: bench_serving --seed N sends the same "
        "lengths).")] = "random",
    seed: Annotated[int, typer.Option(help="Random seed of lengths and arrivals.",
        metavar="N")] = 0,
    chat: Annotated[bool, typer.Option(
        "--chat/--no-chat",
        help="The prompts are chat messages (vLLM bench's --backend openai-chat): the server "
        "wraps each in the model's chat template (models_db chat_template: Qwen3 8 tokens, "
        "gpt-oss 67) and prefills those too; the template's opening, the same in every "
        "request, is a prefix the prefix cache computes once.")] = False,
    scheduler: Annotated[Scheduler, typer.Option(
        help="continuous (vLLM-style iteration-level), static batches, or dynamic batches "
             "(static, waiting up to --max-wait for a batch to fill).")] =
    Scheduler.continuous,
    max_wait: Annotated[float, duration_option(
        "--max-wait", help="Dynamic batching: how long a batch waits for more requests "
        "(50ms, 0.05).")] = 0.05,
    max_num_seqs: Annotated[Optional[int], typer.Option(
        help="Running requests at most (default: the engine's).", metavar="N")] = None,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option(
        help="Tokens per step at most, prefill chunks and decodes (default: the engine's).",
        metavar="TOKENS")
    ] = None,
    chunked_prefill: Annotated[Optional[bool], typer.Option(
        "--chunked-prefill/--no-chunked-prefill",
        "--enable-chunked-prefill/--no-enable-chunked-prefill",
        help="Split long prompts into chunks of the step budget (default: the engine's). "
        "Off, a prompt must fit the budget whole, except on SGLang, which prefills a step's "
        "first prompt whole at any length.")
    ] = None,
    hybrid_kv_cache: Annotated[Optional[bool], typer.Option(
        "--hybrid-kv-cache/--no-hybrid-kv-cache",
        "--no-disable-hybrid-kv-cache-manager/--disable-hybrid-kv-cache-manager",
        help="A model that mixes sliding-window and full-attention layers (gpt-oss, "
        "Gemma-2/3) caches only the window in the former, as vLLM's hybrid KV cache manager "
        "does (default: the engine's; on for vllm, and vllm-0.8 from 0.10).")] = None,
    async_scheduling: AsyncSchedulingOpt = None,
    extra_llm_api_options: Annotated[Optional[Path], typer.Option(
        "--extra-llm-api-options", "--extra_llm_api_options", metavar="FILE",
        help="TensorRT-LLM's LLM-API options file, as trtllm-serve --config reads it (--engine "
        "trtllm): its parallelism, scheduler limits and capacity policy, chunked prefill, "
        "KV-cache fraction, block reuse and type, and CUDA-graph batch sizes and padding, "
        "over the engine's defaults; a flag given here as well must agree with it.")] = None,
    capacity_policy: Annotated[Optional[str], typer.Option(
        metavar="max-utilization|guaranteed-no-evict",
        help="max-utilization: KV blocks as tokens arrive, preempting when they run out "
        "(vLLM, SGLang); guaranteed-no-evict: admit a request only when its whole length "
        "fits, never preempt (TensorRT-LLM). Default: the engine's.")] = None,
    mixed_batches: Annotated[Optional[bool], typer.Option(
        "--mixed-batches/--separate-prefill",
        help="Prefill chunks share a step with the running decodes (vLLM, TensorRT-LLM), "
        "or a step that prefills runs no decodes (SGLang without --enable-mixed-chunk). "
        "Default: the engine's.")] = None,
    max_prefill_tokens: Annotated[Optional[int], typer.Option(
        help="SGLang's --max-prefill-tokens: new prompt tokens a prefill step takes beside its "
        "first request's; a request whose whole prompt is not under what is left waits for "
        "the next step. Default: the engine's (SGLang 16,384; none for the others).",
        metavar="TOKENS")] = None,
    batch_wait_timeout_iters: Annotated[Optional[int], typer.Option(
        help="TensorRT-LLM's batch waiting (its LLM-API key; with --batch-wait-max-tokens-ratio "
        "above 0): a step that would prefill beside running decodes holds its prefills back "
        "for up to this many steps in a row. Default: the engine's (0: off).",
        metavar="STEPS")] = None,
    batch_wait_max_tokens_ratio: Annotated[Optional[float], typer.Option(
        help="TensorRT-LLM's batch waiting: held prefills go in once their prompts and the "
        "decodes' tokens reach this share of --max-num-batched-tokens. Default: the engine's "
        "(0: off).", metavar="SHARE")] = None,
    ignore_eos: Annotated[bool, typer.Option(
        "--ignore-eos",
        help="The client sends ignore_eos (vLLM's and SGLang's benchmark clients' flag): "
        "SGLang with its prefix cache off then admits by another path, which chunks a long "
        "prompt beside others instead of holding it for --max-prefill-tokens, and admits a "
        "request only where every request's whole output fits as they finish shortest "
        "first.")] = False,
    api_server_count: Annotated[Optional[int], typer.Option(
        "--api-server-count", "-asc",
        help="API-server processes in front of the engine (vLLM's --api-server-count): they "
        "share the profile's per-request and per-token API-server time, which caps the "
        "requests a second admitted and the tokens a second streamed. Default 1.",
        metavar="N")] = None,
    num_scheduler_steps: Annotated[Optional[int], typer.Option(
        "--num-scheduler-steps",
        help="vLLM V0's multi-step scheduling (engine vllm-v0): forward steps per scheduler "
        "call; a decode batch runs this many steps before anything waiting is admitted, the "
        "host's work of the later ones beside the GPU's. Default: the engine's (1).",
        metavar="N")] = None,
    multi_step_stream_outputs: Annotated[Optional[bool], typer.Option(
        "--multi-step-stream-outputs/--no-multi-step-stream-outputs",
        help="With --num-scheduler-steps: each step's tokens stream as it ends (vLLM's "
        "default since 0.6.3), or a block's reach the client at its end, in bursts (0.6.0-"
        "0.6.2; vLLM's --multi-step-stream-outputs False).")] = None,
    performance_mode: PerformanceModeOpt = None,
    kv_layout: Annotated[KVLayout, typer.Option(
        help="paged: blocks on demand; contiguous: max-model-len reserved per request.")] =
    KVLayout.paged,
    block_size: Annotated[Optional[int], typer.Option(
        help="Tokens per KV block (default: the engine's).", metavar="TOKENS")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(
        help="The longest request (prompt + output) the server takes, longer ones refused as "
        "vLLM refuses them; a contiguous cache reserves this much per request (default: "
        "the model's context, or the longest request with --allow-longer-context).",
        metavar="TOKENS")
    ] = None,
    memory_utilization: UtilOpt = DEFAULT_UTIL,
    reserve_gib: ReserveOpt = DEFAULT_RESERVE_GIB,
    cpu_offload_gb: CpuOffloadOpt = 0.0,
    kv_cache_memory_bytes: KvMemoryOpt = None,
    kv_cache_tokens: KvTokensOpt = None,
    extensible_kv_cache: ExtensibleOpt = None,
    ttft_slo: Annotated[Optional[float], duration_option(
        "--ttft-slo", help="TTFT target (2s, 500ms): report the goodput.")] = None,
    tpot_slo: Annotated[Optional[float], duration_option(
        "--tpot-slo", help="TPOT target (50ms): report the goodput.")] = None,
    measure_window: Annotated[Optional[str], typer.Option(
        "--measure-window", metavar="FROM,TO",
        help="The TTFT, TPOT and end-to-end statistics of the requests arriving from FROM to "
        "TO seconds only (a steady state, the run's ramp-up and drain left out: plan's rows "
        "give theirs as measured_from_s, measured_to_s); every request is simulated.")
    ] = None,
    trace: Annotated[Optional[Path], typer.Option(
        help="Write one row per request as it finishes (CSV, or JSONL for .jsonl).",
        metavar="FILE")] = None,
    allow_longer_context: LongerOpt = False,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="PNG over time (running, queue, KV) and the TTFT / TPOT "
        "distributions; its time series as a CSV beside it.", metavar="PNG")] = None,
    speculative: SpeculativeOpt = None,
    draft_model: DraftOpt = None,
    num_speculative_tokens: SpeculativeTokensOpt = None,
    acceptance_rate: AcceptanceOpt = None,
    prefill_instances: Annotated[Optional[int], typer.Option(
        "--prefill-instances", rich_help_panel="Disaggregated prefill / decode",
        help="Serve disaggregated: this many prefill instances compute the prompts, and "
        "their KV crosses to --decode-instances decode instances (vLLM's, SGLang's and "
        "Dynamo's P/D). Giving either turns it on; the other defaults to 1.", metavar="N")] = None,
    decode_instances: Annotated[Optional[int], typer.Option(
        "--decode-instances", rich_help_panel="Disaggregated prefill / decode",
        help="Decode instances of a disaggregated deployment.", metavar="N")] = None,
    prefill_tp: Annotated[Optional[int], typer.Option(
        rich_help_panel="Disaggregated prefill / decode",
        help="Tensor-parallel GPUs of each prefill instance (default: --tp).", metavar="N")] = None,
    decode_tp: Annotated[Optional[int], typer.Option(
        rich_help_panel="Disaggregated prefill / decode",
        help="Tensor-parallel GPUs of each decode instance (default: --tp).", metavar="N")] = None,
    prefill_gpu: Annotated[Optional[str], typer.Option(
        rich_help_panel="Disaggregated prefill / decode", metavar="GPU",
        help="The prefill instances' GPU (default: --gpu).")] = None,
    decode_gpu: Annotated[Optional[str], typer.Option(
        rich_help_panel="Disaggregated prefill / decode", metavar="GPU",
        help="The decode instances' GPU (default: --gpu).")] = None,
    prefill_max_num_seqs: Annotated[Optional[int], typer.Option(
        rich_help_panel="Disaggregated prefill / decode",
        help="Running requests at most on a prefill instance (default: --max-num-seqs).",
        metavar="N")
    ] = None,
    decode_max_num_seqs: Annotated[Optional[int], typer.Option(
        rich_help_panel="Disaggregated prefill / decode",
        help="Running requests at most on a decode instance (default: --max-num-seqs).",
        metavar="N")
    ] = None,
    prefill_max_num_batched_tokens: Annotated[Optional[int], typer.Option(
        rich_help_panel="Disaggregated prefill / decode",
        help="Tokens per step on a prefill instance (default: --max-num-batched-tokens).",
        metavar="TOKENS")
    ] = None,
    decode_max_num_batched_tokens: Annotated[Optional[int], typer.Option(
        rich_help_panel="Disaggregated prefill / decode",
        help="Tokens per step on a decode instance (default: --max-num-batched-tokens).",
        metavar="TOKENS")
    ] = None,
    kv_link: Annotated[str, typer.Option(
        rich_help_panel="Disaggregated prefill / decode", metavar="auto|intra-node|inter-node",
        help="The link the KV crosses between the pools: the GPUs' own (NVLink) within a "
        "server, or the inter-node network from hardware_db; auto: within a server when "
        "both pools are one GPU type and fit one server.")] = "auto",
    as_json: JsonOpt = False,
) -> None:
    """Simulate one replica serving a request stream: continuous or static batching, paged or
    contiguous KV, each step costed by the estimate's operator and engine model. A replica is
    --tp GPUs, --tp x --pp over pipeline stages, or --ep expert-parallel GPUs. --speculative
    decodes 1 + k tokens per request and step, keeping the expected (1 - a^(k+1)) / (1 - a)."""
    simulate_run(locals(), emit=True)


def simulate_run(a: dict, *, emit: bool = False) -> dict:
    """One simulated run from ``simulate``'s parameters by name (``a``: the values typer hands
    the command; a name left out takes the command's default): the object ``--json`` prints.
    With ``emit``, the command's output too (the tables, or the JSON, trace and plot asked
    for); the web page (planner/ui) takes the object alone."""
    defaults = command_defaults(simulate)
    a = with_llm_api_options({**defaults, **a}, defaults)
    try:
        return _simulate_run(a, emit)
    except LlmplanError as e:  # a refusal of a setting the options file made names its key
        raise said_of_file(e, a) from None


def said_of_file(e: LlmplanError, a: dict) -> LlmplanError:
    """``e`` as said of the options file's keys where it speaks of a setting that file made:
    a field the message names (``UsageError.fields``: ``tp 3 does not divide ...`` ->
    ``FILE: tensor_parallel_size 3 does not divide ...``), or the flag it begins with
    (``--max-num-seqs: ...`` -> ``FILE: max_batch_size: ...``); else ``e`` itself."""
    keys = a.get("llm_api_keys") or {}
    if not keys:
        return e
    path = a["extra_llm_api_options"]
    fields = getattr(e, "fields", ())
    if any(f in keys for f in fields):  # the rest said as flags still (``flagged``)
        return UsageError(f"{path}: {said_as(e, lambda f: keys.get(f, f))}",
                          fields=tuple(f for f in fields if f not in keys))
    msg = str(e)
    for name, key in keys.items():
        flag = "--" + name.replace("_", "-")
        if msg.startswith((flag + " ", flag + ":")):
            return LlmplanError(f"{path}: {key}{msg[len(flag):]}")
    return e


def _simulate_run(a: dict, emit: bool) -> dict:
    """``simulate_run`` once an options file is laid in."""
    (model, gpu, engine, tp, pp, ep, expert_imbalance, weights, kv_cache, quantization, dtype,
     kv_cache_dtype, enforce_eager, group_size, quantized_layers, compute, calibration,
     time_model, attention, kernel_overhead_us, request_rate, burstiness, max_concurrency,
     num_requests, prompt_tokens, output_tokens, range_ratio, prefix_tokens, prefix_cache,
     dataset, dataset_name, seed, chat, scheduler, max_wait, max_num_seqs,
     max_num_batched_tokens,
     chunked_prefill, hybrid_kv_cache, capacity_policy, mixed_batches, max_prefill_tokens,
     batch_wait_timeout_iters, batch_wait_max_tokens_ratio, ignore_eos, api_server_count,
     num_scheduler_steps,
     multi_step_stream_outputs, performance_mode, kv_layout, block_size,
     max_model_len, memory_utilization, reserve_gib, cpu_offload_gb, ttft_slo, tpot_slo, trace,
     allow_longer_context, plot, speculative, draft_model, num_speculative_tokens,
     acceptance_rate, prefill_instances, decode_instances, prefill_tp, decode_tp, prefill_gpu,
     decode_gpu, prefill_max_num_seqs, decode_max_num_seqs, prefill_max_num_batched_tokens,
     decode_max_num_batched_tokens, kv_link, as_json) = (a[k] for k in (
        "model", "gpu", "engine", "tp", "pp", "ep", "expert_imbalance", "weights", "kv_cache",
        "quantization", "dtype", "kv_cache_dtype", "enforce_eager", "group_size",
        "quantized_layers", "compute", "calibration", "time_model", "attention",
        "kernel_overhead_us", "request_rate", "burstiness", "max_concurrency", "num_requests",
        "prompt_tokens", "output_tokens", "range_ratio", "prefix_tokens", "prefix_cache",
        "dataset", "dataset_name", "seed", "chat", "scheduler", "max_wait", "max_num_seqs",
        "max_num_batched_tokens", "chunked_prefill", "hybrid_kv_cache", "capacity_policy",
        "mixed_batches", "max_prefill_tokens", "batch_wait_timeout_iters",
        "batch_wait_max_tokens_ratio", "ignore_eos", "api_server_count",
        "num_scheduler_steps",
        "multi_step_stream_outputs",
        "performance_mode", "kv_layout",
        "block_size", "max_model_len", "memory_utilization",
        "reserve_gib", "cpu_offload_gb", "ttft_slo", "tpot_slo", "trace",
        "allow_longer_context", "plot", "speculative", "draft_model", "num_speculative_tokens",
        "acceptance_rate", "prefill_instances", "decode_instances", "prefill_tp", "decode_tp",
        "prefill_gpu", "decode_gpu", "prefill_max_num_seqs", "decode_max_num_seqs",
        "prefill_max_num_batched_tokens", "decode_max_num_batched_tokens", "kv_link", "as_json"))
    # a TensorRT-LLM options file's cuda_graph_config: the sizes captured, and padding
    graph = (a.get("cuda_graph_sizes"), a.get("cuda_graph_padding"))
    enable_prefix_caching = a.get("enable_prefix_caching")  # vLLM's --prefix-cache (_scheduler)
    window = _window(a.get("measure_window"))
    from planner.io import catalog
    from planner.serving import run
    from planner.serving.metrics import summary

    _check_numbers(locals())
    opts = with_kv_pool(with_expert_imbalance(options_from(
        time_model, attention, kernel_overhead_us, reserve_gib, memory_utilization,
        cpu_offload_gb=cpu_offload_gb), expert_imbalance), a["kv_cache_memory_bytes"],
        a["kv_cache_tokens"])
    output_path(trace, "--trace")
    output_path(plot, "--plot", ".png")
    m = catalog.load_model(model)
    ckpt = m.quantization.weights if m.quantization is not None else None
    weights, kv_cache, compute = engine_precision(weights, quantization, dtype, kv_cache,
                                                  kv_cache_dtype, compute, checkpoint=ckpt)
    async_scheduling = a["async_scheduling"]  # None: the engine's (and the disaggregated pools')
    extensible_kv_cache = a["extensible_kv_cache"]
    dep = build_deployment(m, gpu=gpu, engine=engine, tp=tp, pp=pp, ep=ep, weights=weights,
                           kv_cache=kv_cache, group_size=group_size,
                           quantized_layers=quantized_layers, compute=compute,
                           calibration=calibration, options=opts,
                           enforce_eager=enforce_eager, async_scheduling=async_scheduling,
                           extensible_kv_cache=extensible_kv_cache)
    if prefill_instances is not None or decode_instances is not None:
        return _simulate_disaggregated(m, locals())
    cfg = _scheduler(dep, locals())
    # the step budget is the prefill chunk, as in the engines
    dep = dep.with_options(prefill_chunk_tokens=cfg.max_num_batched_tokens)
    reqs = request_stream(dataset, dataset_name, num_requests, prompt_tokens, output_tokens,
                          range_ratio, request_rate, burstiness, max_concurrency, seed,
                          prefix_tokens)
    reqs, template_tokens = _chat(reqs, m, chat)
    _window_holds(window, reqs)
    if dataset is not None and _timed(reqs, request_rate, max_concurrency):
        request_rate = math.nan  # the dataset's arrival_s set the arrivals
    longest = max(reqs, key=lambda r: r.prompt_tokens + r.output_tokens)
    check_context(m, longest.prompt_tokens, longest.output_tokens, allow_longer_context,
                  where="the longest request")
    if allow_longer_context and max_model_len is None:  # the server is started to take them
        cfg = replace(cfg, max_model_len=max(cfg.max_model_len,
                                             longest.prompt_tokens + longest.output_tokens))
    flags = (speculative, draft_model, num_speculative_tokens, acceptance_rate)
    if any(v is not None for v in flags):
        run.check_speculation(dep, cfg)
    spec = speculation_config(*flags, model=m)
    check_offload_speculation(opts, spec)
    plain = dep  # the same requests without speculation run on it (the baseline)
    # the engine as it serves with the method (async scheduling: for_speculation)
    dep = dep.for_speculation(None if spec is None else spec.method)
    sp = None if spec is None else run.speculation_serving(dep, spec, cfg)
    from planner.cli.progress import simulation_progress

    with simulation_progress(dep, reqs, enabled=not as_json,  # on stderr, when a terminal
                             tokens_per_step=sp.tokens_per_step if sp else 1.0) as step_coster, \
            _trace_sink(trace) as sink:
        res = run.run(dep, reqs, cfg, speculation=sp, sample_every_s=0.0 if plot else None,
                      step_coster=step_coster, on_record=sink)
    _refusals(res)
    d = _result(dep, cfg, reqs, sp, summary(res, ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo,
                                            window=window),
                request_rate=request_rate, burstiness=burstiness,
                max_concurrency=max_concurrency, performance_mode=performance_mode)
    if sp is not None:  # the same requests without speculation, beside the headline
        d.update(_baseline(summary(run.run(plain, reqs, cfg), ttft_slo_s=ttft_slo,
                                   tpot_slo_s=tpot_slo, itl=False), d))
    if trace is not None:
        stderr.print(f"wrote {len(res.requests):,} requests to {trace}")
    if plot is not None:
        _plot(plot, dep, cfg, res, len(reqs), request_rate, max_concurrency)
    d["chat_template_tokens"] = template_tokens
    if a.get("extra_llm_api_options") is not None:
        d["llm_api_options"] = str(a["extra_llm_api_options"])
    applied = _served_bands(dep, cfg, d, request_rate, max_concurrency)
    applied = _near_capacity(dep, cfg, reqs, sp, d, applied, request_rate, max_concurrency)
    d.setdefault("near_capacity", None)  # the check applies to open streams kept up with
    applied = _offered_cap(applied, reqs, request_rate, max_concurrency)
    d.update(band_fields(applied))
    # a top-level figure that is not finite does not apply (the rate of "every request at
    # t = 0", a TPOT with one output token): null; the gate refuses any other
    payload = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
               for k, v in d.items()}
    if not emit:
        return payload
    if as_json:
        json_out(payload)
        return payload
    from planner.io.gate import gate

    gate(payload, "simulate's tables")  # the figures the tables show
    _render(d)
    render_bands(stdout, applied, {
        **{f"{s}_{k}_ms": (f"{s} {k.upper()}", lambda v: f"{v:,.1f} ms")
           for s in ("mean", "median") for k in ("ttft", "tpot")},
        "output_throughput": ("output throughput", lambda v: f"{fmt.per_s(v)} tok/s"),
        **{f"{s}_e2el_ms": (f"{s} E2E", lambda v: f"{v:,.1f} ms") for s in ("mean", "median")}})
    near = d.get("near_capacity")
    if near and near["widened"]:
        keeps = "keeps up with" if near["slowed_keeps_up"] else "does not keep up with"
        grows = "" if near["slowed_keeps_up"] else (
            ": its queue grows with the stream, so the widened high ends grow with "
            "--num-requests and stand for no bound")
        # "near capacity" only where the slower server falls behind: below it a slower
        # server still holds more requests at once, whose larger steps (a MoE's more experts
        # read) widen the bands, far from any capacity
        head = "near capacity" if not near["slowed_keeps_up"] else "a slower server"
        stdout.print(f"{head}: a server whose steps take x{near['step_factor']:.2f} "
                     f"their predicted time (the TPOT band's high end) {keeps} this stream "
                     f"(its first {near['requests']:,} requests){grows}"
                     + ("" if not near["slowed_keeps_up"] else
                        ", holding more requests at once, each step larger")
                     + "; the bands widened above are that server's (--json: near_capacity)")
    return payload


DISAGG_CONFLICTS = ("speculative", "draft_model", "num_speculative_tokens", "acceptance_rate",
                    "max_concurrency", "trace", "plot")


def _simulate_disaggregated(m, a: dict) -> dict:
    """``simulate`` with --prefill-instances / --decode-instances: the two pools built from
    the command's options with each side's own GPU, TP and scheduler limits, served and
    reported (``planner.serving.disagg``)."""
    from planner.serving import run
    from planner.serving.disagg import pool_figures, transfer_figures
    from planner.serving.metrics import summary

    given = [k for k in DISAGG_CONFLICTS if a[k] not in (None, False)]
    if given:
        raise LlmplanError(f"--{given[0].replace('_', '-')}: not simulated with disaggregated "
                           "prefill / decode (an open stream of requests, no speculation, "
                           "no trace or plot)")
    if a["pp"] > 1 or a["ep"] > 1:
        raise LlmplanError("--pp / --ep: disaggregated pools are tensor-parallel replicas "
                           "(give each side's --prefill-tp / --decode-tp)")
    if a["scheduler"] != Scheduler.continuous:
        raise LlmplanError("--scheduler: disaggregated pools are simulated with continuous "
                           "batching only")
    if a["extensible_kv_cache"]:
        raise LlmplanError("--extensible-kv-cache: not modelled for disaggregated pools, "
                           "whose KV connector shares the cache (their KV cache is sized as "
                           "vLLM 0.20-0.33 size it)")
    weights, kv_cache, compute = engine_precision(
        a["weights"], a["quantization"], a["dtype"], a["kv_cache"], a["kv_cache_dtype"],
        a["compute"], checkpoint=m.quantization.weights if m.quantization is not None else None)
    counts = {side: a[f"{side}_instances"] or 1 for side in ("prefill", "decode")}
    deps, cfgs = {}, {}
    for side in ("prefill", "decode"):
        dep = build_deployment(m, gpu=a[f"{side}_gpu"] or a["gpu"], engine=a["engine"],
                               tp=a[f"{side}_tp"] or a["tp"], weights=weights,
                               kv_cache=kv_cache, group_size=a["group_size"],
                               quantized_layers=a["quantized_layers"], compute=compute,
                               calibration=a["calibration"], options=a["opts"],
                               enforce_eager=a["enforce_eager"],
                               async_scheduling=a["async_scheduling"], kv_connector=True)
        over = dict(a)
        for what in ("max_num_seqs", "max_num_batched_tokens"):
            if a[f"{side}_{what}"] is not None:
                over[what] = a[f"{side}_{what}"]
        cfg = _scheduler(dep, over)
        deps[side] = dep.with_options(prefill_chunk_tokens=cfg.max_num_batched_tokens)
        cfgs[side] = cfg
    reqs = request_stream(a["dataset"], a["dataset_name"], a["num_requests"],
                          a["prompt_tokens"], a["output_tokens"], a["range_ratio"],
                          a["request_rate"], a["burstiness"], None, a["seed"],
                          a["prefix_tokens"])
    reqs, template_tokens = _chat(reqs, m, a["chat"])
    _window_holds(a["window"], reqs)
    timed = a["dataset"] is not None and _timed(reqs, a["request_rate"], None)
    longest = max(reqs, key=lambda r: r.prompt_tokens + r.output_tokens)
    check_context(m, longest.prompt_tokens, longest.output_tokens, a["allow_longer_context"],
                  where="the longest request")
    if a["allow_longer_context"] and a["max_model_len"] is None:
        need = longest.prompt_tokens + longest.output_tokens
        cfgs = {k: replace(c, max_model_len=max(c.max_model_len, need)) for k, c in cfgs.items()}
    link = run.kv_link(deps["prefill"], deps["decode"], prefill_instances=counts["prefill"],
                       decode_instances=counts["decode"], where=a["kv_link"])
    res = run.run_disaggregated(deps["prefill"], deps["decode"], reqs,
                                prefill_instances=counts["prefill"],
                                decode_instances=counts["decode"],
                                prefill_cfg=cfgs["prefill"], decode_cfg=cfgs["decode"],
                                link=link)
    whole = res.combined()
    _refusals(whole)
    d = summary(whole, ttft_slo_s=a["ttft_slo"], tpot_slo_s=a["tpot_slo"],
                window=a["window"])
    pools = {}
    for side, runs in (("prefill", res.prefill), ("decode", res.decode)):
        dep, cfg = deps[side], cfgs[side]
        pools[side] = {"instances": counts[side], "gpu": dep.hardware.name, "tp": dep.tp,
                       "num_gpus": counts[side] * dep.layout.num_gpus,
                       "max_num_seqs": cfg.max_num_seqs,
                       "max_num_batched_tokens": cfg.max_num_batched_tokens,
                       # each pool's servers apply the chat template to the request they get
                       "api_server_chat_template_s": cfg.chat_template_parse_s,
                       **pool_figures(runs, res.duration_s)}
    done = res.prefill_done_s
    pools["prefill"]["mean_prompt_done_s"] = sum(done) / len(done) if done else None
    xfer = transfer_figures(res)
    dec, prec = deps["decode"], deps["decode"].precision
    out = {"model": m.name, "layout": "disaggregated",
           "gpu": dec.hardware.name, "tp": dec.tp, "pp": 1, "ep": 1,
           "num_gpus": pools["prefill"]["num_gpus"] + pools["decode"]["num_gpus"],
           "engine": dec.engine.name, "engine_release": dec.engine.release,
           "kv_cache_memory_bytes": dec.options.kv_cache_memory_bytes,
           "kv_cache_max_tokens": dec.options.kv_cache_max_tokens,
           "weights": prec.weights.value,
           "quantized_layers": prec.quantized_layers, "kv_cache": prec.kv_cache.value,
           "scheduler": "continuous", "prefix_caching": cfgs["prefill"].prefix_caching,
           "request_rate": None if timed else
           a["request_rate"] if math.isfinite(a["request_rate"]) else "inf",
           "arrivals": "dataset" if timed else "rate",
           "burstiness": a["burstiness"], "max_concurrency": None, "num_prompts": len(reqs),
           "chat_template_tokens": template_tokens,
           "prefill": pools["prefill"], "decode": pools["decode"], "kv_transfer": xfer, **d}
    payload = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
               for k, v in out.items()}
    if not a["emit"]:
        return payload
    if a["as_json"]:
        json_out(payload)
        return payload
    from planner.io.gate import gate

    gate(payload, "simulate's tables")  # the figures the tables show
    _render_disaggregated(out)
    return payload


def _render_disaggregated(d: dict) -> None:
    from planner.io import fmt
    from planner.io.render import plain, table

    rate = "the dataset's arrival times" if d["arrivals"] == "dataset" else \
        f"{d['request_rate']} req/s"
    stdout.print(f"[bold]{plain(d['model'])}[/] disaggregated, engine {plain(_engine_text(d))}: "
                 f"{d['prefill']['instances']} prefill + {d['decode']['instances']} decode "
                 f"instances, {d['num_gpus']} GPUs; {d['num_prompts']:,} requests at {rate}")
    rows = []
    for side in ("prefill", "decode"):
        p = d[side]
        rows.append([side, f"{p['instances']} x TP{p['tp']} {plain(p['gpu'])}",
                     fmt.pct(p.get("busy_frac_mean", math.nan)),
                     f"{p.get('mean_running_requests', math.nan):,.1f}",
                     f"{p.get('kv_cache_reserved_frac_peak', math.nan):.0%}",
                     f"{p.get('preemptions', 0):,}"])
    stdout.print(table("Pools (busy: share of the run in steps; running: mean requests; KV: "
                       "peak reserved)", ["pool", "instances", "busy", "running", "KV",
                                          "preempted"], rows, left=2))
    x = d["kv_transfer"]
    stdout.print(f"KV transfer over {x['link']} ({x['gpu_pairs']} GPU pair"
                 f"{'s' if x['gpu_pairs'] > 1 else ''}, {x['link_bytes_per_s'] / 1e9:,.0f} GB/s): "
                 f"{fmt.gib(x['bytes_per_request_mean'] or 0)} per request, "
                 f"{(x['mean_transfer_s'] or 0) * 1e3:,.2f} ms mean on the wire + "
                 f"{(x['mean_link_wait_s'] or 0) * 1e3:,.2f} ms waiting for the link; "
                 f"{(x['bandwidth_used_bytes_per_s'] or 0) / 1e9:,.2f} GB/s used, busiest link "
                 f"{(x['link_busy_frac_max'] or 0):.0%} busy")
    pd_ = d["prefill"].get("mean_prompt_done_s")
    if pd_ is not None and d.get("mean_ttft_ms") is not None:
        rest = d["mean_ttft_ms"] - pd_ * 1e3 - ((x["mean_transfer_s"] or 0)
                                                 + (x["mean_link_wait_s"] or 0)) * 1e3
        stdout.print(f"mean TTFT {d['mean_ttft_ms']:,.1f} ms = {pd_ * 1e3:,.1f} ms to the "
                     f"prompt's end on a prefill instance + "
                     f"{((x['mean_transfer_s'] or 0) + (x['mean_link_wait_s'] or 0)) * 1e3:,.2f}"
                     f" ms KV transfer + {rest:,.1f} ms on a decode instance to its first token")
    rows = []
    for name, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"),
                      ("end-to-end", "e2el")):
        vals = [d.get(f"{s}_{key}_ms") for s in ("mean", "median", "p90", "p99")]
        rows.append([name, *("-" if v is None else f"{v:,.1f}" for v in vals)])
    stdout.print(table(_latency_title(d), ["", "mean", "median", "p90", "p99"], rows, left=1))
    stdout.print(f"completed {d['completed']:,} in {d['duration']:,.2f} s: "
                 f"{fmt.per_s(d['output_throughput'])} output tok/s"
                 + (f", goodput {fmt.sig(d['request_goodput'])} req/s" if "request_goodput" in d
                    else ""))
    stdout.print("error bands: none (no published disaggregated runs are held out to set "
                 "them)")


def _served_bands(dep, cfg, d: dict, request_rate: float, max_concurrency) -> dict:
    """The served figures' error bands (planner/data/bands.yaml), in the regime the simulated
    server was in: saturated or keeping up with the offered rate."""
    regime = _regime(d, math.nan if loop_alone(request_rate, max_concurrency) else request_rate,
                     cfg)
    d["regime"] = regime
    figs = {}
    for s in ("mean", "median"):  # the statistics the served runs were compared on
        for k, phase in (("ttft", "served TTFT"), ("tpot", "served TPOT"),
                         ("e2el", "served E2E")):
            v = d.get(f"{s}_{k}_ms")
            if v is not None and math.isfinite(v):
                figs[f"{s}_{k}_ms"] = (v, phase, regime, False)
    if math.isfinite(d.get("output_throughput", math.nan)):
        figs["output_throughput"] = (d["output_throughput"], "served throughput", regime, False)
    return figure_bands(dep.engine.name, figs, gpu_class=dep.hardware.architecture,
                        model_kind=model_kind(dep.model))


# requests of the stream simulated again for the near-capacity check (a bounded cost: a
# server past its capacity shows a growing queue well within this many)
NEAR_CAPACITY_REQUESTS = 5000


def _near_capacity(dep, cfg, reqs, sp, d: dict, applied: dict, request_rate: float,
                   max_concurrency) -> dict:
    """A stream the simulated server keeps up with may be near its capacity, where a server
    as slow as the TPOT band's high end would not keep up: its first requests (up to
    NEAR_CAPACITY_REQUESTS) are simulated again on such a server and, where its latency grows
    past the bands, the bands widen (``planner.evidence.bands.widen_near_capacity``). JSON:
    ``near_capacity``."""
    from planner.evidence.bands import widen_near_capacity
    from planner.serving import run
    from planner.serving.metrics import summary
    from planner.serving.steps import SlowedCoster

    tpot = applied.get("mean_tpot_ms")
    if (d.get("regime") != "unsaturated" or max_concurrency is not None
            or not math.isfinite(request_rate) or tpot is None or not tpot.value > 0):
        return applied
    factor = tpot.high / tpot.value
    if not factor > 1.0:
        return applied
    subset = reqs[:NEAR_CAPACITY_REQUESTS]
    coster = run.coster(dep)
    # the whole stream's figures are the run's own; a longer stream's first requests run again
    nominal = d if len(subset) == len(reqs) else summary(
        run.run(dep, subset, cfg, speculation=sp, step_coster=coster), itl=False)
    slowed = summary(run.run(dep, subset, cfg, speculation=sp,
                             step_coster=SlowedCoster(coster, factor)), itl=False)
    out, widened = widen_near_capacity(applied, nominal, slowed, factor)
    d["near_capacity"] = {
        "step_factor": factor, "requests": len(subset), "widened": widened,
        "slowed_mean_ttft_ratio": slowed["mean_ttft_ms"] / nominal["mean_ttft_ms"],
        "slowed_mean_tpot_ratio": (slowed["mean_tpot_ms"] / nominal["mean_tpot_ms"]
                                   if nominal.get("mean_tpot_ms") else None),
        "slowed_keeps_up": _regime(slowed, request_rate, cfg) == "unsaturated"}
    return out


def _offered_cap(applied: dict, reqs, request_rate: float, max_concurrency) -> dict:
    """An open stream's output throughput cannot pass what it offers (its rate times its
    requests' mean output): the band's high end is held there, or at the figure itself where
    that is above (a run's sampled lengths and times)."""
    a = applied.get("output_throughput")
    if a is None or max_concurrency is not None or not (0 < request_rate < math.inf):
        return applied
    offered = request_rate * sum(r.output_tokens for r in reqs) / len(reqs)
    cap = max(offered, a.value)
    if a.high <= cap:
        return applied
    return {**applied, "output_throughput": replace(
        a, high=cap, basis=a.basis + f"; high end held at the offered {fmt.per_s(offered)} tok/s")}


def _regime(s: dict, request_rate: float, cfg) -> str:
    """The served regime of a run's summary ``s`` at ``request_rate`` (NaN: a closed loop)
    under the scheduler ``cfg`` (``planner.evidence.bands.served_regime``)."""
    from planner.evidence.bands import served_regime

    return served_regime(request_rate, s.get("request_throughput"),
                         s.get("max_running_requests"), cfg.max_num_seqs)


# the block sizes vLLM's --block-size takes (vllm/config/cache.py BlockSize: 1-128 through
# 0.10, 256 added later)
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)


def _scheduler(dep, a: dict):
    """The engine's scheduler defaults with the flags given over them, checked."""
    from planner.serving import run

    given = {k: a[k] for k in ("max_num_seqs", "max_num_batched_tokens", "block_size",
                               "chunked_prefill", "capacity_policy", "mixed_batches",
                               "hybrid_kv_cache", "max_prefill_tokens")
             if a[k] is not None}
    if ("block_size" in given and dep.engine.name.split("-")[0] == "vllm"
            and given["block_size"] not in VLLM_BLOCK_SIZES):
        raise LlmplanError(f"--block-size: vLLM takes {', '.join(map(str, VLLM_BLOCK_SIZES))} "
                           f"tokens (its CacheConfig's BlockSize), got {given['block_size']}")
    if "max_prefill_tokens" in given and dep.engine.max_prefill_tokens is None:
        raise LlmplanError(f"--max-prefill-tokens: SGLang's (its PrefillAdder's bound on a "
                           f"prefill step); engine {dep.engine.name} has none")
    for flag, field in (("batch_wait_timeout_iters", "batch_wait_iters"),
                        ("batch_wait_max_tokens_ratio", "batch_wait_tokens_ratio")):
        if a.get(flag) is not None:
            if dep.engine.batch_wait_iters is None:
                raise LlmplanError(f"--{flag.replace('_', '-')}: TensorRT-LLM's batch waiting "
                                   f"(its PyTorch executor's); engine {dep.engine.name} has "
                                   "none")
            given[field] = a[flag]
    if dep.layout.ep > 1 and given.get("batch_wait_iters", dep.engine.batch_wait_iters) and \
            given.get("batch_wait_tokens_ratio", dep.engine.batch_wait_tokens_ratio):
        raise LlmplanError("--batch-wait-timeout-iters: TensorRT-LLM waits only where attention "
                           "data parallelism is off, and llmplan's expert-parallel replicas "
                           "(--ep) run attention data-parallel: not simulated together")
    if a.get("ignore_eos"):
        given["ignore_eos"] = True
    if a.get("chat"):
        given["chat_template_parse_s"] = run.chat_parse_s(dep, True)
    if a["api_server_count"] is not None:
        given["api_servers"] = a["api_server_count"]
    if a["num_scheduler_steps"] is not None:
        given["scheduler_steps"] = a["num_scheduler_steps"]
    if a["multi_step_stream_outputs"] is not None:
        given["multi_step_stream"] = a["multi_step_stream_outputs"]
    sizes, padding = a.get("graph", (None, None))
    if sizes is not None:
        given.update(graph_sizes=sizes, graph_padding=padding)
    prefix_cache = a["prefix_cache"]
    if prefix_cache is not None and prefix_cache not in ("on", "off"):
        raise LlmplanError(f"--prefix-cache: must be on or off, got {prefix_cache!r}")
    if a.get("enable_prefix_caching") is not None:  # vLLM's names for it
        vllm = "on" if a["enable_prefix_caching"] else "off"
        flag = "--enable-prefix-caching" if vllm == "on" else "--no-enable-prefix-caching"
        if prefix_cache not in (None, vllm):
            raise LlmplanError(f"--prefix-cache {prefix_cache} and {flag} disagree: give one")
        prefix_cache = vllm
    if prefix_cache is not None:
        given["prefix_caching"] = prefix_cache == "on"
    cfg = run.scheduler(dep, mode=a["performance_mode"], kind=a["scheduler"].value, **given,
                        kv_layout=a["kv_layout"].value,
                        max_model_len=a["max_model_len"] or dep.model.max_position_embeddings,
                        max_concurrency=a["max_concurrency"],
                        max_wait_s=a["max_wait"] if a["scheduler"] == Scheduler.dynamic else 0.0)
    cfg.check()
    return cfg


# a trtllm-serve options file's settings (``planner.io.trtllm_options``) as simulate's
# parameters
LLM_API_PARAMS = {"--tp": "tp", "--pp": "pp", "--ep": "ep", "--max-num-seqs": "max_num_seqs",
                  "--max-num-batched-tokens": "max_num_batched_tokens",
                  "--max-model-len": "max_model_len", "--chunked-prefill": "chunked_prefill",
                  "--memory-utilization": "memory_utilization",
                  "--prefix-cache": "prefix_cache", "--kv-cache": "kv_cache",
                  "--block-size": "block_size", "--capacity-policy": "capacity_policy",
                  "--enforce-eager": "enforce_eager",
                  "--cuda-graph-sizes": "cuda_graph_sizes",
                  "--cuda-graph-padding": "cuda_graph_padding",
                  "--async-scheduling": "async_scheduling",
                  "--kv-cache-tokens": "kv_cache_tokens",
                  "--batch-wait-timeout-iters": "batch_wait_timeout_iters",
                  "--batch-wait-max-tokens-ratio": "batch_wait_max_tokens_ratio"}


# an options file's settings that only TensorRT-LLM's PyTorch backend has (TorchLlmArgs'
# cuda_graph_config, disable_overlap_scheduler and batch waiting)
PYTORCH_ONLY = ("--enforce-eager", "--cuda-graph-sizes", "--cuda-graph-padding",
                "--async-scheduling", "--batch-wait-timeout-iters",
                "--batch-wait-max-tokens-ratio")


def with_llm_api_options(a: dict, defaults: dict) -> dict:
    """``a`` with a TensorRT-LLM options file's settings (--extra-llm-api-options) laid in:
    for the trtllm engine only; a flag the command was given as well must agree with the
    file (trtllm-serve would let the file win; here two sayings of one setting are a
    mistake to point at)."""
    path = a.get("extra_llm_api_options")
    if path is None:
        return a
    from planner.io import catalog
    from planner.io.trtllm_options import KEY_OF, read_llm_api_options

    spec = catalog.load_engine_spec(a["engine"])
    if (spec.family or spec.name) != "trtllm":
        raise LlmplanError(f"--extra-llm-api-options: TensorRT-LLM's options file; the engine "
                           f"here is {spec.name} (give --engine trtllm)")
    out = dict(a)
    settings = read_llm_api_options(Path(path))
    sv = spec.serving
    if sv is None or (sv.cuda_graph_sizes is None and sv.async_scheduling is None):
        # a TensorRT engine's profile (trtllm-engine): the PyTorch backend's own settings do
        # not reach it
        torch_only = sorted({KEY_OF[o].split(".")[0] for o in settings if o in PYTORCH_ONLY})
        if torch_only:
            raise LlmplanError(f"--extra-llm-api-options: {path}'s {', '.join(torch_only)}: "
                               f"the PyTorch backend's settings; the engine here is "
                               f"{spec.name}, a TensorRT engine's profile (give --engine "
                               f"trtllm)")
    # simulate's checks of these values, further on, are said of the file's keys
    # (said_of_file)
    out["llm_api_keys"] = {LLM_API_PARAMS[ours]: KEY_OF[ours] for ours in settings}
    for ours, value in settings.items():
        name = LLM_API_PARAMS[ours]
        if ours == "--prefix-cache":
            value = "on" if value else "off"
        given = getattr(a.get(name), "value", a.get(name))
        if given is not None and given != defaults.get(name) and given != value:
            raise LlmplanError(f"--{name.replace('_', '-')} {given} and {path}'s "
                               f"{KEY_OF[ours]} ({value}) disagree: give it once")
        out[name] = value
    return out


def _refusals(res) -> None:
    """Requests the engine would refuse are reported, not fatal, unless none was served."""
    if not res.failed:
        return
    reason = next(r.failed for r in res.requests if r.failed)
    n = len(res.requests)
    if res.failed == n:
        raise LlmplanError(f"every request was refused: {reason}")
    stderr.print(f"[yellow]{res.failed:,} of {n:,} requests refused[/] (as the engine "
                 f"would), the first because {reason}; the figures are over the rest")


def _check_numbers(a: dict) -> None:
    """The bounds of simulate's own numeric flags (the deployment's are checked where it is
    built)."""
    for flag in ("num_requests", "max_num_seqs", "max_num_batched_tokens", "block_size",
                 "max_model_len", "prompt_tokens", "output_tokens", "max_concurrency",
                 "api_server_count", "num_scheduler_steps", "max_prefill_tokens",
                 *(f"{side}_{what}" for side in ("prefill", "decode")
                   for what in ("instances", "tp", "max_num_seqs", "max_num_batched_tokens"))):
        positive("--" + flag.replace("_", "-"), a[flag])
    positive("--request-rate", a["request_rate"], allow_inf=True)
    positive("--batch-wait-timeout-iters", a["batch_wait_timeout_iters"], allow_zero=True)
    share = a["batch_wait_max_tokens_ratio"]
    if share is not None and not 0 <= share <= 1:  # NaN fails both
        raise LlmplanError(f"--batch-wait-max-tokens-ratio: must be a share within 0-1, got "
                           f"{share:g}")
    if not 0 <= a["prefix_tokens"] <= MAX_TRACE_TOKENS:
        raise LlmplanError(f"--prefix-tokens: must be in 0..{MAX_TRACE_TOKENS:,}, got "
                           f"{a['prefix_tokens']:,}")
    positive("--burstiness", a["burstiness"])
    positive("--max-wait", a["max_wait"], allow_zero=True)
    if not 0 <= a["seed"] < 2**64:
        raise LlmplanError(f"--seed: must be an integer in [0, 2^64), got {a['seed']}")
    positive("--ttft-slo", a["ttft_slo"])
    positive("--tpot-slo", a["tpot_slo"])
    if not (0 <= a["range_ratio"] < 1):
        raise LlmplanError(f"--range-ratio: must be in [0, 1), got {a['range_ratio']:g}")
    if (a["num_requests"] or 0) > 10_000_000:
        raise LlmplanError("--num-requests: at most 10,000,000")


def _timed(reqs, request_rate: float, max_concurrency) -> bool:
    """Whether a dataset's own arrival_s set the arrivals: at an infinite rate and no closed
    loop (which a timed dataset refuses beside it), any arrival after t = 0 is its own."""
    return max_concurrency is None and math.isinf(request_rate) and \
        any(r.arrival_s > 0 for r in reqs)


def _chat(reqs, m, chat: bool):
    """The requests as the engine sees chat messages, each in the model's chat template, and
    the tokens that adds to a prompt (0 without --chat)."""
    if not chat:
        return reqs, 0
    if m.chat_template is None:
        raise LlmplanError(f"--chat: {m.name}'s chat template is not recorded (models_db "
                           "chat_template: the tokens it adds to one user message)")
    from planner.serving.traffic import with_chat_template

    return with_chat_template(reqs, m.chat_template), m.chat_template.tokens


def loop_alone(request_rate: float, max_concurrency: int | None) -> bool:
    """A closed loop of ``max_concurrency`` clients with no rate beside it (an infinite one):
    each request goes out when a client is free. With a finite rate the loop paces the rate's
    arrival times; with none (NaN) a dataset's own times set them."""
    return max_concurrency is not None and math.isinf(request_rate)


DEFAULT_NUM_REQUESTS = 1000  # simulate's -n where neither it nor a --dataset gives one


def _latency_title(d: dict) -> str:
    if d.get("measured_from_s") is None:
        return "Latency (ms)"
    return (f"Latency (ms) of the {d['measured_requests']:,} requests arriving "
            f"{d['measured_from_s']:g}-{d['measured_to_s']:g} s (ITL: every request's)")


def _window(text: str | None) -> tuple[float, float] | None:
    """--measure-window FROM,TO: seconds of arrival, 0 <= FROM < TO."""
    if text is None:
        return None
    parts = text.split(",")
    try:
        lo, hi = (float(x) for x in parts)
    except ValueError:
        raise LlmplanError(f"--measure-window: expected FROM,TO in seconds (30,90), got "
                           f"{text!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
        raise LlmplanError(f"--measure-window: expected 0 <= FROM < TO, got {text!r}")
    return lo, hi


def _window_holds(window: tuple[float, float] | None, reqs) -> None:
    """A --measure-window that no request of the stream arrives in is refused, saying when
    the arrivals are (a closed loop's, set as its clients send, are not known beforehand)."""
    if window is None:
        return
    times = [r.arrival_s for r in reqs]
    if not times or not all(math.isfinite(t) for t in times):
        return
    lo, hi = window
    if not any(lo <= t < hi for t in times):
        raise LlmplanError(f"--measure-window: no request arrives in {lo:g}-{hi:g} s; the "
                           f"stream's {len(times):,} arrive at {min(times):.4g}-"
                           f"{max(times):.4g} s")


def request_stream(dataset, dataset_name, num_requests, prompt_tokens, output_tokens,
                   range_ratio, request_rate, burstiness, max_concurrency, seed,
                   prefix_tokens=0):
    """The request stream: a trace file's, or lengths as vLLM's bench serve draws them
    (``--dataset-name``: random, sharegpt or sonnet) or SGLang's bench_serving its random
    dataset (sglang-random); ``simulate``'s, and ``check``'s for a served budget. With
    ``max_concurrency`` and no finite rate the requests are untimed (a closed loop sends each
    when a client is free); with both, timed at the rate and paced by the loop as well."""
    from planner.serving.traffic import replay, synthetic

    closed = loop_alone(request_rate, max_concurrency)
    shaped = dataset is None and dataset_name not in ("random", "sonnet", "sglang-random")
    if not shaped:  # a published length distribution keeps its own means unless given
        prompt_tokens = DEFAULT_PROMPT_TOKENS if prompt_tokens is None else prompt_tokens
        output_tokens = DEFAULT_OUTPUT_TOKENS if output_tokens is None else output_tokens
    if dataset is not None and dataset_name != "random":
        raise LlmplanError(f"--dataset-name {dataset_name} and --dataset: a trace gives its "
                           "own lengths; give one")
    given = num_requests
    num_requests = DEFAULT_NUM_REQUESTS if num_requests is None else num_requests

    if prefix_tokens and (dataset is not None or dataset_name not in ("random", "sonnet")):
        raise LlmplanError("--prefix-tokens: only with the random and sonnet datasets (a "
                           "--dataset gives its prefixes in prefix_id / prefix_tokens "
                           "columns)")
    if dataset is None and dataset_name == "sglang-random":
        # SGLang's bench_serving --dataset-name random: -p and -o are the longest lengths
        # (--random-input-len / --random-output-len); a request asked for no output token
        # still runs one step
        from planner.evidence.redraw import sglang_random_lengths
        from planner.evidence.runs import RandomLengths

        inputs, outputs = sglang_random_lengths(
            seed, num_requests, RandomLengths(prompt_tokens, output_tokens, range_ratio))
        return replay([(p, max(o, 1), None) for p, o in zip(inputs, outputs, strict=True)],
                      request_rate=request_rate, burstiness=burstiness,
                      closed_loop=closed, seed=seed)
    if dataset is None and dataset_name == "sonnet":
        # vLLM's SonnetDataset (benchmarks/benchmark_dataset.py): every prompt starts with the
        # same prefix_len tokens of sonnet lines (200 by default), then lines drawn at random
        # up to input_len tokens in all; -p is that input_len
        shared = min(prefix_tokens or 200, prompt_tokens - 1)
        return synthetic(num_requests, prompt_tokens=prompt_tokens - shared,
                         output_tokens=output_tokens, request_rate=request_rate,
                         burstiness=burstiness, closed_loop=closed,
                         seed=seed, prefix_tokens=shared)
    if dataset is not None:
        rows = read_trace(dataset)
        if given is not None:  # vLLM bench's --num-prompts over a dataset: its first N
            if given > len(rows):
                raise LlmplanError(f"--num-requests: {dataset} holds {len(rows):,} rows, "
                                   f"fewer than {given:,}")
            rows = rows[:given]
        if rows[0][2] is not None and (not math.isinf(request_rate) or
                                       max_concurrency is not None):
            raise LlmplanError(f"{dataset}: its rows give arrival_s, which sets the arrivals: "
                               "drop --request-rate / --max-concurrency, or the column")
        return replay(rows, request_rate=request_rate, burstiness=burstiness,
                      closed_loop=closed, seed=seed)
    if dataset_name != "random":
        from planner.io import catalog
        from planner.serving.traffic import shaped_lengths

        if dataset_name not in catalog.length_names():
            raise LlmplanError(f"--dataset-name: '{dataset_name}' is not one of random, "
                               f"sonnet, sglang-random, {', '.join(catalog.length_names())}")
        lens = shaped_lengths(catalog.load_lengths(dataset_name), num_requests,
                              mean_prompt=prompt_tokens, mean_output=output_tokens, seed=seed)
        return replay([(p, o, None) for p, o in lens], request_rate=request_rate,
                      burstiness=burstiness, closed_loop=closed,
                      seed=seed)
    return synthetic(num_requests, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                     range_ratio=range_ratio, request_rate=request_rate,
                     burstiness=burstiness, closed_loop=closed, seed=seed,
                     prefix_tokens=prefix_tokens)


def _result(dep, cfg, reqs, sp, d: dict, *, request_rate, burstiness, max_concurrency,
            performance_mode: str | None = None) -> dict:
    """The JSON object: the deployment, the traffic, then the metrics as vLLM keys them.
    ``performance_mode``: vLLM's --performance-mode as given (None: not given)."""
    if sp is not None:
        c = sp.config
        d["speculative"] = {"method": c.method, "num_speculative_tokens": c.k,
                            "acceptance_rate": c.acceptance,
                            "acceptance_source": c.acceptance_source,
                            "draft_model": c.draft.name if c.draft else None,
                            "tokens_per_step": sp.tokens_per_step,
                            "draft_weight_bytes": sp.draft_weight_bytes,
                            "draft_kv_bytes_per_token": sp.draft_kv_bytes_per_token}
    from planner.layouts.deployment import weights_fields
    from planner.serving.sim import hybrid_kv_groups

    lay, prec = dep.layout, dep.precision
    return {"model": dep.model.name, "gpu": dep.hardware.name, "tp": lay.tp, "pp": lay.pp,
            "ep": lay.ep, "num_gpus": lay.num_gpus, "engine": dep.engine.name,
            "engine_release": dep.engine.release,
            **_expert_fields(dep),
            "weights": prec.weights.value, "quantized_layers": prec.quantized_layers,
            **weights_fields(dep),
            "kv_cache": prec.kv_cache.value, "scheduler": cfg.kind, "kv_layout": cfg.kv_layout,
            "capacity_policy": cfg.capacity_policy, "mixed_batches": cfg.mixed_batches,
            # SGLang's admission: KV held back for the running requests' outputs
            "decode_reserve": None if cfg.decode_reserve is None
            else cfg.decode_reserve._asdict(),
            # SGLang's max_prefill_tokens: a prefill step's new prompt tokens (None: none)
            "max_prefill_tokens": cfg.max_prefill_tokens, "ignore_eos": cfg.ignore_eos,
            # TensorRT-LLM's batch waiting (0: off)
            "batch_wait_iters": cfg.batch_wait_iters,
            "batch_wait_tokens_ratio": cfg.batch_wait_tokens_ratio,
            "prefix_caching": cfg.prefix_caching, "api_servers": cfg.api_servers,
            # the pool is vLLM's hybrid one: sliding-window layers hold their window only,
            # and kv_capacity_tokens counts tokens of one group of layers
            "hybrid_kv_cache": hybrid_kv_groups(dep.model, cfg) is not None,
            # the KV cache given outright per GPU, and its token cap (None: not given)
            "kv_cache_memory_bytes": dep.options.kv_cache_memory_bytes,
            "kv_cache_max_tokens": dep.options.kv_cache_max_tokens,
            # the host's work for a step beside the GPU's work on the step before
            "async_scheduling": dep.engine.overlaps_host(dep.layout.pp),
            "performance_mode": performance_mode,
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            # the largest prefill replayed from piecewise CUDA graphs (SGLang's; a TP
            # replica's only); None: every prefill runs eagerly
            # (none under speculative decoding: planner.serving.sim)
            "prefill_graph_max_tokens": cfg.prefill_graphs.largest
            if cfg.prefill_graphs is not None and dep.layout.pp == 1 and dep.layout.ep == 1
            and sp is None else None,
            "api_server_request_s": dep.engine.frontend_request_s,
            # beside it, per chat request: the chat template parsed anew (vLLM 0.11.0)
            "api_server_chat_template_s": cfg.chat_template_parse_s,
            "api_server_token_s": dep.engine.frontend_token_s,
            # as vLLM's result file writes it: a number, or "inf"
            "request_rate": None if loop_alone(request_rate, max_concurrency)
            or math.isnan(request_rate)
            else (request_rate if math.isfinite(request_rate) else "inf"),
            # the dataset's own arrival_s, a closed loop, a rate, or a rate a closed loop paces
            "arrivals": "dataset" if math.isnan(request_rate) else
            ("closed loop" if math.isinf(request_rate) else "rate and closed loop")
            if max_concurrency is not None else "rate",
            "burstiness": burstiness, "max_concurrency": max_concurrency,
            "num_prompts": len(reqs), **d}


BASELINE_KEYS = ("completed", "duration", "request_throughput", "output_throughput",
                 "total_token_throughput", "request_goodput",
                 *(f"{s}_{k}_ms" for k in ("ttft", "tpot", "e2el")
                   for s in ("mean", "median", "p90", "p99")))


def _expert_fields(dep) -> dict:
    """With --ep: the attention groups and the expert imbalance used, with its source."""
    if dep.layout.ep == 1:
        return {}
    from planner.layouts.expert import expert_imbalance

    factor, source = expert_imbalance(dep.options)
    return {"dp": dep.layout.dp, "expert_imbalance": factor, "expert_imbalance_source": source}


def _imbalance_text(d: dict) -> str:
    if "expert_imbalance" not in d:
        return ""
    given = d["expert_imbalance_source"]["from"]
    return f"; expert imbalance {d['expert_imbalance']:.2f}x ({given})"


def _baseline(base: dict, d: dict) -> dict:
    """``baseline``: the run's figures without speculation (the headline keys carry the
    speculative ones); ``speedup``: its mean TPOT / the speculative mean TPOT."""
    t, tb = d.get("mean_tpot_ms"), base.get("mean_tpot_ms")
    return {"baseline": {k: base[k] for k in BASELINE_KEYS if k in base},
            "speedup": tb / t if t and tb else None, "headline": "speculative"}


def _plot(plot: Path, dep, cfg, res, n: int, request_rate, max_concurrency) -> None:
    from planner.io.report import plot_simulation

    rate = "the dataset's arrival times" if math.isnan(request_rate) else \
        f"closed loop of {max_concurrency}" if loop_alone(request_rate, max_concurrency) else \
        f"{request_rate:g} req/s" + (f", at most {max_concurrency} in flight"
                                     if max_concurrency else "")
    csv_path = plot_simulation(res, plot, title=(
        f"{dep.model.label} on {dep.layout.gpus_text} x {dep.hardware.display_name}, engine "
        f"{dep.engine.label}, {cfg.kind} batching, {cfg.kv_layout} KV: {n:,} requests at {rate}"))
    stderr.print(f"wrote {plot} and {csv_path}")


def _engine_text(d: dict) -> str:
    """The engine as the output names it: the profile, and the release --engine FAMILY@RELEASE
    picked it for."""
    return f"{d['engine']}@{d['engine_release']}" if d.get("engine_release") else d["engine"]


TRACE_COLUMNS = ("id", "arrival_s", "first_token_s", "finish_s", "prompt_tokens",
                 "output_tokens", "ttft_s", "tpot_s", "e2e_s", "preemptions", "cached_tokens",
                 "failed")


@contextmanager
def _trace_sink(path: Path | None):
    """The sink the simulator hands each request's result as it is done or refused: one row
    of ``path`` (CSV, or JSON Lines for .jsonl) written then, so a trace of millions of
    requests is never held (rows in the order requests finish; ``id`` is the order sent).
    None: no sink."""
    if path is None:
        yield None
        return
    with path.open("w", newline="") as f:
        if path.suffix.lower() == ".jsonl":
            def sink(r) -> None:
                row = {c: getattr(r, c) for c in TRACE_COLUMNS}
                f.write(json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v)
                                        else v) for k, v in row.items()}) + "\n")
        else:
            w = csv_mod.DictWriter(f, fieldnames=TRACE_COLUMNS)
            w.writeheader()

            def sink(r) -> None:
                w.writerow({c: getattr(r, c) for c in TRACE_COLUMNS})
        yield sink


def _spec_line(sp: dict) -> str:
    from planner.io import fmt

    who = f"draft {sp['draft_model']}" if sp["draft_model"] else sp["method"]
    mem = (f"; drafter {fmt.gib(sp['draft_weight_bytes'])} of weights in the KV pool's memory"
           if sp["draft_weight_bytes"] else "")
    return (f"{who}, k = {sp['num_speculative_tokens']}, acceptance "
            f"{sp['acceptance_rate']:g}: {sp['tokens_per_step']:.2f} tokens per step and "
            f"request{mem}")


def _api_line(d: dict) -> str:
    """The engine's API server: its capacity and whether it set the pace."""
    n, a, t = d["api_servers"], d["api_server_request_s"], d["api_server_token_s"]
    c = d.get("api_server_chat_template_s", 0.0)
    cap = []
    if a + c:
        cap.append(f"admits up to {n / (a + c):,.0f} req/s" + (
            f", {c * 1e3:,.1f} ms a request parsing the chat template" if c else ""))
    if t:
        cap.append(f"streams up to {fmt.per_s(n / t)} tok/s")
    return (f"{n} process{'es' if n > 1 else ''} ({', '.join(cap)}); requests waited "
            f"{d['mean_api_server_wait_s'] * 1e3:,.1f} ms mean for it; its streaming set the "
            f"pace {d['api_server_stream_bound_frac']:.0%} of the run")


def _prefix_line(d: dict) -> str:
    if not d["prefix_caching"]:
        return "off"
    if d["prefix_cache_hit_rate"] is None:
        return "on, not simulated under static batching or a contiguous cache"
    from planner.io import fmt

    return f"on; {fmt.pct(d['prefix_cache_hit_rate'])} of prompt tokens found cached"


def _render(d: dict) -> None:
    from planner.io import fmt
    from planner.io.render import table
    from planner.layouts.deployment import Layout

    rate = f"closed loop of {d['max_concurrency']} clients" if d.get("arrivals") == \
        "closed loop" else "the dataset's arrival times" if d.get("arrivals") == "dataset" else \
        f"{d['request_rate']} req/s" + (f", at most {d['max_concurrency']} in flight"
                                        if d["max_concurrency"] else "")
    from planner.io.render import plain

    stdout.print(f"[bold]{plain(d['model'])}[/] on {Layout(d['tp'], d['pp'], d['ep']).gpus_text} x "
                 f"{plain(d['gpu'])}, engine "
                 f"{plain(_engine_text(d))}, "
                 f"{d['scheduler']} batching, {d['kv_layout']} KV; {d['num_prompts']:,} "
                 f"requests at {rate}" + _imbalance_text(d))
    stdout.print(table("Serving", ["what", "value"], [
        ["completed", f"{d['completed']:,} in {d['duration']:,.2f} s"],
        ["request throughput", f"{fmt.sig(d['request_throughput'])} req/s"],
        ["output throughput", f"{fmt.per_s(d['output_throughput'])} tok/s"],
        ["total token throughput", f"{fmt.per_s(d['total_token_throughput'])} tok/s"],
        *([["goodput", f"{fmt.sig(d['request_goodput'])} req/s"]] if "request_goodput" in d
          else []),
        ["running requests", f"mean {d['mean_running_requests']:,.1f}, max "
                             f"{d['max_running_requests']:,}"],
        ["scheduler limits", f"{d['max_num_seqs']:,} requests, "
                             f"{d['max_num_batched_tokens']:,} tokens a step"
         + (f", {d['max_prefill_tokens']:,} new prompt tokens a prefill step"
            if d.get("max_prefill_tokens") else "")
         + (f" (--performance-mode {d['performance_mode']})" if d.get("performance_mode")
            else "")
         + (f"; prefills of up to {d['prefill_graph_max_tokens']:,} tokens replayed from "
            "piecewise CUDA graphs" if d.get("prefill_graph_max_tokens") else "")],
        *([["speculative decoding", _spec_line(d["speculative"])]] if d.get("speculative")
          else []),
        ["KV cache", f"{d['kv_capacity_tokens']:,} tokens"
                     + (" of one group of layers, the sliding-window ones holding their "
                        "window (vLLM's hybrid KV cache manager)" if d.get("hybrid_kv_cache")
                        else "")
                     + (f" ({fmt.gib(d['kv_cache_memory_bytes'])} a GPU, given)"
                        if d.get("kv_cache_memory_bytes") else "")
                     + (f" (at most {d['kv_cache_max_tokens']:,}, given)"
                        if d.get("kv_cache_max_tokens") else "")
                     + f"; holding {fmt.pct(d['kv_cache_used_frac_mean'])} mean, "
                     f"{fmt.pct(d['kv_cache_used_frac_peak'])} peak; reserved "
                     f"{fmt.pct(d['kv_cache_reserved_frac_peak'])} peak"],
        ["preemptions", f"{d['preemptions']:,}"],
        ["prefix cache", _prefix_line(d)],
        *([["chat template", f"{d['chat_template_tokens']:,} tokens a prompt beyond -p"]]
          if d.get("chat_template_tokens") else []),
        *([["API server", _api_line(d)]] if d["api_server_request_s"] or d["api_server_token_s"]
          or d.get("api_server_chat_template_s")
          else []),
        *([["refused", f"{d['failed']:,}: {d['failed_reason']}"]] if d.get("failed")
          else []),
    ], left=2))
    rows = []
    for name, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"),
                      ("end-to-end", "e2el")):
        vals = [d.get(f"{s}_{key}_ms") for s in ("mean", "median", "p90", "p99")]
        rows.append([name, *("-" if v is None else f"{v:,.1f}" for v in vals)])
    stdout.print(table(_latency_title(d), ["", "mean", "median", "p90", "p99"], rows, left=1))
    b = d.get("baseline")
    if b is not None:
        sp = "-" if d["speedup"] is None else f"{d['speedup']:.2f}x"
        tpot = b.get("mean_tpot_ms")
        stdout.print(f"without speculation (the same requests): mean TPOT "
                     f"{'-' if tpot is None else f'{tpot:,.1f} ms'}, mean TTFT "
                     f"{b['mean_ttft_ms']:,.1f} ms, output throughput "
                     f"{fmt.per_s(b['output_throughput'])} tok/s; speculation's TPOT speedup {sp}")
