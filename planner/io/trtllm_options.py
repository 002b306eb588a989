"""TensorRT-LLM's LLM-API options file: the YAML ``trtllm-serve --config`` (also spelled
``--extra_llm_api_options``) reads and lays over the command's own arguments
(tensorrt_llm/commands/serve.py: ``llm_args = update_llm_args_with_extra_dict(llm_args,
yaml.safe_load(f))``, so a key in the file wins over the same setting on the command line).

Read into the options llmplan models, keyed as ``planner.cli.flags.server_flags`` keys a
server command's flags:

    tensor_parallel_size, pipeline_parallel_size    --tp, --pp
    moe_expert_parallel_size                        --ep (equal to the TP size, or 1)
    max_batch_size, max_num_tokens, max_seq_len     --max-num-seqs, --max-num-batched-tokens,
                                                    --max-model-len
    enable_chunked_prefill                          --chunked-prefill
    kv_cache_config.free_gpu_memory_fraction        --memory-utilization (of free memory)
    kv_cache_config.enable_block_reuse              --prefix-cache
    kv_cache_config.dtype                           --kv-cache (auto: the model's)
    kv_cache_config.tokens_per_block                --block-size
    kv_cache_config.max_tokens                      --kv-cache-tokens (the pool's tokens at
                                                    most: the smaller of it and the fraction's)
    scheduler_config.capacity_scheduler_policy      --capacity-policy
    disable_overlap_scheduler                       --async-scheduling (its negation: the
                                                    PyTorch backend's overlap scheduler)
    batch_wait_timeout_iters,                       --batch-wait-timeout-iters,
    batch_wait_max_tokens_ratio                     --batch-wait-max-tokens-ratio (its PyTorch
                                                    executor holds context requests back
                                                    while both are above 0; not where
                                                    enable_attention_dp is true, as there)
    cuda_graph_config                               null: --enforce-eager; else the decode
                                                    batch sizes captured and whether a batch
                                                    pads up to one (--cuda-graph-sizes,
                                                    --cuda-graph-padding)

Every other key (moe_config, speculative_config, enable_attention_dp, ...) is passed over, as
a command's unmodelled flags are. A value of the wrong kind is one line naming the file and
the key.
"""

from __future__ import annotations

import math
from pathlib import Path

from planner.core.errors import LlmplanError

LLM_ARGS = ("https://github.com/NVIDIA/TensorRT-LLM/blob/"
            "0004396720054fd8e205cbf616f21f0b57c6b412/tensorrt_llm/llmapi/llm_args.py")
# CapacitySchedulerPolicy as llmplan's scheduler names it (STATIC_BATCH is not modelled)
POLICIES = {"GUARANTEED_NO_EVICT": "guaranteed-no-evict", "MAX_UTILIZATION": "max-utilization"}
# KvCacheConfig.dtype: auto keeps the model's 16-bit type
KV_DTYPES = {"auto": None, "fp8": "fp8"}


# the file's key for each option it sets, for messages
KEY_OF = {"--tp": "tensor_parallel_size", "--pp": "pipeline_parallel_size",
          "--ep": "moe_expert_parallel_size", "--max-num-seqs": "max_batch_size",
          "--max-num-batched-tokens": "max_num_tokens", "--max-model-len": "max_seq_len",
          "--chunked-prefill": "enable_chunked_prefill",
          "--memory-utilization": "kv_cache_config.free_gpu_memory_fraction",
          "--prefix-cache": "kv_cache_config.enable_block_reuse",
          "--kv-cache": "kv_cache_config.dtype", "--block-size": "kv_cache_config.tokens_per_block",
          "--kv-cache-tokens": "kv_cache_config.max_tokens",
          "--capacity-policy": "scheduler_config.capacity_scheduler_policy",
          "--enforce-eager": "cuda_graph_config", "--cuda-graph-sizes": "cuda_graph_config",
          "--cuda-graph-padding": "cuda_graph_config.enable_padding",
          "--async-scheduling": "disable_overlap_scheduler",
          "--batch-wait-timeout-iters": "batch_wait_timeout_iters",
          "--batch-wait-max-tokens-ratio": "batch_wait_max_tokens_ratio"}


