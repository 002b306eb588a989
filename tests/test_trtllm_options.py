"""TensorRT-LLM's LLM-API options file (trtllm-serve --config / --extra_llm_api_options),
read into llmplan's options (planner/io/trtllm_options.py): on `simulate
--extra-llm-api-options`, and in a trtllm-serve command replayed by `validate`, where the file
is laid over the command's own flags as trtllm-serve lays it."""

from __future__ import annotations

import pytest

from planner.cli.flags import server_flags
from planner.core.specs import DType
from planner.io import catalog
from planner.io.trtllm_options import cuda_graph_batch_sizes, read_llm_api_options

FULL = """\
tensor_parallel_size: 2
max_batch_size: 256
max_num_tokens: 4096
max_seq_len: 16384
enable_chunked_prefill: true
kv_cache_config:
  free_gpu_memory_fraction: 0.85
  enable_block_reuse: false
  dtype: fp8
  tokens_per_block: 64
scheduler_config:
  capacity_scheduler_policy: MAX_UTILIZATION
cuda_graph_config:
  enable_padding: true
  max_batch_size: 256
moe_config:
  backend: CUTLASS
"""
SIM = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", "trtllm", "-n", "300",
       "--request-rate", "20", "--seed", "3")


def _write(tmp_path, text: str, name: str = "extra.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_default_sizes_are_the_profiles():
    """No cuda_graph_config: max_batch_size 0 is taken as 128 and padding is off, which gives
    the sizes engines_db/trtllm.yaml states (1-32, 64, 128)."""
    sizes = catalog.load_engine_spec("trtllm").serving.cuda_graph_sizes.sizes
    assert cuda_graph_batch_sizes(128, False) == tuple(sizes) == \
        tuple(range(1, 33)) + (64, 128)


@pytest.mark.parametrize("most, padding, expected", [
    # 1, 2, 4, the multiples of 8 to 128; no power of two from 256 below 2^8; 256 appended
    (256, True, (1, 2, 4) + tuple(range(8, 129, 8)) + (256,)),
    # 1-32, 64, 128, then 256 and 512 (below 2^ceil(log2 1000) = 1024), then 1000 itself
    (1000, False, tuple(range(1, 33)) + (64, 128, 256, 512, 1000)),
    # a small cap keeps the sizes under it and adds itself
    (12, True, (1, 2, 4, 8, 12)),
    (1, False, (1,)),
])
def test_generated_sizes_by_hand(most, padding, expected):
    assert cuda_graph_batch_sizes(most, padding) == expected


def test_a_whole_file_by_hand(tmp_path):
    got = read_llm_api_options(_write(tmp_path, FULL))
    assert got == {
        "--tp": 2, "--max-num-seqs": 256, "--max-num-batched-tokens": 4096,
        "--max-model-len": 16384, "--chunked-prefill": True, "--memory-utilization": 0.85,
        "--prefix-cache": False, "--kv-cache": "fp8", "--block-size": 64,
        "--capacity-policy": "max-utilization",
        "--cuda-graph-sizes": (1, 2, 4) + tuple(range(8, 129, 8)) + (256,),
        "--cuda-graph-padding": True}  # moe_config is passed over
    assert read_llm_api_options(_write(tmp_path, "cuda_graph_config: null\n", "off.yaml")) \
        == {"--enforce-eager": True}
    assert read_llm_api_options(_write(tmp_path, "", "empty.yaml")) == {}
    given = read_llm_api_options(_write(
        tmp_path, "cuda_graph_config:\n  batch_sizes: [64, 1, 8, 8]\n", "sizes.yaml"))
    assert given == {"--cuda-graph-sizes": (1, 8, 64), "--cuda-graph-padding": False}
    ep = read_llm_api_options(_write(
        tmp_path, "tensor_parallel_size: 8\nmoe_expert_parallel_size: 8\n", "ep.yaml"))
    assert ep == {"--tp": 8, "--ep": 8}
    serial = read_llm_api_options(_write(tmp_path, "disable_overlap_scheduler: true\n",
                                         "serial.yaml"))
    assert serial == {"--async-scheduling": False}


def test_the_overlap_scheduler_from_the_file_or_the_flag(tmp_path, run_json):
    """TensorRT-LLM's PyTorch backend overlaps a step's host work with the GPU's (the
    profile's default from 1.0); disable_overlap_scheduler: true puts it back in series, as
    --no-async-scheduling does; and a step that pays its host work after its GPU work is not
    faster."""
    serial = _write(tmp_path, "disable_overlap_scheduler: true\n", "serial.yaml")
    a = run_json(*SIM, "--extra-llm-api-options", str(serial))
    a.pop("llm_api_options")
    b = run_json(*SIM, "--no-async-scheduling")
    assert a == b and a["async_scheduling"] is False
    on = run_json(*SIM)
    assert on["async_scheduling"] is True
    assert on["mean_tpot_ms"] < a["mean_tpot_ms"]
    assert run_json(*SIM, "--async-scheduling") == on


def test_simulate_takes_the_file_as_its_own_flags(tmp_path, run_json):
    """The scheduler and KV settings of a file (its CUDA graphs left at the engine's
    defaults) simulate exactly as the same settings given as flags."""
    cfg = _write(tmp_path, "max_batch_size: 64\nmax_num_tokens: 2048\nenable_chunked_prefill: "
                           "true\nkv_cache_config:\n  free_gpu_memory_fraction: 0.5\n  "
                           "enable_block_reuse: false\nscheduler_config:\n  "
                           "capacity_scheduler_policy: MAX_UTILIZATION\n")
    a = run_json(*SIM, "--extra-llm-api-options", str(cfg))
    b = run_json(*SIM, "--max-num-seqs", "64", "--max-num-batched-tokens", "2048",
                 "--chunked-prefill", "--memory-utilization", "0.5", "--prefix-cache", "off",
                 "--capacity-policy", "max-utilization")
    assert a.pop("llm_api_options") == str(cfg) and b.pop("llm_api_options", None) is None
    assert a == b
    assert (a["max_num_seqs"], a["max_num_batched_tokens"]) == (64, 2048)
    # trtllm-serve's spelling of the option too; a flag that agrees with the file is fine
    c = run_json(*SIM, "--extra_llm_api_options", str(cfg), "--max-num-seqs", "64")
    c.pop("llm_api_options")
    assert c == b


def test_cuda_graph_config_reaches_the_simulator(tmp_path, run_json):
    """null: no CUDA graphs, as --enforce-eager; padding over more sizes changes the decode
    steps (TensorRT-LLM without padding runs a batch of 37 eagerly)."""
    off = _write(tmp_path, "cuda_graph_config: null\n", "off.yaml")
    a = run_json(*SIM, "--extra-llm-api-options", str(off))
    a.pop("llm_api_options")
    assert a == run_json(*SIM, "--enforce-eager")
    pad = _write(tmp_path, "cuda_graph_config:\n  enable_padding: true\n  max_batch_size: "
                           "512\n", "pad.yaml")
    p = run_json(*SIM, "--extra-llm-api-options", str(pad))
    plain = run_json(*SIM)
    assert p["mean_tpot_ms"] != plain["mean_tpot_ms"]


@pytest.mark.parametrize("text, problem", [
    ("max_batch_size: -4\n", "max_batch_size: must be a whole number of at least 1"),
    ("kv_cache_config: [1, 2]\n", "kv_cache_config: must be a mapping"),
    ("scheduler_config:\n  capacity_scheduler_policy: STATIC_BATCH\n",
     "'STATIC_BATCH' is not one of GUARANTEED_NO_EVICT, MAX_UTILIZATION"),
    ("max_batch_size: [\n", "malformed YAML"),
    ("tensor_parallel_size: 8\nmoe_expert_parallel_size: 4\n", "splits the experts both ways"),
    ("- 1\n- 2\n", "must be a mapping of LLM-API options"),
    ("cuda_graph_config:\n  batch_sizes: [1, 8, 64]\n  max_batch_size: 32\n",
     "32 is not the largest of batch_sizes (64)"),
    ("kv_cache_config:\n  dtype: nvfp4\n", "'nvfp4' is not one of auto, fp8"),
    ("enable_chunked_prefill: 1\n", "enable_chunked_prefill: must be true or false"),
    ("disable_overlap_scheduler: yes please\n", "disable_overlap_scheduler: must be true or false"),
    ("kv_cache_config:\n  free_gpu_memory_fraction: 1.5\n", "must be a fraction in (0, 1]"),
    # simulate's own bound on the flag, said of the file's key, not of --max-num-seqs
    ("max_batch_size: 123456789012345678901234\n",
     "max_batch_size: a 24-digit number is out of range"),
    ("max_num_tokens: 12345678901234567890\n", "max_num_tokens: a 20-digit number"),
    # the reader's own bound where no flag checks the value after it (fuzz seed 105)
    ("cuda_graph_config:\n  max_batch_size: 100000000000000000000000\n",
     "cuda_graph_config.max_batch_size: a 24-digit number is out of range"),
    ("cuda_graph_config:\n  batch_sizes: [1, 10000000000000000000]\n",
     "cuda_graph_config.batch_sizes: a 20-digit number is out of range"),
    # a refusal further on (the deployment's), of a setting the file made, names its key too
    ("tensor_parallel_size: 3\n", "tensor_parallel_size 3 does not divide"),
])
def test_a_bad_file_is_one_line(text, problem, tmp_path, run_cli):
    cfg = _write(tmp_path, text)
    code, _, err = run_cli(*SIM, "--extra-llm-api-options", str(cfg))
    assert code == 2 and problem in err and str(cfg) in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_refused_where_it_does_not_apply(tmp_path, run_cli):
    cfg = _write(tmp_path, "max_batch_size: 256\n")
    code, _, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "10",
                           "--extra-llm-api-options", str(cfg))
    assert code == 2 and "the engine here is vllm" in err
    code, _, err = run_cli(*SIM, "--max-num-seqs", "64", "--extra-llm-api-options", str(cfg))
    assert code == 2 and "--max-num-seqs 64" in err and "max_batch_size (256) disagree" in err
    code, _, err = run_cli(*SIM, "--extra-llm-api-options", str(tmp_path / "none.yaml"))
    assert code == 2 and "no such file" in err
    # the PyTorch backend's own settings do not reach a TensorRT engine's profile; the
    # settings both have do
    torch = _write(tmp_path, "cuda_graph_config:\n  enable_padding: true\n"
                   "disable_overlap_scheduler: true\n", "torch.yaml")
    engine = [x if x != "trtllm" else "trtllm-engine" for x in SIM]
    code, _, err = run_cli(*engine, "--extra-llm-api-options", str(torch))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "cuda_graph_config, disable_overlap_scheduler: the PyTorch backend's" in err
    assert "the engine here is trtllm-engine" in err and str(torch) in err
    code, _, err = run_cli(*SIM, "--extra-llm-api-options", str(torch))
    assert code == 0, err
    code, _, err = run_cli(*engine, "--extra-llm-api-options", str(cfg))
    assert code == 0, err


