"""Options, enums and helpers the CLI's commands share, and ``build_deployment``: the one place
a command turns its flags into a ``planner.layouts.deployment.Deployment``. Defaults come from
the library's own declarations (``Workload``, ``Options``, ``DEFAULT_GROUP_SIZE``; the
scheduler's from the engine profile), not from literals here."""

from __future__ import annotations

import json
import math
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from planner.cli.flags import DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS, cli_aliases, human_int
from planner.core.errors import LlmplanError
from planner.core.specs import DEFAULT_GROUP_SIZE, GIB, Options, Workload
from planner.layouts.expert import EXPERT_IMBALANCE

stdout = Console()
stderr = Console(stderr=True)


class WeightsOpt(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"
    int4 = "int4"
    mxfp4 = "mxfp4"


class KVOpt(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"


class ComputeChoice(str, Enum):
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"
    int8 = "int8"


class TimeModel(str, Enum):
    roofline = "roofline"
    additive = "additive"


class Attention(str, Enum):
    flash = "flash"
    naive = "naive"


# Defaults are declared once, in the specs.
_W = Workload.model_fields
# The workload every command defaults to (declared once, in Workload): estimate, sweep,
# simulate, plan, report and a budget of check that leaves it out; tests/test_defaults.py
# holds them together.
DEFAULT_PROMPT_TOKENS = _W["prompt_tokens"].default
DEFAULT_OUTPUT_TOKENS = _W["output_tokens"].default
DEFAULT_BATCH = _W["batch"].default  # concurrent sequences of a static batch
_O = Options.model_fields

ModelOpt = Annotated[str, typer.Option(
    "--model", "-m",
    help="Built-in model name, a YAML file, an HF config.json or a snapshot folder.",
    metavar="MODEL")]
GpuOpt = Annotated[str, typer.Option("--gpu", "-g", help="Built-in GPU name or a YAML file.",
    metavar="GPU")]
TP_NAMES = ("--tp", *cli_aliases("--tp"))  # with vLLM's --tensor-parallel-size, -tp
PP_NAMES = ("--pp", *cli_aliases("--pp"))
TpOpt = Annotated[int, typer.Option(*TP_NAMES, help="Tensor-parallel GPUs.", metavar="N")]
PpOpt = Annotated[int, typer.Option(
    *PP_NAMES, help="Pipeline-parallel stages, each on --tp GPUs (vLLM's split of the layers).",
    metavar="N")]
EpOpt = Annotated[int, typer.Option(
    "--ep", help="Expert-parallel GPUs for a MoE model: each holds 1/N of the routed experts; "
                 "attention and the other weights tensor-parallel over --tp of them, in N / "
                 "--tp data-parallel groups (--tp 1: attention data-parallel on every GPU; "
                 "--tp N: one TP group, vLLM's --enable-expert-parallel). A multiple of "
                 "--tp; no --pp with it.", metavar="N")]
ExpertImbalanceOpt = Annotated[Optional[float], typer.Option(
    "--expert-imbalance", help="With --ep: the busiest GPU's routed token-expert pairs over "
    "the mean (max / mean load, >= 1); uniform routing's expected maximum stays the floor. "
    f"Default {EXPERT_IMBALANCE:.2f}: SGLang's DeepSeek-V3 EP32 prefill, balanced routing "
    "over its default placement (lmsys.org/blog/2025-05-05-large-scale-ep; estimated).",
    metavar="RATIO")]
WeightsOption = Annotated[Optional[WeightsOpt], typer.Option(
    "--weights", help="Weight precision (default: what an HF config.json's "
    "quantization_config says the checkpoint stores, else its torch_dtype (float16: fp16), "
    "else bf16).")]
KVOption = Annotated[Optional[KVOpt], typer.Option(
    "--kv-cache", help="KV-cache precision (default: the 16-bit type of the weights).")]
# vLLM's spellings of the same choices, with their own vocabularies (planner/cli/flags.py)
KvCacheDtype = Enum("KvCacheDtype", {k: k for k in KV_CACHE_DTYPES}, type=str)
Quantization = Enum("Quantization", {k: k for k in QUANTIZATIONS}, type=str)
ModelDtype = Enum("ModelDtype", {k: k for k in DTYPES}, type=str)
KvCacheDtypeOpt = Annotated[Optional[KvCacheDtype], typer.Option(
    "--kv-cache-dtype", help="vLLM's name for --kv-cache: auto (the model's 16-bit type), "
    "bfloat16, float16, fp8 / fp8_e4m3 / fp8_e5m2 (one byte).")]
QuantizationOpt = Annotated[Optional[Quantization], typer.Option(
    "--quantization", help="vLLM's --quantization where it names one storage type: fp8; "
    "awq, gptq (and their _marlin kernels): int4 in groups of --group-size 128; mxfp4. "
    "For --weights (an 8-bit GPTQ checkpoint is --weights int8).")]
DtypeOpt = Annotated[Optional[ModelDtype], typer.Option(
    "--dtype", help="vLLM's --dtype, the model's 16-bit type: bfloat16, float16 / half, "
    "auto. With 16-bit weights it is their type; with int8 / int4 / mxfp4 weights the type "
    "the matmuls run in (--compute).")]
PerformanceModeOpt = Annotated[Optional[str], typer.Option(
    "--performance-mode", metavar="balanced|interactivity|throughput",
    help="vLLM's --performance-mode (0.17 and later; engine vllm): throughput doubles the "
    "default --max-num-seqs and --max-num-batched-tokens (a value given stands); "
    "interactivity captures CUDA graphs at every decode batch of 1-32, so small batches pad "
    "less; balanced (vLLM's default) changes nothing.")]
EnforceEagerOpt = Annotated[bool, typer.Option(
    "--enforce-eager", help="No CUDA graphs (vLLM's --enforce-eager): every decode step "
    "launches its kernels from the host, at the engine's host_launch_us each.")]
AsyncSchedulingOpt = Annotated[Optional[bool], typer.Option(
    "--async-scheduling/--no-async-scheduling",
    "--enable-overlap-schedule/--disable-overlap-schedule",
    help="The host prepares the next step while the GPU runs this one, so a step takes the "
    "longer of the two: vLLM's async scheduling, SGLang's and TensorRT-LLM's overlap "
    "schedulers (default: the engine's; on for vllm, sglang and trtllm).")]
BatchOpt = Annotated[int, typer.Option("--batch", "-b", help="Concurrent sequences.", metavar="N")]
PROMPT_FLAGS = ("--prompt-tokens", "-p", "--random-input-len", "--input-len")
OUTPUT_FLAGS = ("--output-tokens", "-o", "--random-output-len", "--output-len")
PromptOpt = Annotated[int, typer.Option(
    *PROMPT_FLAGS,
    help="Prompt tokens per sequence (vLLM bench's --random-input-len / --input-len).",
    metavar="TOKENS")]
OutputOpt = Annotated[int, typer.Option(
    *OUTPUT_FLAGS,
    help="Output tokens per sequence (vLLM bench's --random-output-len / --output-len).",
    metavar="TOKENS")]
# a request stream's lengths (simulate): None keeps a published length distribution's own
# means (--dataset-name sharegpt), as vLLM's bench serve draws the dataset
StreamPromptOpt = Annotated[Optional[int], typer.Option(
    *PROMPT_FLAGS,
    help="Prompt tokens per request (vLLM bench's --random-input-len / --input-len; default "
    f"{DEFAULT_PROMPT_TOKENS:,}); with --dataset-name sharegpt, the mean its lengths are "
    "scaled to (default: ShareGPT's own).", metavar="TOKENS")]
StreamOutputOpt = Annotated[Optional[int], typer.Option(
    *OUTPUT_FLAGS,
    help="Output tokens per request (vLLM bench's --random-output-len / --output-len; "
    f"default {DEFAULT_OUTPUT_TOKENS:,}); with --dataset-name sharegpt, the mean its lengths "
    "are scaled to (default: ShareGPT's own).", metavar="TOKENS")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object, nothing else.")]
def duration_s(text: str) -> float:
    """A duration from the command line in seconds: 500ms, 3s, 2min, 150us or a bare number of
    seconds (typer's parser for every duration option)."""
    from planner.evidence.budget import parse_quantity

    try:
        v = parse_quantity(text, "time")
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    return v


def duration_option(*names: str, help: str, metavar: str = "DURATION"):
    """A duration option (``duration_s``): units welcome, seconds without one."""
    return typer.Option(*names, parser=duration_s, metavar=metavar, help=help)


PricesOpt = Annotated[Optional[str], typer.Option(
    "--prices", metavar="SET|FILE",
    help="The price set every cost is on (one basis, planner/data/prices): "
    "hyperscaler-on-demand (the default, or $LLMPLAN_PRICES), specialty-on-demand, "
    "committed-1y, committed-3y, owned, or a YAML file of that schema (llmplan "
    "prices).")]
PriceOpt = Annotated[Optional[list[str]], typer.Option(
    "--price", metavar="GPU=USD",
    help="USD per GPU-hour for one GPU, over the price set (repeatable, or "
    "comma-separated: h100-sxm=2.5,h200=3.1).")]
ComputeOpt = Annotated[Optional[ComputeChoice], typer.Option(
    "--compute", help="Type the matmuls run in (default: from the weights, bf16 for bf16 "
                      "weights, which a T4 or V100 lacks: give --weights fp16 or --compute "
                      "fp16 there; fp16 for int8 / int4 weights on those GPUs).")]
class QuantizedLayers(str, Enum):
    all = "all"
    experts = "experts"
    mlp = "mlp"


QuantizedLayersOpt = Annotated[QuantizedLayers, typer.Option(
    "--quantized-layers", help="Which linear layers the --weights type covers: all; only a "
    "MoE model's routed experts (gpt-oss's released MXFP4 checkpoint; the rest 16-bit); or "
    "every MLP layer, attention in 16-bit (Meta's Llama-3.1-405B-FP8).")]
class SpeculativeMethod(str, Enum):
    draft_model = "draft-model"
    mtp = "mtp"
    eagle = "eagle"
    eagle3 = "eagle3"
    ngram = "ngram"


SpeculativeOpt = Annotated[Optional[SpeculativeMethod], typer.Option(
    "--speculative",
    help="Speculative decoding: a draft model, the model's own MTP layer (DeepSeek), an EAGLE "
         "or EAGLE-3 head, or n-gram prompt lookup. The headline TPOT, latency, throughput "
         "and cost are then the speculative ones, the figures without it beside them.")]
DraftOpt = Annotated[Optional[str], typer.Option(
    "--draft-model",
    help="The draft model (built-in name, YAML or config.json) for --speculative "
         "draft-model.", metavar="MODEL")]
SpeculativeTokensOpt = Annotated[Optional[int], typer.Option(
    "--num-speculative-tokens",
    help="Tokens proposed per step, k (default: the k of the published acceptance used; "
         "required with --acceptance-rate where there is none).", metavar="K")]
AcceptanceOpt = Annotated[Optional[float], typer.Option(
    "--acceptance-rate",
    help="Probability that each proposed token is accepted, in [0, 1] (default: the "
         "published figure for the method and model family in planner/data/speculation.yaml, "
         "source named in the output; none for ngram, whose acceptance is the traffic's).",
         metavar="FRACTION")]
LongerOpt = Annotated[bool, typer.Option(
    "--allow-longer-context",
    help="Accept prompt + output tokens beyond the model's max_position_embeddings.")]


def check_context(m, prompt_tokens: int, output_tokens: int, allow: bool,
                  where: str = "--prompt-tokens + --output-tokens") -> None:
    """A sequence longer than the model's context is an error unless asked for: the engines
    refuse it (vLLM's max_model_len), and RoPE scaling past it is not what was measured."""
    total = prompt_tokens + output_tokens
    if total > m.max_position_embeddings and not allow:
        raise LlmplanError(f"{where}: {prompt_tokens:,} + {output_tokens:,} = {total:,} tokens "
                           f"exceeds {m.name}'s context of {m.max_position_embeddings:,} "
                           "(max_position_embeddings); --allow-longer-context to go on")


DAY_S = 86_400.0
# Upper bounds of options whose every finite value would otherwise be taken: beyond them a
# value is a typo, not a deployment. Times: a day; prices: $10,000 per GPU-hour, as in
# hardware_db (list prices of the largest GPUs are under $15); traffic: 1e9 requests or
# tokens per second (about 10,000 times the busiest public LLM APIs).
UPPER_BOUNDS: dict[str, tuple[float, str]] = {
    **{flag: (DAY_S, " s (a day)") for flag in (
        "--measured-tpot", "--measured-ttft", "--ttft-slo", "--tpot-slo", "--ttft", "--tpot",
        "--max-wait")},
    "--price-per-hour": (10_000.0, " US$ per GPU-hour"),
    "--rps": (1e9, " requests/s"),
    "--request-rate": (1e9, " requests/s (inf sends every request at t = 0)"),
    "--tokens-per-s": (1e9, " tokens/s"),
    # the gamma shape of arrivals: the spread of gaps is 1/sqrt(shape), 0.1% at 1e6
    "--burstiness": (1e6, " (arrivals are regular within 0.1% at 1e6)"),
}


# Lower bounds of rates: below them the arrival times of a stream overflow (a rate of 1e-320
# puts the next request at t = inf) or the run lasts longer than any plan (fuzz, issue 27).
# One request in about 11.6 days; a gamma shape whose gaps spread 1,000x.
LOWER_BOUNDS: dict[str, tuple[float, str]] = {
    "--request-rate": (1e-6, " requests/s (one in 11.6 days)"),
    "--rps": (1e-6, " requests/s (one in 11.6 days)"),
    "--tokens-per-s": (1e-6, " tokens/s"),
    "--burstiness": (1e-6, " (gaps spread 1,000x at 1e-6)"),
}


def positive(name: str, value: float | None, *, allow_zero: bool = False,
             allow_inf: bool = False) -> None:
    """A size or rate from the command line: a finite number above (or at) zero and at most
    its documented bound (``UPPER_BOUNDS``); with ``allow_inf``, +inf too (a request rate of
    inf: every request at t = 0)."""
    if value is None:
        return
    if isinstance(value, int) and abs(value) > 10**18:  # float() of it would overflow
        raise LlmplanError(f"{name}: a {len(str(abs(value)))}-digit number is out of range")
    if not (math.isfinite(value) or (allow_inf and value == math.inf)):
        raise LlmplanError(f"{name}: must be a finite number{' or inf' if allow_inf else ''}, "
                           f"got {value:g}")
    if value < 0 or (value == 0 and not allow_zero):
        raise LlmplanError(f"{name}: must be {'non-negative' if allow_zero else 'positive'}, "
                           f"got {value:g}")
    bound = UPPER_BOUNDS.get(name)
    if bound is not None and math.isfinite(value) and value > bound[0]:
        raise LlmplanError(f"{name}: {value:g} is above the limit of {bound[0]:g}{bound[1]}")
    low = LOWER_BOUNDS.get(name)
    if low is not None and 0 < value < low[0]:
        raise LlmplanError(f"{name}: {value:g} is below the limit of {low[0]:g}{low[1]}")


def output_path(path: Path | None, flag: str, suffix: str | None = None) -> None:
    """A file llmplan will write: its folder must exist and it must not be a folder; a PNG
    option must name a .png."""
    if path is None:
        return
    if len(path.name.encode()) > 255:
        raise LlmplanError(f"{flag}: file name of {len(path.name.encode())} bytes is longer "
                           "than 255")
    if path.is_dir():
        raise LlmplanError(f"{flag}: {path} is a directory; give a file name")
    if not path.parent.is_dir():
        raise LlmplanError(f"{flag}: folder {path.parent} does not exist")
    if suffix and path.suffix.lower() != suffix:
        raise LlmplanError(f"{flag}: {path} must end in {suffix}")


def json_text(obj: object) -> str:
    """A command's ``--json`` object as text: through the output gate (``planner.io.gate``:
    every figure finite and possible, or refused in one line) first."""
    from planner.io.gate import gate

    return json.dumps(gate(obj), indent=2, default=str)


def json_out(obj: object) -> None:
    """The one writer of a command's ``--json`` object (``json_text``)."""
    sys.stdout.write(json_text(obj) + "\n")




def options_from(time_model: TimeModel, attention: Attention,
                 kernel_overhead_us: float | None,
                 reserve_gib: float, memory_utilization: float | None,
                 prefill_chunk_tokens: int = 8192, cpu_offload_gb: float = 0.0) -> Options:
    """Validated model options from the shared CLI flags."""
    positive("--cpu-offload-gb", cpu_offload_gb, allow_zero=True)
    positive("--kernel-overhead-us", kernel_overhead_us, allow_zero=True)
    positive("--prefill-chunk-tokens", prefill_chunk_tokens, allow_zero=True)
    positive("--reserve-gib", reserve_gib, allow_zero=True)
    positive("--memory-utilization", memory_utilization)
    if memory_utilization is not None and memory_utilization > 1:
        raise LlmplanError(f"--memory-utilization: must be at most 1, got {memory_utilization:g}")
    if kernel_overhead_us is not None and kernel_overhead_us > 1e6:
        raise LlmplanError(f"--kernel-overhead-us: must be at most 1e6 (one second per kernel), "
                           f"got {kernel_overhead_us:g}")
    if reserve_gib > 1e5:
        raise LlmplanError(f"--reserve-gib: must be at most 1e5, got {reserve_gib:g}")
    return Options(time_model=time_model.value, attention=attention.value,
                   kernel_overhead_s=None if kernel_overhead_us is None else
                   kernel_overhead_us * 1e-6, reserve_bytes=reserve_gib * GIB,
                   memory_utilization_frac=memory_utilization,
                   prefill_chunk_tokens=prefill_chunk_tokens or None,
                   cpu_offload_bytes=cpu_offload_gb * GIB)


def with_kv_pool(opts: Options, memory_bytes: str | None, tokens: int | None) -> Options:
    """``opts`` with the KV pool given outright (``--kv-cache-memory-bytes``, read as vLLM
    reads it: ``planner.cli.flags.human_int``) and its token cap (``--kv-cache-tokens``);
    None leaves each as the engine sizes it."""
    update: dict = {}
    if memory_bytes is not None:
        try:
            n = human_int(str(memory_bytes))
        except ValueError:
            n = None
        if n is None or n <= 0:
            raise LlmplanError(f"--kv-cache-memory-bytes: '{memory_bytes}' is not a positive "
                               "number of bytes (20G is 20 GiB, 20g 20 x 10^9)")
        if n > MAX_KV_POOL_BYTES:
            raise LlmplanError(f"--kv-cache-memory-bytes: {n:,} is above the limit of "
                               f"{MAX_KV_POOL_BYTES:,} (1 PiB)")
        update["kv_cache_memory_bytes"] = float(n)
    if tokens is not None:
        positive("--kv-cache-tokens", tokens)
        if tokens > MAX_KV_POOL_TOKENS:
            raise LlmplanError(f"--kv-cache-tokens: {tokens:,} is above the limit of "
                               f"{MAX_KV_POOL_TOKENS:,}")
        update["kv_cache_max_tokens"] = int(tokens)
    return opts.model_copy(update=update) if update else opts


# bounds on a KV pool given outright: well past any GPU's memory, short of overflowing a sweep
MAX_KV_POOL_BYTES = 1024**5
MAX_KV_POOL_TOKENS = 10**12


# the GPU makers whose GPUs vLLM 0.34 runs its extensible KV cache on (CUDA and ROCm:
# vllm/config/vllm.py, _resolve_extensible_kv_cache, current_platform.is_cuda_alike())
EXTENSIBLE_KV_MAKERS = ("nvidia", "amd")


def extensible_kv(eng, on: bool | None, opts: Options, hw=None):
    """``eng`` as ``--extensible-kv-cache`` asks (None: the engine's default): off, sized as
    vLLM 0.20-0.33 size it (``Engine.without_measured_kv``); on, refused in one line where vLLM
    refuses it (vllm/config/vllm.py of 0.34.0, ``_resolve_extensible_kv_cache``): a release
    before 0.34 (it has no such flag), a GPU not NVIDIA's or AMD's (``hw``, where given), a KV
    pool given outright. A pool given outright turns it off, as vLLM does when unset."""
    if on is None and opts.kv_cache_memory_bytes is None:
        return eng
    if not on:
        return eng.without_measured_kv()
    maker = (getattr(hw, "vendor", None) or "nvidia").lower()
    if hw is not None and maker not in EXTENSIBLE_KV_MAKERS:
        raise LlmplanError(f"--extensible-kv-cache: vLLM runs it on NVIDIA and AMD GPUs only "
                           f"(CUDA and ROCm); {hw.name} is {hw.vendor}'s")
    if eng.memory_basis != "measured" or eng.memory_fallback is None:
        raise LlmplanError(f"--extensible-kv-cache: {eng.label} has none (vLLM 0.34 and "
                           "later; --engine vllm@0.34)")
    if opts.kv_cache_memory_bytes is not None:
        raise LlmplanError("--extensible-kv-cache with --kv-cache-memory-bytes: vLLM refuses "
                           "them together (it sizes the KV cache from measured memory, which "
                           "kv_cache_memory_bytes overrides)")
    return eng


WEIGHT_CHOICES = ("bf16", "fp16", "fp8", "int8", "int4", "mxfp4")
KV_CHOICES = ("bf16", "fp16", "fp8", "int8")


def parse_choices(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    """A comma-separated list whose every item must be one of ``allowed``."""
    from planner.search.sweep import parse_str_list

    out = parse_str_list(text)
    if not out:
        raise LlmplanError(f"{flag}: no value given")
    for v in out:
        if v not in allowed:
            raise LlmplanError(f"{flag}: '{v}' is not one of {', '.join(allowed)}")
    return out


TimeModelOpt = Annotated[TimeModel, typer.Option(
    help="roofline: max(compute, memory) per operator; additive: their sum.")]
AttentionOpt = Annotated[Attention, typer.Option(
    help="flash: O(N) attention memory; naive: materialize the O(N^2) scores.")]
OverheadOpt = Annotated[Optional[float], typer.Option(
    help="Fixed cost per kernel in microseconds, in place of the engine profile's (0: none); "
    "the ideal bound has none.", metavar="US")]
ReserveOpt = Annotated[float, typer.Option(help="Runtime reserve: CUDA context, workspaces.",
    metavar="GIB")]
UtilOpt = Annotated[Optional[float], typer.Option(
    "--memory-utilization", *cli_aliases("--memory-utilization"),
    help="The engine's memory fraction, on the engine's own basis: of total memory for vLLM "
    "(gpu_memory_utilization) and SGLang (mem_fraction_static, for weights and KV cache "
    "only), of the memory weights and activations leave for TensorRT-LLM "
    "(free_gpu_memory_fraction). Default: the engine profile's (llmplan engines).",
    metavar="FRACTION")]
CpuOffloadOpt = Annotated[float, typer.Option(
    "--cpu-offload-gb",
    help="GiB of weights per GPU kept in host memory (vLLM's cpu_offload_gb): the GPU holds "
    "that much less of them and that much more KV cache, and every forward pass brings them "
    "over the GPU's host link (hardware_db host_link). At most the decoder layers' weights; "
    "tensor-parallel replicas only.", metavar="GIB")]
KvMemoryOpt = Annotated[Optional[str], typer.Option(
    "--kv-cache-memory-bytes",
    help="The KV cache given outright, per GPU (vLLM's kv_cache_memory_bytes, 0.11 and "
    "later): exactly this much, whatever the memory fraction says; it must fit beside the "
    "weights, activations and reserve; it turns the extensible KV cache off. As vLLM reads "
    "it: 20G is 20 GiB, 20g 20 x 10^9 bytes. Any engine is sized so here. Not with "
    "--speculative.",
    metavar="BYTES")]
KvTokensOpt = Annotated[Optional[int], typer.Option(
    "--kv-cache-tokens", "--max-total-tokens",
    help="At most this many tokens in each GPU's KV cache (SGLang's max_total_tokens, "
    "TensorRT-LLM's kv_cache_config.max_tokens): the engine's own sizing, capped. Not with "
    "--speculative.",
    metavar="TOKENS")]
ExtensibleOpt = Annotated[Optional[bool], typer.Option(
    "--extensible-kv-cache/--no-extensible-kv-cache",
    "--enable-extensible-kv-cache/--no-enable-extensible-kv-cache",
    help="vLLM 0.34's extensible KV cache: sized from the memory measured after warm-up "
    "(default on NVIDIA and AMD GPUs); off, 0.92 of the total as 0.20-0.33 size it.")]
CalibrationOpt = Annotated[Optional[Path], typer.Option(
    help="Measured ceilings from `llmplan measure --calibrate`.", metavar="FILE")]
GroupSizeOpt = Annotated[Optional[int], typer.Option(
    help="Weights per scale for int8/int4 (default: the checkpoint's quantization_config, "
         "else 128).", metavar="N")]
DEFAULT_ENGINE = "vllm"
EngineOpt = Annotated[str, typer.Option(
    "--engine", "-e", help="Engine profile: ideal, vllm, vllm-0.8, vllm-v0, sglang, trtllm, "
    "trtllm-engine, gpt-fast, "
    "hf-eager, FAMILY@RELEASE (vllm@0.6.3 picks the profile covering that release) "
    "(engines_db) or a YAML file. ideal = the datasheet roofline with no overheads.",
    metavar="ENGINE")]
ChunkOpt = Annotated[int, typer.Option(
    help="Tokens per prefill pass (chunked prefill; bounds activation memory). 0: whole batch.",
    metavar="TOKENS")]
DEFAULT_CHUNK = _O["prefill_chunk_tokens"].default
DEFAULT_RESERVE_GIB = _O["reserve_bytes"].default / GIB
DEFAULT_UTIL = _O["memory_utilization_frac"].default


def check_layout(m, tp: int, pp: int, ep: int):
    """--tp, --pp and --ep of one replica: within bounds, and a layout the model allows
    (``planner.layouts.deployment.Layout``, returned)."""
    from planner.layouts.deployment import Layout

    for name, v in (("--tp", tp), ("--pp", pp), ("--ep", ep)):
        positive(name, v)
    if pp > 1024:
        raise LlmplanError(f"--pp: at most 1024 stages, got {pp}")
    if ep > 100_000:
        raise LlmplanError(f"--ep: at most 100,000 GPUs, got {ep}")
    return Layout(tp, pp, ep).check(m)


# max / mean load can be at most the number of expert-parallel GPUs, which is at most the
# routed experts (256 for DeepSeek-V3, the most in models_db): 1,024 leaves room
MAX_EXPERT_IMBALANCE = 1024.0


def with_expert_imbalance(opts: Options, value: float | None) -> Options:
    """``opts`` with ``--expert-imbalance`` (None: the default), a finite factor >= 1."""
    if value is None:
        return opts
    if not math.isfinite(value) or value < 1:
        raise LlmplanError(f"--expert-imbalance: must be a finite max / mean load of at "
                           f"least 1, got {value:g}")
    if value > MAX_EXPERT_IMBALANCE:  # the busiest of N GPUs carries at most N x the mean
        raise LlmplanError(f"--expert-imbalance: {value:g} is above the limit of "
                           f"{MAX_EXPERT_IMBALANCE:g} (the busiest of N expert-parallel GPUs "
                           "carries at most N x the mean)")
    return opts.model_copy(update={"expert_imbalance": float(value)})


def check_quantized_layers(m, quantized_layers) -> str:
    """"experts" needs routed experts; returns the plain value."""
    q = getattr(quantized_layers, "value", quantized_layers) or "all"
    if q == "experts" and m.moe is None:
        raise LlmplanError(f"--quantized-layers experts: {m.name} has no routed experts "
                           "(not a mixture-of-experts model)")
    return q


def check_offload_speculation(options, spec) -> None:
    """Weights in host memory and speculative decoding are not modelled together: vLLM's
    offload budget is shared by the drafter's layers; nor is a KV cache given outright or
    capped, which the drafter's cache shares beside its weights."""
    if spec is not None and options.cpu_offload_bytes:
        raise LlmplanError("--cpu-offload-gb with --speculative: not modelled together (the "
                           "drafter's layers share vLLM's offload budget)")
    for flag, given in (("--kv-cache-memory-bytes", options.kv_cache_memory_bytes),
                        ("--kv-cache-tokens", options.kv_cache_max_tokens)):
        if spec is not None and given is not None:
            raise LlmplanError(f"{flag} with --speculative: not modelled together (the "
                               "drafter's KV cache shares the pool, its weights beside it)")


def speculation_config(method, draft_model, k, a, model=None):
    """The speculative-decoding configuration the flags ask for; None when none is. Without
    --acceptance-rate the rate (and k, unless given) is the published one for the method and
    ``model`` (planner/data/speculation.yaml), its source carried into the output."""
    from planner.io import catalog
    from planner.layouts.speculation import (
        SpeculationConfig,
        check_method,
        check_tokenizer,
        published_acceptance,
    )

    if all(v is None for v in (method, draft_model, k, a)):
        return None
    if method is None:
        raise LlmplanError("--draft-model, --num-speculative-tokens and --acceptance-rate go "
                           "with --speculative draft-model|mtp|eagle|eagle3|ngram")
    if a is not None and not 0 <= a <= 1:
        raise LlmplanError(f"--acceptance-rate: must be in [0, 1], got {a:g}")
    positive("--num-speculative-tokens", k)
    if (method == SpeculativeMethod.draft_model) != (draft_model is not None):
        raise LlmplanError("--draft-model goes with --speculative draft-model, and that "
                           "needs it")
    if model is not None:
        check_method(model, method.value)
    draft = catalog.load_model(draft_model) if draft_model else None
    if draft is not None and model is not None:
        check_tokenizer(model, draft)
    source = "--acceptance-rate"
    entry = None if model is None else published_acceptance(
        catalog.load_acceptance(), model, method.value, draft)
    if a is None:
        if entry is None:
            raise LlmplanError(_no_published(method.value, model, draft))
        a, source = entry.acceptance, entry.text
    if k is None and entry is not None:
        k = entry.k  # the k the published figure was measured at
    if k is None:
        raise LlmplanError(f"--speculative {method.value}: give --num-speculative-tokens with "
                           "--acceptance-rate (the k your rate was measured at)")
    return SpeculationConfig(method.value, k, a, draft, acceptance_source=source)


def _no_published(method: str, model, draft) -> str:
    """Why there is no default acceptance, as one line."""
    if method == "ngram":
        return ("--speculative ngram: give --acceptance-rate and --num-speculative-tokens, "
                "measured on your traffic (prompt lookup accepts what the output repeats of "
                "the prompt: a property of the workload, so there is no default)")
    who = model.name if model is not None else "this model"
    if draft is not None:
        who += f" drafted by {draft.name}"
    return (f"--speculative {method}: no published acceptance for {who} in "
            "planner/data/speculation.yaml; give --acceptance-rate and "
            "--num-speculative-tokens")


def _value(v):
    """An option's plain value: an enum's, or the value itself."""
    return getattr(v, "value", v)


def _choice(value, table: dict, flag: str):
    """An enum or text of a vLLM vocabulary (planner/cli/flags.py) as ours; None if not
    given."""
    if value is None:
        return None
    key = _value(value)
    if key not in table:
        raise LlmplanError(f"{flag}: '{key}' is not one of {', '.join(table)}")
    return table[key]


def engine_precision(weights=None, quantization=None, dtype=None, kv_cache=None,
                     kv_cache_dtype=None, compute=None, *, checkpoint=None
                     ) -> tuple[str | None, str | None, str | None]:
    """(weights, kv_cache, compute) from our flags and vLLM's names for them, refused in one
    line where two say different things: ``--quantization`` stands for ``--weights``
    (awq / gptq: int4), ``--kv-cache-dtype`` for ``--kv-cache`` (auto: the default), and
    ``--dtype`` is the 16-bit type: the weights' when they are 16-bit, the matmuls' for
    weight-only int8 / int4 / mxfp4, the KV cache's default beside fp8 weights. Weights None:
    not given (the checkpoint's, ``checkpoint``, when it has a quantization_config, else
    bf16); ``--dtype`` then speaks of the checkpoint's type."""
    w = _value(weights) if weights is not None else None
    kv = _value(kv_cache) if kv_cache is not None else None
    c = _value(compute) if compute is not None else None
    if quantization is not None:
        q = _choice(quantization, QUANTIZATIONS, "--quantization")
        if w is not None and w != q:
            raise LlmplanError(f"--weights {w} and --quantization {_value(quantization)} "
                               f"({q}) disagree: give one")
        w = q
    if kv_cache_dtype is not None:
        k = _choice(kv_cache_dtype, KV_CACHE_DTYPES, "--kv-cache-dtype")
        if kv is not None and kv != k:
            raise LlmplanError(f"--kv-cache {kv} and --kv-cache-dtype "
                               f"{_value(kv_cache_dtype)} disagree: give one")
        kv = kv if k is None else k
    d = _choice(dtype, DTYPES, "--dtype")
    if d is not None:
        stored = w or _value(checkpoint)
        if stored is None or stored in ("bf16", "fp16"):
            if weights is not None and w != d:
                raise LlmplanError(f"--weights {w} and --dtype {_value(dtype)} disagree: "
                                   "give one")
            w = d
        elif stored in ("int8", "int4", "mxfp4"):
            if c is not None and c != d:
                raise LlmplanError(f"--compute {c} and --dtype {_value(dtype)} disagree: "
                                   "give one")
            c = d
        elif kv is None:  # fp8 weights: the 16-bit type is the KV cache's
            kv = d
    return w, kv, c


WEIGHTS_SOURCES = ("checkpoint", "--weights", "default")


def resolve_precision(m, weights=None, kv_cache=None, group_size: int | None = None,
                      compute=None, quantized_layers=None):
    """(precision, source): what ``--weights`` asks for (source "--weights"); without it, what
    the checkpoint's quantization_config says it stores ("checkpoint": ``--group-size``,
    ``--kv-cache``, ``--compute`` and ``--quantized-layers experts`` still apply over it, and a
    config that cannot be read is a one-line error here); else the config's 16-bit
    ``torch_dtype`` (float16: fp16; vLLM's --dtype auto), else bf16 ("default")."""
    positive("--group-size", group_size)
    kv = _value(kv_cache) if kv_cache else None
    c = _value(compute) if compute else None
    ql = _value(quantized_layers)
    q = m.quantization
    if weights is None and q is not None:
        p = q.shipped(kv, compute=c, group_size=group_size, quantized_layers=ql)
        check_quantized_layers(m, p.quantized_layers)
        return p, "checkpoint"
    # no --weights (nor --dtype): the 16-bit type is left to the engine (vLLM's --dtype auto)
    p = m.precision_of(_value(weights) or m.torch_dtype or "bf16", kv,
                       group_size or DEFAULT_GROUP_SIZE, c, check_quantized_layers(m, ql),
                       auto=weights is None and c is None)
    return p, ("--weights" if weights is not None else "default")


def precision_of(m, weights, kv_cache=None, group_size: int | None = None,
                 compute=None, quantized_layers="all"):
    """The precision the flags ask for (enums or plain values), checked against the model."""
    return resolve_precision(m, weights, kv_cache, group_size, compute, quantized_layers)[0]


def weights_source_text(m, p, source: str, group_size: int | None = None) -> str:
    """Where the weights' precision came from, for the human output: "AWQ, group 128, zero
    points, from config.json quantization_config", "--weights (over the checkpoint's AWQ,
    ...)", "default"."""
    q = m.quantization
    if source == "checkpoint":
        extra = f"; group {group_size} from --group-size" if group_size else ""
        return f"{q.label}{extra}, from {q.file} quantization_config"
    if source == "--weights":
        return "--weights" + (f"; {q.file}'s quantization_config ({q.label}) set aside"
                              if q is not None and q.problem is None else "")
    if p.auto and p.weights.value == "fp16" and (m.torch_dtype or "bf16") != "fp16":
        return (f"default ({m.torch_dtype or 'bf16'}), run in fp16: the engine's fallback on "
                "this GPU (note below)")
    if m.torch_dtype is not None:
        return f"default: the checkpoint's torch_dtype ({m.torch_dtype}), from {m.source}"
    if m.source.endswith(".json"):
        return f"default: no quantization_config in {m.source}"
    return "default"


def engine_flags(eng, *, enforce_eager: bool = False, async_scheduling: bool | None = None):
    """``eng`` as the command's engine flags run it: without CUDA graphs (--enforce-eager),
    with async scheduling on or off (--async-scheduling; None: the engine's default)."""
    from dataclasses import replace

    if enforce_eager:
        eng = replace(eng, cuda_graphs=False)
    if async_scheduling is not None:
        eng = replace(eng, async_scheduling=async_scheduling)
    return eng


def check_async_pipeline(eng, pps, async_scheduling: bool | None) -> list[int]:
    """The pipeline depths of ``pps`` the engine starts with --async-scheduling asked for:
    vLLM before 0.15 stops at start-up under pipeline parallelism ("Async scheduling is not
    yet compatible with pipeline_parallel_size > 1": vllm/config/vllm.py of 0.12-0.14,
    engine/arg_utils.py of 0.11), where left to its default it runs PP without it
    (``overlaps_host``). Refused, in one line, where no depth is left."""
    deep = [p for p in pps if p > 1]
    if async_scheduling and deep and eng.family == "vllm" and not eng.async_with_pp:
        if len(deep) < len(pps):
            return [p for p in pps if p == 1]
        release = f"release {eng.release}" if eng.release else eng.name
        raise LlmplanError(
            f"--async-scheduling with --pp {deep[0]}: vLLM ({release}) refuses async "
            "scheduling under pipeline parallelism before 0.15 ('Async scheduling is not yet "
            "compatible with pipeline_parallel_size > 1'); leave --async-scheduling out (PP "
            "then runs without it) or use --engine vllm@0.15 or later")
    return list(pps)


def build_deployment(m, *, gpu: str, engine: str, tp: int = 1, pp: int = 1, ep: int = 1,
                     weights=None, kv_cache=None, group_size: int | None = None,
                     quantized_layers=None, compute=None, calibration: Path | None = None,
                     options=None, enforce_eager: bool = False, prices: str | None = None,
                     price: list[str] | None = None, async_scheduling: bool | None = None,
                     kv_connector: bool = False, extensible_kv_cache: bool | None = None):
    """The deployment the options describe (``planner.layouts.deployment.Deployment``): the
    GPU, engine and calibration loaded, the precision and layout checked, the engine
    prepared (``enforce_eager``: without its CUDA graphs; ``async_scheduling``: its host
    work beside the GPU's or not, None: the engine's default), the GPU priced from the price set
    ``prices`` with the ``price`` overrides (--prices, --price). Every command that predicts
    builds its deployment here. ``weights`` None: the checkpoint's (``resolve_precision``);
    ``kv_connector``: a disaggregated pool's, its KV cache sized as without the measured
    basis (``Engine.without_measured_kv``); ``extensible_kv_cache``: that basis on or off
    (``extensible_kv``; None: the engine's)."""
    from planner.io import catalog
    from planner.layouts.deployment import Deployment

    positive("--group-size", group_size)  # before the files, as every command checks numbers
    overrides = catalog.parse_price_overrides(price)
    hw = catalog.load_hardware(gpu, prices, overrides)
    catalog.check_price_names(overrides, [hw.name])
    eng = engine_flags(catalog.load_engine(engine), enforce_eager=enforce_eager,
                       async_scheduling=async_scheduling)
    check_async_pipeline(eng, (pp,), async_scheduling)
    eng = extensible_kv(eng, extensible_kv_cache, options or Options(), hw)
    if kv_connector:  # a disaggregated pool: vLLM 0.34 sizes its KV cache as before there
        eng = eng.without_measured_kv()
    cal = catalog.load_calibration(calibration) if calibration else None
    prec, source = resolve_precision(m, weights, kv_cache, group_size, compute,
                                     quantized_layers)
    layout = check_layout(m, tp, pp, ep)
    return Deployment.build(m, hw, engine=eng, precision=prec, layout=layout, options=options,
                            calibration=cal, weights_source=source)


def static_bands(dep, figures, batch: int) -> dict:
    """The error bands of a static batch's headline figures (``figures``: anything with
    ``ttft_s``, ``tpot_s``, ``latency_s``, ``throughput_tokens_per_s``) on deployment ``dep``,
    as ``estimate`` prints them and ``check --at high`` holds them: batch 1 or batched; a
    figure that is None has none."""
    from planner.evidence.bands import static_regime

    regime = static_regime(batch)
    figs = {"ttft_s": (figures.ttft_s, "prefill", regime, False),
            "tpot_s": (figures.tpot_s, "decode", regime, False),
            "latency_s": (figures.latency_s, "end-to-end", regime, False),
            "throughput_tokens_per_s": (figures.throughput_tokens_per_s, "decode", regime,
                                        True)}
    return figure_bands(dep.engine.name, {k: v for k, v in figs.items() if v[0] is not None},
                        gpu_class=dep.hardware.architecture, model_kind=model_kind(dep.model))


def check_engine_option(name: str) -> None:
    """Load the engine profile --engine names before any work: a bad name or file is the
    option's fault, said as such, not the first deployment or row that would use it."""
    from planner.io import catalog

    try:
        catalog.load_engine_spec(name)
    except LlmplanError as err:
        raise LlmplanError(f"--engine: {err}") from None


def model_kind(model) -> str:
    """The kind of model the error bands tell apart: "MoE" (routed experts) or "dense"."""
    return "MoE" if model.moe is not None else "dense"


def figure_bands(engine_name: str, figures: dict[str, tuple[float, str, str, bool]],
                 gpu_class: str | None = None, model_kind: str = "") -> dict:
    """Each predicted figure with its error band from planner/data/bands.yaml
    (``planner.evidence.bands``): ``figures`` maps a name (``ttft_s``) to (value, phase,
    regime, is a rate); ``gpu_class``: the GPU's architecture, so a band measured on other
    GPUs says so; ``model_kind``: "MoE" or "dense", whose own error a band's basis names
    where it differs (``planner.evidence.bands.kind_note``). The ideal engine is a bound, not
    a prediction: no band."""
    from planner.evidence.bands import apply
    from planner.io import catalog

    if engine_name == "ideal":
        return {}
    bands = catalog.load_bands()
    out = {}
    for name, (value, phase, regime, rate) in figures.items():
        a = apply(bands, value, engine_name, phase, regime, inverse=rate,
                  gpu_class=gpu_class or "", model_kind=model_kind)
        if a is not None:
            out[name] = a
    return out


def band_fields(applied: dict) -> dict:
    """``name_low``, ``name_high`` for JSON, and ``bands``: each band's evidence."""
    d: dict = {}
    for name, a in applied.items():
        d[f"{name}_low"], d[f"{name}_high"] = a.low, a.high
    d["bands"] = {name: a.as_dict() for name, a in applied.items()}
    return d


def render_bands(console, applied: dict, labels: dict[str, tuple[str, object]]) -> None:
    """A table of the figures' bands: ``labels`` maps a name to (label, formatter)."""
    from planner.io.render import table

    if not applied:
        return
    rows = [[labels[n][0], labels[n][1](a.value), f"{labels[n][1](a.low)} - "
             f"{labels[n][1](a.high)}", a.basis] for n, a in applied.items() if n in labels]
    console.print(table("How far off it may be (p10-p90 of measured / predicted on held-out "
                        "published runs)", ["figure", "predicted", "band", "evidence"], rows,
                        left=4, compact=True, fold=(3,)))


def once_by_name(specs) -> list:
    """Specs (models, GPUs) by name, the first of each name kept, in the order given: a name
    given twice, or an alias beside it, is one entry."""
    seen: dict = {}
    for spec in specs:
        seen.setdefault(spec.name, spec)
    return list(seen.values())
