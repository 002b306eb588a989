"""Serving engines' own flag names and what each stands for here: one table.

The CLI accepts vLLM's names beside its own (``--tensor-parallel-size`` / ``-tp`` for ``--tp``,
``--gpu-memory-utilization`` for ``--memory-utilization``, ...), and the replay of a published
serving run reads its server command (vLLM's, SGLang's or trtllm-serve's) with the same table,
so a name means one thing wherever llmplan meets it. Each entry names the engine's argument
definition it was read from.

Our options an engine flag stands for (``EngineFlag.ours``): ``--tp``, ``--pp``,
``--memory-utilization`` (on the engine's own basis: ``planner.core.engine.MEMORY_BASES``),
``--kv-cache``, ``--weights``, ``--dtype`` (the 16-bit type), ``--chunked-prefill``,
``--enforce-eager`` (no CUDA graphs), ``--cpu-offload-gb``, ``--max-num-seqs``,
``--max-num-batched-tokens``, ``--block-size``, ``--prefix-cache`` (automatic prefix
caching, True or False here), ``--mixed-batches`` (prefill chunks beside decodes),
``--async-scheduling`` (the host's work beside the GPU's, True or False),
``--hybrid-kv-cache`` (vLLM's hybrid KV cache manager: sliding-window layers cache their
window only, True or False),
``--api-server-count`` (API-server processes: ``planner.serving.frontend``),
``--kv-cache-memory-bytes`` (the KV cache given outright), ``--kv-cache-tokens`` (its tokens
at most), ``--extensible-kv-cache`` (vLLM 0.34's, True or False),
``--max-model-len`` (the longest request taken), ``--max-prefill-tokens`` (SGLang's: the new
prompt tokens of a prefill step beside its first request's), ``--num-scheduler-steps`` and
``--multi-step-stream-outputs`` (vLLM V0's multi-step scheduling), ``--performance-mode``
(vLLM 0.17 and later: ``planner.core.engine.Engine.in_mode``), read from SGLang's
server commands only, ``--cuda-graph-max-bs`` (the largest decode batch captured in a CUDA
graph), ``--prefill-graphs`` and ``--prefill-graph-max-tokens`` (prefill passes replayed
from piecewise CUDA graphs, and their largest token count), and from a trtllm-serve options
file (``planner.io.trtllm_options``) ``--ep``, ``--capacity-policy``, ``--cuda-graph-sizes``
and ``--cuda-graph-padding``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from planner.core.engine import PERFORMANCE_MODES
from planner.core.errors import LlmplanError

VLLM_ARGS = "https://github.com/vllm-project/vllm/blob/v0.11.0/vllm/engine/arg_utils.py"
# the V0 engine's (0.6-0.7): multi-step scheduling, gone from the V1 engine
VLLM_V0_ARGS = "https://github.com/vllm-project/vllm/blob/v0.6.3/vllm/engine/arg_utils.py"
VLLM_CACHE = ("https://github.com/vllm-project/vllm/blob/"
              "c1d86421174a87056edc90a41dc9942391509e84/vllm/config/cache.py")
# the extensible KV cache's flag, 0.34.0's (read in the release's PyPI wheel)
VLLM_CACHE_034 = "https://github.com/vllm-project/vllm/blob/v0.34.0/vllm/config/cache.py"
# --performance-mode (PR #34936, vLLM 0.17): balanced, interactivity or throughput
VLLM_PERFORMANCE_MODE = "https://github.com/vllm-project/vllm/pull/34936"
# --api-server-count (PR #17546, vLLM 0.9): API-server processes in front of the engine
VLLM_API_SERVERS = "https://github.com/vllm-project/vllm/pull/17546"
SGLANG_ARGS = "https://github.com/sgl-project/sglang/blob/v0.5.3/python/sglang/srt/server_args.py"
# the piecewise CUDA graphs of prefill passes: ServerArgs of SGLang 0.5.12 (read in the
# release's PyPI wheel, sglang-0.5.12; 0.5.14 adds --disable-prefill-cuda-graph,
# --cuda-graph-backend-prefill and --cuda-graph-max-bs-prefill)
SGLANG_PCG_ARGS = ("https://github.com/sgl-project/sglang/blob/v0.5.12/python/sglang/srt/"
                   "server_args.py")
TRTLLM_SERVE = ("https://github.com/NVIDIA/TensorRT-LLM/blob/"
                "0004396720054fd8e205cbf616f21f0b57c6b412/tensorrt_llm/commands/serve.py")

# vLLM's CacheDType (vllm/config/cache.py), with SGLang's bf16 spellings: auto keeps the
# model's 16-bit type; fp8 is e4m3 (fp8_inc is Gaudi's), stored in one byte like e5m2
KV_CACHE_DTYPES: dict[str, str | None] = {
    "auto": None, "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16",
    "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "fp8_inc": "fp8"}
# vLLM's --quantization where it names one storage type: AWQ and GPTQ checkpoints are 4-bit
# with groups of 128 (llmplan's default --group-size; an 8-bit GPTQ checkpoint is --weights
# int8); every other method has no single equivalent here and is refused by name
QUANTIZATIONS: dict[str, str] = {
    "fp8": "fp8", "awq": "int4", "awq_marlin": "int4", "gptq": "int4", "gptq_marlin": "int4",
    "mxfp4": "mxfp4"}
# vLLM's --dtype: the type of everything not quantized (float32 is not planned for)
DTYPES: dict[str, str | None] = {
    "auto": None, "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
# vLLM's StoreBoolean reads true / false in any case (``EngineFlag.fold_case``)
BOOLEANS: dict[str, bool] = {"true": True, "false": False}


def human_int(text: str) -> int | None:
    """vLLM's human_readable_int (vllm/engine/arg_utils.py): a whole number, or one with a
    suffix, lower case decimal (25.6k = 25,600), upper case binary (16K = 16,384); for
    --max-model-len also auto or -1 (the longest that fits the memory, 0.11 and later),
    which is None here: the model's context, as llmplan serves it by default."""
    text = text.strip()
    if text in ("auto", "-1"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", text)
    if m is None:
        raise ValueError(text)
    number, suffix = m.groups()
    if suffix in "kmgt" and suffix:
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    if "." in number:
        raise ValueError(text)
    return int(number) * 1024 ** ("KMGT".index(suffix) + 1 if suffix else 0)


@dataclass(frozen=True)
class EngineFlag:
    """One engine flag: ``names`` as the engines spell it, the option of ours it stands for,
    and how its value reads: ``value`` for a flag that takes none (what it sets ours to),
    else ``choices`` (the engine's values -> ours) or a number of ``number`` type."""

    names: tuple[str, ...]
    ours: str
    engines: tuple[str, ...]
    source: str
    value: object = None
    choices: dict | None = None
    number: Callable[[str], object] | None = None  # int, float or human_int
    # what a flag whose value is optional (argparse's nargs="?") stands for given bare
    const: object = None
    fold_case: bool = False  # choices read in any case

    @property
    def takes_value(self) -> bool:
        return self.value is None

    def read(self, text: str, name: str | None = None) -> object:
        """The engine's value as ours; ``LlmplanError`` naming the flag (as ``name`` spells
        it) when it is not one."""
        name = name or self.names[0]
        if self.choices is not None:
            if self.fold_case:
                text = text.lower()
            if text not in self.choices:
                raise LlmplanError(f"{name}: '{text}' is not one of "
                                   f"{', '.join(self.choices)} (the values llmplan maps)")
            return self.choices[text]
        try:
            return (self.number or str)(text)
        except ValueError:
            raise LlmplanError(f"{name}: '{text}' is not a number") from None


V, S, T = ("vllm",), ("sglang",), ("trtllm",)
# what each server's memory fraction is a fraction of (planner.core.memory.kv_budget_bytes):
# vLLM's gpu_memory_utilization of the total, SGLang's mem_fraction_static of the memory its
# weights and KV pool may take, TensorRT-LLM's free_gpu_memory_fraction of what is free
BASIS_OF = {"vllm": "total", "sglang": "static", "trtllm": "free"}
# programs that start a server given after their own arguments (TensorRT-LLM's under MPI)
LAUNCHERS = frozenset({"mpirun", "mpiexec", "srun"})
VS = ("vllm", "sglang")
FLAGS: tuple[EngineFlag, ...] = (
    # vLLM (EngineArgs.add_cli_args; CacheConfig for the KV-cache and offload fields)
    EngineFlag(("--tensor-parallel-size", "-tp"), "--tp", VS, VLLM_ARGS, number=int),
    EngineFlag(("--pipeline-parallel-size", "-pp"), "--pp", V, VLLM_ARGS, number=int),
    EngineFlag(("--gpu-memory-utilization",), "--memory-utilization", V, VLLM_CACHE,
               number=float),
    EngineFlag(("--kv-cache-dtype",), "--kv-cache", VS, VLLM_CACHE, choices=KV_CACHE_DTYPES),
    EngineFlag(("--quantization", "-q"), "--weights", VS, VLLM_ARGS, choices=QUANTIZATIONS),
    EngineFlag(("--dtype",), "--dtype", VS, VLLM_ARGS, choices=DTYPES),
    EngineFlag(("--enable-chunked-prefill",), "--chunked-prefill", V, VLLM_ARGS, value=True),
    EngineFlag(("--no-enable-chunked-prefill",), "--chunked-prefill", V, VLLM_ARGS,
               value=False),
    EngineFlag(("--enforce-eager",), "--enforce-eager", V, VLLM_ARGS, value=True),
    EngineFlag(("--cpu-offload-gb",), "--cpu-offload-gb", VS, VLLM_CACHE, number=float),
    EngineFlag(("--max-num-seqs",), "--max-num-seqs", V, VLLM_ARGS, number=int),
    EngineFlag(("--max-num-batched-tokens",), "--max-num-batched-tokens", V, VLLM_ARGS,
               number=int),
    EngineFlag(("--block-size",), "--block-size", V, VLLM_ARGS, number=int),
    EngineFlag(("--enable-prefix-caching",), "--prefix-cache", V, VLLM_ARGS, value=True),
    EngineFlag(("--async-scheduling",), "--async-scheduling", V, VLLM_ARGS, value=True),
    EngineFlag(("--no-async-scheduling",), "--async-scheduling", V, VLLM_ARGS, value=False),
    EngineFlag(("--api-server-count", "-asc"), "--api-server-count", V, VLLM_API_SERVERS,
               number=int),
    EngineFlag(("--no-enable-prefix-caching",), "--prefix-cache", V, VLLM_ARGS, value=False),
    EngineFlag(("--disable-hybrid-kv-cache-manager",), "--hybrid-kv-cache", V, VLLM_ARGS,
               value=False),
    EngineFlag(("--no-disable-hybrid-kv-cache-manager",), "--hybrid-kv-cache", V, VLLM_ARGS,
               value=True),
    EngineFlag(("--max-model-len",), "--max-model-len", V, VLLM_ARGS, number=human_int),
    # the KV cache given outright, per GPU (CacheConfig.kv_cache_memory_bytes, 0.11 and
    # later), and 0.34's extensible KV cache on or off (enable_extensible_kv_cache)
    EngineFlag(("--kv-cache-memory-bytes",), "--kv-cache-memory-bytes", V, VLLM_CACHE,
               number=human_int),
    EngineFlag(("--enable-extensible-kv-cache",), "--extensible-kv-cache", V, VLLM_CACHE_034,
               value=True),
    EngineFlag(("--no-enable-extensible-kv-cache",), "--extensible-kv-cache", V,
               VLLM_CACHE_034, value=False),
    EngineFlag(("--num-scheduler-steps",), "--num-scheduler-steps", V, VLLM_V0_ARGS,
               number=int),
    # StoreBoolean, nargs="?": "--multi-step-stream-outputs False", or bare for True
    EngineFlag(("--multi-step-stream-outputs",), "--multi-step-stream-outputs", V,
               VLLM_V0_ARGS, choices=BOOLEANS, const=True, fold_case=True),
    EngineFlag(("--performance-mode",), "--performance-mode", V, VLLM_PERFORMANCE_MODE,
               choices={m: m for m in PERFORMANCE_MODES}),
    # SGLang (ServerArgs.add_cli_args); argparse also takes --tp for --tp-size
    EngineFlag(("--tp-size", "--tp"), "--tp", S, SGLANG_ARGS, number=int),
    EngineFlag(("--pp-size",), "--pp", S, SGLANG_ARGS, number=int),
    EngineFlag(("--mem-fraction-static",), "--memory-utilization", S, SGLANG_ARGS,
               number=float),
    EngineFlag(("--chunked-prefill-size",), "--max-num-batched-tokens", S, SGLANG_ARGS,
               number=int),
    EngineFlag(("--max-running-requests",), "--max-num-seqs", S, SGLANG_ARGS, number=int),
    # new prompt tokens a prefill batch takes beside its first request's (PrefillAdder's
    # rem_input_tokens; 16,384 by default: engines_db/sglang.yaml serving.max_prefill_tokens)
    EngineFlag(("--max-prefill-tokens",), "--max-prefill-tokens", S, SGLANG_ARGS,
               number=human_int),
    EngineFlag(("--disable-cuda-graph",), "--enforce-eager", S, SGLANG_ARGS, value=True),
    EngineFlag(("--cuda-graph-max-bs",), "--cuda-graph-max-bs", S, SGLANG_ARGS, number=int),
    EngineFlag(("--page-size",), "--block-size", S, SGLANG_ARGS, number=int),
    EngineFlag(("--disable-radix-cache",), "--prefix-cache", S, SGLANG_ARGS, value=False),
    EngineFlag(("--enable-mixed-chunk",), "--mixed-batches", S, SGLANG_ARGS, value=True),
    # the overlap scheduler, SGLang's counterpart of vLLM's async scheduling (on by default)
    EngineFlag(("--disable-overlap-schedule",), "--async-scheduling", S, SGLANG_ARGS,
               value=False),
    EngineFlag(("--context-length",), "--max-model-len", S, SGLANG_ARGS, number=human_int),
    # the KV pool's tokens at most: min(profiled, max_total_tokens), ModelRunner's
    # init_memory_pool (python/sglang/srt/model_executor/model_runner.py)
    EngineFlag(("--max-total-tokens",), "--kv-cache-tokens", S, SGLANG_ARGS, number=int),
    # prefill passes replayed from piecewise CUDA graphs (planner.core.engine.PrefillGraphs):
    # opt-in in 0.5.6-0.5.9, on by default from 0.5.10; 0.5.14 renames them (the old names
    # kept as aliases)
    EngineFlag(("--disable-piecewise-cuda-graph", "--disable-prefill-cuda-graph"),
               "--prefill-graphs", S, SGLANG_PCG_ARGS, value=False),
    EngineFlag(("--enable-piecewise-cuda-graph", "--enforce-piecewise-cuda-graph"),
               "--prefill-graphs", S, SGLANG_PCG_ARGS, value=True),
    EngineFlag(("--cuda-graph-backend-prefill",), "--prefill-graphs", S, SGLANG_PCG_ARGS,
               choices={"disabled": False, "tc_piecewise": True, "breakable": True}),
    EngineFlag(("--piecewise-cuda-graph-max-tokens", "--cuda-graph-max-bs-prefill"),
               "--prefill-graph-max-tokens", S, SGLANG_PCG_ARGS, number=int),
    # trtllm-serve (tensorrt_llm/commands/serve.py)
    EngineFlag(("--tp_size", "--tensor_parallel_size"), "--tp", T, TRTLLM_SERVE, number=int),
    EngineFlag(("--pp_size", "--pipeline_parallel_size"), "--pp", T, TRTLLM_SERVE, number=int),
    EngineFlag(("--ep_size", "--moe_expert_parallel_size"), "--ep", T, TRTLLM_SERVE,
               number=int),
    EngineFlag(("--kv_cache_free_gpu_memory_fraction", "--free_gpu_memory_fraction"),
               "--memory-utilization", T, TRTLLM_SERVE, number=float),
    # its LLM-API options file, laid over the command's own arguments
    # (``planner.io.trtllm_options``); read where the server command is
    EngineFlag(("--config", "--extra_llm_api_options"), "--llm-api-options", T, TRTLLM_SERVE),
    EngineFlag(("--max_batch_size",), "--max-num-seqs", T, TRTLLM_SERVE, number=int),
    EngineFlag(("--max_num_tokens",), "--max-num-batched-tokens", T, TRTLLM_SERVE, number=int),
    EngineFlag(("--max_seq_len",), "--max-model-len", T, TRTLLM_SERVE, number=int),
    EngineFlag(("--enable_chunked_prefill",), "--chunked-prefill", T, TRTLLM_SERVE,
               value=True),
    # the PyTorch backend (the default) replays CUDA graphs of decode batches of exactly its
    # captured sizes; a TensorRT engine's steps run as the trtllm-engine profile prices them
    EngineFlag(("--backend",), "--trtllm-backend", T, TRTLLM_SERVE,
               choices={"pytorch": "pytorch", "tensorrt": "tensorrt", "trt": "tensorrt"}),
)
BY_NAME: dict[str, EngineFlag] = {n: f for f in FLAGS for n in f.names}
# flags that win over any other setting of the same option in a server command: SGLang's
# --enforce-piecewise-cuda-graph skips every rule that would turn the prefill graphs off,
# --disable-piecewise-cuda-graph included (ServerArgs._handle_piecewise_cuda_graph, 0.5.10)
ENFORCING = frozenset({"--enforce-piecewise-cuda-graph"})


def cli_aliases(ours: str) -> tuple[str, ...]:
    """vLLM's names for one of our options, as the CLI accepts them beside ours."""
    return tuple(n for f in FLAGS if f.ours == ours and "vllm" in f.engines
                 and f.takes_value for n in f.names)


# Our options whose vLLM names share one parameter (the CLI's parser keeps the last of them):
# a command line that gives two of them different values is refused (``check_duplicates``),
# with our own spellings of the boolean ones
SAME_PARAMETER: dict[str, dict[str, object]] = {
    "--tp": {n: None for n in ("--tp", *cli_aliases("--tp"))},
    "--pp": {n: None for n in ("--pp", *cli_aliases("--pp"))},
    "--memory-utilization": {n: None for n in ("--memory-utilization",
                                               *cli_aliases("--memory-utilization"))},
    "--chunked-prefill": {"--chunked-prefill": True, "--no-chunked-prefill": False,
                          "--enable-chunked-prefill": True,
                          "--no-enable-chunked-prefill": False},
    "--cpu-offload-gb": {"--cpu-offload-gb": None},
    "--rps": {"--rps": None, "--request-rate": None},  # plan's two names (simulate has one)
    "--multi-step-stream-outputs": {"--multi-step-stream-outputs": True,
                                    "--no-multi-step-stream-outputs": False},
    "--hybrid-kv-cache": {"--hybrid-kv-cache": True, "--no-hybrid-kv-cache": False,
                          "--no-disable-hybrid-kv-cache-manager": True,
                          "--disable-hybrid-kv-cache-manager": False},
}


def check_duplicates(argv: list[str]) -> None:
    """Refuse a command line that gives one option twice with different values under any of
    its names (``--tp 2 --tensor-parallel-size 4``, ``--chunked-prefill
    --no-enable-chunked-prefill``): the parser would silently keep the last."""
    seen: dict[str, tuple[str, str]] = {}
    for i, word in enumerate(argv):
        if word == "--":
            break
        name, eq, inline = word.partition("=")
        for ours, names in SAME_PARAMETER.items():
            if name not in names:
                continue
            flag_value = names[name]
            if flag_value is not None:
                value = str(flag_value)
            elif eq:
                value = inline
            elif i + 1 < len(argv):
                value = argv[i + 1]
            else:
                continue
            said = f"{name} {value if value.strip() else repr(value)}" if flag_value is None \
                else name
            if ours in seen and not _same(seen[ours][0], value):
                raise LlmplanError(f"{seen[ours][1]} and {said} disagree: give {ours} once")
            seen.setdefault(ours, (value, said))


def _same(a: str, b: str) -> bool:
    """Two spellings of one value: 0.9 and 0.90 are the same number."""
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def server_flags(command: str | None, base: Path | None = None) -> dict[str, object]:
    """What a server command line (vLLM's, SGLang's or trtllm-serve's) sets, keyed by our
    option (``{"--tp": 8, "--max-num-batched-tokens": 4096}``); flags llmplan does not model
    are passed over. SGLang's ``--chunked-prefill-size`` -1 (or 0) turns chunking off.
    trtllm-serve's ``--config`` / ``--extra_llm_api_options`` file (a path from ``base``,
    else the working directory) is read and laid over the command's flags, as trtllm-serve
    lays it (``planner.io.trtllm_options``); vLLM's own ``--config`` is passed over."""
    out: dict[str, object] = {}
    if not command:
        return out
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    options: dict[str, object] = {}
    said: dict[str, str] = {}  # the flag that set each of ours, as the command spells it
    enforced: set[str] = set()  # ours set by a flag that wins (ENFORCING)
    # trtllm-serve, first or behind a launcher (``mpirun -n 1 ... trtllm-serve MODEL``); not
    # a word of another server's arguments (``--served-model-name trtllm-serve``)
    trtllm = bool(words) and (Path(words[0]).name == "trtllm-serve" or (
        Path(words[0]).name in LAUNCHERS and
        any(Path(w).name == "trtllm-serve" for w in words[1:])))
    i = 0
    while i < len(words):
        name, eq, inline = words[i].partition("=")
        f = BY_NAME.get(name)
        i += 1
        if f is None:
            continue
        if not f.takes_value:
            value = f.value
        elif f.const is not None and not eq and (i == len(words) or
                                                 words[i].startswith("-")):
            value = f.const
        else:
            if eq:
                text = inline
            elif i < len(words):
                text, i = words[i], i + 1
            else:
                raise LlmplanError(f"{name}: no value in the server command")
            value = f.read(text, name)
            if value is None:  # --max-model-len auto: as if not given
                continue
        ours = f.ours
        if ours == "--llm-api-options":
            if trtllm:
                from planner.io.trtllm_options import read_llm_api_options

                options = read_llm_api_options(Path(base or ".") / value)
            continue
        if f.names[0] == "--chunked-prefill-size" and isinstance(value, int) and value <= 0:
            ours, value = "--chunked-prefill", False
        if ours == "--memory-utilization":
            # a fraction of what the server that reads the flag sizes its KV cache from,
            # whichever engine replays the run
            basis = BASIS_OF[f.engines[0]]
            if out.get("--memory-basis", basis) != basis:
                raise LlmplanError(f"the server command gives a memory fraction twice, of "
                                   f"{out['--memory-basis']} and of {basis} memory ({name})")
            out["--memory-basis"] = basis
        if ours in enforced:  # given by a flag that wins over the others (ENFORCING)
            continue
        if name in ENFORCING:
            out[ours] = value
            enforced.add(ours)
            out["--enforced"] = tuple(sorted(enforced))  # past every off-rule of the engine
            continue
        if ours in out and out[ours] != value:
            raise LlmplanError(f"the server command gives {ours} twice: {out[ours]} "
                               f"({said[ours]}) and {value} ({name})")
        out[ours] = value
        said[ours] = name
    if "--memory-utilization" in options:  # kv_cache_config.free_gpu_memory_fraction
        options["--memory-basis"] = BASIS_OF["trtllm"]
    return {**out, **options}