def test_a_server_command_lays_the_file_over_its_flags(tmp_path):
    """trtllm-serve reads the file after its own arguments and lets it win; the path is the
    manifest's folder's; vLLM's own --config is passed over."""
    _write(tmp_path, "max_batch_size: 128\nkv_cache_config:\n  enable_block_reuse: false\n")
    got = server_flags("trtllm-serve Qwen/Qwen3-8B --max_batch_size 64 --tp_size 2 "
                       "--extra_llm_api_options extra.yaml", tmp_path)
    assert got == {"--max-num-seqs": 128, "--tp": 2, "--prefix-cache": False}
    assert server_flags("trtllm-serve Qwen/Qwen3-8B --config=extra.yaml", tmp_path) == \
        {"--max-num-seqs": 128, "--prefix-cache": False}
    assert server_flags("vllm serve Qwen/Qwen3-8B --config extra.yaml --max-num-seqs 32",
                        tmp_path) == {"--max-num-seqs": 32}
    # behind a launcher, as InferenceX starts it (mpirun -n 1 ... trtllm-serve MODEL)
    assert server_flags("mpirun -n 1 --oversubscribe trtllm-serve M --tp_size=8 "
                        "--extra_llm_api_options=extra.yaml", tmp_path) == \
        {"--max-num-seqs": 128, "--tp": 8, "--prefix-cache": False}
    # a word of another server's arguments is not trtllm-serve: SGLang's --config is not read
    assert server_flags("python3 -m sglang.launch_server --served-model-name trtllm-serve "
                        "--config extra.yaml --tp 2", tmp_path) == {"--tp": 2}
    # trtllm-serve's long spellings of TP, PP, EP and the KV fraction
    assert server_flags("trtllm-serve M --tensor_parallel_size 4 --pipeline_parallel_size 2 "
                        "--moe_expert_parallel_size 4 --free_gpu_memory_fraction 0.8") == \
        {"--tp": 4, "--pp": 2, "--ep": 4, "--memory-utilization": 0.8, "--memory-basis": "free"}