def cuda_graph_batch_sizes(max_batch_size: int, enable_padding: bool) -> tuple[int, ...]:
    """The decode batch sizes TensorRT-LLM captures when cuda_graph_config names no
    batch_sizes (CudaGraphConfig._generate_cuda_graph_batch_sizes, llm_args.py): with padding
    1, 2, 4 and the multiples of 8 to 128, else 1 to 32, 64 and 128; then the powers of two
    from 256 below 2^ceil(log2 max_batch_size); those up to max_batch_size, and it."""
    sizes = [1, 2, 4] + [8 * i for i in range(1, 17)] if enable_padding else \
        list(range(1, 32)) + [32, 64, 128]
    sizes += [2**i for i in range(8, math.ceil(math.log2(max_batch_size)))]
    sizes = sorted(s for s in sizes if s <= max_batch_size)
    if not sizes or sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return tuple(sizes)


class _Reader:
    """Values of one file, each checked where it is read."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, key: str, problem: str) -> LlmplanError:
        return LlmplanError(f"{self.path}: {key}: {problem}")

    def section(self, data: dict, key: str) -> dict | None:
        v = data.get(key)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise self.fail(key, "must be a mapping")
        return v

    def integer(self, v, key: str, low: int = 1) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise self.fail(key, f"must be a whole number of at least {low}, got {v!r}")
        if v > 10**18:  # as the command line's bound (planner.cli.options.positive)
            raise self.fail(key, f"a {len(str(v))}-digit number is out of range")
        return v

    def flag(self, v, key: str) -> bool:
        if not isinstance(v, bool):
            raise self.fail(key, f"must be true or false, got {v!r}")
        return v

    def fraction(self, v, key: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise self.fail(key, f"must be a fraction in (0, 1], got {v!r}")
        return float(v)

    def choice(self, v, key: str, choices: dict):
        if not isinstance(v, str) or v not in choices:
            raise self.fail(key, f"{v!r} is not one of {', '.join(choices)} (the values "
                                 "llmplan models)")
        return choices[v]


def read_llm_api_options(path: Path) -> dict[str, object]:
    """What a trtllm-serve options file sets, keyed by our option (see the module)."""
    from planner.io.catalog import read_yaml

    data = read_yaml(Path(path), what="TensorRT-LLM options file")
    if data is None:
        return {}
    r = _Reader(path)
    if not isinstance(data, dict):
        raise LlmplanError(f"{path}: must be a mapping of LLM-API options (as trtllm-serve "
                           "--config reads it)")
    out: dict[str, object] = {}
    for ours in ("--tp", "--pp", "--max-num-seqs", "--max-num-batched-tokens",
                 "--max-model-len"):  # whole numbers at the file's top level
        key = KEY_OF[ours]
        if data.get(key) is not None:
            out[ours] = r.integer(data[key], key)
    ep = data.get("moe_expert_parallel_size")
    if ep is not None:
        ep = r.integer(ep, "moe_expert_parallel_size")
        tp = out.get("--tp", 1)
        if ep not in (1, tp):
            raise r.fail("moe_expert_parallel_size",
                         f"{ep} with tensor_parallel_size {tp} splits the experts both ways "
                         "(tensor and expert parallel), which llmplan does not model: EP "
                         "over the whole TP group, or 1")
        out["--ep"] = ep
    if data.get("enable_chunked_prefill") is not None:
        out["--chunked-prefill"] = r.flag(data["enable_chunked_prefill"],
                                          "enable_chunked_prefill")
    kv = r.section(data, "kv_cache_config")
    if kv is not None:
        _kv_cache(r, kv, out)
    sched = r.section(data, "scheduler_config")
    if sched is not None and sched.get("capacity_scheduler_policy") is not None:
        out["--capacity-policy"] = r.choice(sched["capacity_scheduler_policy"],
                                            "scheduler_config.capacity_scheduler_policy",
                                            POLICIES)
    waits: dict[str, object] = {}
    if data.get("batch_wait_timeout_iters") is not None:
        waits["--batch-wait-timeout-iters"] = r.integer(data["batch_wait_timeout_iters"],
                                                        "batch_wait_timeout_iters", low=0)
    if data.get("batch_wait_max_tokens_ratio") is not None:
        v = data["batch_wait_max_tokens_ratio"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise r.fail("batch_wait_max_tokens_ratio", f"must be within [0, 1], got {v!r}")
        waits["--batch-wait-max-tokens-ratio"] = float(v)
    # PyExecutor._schedule waits only where attention DP is off
    dp = data.get("enable_attention_dp")
    if dp is None or not r.flag(dp, "enable_attention_dp"):
        out.update(waits)
    if data.get("disable_overlap_scheduler") is not None:
        out["--async-scheduling"] = not r.flag(data["disable_overlap_scheduler"],
                                               "disable_overlap_scheduler")
    if "cuda_graph_config" in data:
        _cuda_graphs(r, data["cuda_graph_config"], out)
    return out


def _kv_cache(r: _Reader, kv: dict, out: dict) -> None:
    key = "kv_cache_config."
    if kv.get("free_gpu_memory_fraction") is not None:
        out["--memory-utilization"] = r.fraction(kv["free_gpu_memory_fraction"],
                                                 key + "free_gpu_memory_fraction")
    if kv.get("enable_block_reuse") is not None:
        out["--prefix-cache"] = r.flag(kv["enable_block_reuse"], key + "enable_block_reuse")
    if kv.get("dtype") is not None:
        dtype = r.choice(kv["dtype"], key + "dtype", KV_DTYPES)
        if dtype is not None:
            out["--kv-cache"] = dtype
    if kv.get("tokens_per_block") is not None:
        out["--block-size"] = r.integer(kv["tokens_per_block"], key + "tokens_per_block")
    if kv.get("max_tokens") is not None:
        # KvCacheConfig.max_tokens: 'if both max_tokens and free_gpu_memory_fraction are
        # specified, memory corresponding to the minimum will be used'
        out["--kv-cache-tokens"] = r.integer(kv["max_tokens"], key + "max_tokens")


def _cuda_graphs(r: _Reader, cg, out: dict) -> None:
    """cuda_graph_config: null turns CUDA graphs off (TorchLlmArgs: 'None to disable'); a
    mapping gives batch_sizes, or max_batch_size (0: 128) for TensorRT-LLM to generate them
    from, and enable_padding."""
    if cg is None:
        out["--enforce-eager"] = True
        return
    if not isinstance(cg, dict):
        raise r.fail("cuda_graph_config", "must be a mapping, or null for no CUDA graphs")
    key = "cuda_graph_config."
    padding = False
    if cg.get("enable_padding") is not None:
        padding = r.flag(cg["enable_padding"], key + "enable_padding")
    most = cg.get("max_batch_size")
    most = 0 if most is None else r.integer(most, key + "max_batch_size", low=0)
    given = cg.get("batch_sizes")
    if given is not None:
        if not isinstance(given, list) or not given:
            raise r.fail(key + "batch_sizes", "must be a list of batch sizes")
        sizes = tuple(sorted({r.integer(s, key + "batch_sizes") for s in given}))
        if most and most != sizes[-1]:
            raise r.fail(key + "max_batch_size", f"{most} is not the largest of batch_sizes "
                                                 f"({sizes[-1]}), as TensorRT-LLM requires")
    else:
        sizes = cuda_graph_batch_sizes(most or 128, padding)
    out["--cuda-graph-sizes"] = sizes
    out["--cuda-graph-padding"] = padding