def test_a_servers_memory_fraction_keeps_its_basis_whichever_engine_replays_it(tmp_path):
    """An options file's free_gpu_memory_fraction is of free memory; replayed with the ideal
    engine (basis total) it stays so. DeepSeek-R1 in fp8 on 4 B200s: 169.1 GB of weights a
    GPU of 193.3; 0.8 of the total (154.6 GB) would leave no KV cache, 0.8 of what is free
    leaves about 18 GB (by hand: 0.8 x (193.3 - 169.1 - 1.07 reserve - activations))."""
    from planner.cli.compare import served_setup
    from planner.serving.run import coster, scheduler

    _write(tmp_path, "kv_cache_config:\n  free_gpu_memory_fraction: 0.8\n")
    server = server_flags("mpirun -n 1 trtllm-serve M --tp_size 4 "
                          "--extra_llm_api_options extra.yaml", tmp_path)
    assert server["--memory-basis"] == "free"
    ideal = catalog.load_engine_spec("ideal")
    dep = served_setup("deepseek-r1", "b200", ideal, 4, DType.fp8, DType.fp8, server=server)
    cfg = scheduler(dep)
    tokens = coster(dep).kv_capacity_tokens(cfg.max_num_seqs, cfg.max_num_batched_tokens)
    per_token = 61 * 576  # MLA's compressed cache, one byte a value, every layer
    assert 0.5 * 18e9 / per_token < tokens < 18.5e9 / per_token
    total = {k: v for k, v in server.items() if k != "--memory-basis"}  # as before: ideal's
    dep = served_setup("deepseek-r1", "b200", ideal, 4, DType.fp8, DType.fp8, server=total)
    assert coster(dep).kv_capacity_tokens(cfg.max_num_seqs, cfg.max_num_batched_tokens) == 0


def test_a_replayed_command_runs_with_the_files_graphs(tmp_path):
    """served_setup (validate's replay) takes the file's CUDA graphs and capacity policy."""
    from planner.cli.compare import served_setup
    from planner.serving import run

    _write(tmp_path, "cuda_graph_config:\n  enable_padding: true\n  max_batch_size: 256\n"
                     "scheduler_config:\n  capacity_scheduler_policy: MAX_UTILIZATION\n")
    server = server_flags("trtllm-serve meta-llama/Llama-3.1-8B-Instruct --config extra.yaml",
                          tmp_path)
    dep = served_setup("llama-3.1-8b", "h100-sxm", catalog.load_engine_spec("trtllm"), 1,
                       None, None, server=server)
    cfg = run.scheduler(dep)
    assert cfg.graph_padding and cfg.capacity_policy == "max-utilization"
    assert cfg.graph_sizes == (1, 2, 4) + tuple(range(8, 129, 8)) + (256,)
    plain = run.scheduler(served_setup("llama-3.1-8b", "h100-sxm",
                                       catalog.load_engine_spec("trtllm"), 1, None, None))
    assert not plain.graph_padding and plain.capacity_policy == "guaranteed-no-evict"


def test_batch_waiting_from_the_file(tmp_path, run_json, run_cli):
    """TorchLlmArgs' batch_wait_timeout_iters and batch_wait_max_tokens_ratio reach the
    simulator's scheduler (InferenceX's DeepSeek-R1 runs set 40 and 0.8); out of range is one
    line naming the key; a TensorRT engine's profile has no such executor."""
    cfg = _write(tmp_path, "batch_wait_timeout_iters: 40\nbatch_wait_max_tokens_ratio: 0.8\n")
    assert read_llm_api_options(cfg) == {"--batch-wait-timeout-iters": 40,
                                         "--batch-wait-max-tokens-ratio": 0.8}
    d = run_json(*SIM, "--extra-llm-api-options", str(cfg))
    assert (d["batch_wait_iters"], d["batch_wait_tokens_ratio"]) == (40, 0.8)
    assert (run_json(*SIM)["batch_wait_iters"], run_json(*SIM)["batch_wait_tokens_ratio"]) \
        == (0, 0.0)
    bad = _write(tmp_path, "batch_wait_max_tokens_ratio: 1.5\n", "bad.yaml")
    code, _, err = run_cli(*SIM, "--extra-llm-api-options", str(bad))
    assert code == 2 and "batch_wait_max_tokens_ratio: must be within [0, 1]" in err
    engine = [x if x != "trtllm" else "trtllm-engine" for x in SIM]
    code, _, err = run_cli(*engine, "--extra-llm-api-options", str(cfg))
    assert code == 2 and "batch_wait_max_tokens_ratio, batch_wait_timeout_iters" in err
    # PyExecutor waits only where attention DP is off: the file's keys then set nothing
    dp = _write(tmp_path, "enable_attention_dp: true\nbatch_wait_timeout_iters: 40\n"
                "batch_wait_max_tokens_ratio: 0.8\n", "dp.yaml")
    assert read_llm_api_options(dp) == {}
    # llmplan's expert-parallel replicas run attention data-parallel: refused together
    code, _, err = run_cli("simulate", "-m", "qwen3-30b-a3b", "-g", "h100-sxm", "-e", "trtllm",
                           "--ep", "2", "-n", "10", "--batch-wait-timeout-iters", "40",
                           "--batch-wait-max-tokens-ratio", "0.8")
    assert code == 2 and "attention data-parallel" in err and len(err.strip().splitlines()) == 1
