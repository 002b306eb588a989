"""vLLM's own flag names on estimate, simulate and plan, and the one table (planner/cli/flags.py)
that maps vLLM's, SGLang's and trtllm-serve's flags to ours for those commands and for the
replay of a published server command."""

from __future__ import annotations

import re

import pytest

from planner.cli.compare import served_setup
from planner.cli.flags import FLAGS, check_duplicates, cli_aliases, server_flags
from planner.core.errors import LlmplanError
from planner.io import catalog

ARGS = ("-m", "llama-3.1-8b", "-g", "h100-sxm")


@pytest.mark.parametrize("command, names", [
    ("estimate", ["--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
                  "--gpu-memory-utilization", "--kv-cache-dtype", "--quantization", "--dtype",
                  "--enforce-eager", "--cpu-offload-gb"]),
    ("simulate", ["--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
                  "--gpu-memory-utilization", "--kv-cache-dtype", "--quantization", "--dtype",
                  "--enforce-eager", "--cpu-offload-gb", "--enable-chunked-prefill",
                  "--no-enable-chunked-prefill", "--max-num-seqs",
                  "--max-num-batched-tokens", "--block-size"]),
    ("plan", ["--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
              "--gpu-memory-utilization", "--kv-cache-dtype", "--quantization",
              "--enforce-eager"]),
])
def test_help_lists_vllms_names(command, names, run_cli):
    code, out, _ = run_cli(command, "--help")
    assert code == 0
    words = set(re.split(r"[\s,/]+", out))
    for n in names:
        assert n in words, (command, n)


def test_cli_aliases_come_from_the_table():
    assert cli_aliases("--tp") == ("--tensor-parallel-size", "-tp")
    assert cli_aliases("--pp") == ("--pipeline-parallel-size", "-pp")
    assert cli_aliases("--memory-utilization") == ("--gpu-memory-utilization",)
    for f in FLAGS:
        assert f.source.startswith("https://github.com/"), f.names


def _strip(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("bands",)}


@pytest.mark.parametrize("theirs, ours", [
    (("-tp", "2"), ("--tp", "2")),
    (("--tensor-parallel-size", "2"), ("--tp", "2")),
    (("--gpu-memory-utilization", "0.8"), ("--memory-utilization", "0.8")),
    (("--kv-cache-dtype", "fp8_e4m3"), ("--kv-cache", "fp8")),
    (("--kv-cache-dtype", "auto"), ()),
    (("--quantization", "awq"), ("--weights", "int4")),
    (("--quantization", "gptq_marlin"), ("--weights", "int4", "--group-size", "128")),
    (("--quantization", "fp8"), ("--weights", "fp8")),
    (("--dtype", "float16"), ("--weights", "fp16")),
    (("--dtype", "half", "--quantization", "awq"), ("--weights", "int4", "--compute", "fp16")),
])
def test_vllms_name_gives_what_ours_gives(theirs, ours, run_json):
    assert _strip(run_json("estimate", *ARGS, *theirs)) == \
        _strip(run_json("estimate", *ARGS, *ours))


def test_pipeline_alias(run_json):
    a = run_json("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "-tp", "2", "-pp", "2")
    b = run_json("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "2", "--pp", "2")
    assert a["pipeline"] == b["pipeline"] and a["tp"] == 2


def test_simulate_takes_vllms_chunked_prefill_names(run_json):
    base = ("simulate", *ARGS, "-n", "30", "-p", "3000", "-o", "8")
    assert run_json(*base, "--no-enable-chunked-prefill") == \
        run_json(*base, "--no-chunked-prefill")
    assert run_json(*base, "--no-chunked-prefill") != run_json(*base)


@pytest.mark.parametrize("cmd, extra, says", [
    ("estimate", ("--tp", "2", "--tensor-parallel-size", "4"),
     "--tp 2 and --tensor-parallel-size 4 disagree"),
    ("estimate", ("-tp", "2", "--tp=1"), "-tp 2 and --tp 1 disagree"),
    ("estimate", ("--tp", "1", "--tp", "2"), "--tp 1 and --tp 2 disagree"),
    ("estimate", ("--pp", "2", "-pp", "4"), "--pp 2 and -pp 4 disagree"),
    ("estimate", ("--memory-utilization", "0.8", "--gpu-memory-utilization", "0.9"),
     "disagree: give --memory-utilization once"),
    ("estimate", ("--weights", "bf16", "--quantization", "fp8"),
     "--weights bf16 and --quantization fp8 (fp8) disagree"),
    ("estimate", ("--weights", "int8", "--quantization", "gptq"), "disagree"),
    ("estimate", ("--kv-cache", "bf16", "--kv-cache-dtype", "fp8"), "disagree"),
    ("estimate", ("--weights", "bf16", "--dtype", "float16"), "disagree"),
    ("estimate", ("--quantization", "awq", "--compute", "bf16", "--dtype", "half"),
     "--compute bf16 and --dtype half disagree"),
    ("estimate", ("--quantization", "bitsandbytes"), "--quantization"),
    ("estimate", ("--dtype", "float32"), "--dtype"),
    ("estimate", ("--kv-cache-dtype", "fp8_ds_mla"), "--kv-cache-dtype"),
    ("simulate", ("--chunked-prefill", "--no-enable-chunked-prefill"),
     "--chunked-prefill and --no-enable-chunked-prefill disagree"),
    ("simulate", ("-tp", "1", "--tensor-parallel-size", "2"), "disagree"),
    ("simulate", ("-e", "vllm-v0", "--num-scheduler-steps", "4",
                  "--multi-step-stream-outputs", "--no-multi-step-stream-outputs"),
     "--multi-step-stream-outputs and --no-multi-step-stream-outputs disagree"),
    ("plan", ("--ttft", "2s", "--tpot", "50ms", "--rps", "1", "--weights", "bf16",
              "--quantization", "fp8"), "--weights bf16 and --quantization fp8 disagree"),
    ("plan", ("--ttft", "2s", "--tpot", "50ms", "--rps", "1", "--kv-cache", "fp8",
              "--kv-cache-dtype", "auto"), "disagree"),
    ("plan", ("--ttft", "2s", "--tpot", "50ms", "--rps", "1", "--tp", "1,2", "-tp", "4"),
     "--tp 1,2 and -tp 4 disagree"),
])
def test_conflicting_duplicates_are_refused_in_one_line(cmd, extra, says, run_cli):
    model = ("-m", "llama-3.1-8b") if cmd == "plan" else ARGS
    code, out, err = run_cli(cmd, *model, *extra)
    assert code == 2 and out == "", err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_same_value_twice_is_not_a_conflict():
    check_duplicates(["estimate", "--tp", "2", "-tp", "2", "--tensor-parallel-size=2"])
    check_duplicates(["simulate", "--enable-chunked-prefill", "--chunked-prefill"])
    check_duplicates(["estimate", "--memory-utilization", "0.9",
                      "--gpu-memory-utilization=0.90"])
    with pytest.raises(LlmplanError):
        check_duplicates(["simulate", "--enable-chunked-prefill", "--no-chunked-prefill"])


def test_enforce_eager_puts_the_host_launch_floor_on_decode(run_json):
    """GPT-2 at batch 1 on an H100: without CUDA graphs every decode operator but the lm_head
    waits on the host, 10 us a kernel (vllm.yaml host_launch_us). Under async scheduling the
    host launches every kernel, the lm_head's too, and then does the step's fixed cost while
    the GPU finishes, so the step is all 123 kernels x 10 us + the fixed cost (the lm_head's
    own 30 us hide under it); with graphs it is shorter."""
    args = ("-m", "gpt2", "-g", "h100-sxm", "-p", "128", "-o", "16")
    eager = run_json("estimate", *args, "--enforce-eager")
    graphed = run_json("estimate", *args)
    ops = eager["operators"]["decode"]
    head = next(o for o in ops if o["name"] == "lm_head")
    kernels = sum(o["kernels"] for o in ops)
    assert kernels - head["kernels"] == 122 and head["time_s"] > 10e-6
    assert eager["tpot_s"] == pytest.approx(
        kernels * 10e-6 + eager["operators"]["decode_fixed_s"], rel=1e-9)
    assert graphed["tpot_s"] < eager["tpot_s"]
    assert eager["ttft_s"] == graphed["ttft_s"]  # prefill never ran from graphs


def test_enforce_eager_reaches_the_simulator(run_json):
    base = ("simulate", "-m", "gpt2", "-g", "h100-sxm", "-n", "20", "-p", "128", "-o", "16",
            "--request-rate", "0.1")
    eager = run_json(*base, "--enforce-eager")["median_tpot_ms"]
    est = run_json("estimate", "-m", "gpt2", "-g", "h100-sxm", "-p", "128", "-o", "16",
                   "--enforce-eager")["tpot_s"] * 1e3
    assert eager == pytest.approx(est, rel=1e-3)
    assert eager > run_json(*base)["median_tpot_ms"]


# --------------------------------------------------------------------- server commands


@pytest.mark.parametrize("command, expected", [
    ("vllm serve m -tp 8 --max-num-batched-tokens 4096", {"--tp": 8,
                                                          "--max-num-batched-tokens": 4096}),
    ("vllm serve m --tensor-parallel-size=2 --gpu-memory-utilization 0.95 --enforce-eager "
     "--kv-cache-dtype fp8_e5m2 --quantization awq --cpu-offload-gb 4 --dtype half",
     {"--tp": 2, "--memory-utilization": 0.95, "--memory-basis": "total",
      "--enforce-eager": True, "--kv-cache": "fp8",
      "--weights": "int4", "--cpu-offload-gb": 4.0, "--dtype": "fp16"}),
    ("vllm serve m --no-enable-chunked-prefill --max-num-seqs 64 -pp 2",
     {"--chunked-prefill": False, "--max-num-seqs": 64, "--pp": 2}),
    ("python3 -m sglang.launch_server --model-path m --tp-size 8 --mem-fraction-static 0.8 "
     "--chunked-prefill-size 4096 --max-running-requests 128 --disable-cuda-graph",
     {"--tp": 8, "--memory-utilization": 0.8, "--memory-basis": "static",
      "--max-num-batched-tokens": 4096,
      "--max-num-seqs": 128, "--enforce-eager": True}),
    ("python3 -m sglang.launch_server --model-path m --tp 4 --chunked-prefill-size -1",
     {"--tp": 4, "--chunked-prefill": False}),
    ("trtllm-serve m --tp_size 2 --max_batch_size 64 --max_num_tokens 8192 "
     "--kv_cache_free_gpu_memory_fraction 0.85 --enable_chunked_prefill --max_seq_len=40960",
     {"--tp": 2, "--max-num-seqs": 64, "--max-num-batched-tokens": 8192,
      "--memory-utilization": 0.85, "--memory-basis": "free", "--chunked-prefill": True,
      "--max-model-len": 40960}),
    ("vllm serve m --no-enable-prefix-caching", {"--prefix-cache": False}),
    ("trtllm-serve m --backend trt", {"--trtllm-backend": "tensorrt"}),
    ("trtllm-serve m --backend pytorch", {"--trtllm-backend": "pytorch"}),
    ("python3 -m sglang.launch_server --model-path m --enable-mixed-chunk "
     "--disable-radix-cache", {"--mixed-batches": True, "--prefix-cache": False}),
    ("vllm serve m --host 0.0.0.0 --port 8000 --async-scheduling",
     {"--async-scheduling": True}),
    ("python3 -m sglang.launch_server --model-path m --disable-overlap-schedule",
     {"--async-scheduling": False}),
    (None, {}),
])
def test_server_commands_read_with_the_table(command, expected):
    assert server_flags(command) == expected


def test_a_memory_fraction_given_on_two_bases_is_refused():
    """0.9 of the total (vLLM's flag) and 0.9 static (SGLang's) are not one setting."""
    from planner.core.errors import LlmplanError

    with pytest.raises(LlmplanError, match="memory fraction twice"):
        server_flags("vllm serve m --gpu-memory-utilization 0.9 --mem-fraction-static 0.9")
    assert server_flags("vllm serve m --gpu-memory-utilization 0.9 "
                        "--gpu-memory-utilization 0.9") == \
        {"--memory-utilization": 0.9, "--memory-basis": "total"}


@pytest.mark.parametrize("command, says", [
    ("vllm serve m -tp two", "-tp: 'two' is not a number"),
    ("vllm serve m --kv-cache-dtype fp8_ds_mla", "--kv-cache-dtype: 'fp8_ds_mla'"),
    ("vllm serve m --tp-size 2 -tp 4", "gives --tp twice"),
    ("vllm serve m --max-num-seqs", "--max-num-seqs: no value"),
    ("trtllm-serve m --backend _autodeploy", "--backend: '_autodeploy' is not one of"),
])
def test_bad_server_commands_are_named(command, says):
    with pytest.raises(LlmplanError, match=says):
        server_flags(command)


def test_a_replayed_server_command_sets_the_deployment():
    """SGLang with --mem-fraction-static 0.7 --disable-cuda-graph: the replayed replica's KV
    pool is 0.7 x (80 GiB - 1 GiB) - weights on SGLang's basis, and it runs without graphs."""
    spec = catalog.load_engine_spec("sglang")
    s = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "bf16", None,
                     server=server_flags("python3 -m sglang.launch_server --model-path m "
                                         "--mem-fraction-static 0.7 --disable-cuda-graph "
                                         "--max-running-requests 64"))
    assert s.options.memory_utilization_frac == 0.7
    assert not s.engine.cuda_graphs and s.engine.max_num_seqs == 64
    from planner.serving.cost import StepCoster

    c = StepCoster(s.model, s.hardware, s.prepared, s.options)
    gib, w = 2**30, 8_030_261_248 * 2
    assert c.kv_capacity_tokens(64, 8192) == int((0.7 * 79 * gib - w) // (2 * 32 * 8 * 128 * 2))


@pytest.mark.parametrize("command, tp, weights, says", [
    ("vllm serve m -tp 8", 4, "bf16", "--tp 8 and the run's TP 4 disagree"),
    ("vllm serve m --quantization fp8", 1, "bf16", "--quantization fp8 and the run's weights"),
])
def test_a_server_command_that_contradicts_its_run_is_refused(command, tp, weights, says):
    spec = catalog.load_engine_spec("vllm")
    with pytest.raises(LlmplanError, match=says):
        served_setup("llama-3.1-70b", "h100-sxm", spec, tp, weights, None,
                     server=server_flags(command))


def test_a_replayed_server_command_sets_the_scheduler():
    """SGLang with --enable-mixed-chunk --disable-radix-cache: decodes share a step with the
    prefill chunks and nothing is cached, against the profile's defaults."""
    from planner.serving import run

    spec = catalog.load_engine_spec("sglang")
    plain = run.scheduler(served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "bf16", None))
    assert (plain.mixed_batches, plain.prefix_caching) == (False, True)
    s = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "bf16", None,
                     server=server_flags("python3 -m sglang.launch_server --model-path m "
                                         "--enable-mixed-chunk --disable-radix-cache"))
    cfg = run.scheduler(s)
    assert (cfg.mixed_batches, cfg.prefix_caching) == (True, False)


def test_sglang_overlaps_its_host_work_unless_told_not_to():
    """SGLang's overlap scheduler (the default since 0.4) prepares the next batch while the
    GPU runs this one: a graphed decode step of Llama-3.1-8B on an H100 (GPU-bound, some 9 ms
    against SGLang's fixed host cost of well under one) takes its GPU time alone; with
    --disable-overlap-schedule, or across pipeline stages, the host's work adds to it."""
    from planner.core.ops import StepShape
    from planner.serving.cost import StepCoster

    spec = catalog.load_engine_spec("sglang")
    on = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "bf16", None)
    off = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "bf16", None,
                       server=server_flags("python3 -m sglang.launch_server --model-path m "
                                           "--disable-overlap-schedule"))
    assert on.engine.overlaps_host() and not on.engine.overlaps_host(pp=2)
    assert not off.engine.overlaps_host()
    c_on, c_off = (StepCoster(s.model, s.hardware, s.prepared, s.options) for s in (on, off))
    shape = StepShape.uniform(1, 1, 1000)
    gpu = c_on.gpu_s(shape, prefill=False)
    host = on.engine.step_overhead_s + on.engine.per_sequence_overhead_s
    assert gpu > 5 * host > 0
    assert c_on.step_time(shape, sequences=1, prefill=False) == pytest.approx(gpu, rel=1e-12)
    assert c_off.step_time(shape, sequences=1, prefill=False) == \
        pytest.approx(gpu + host, rel=1e-12)


def test_trtllm_serves_with_the_pytorch_backends_graphs_unless_told_tensorrt():
    """trtllm-serve's default backend (PyTorch) captures decode batches of 1-32, 64 and 128
    and does not pad; --backend tensorrt runs a built engine, priced by the trtllm-engine
    profile."""
    from planner.serving import run

    spec = catalog.load_engine_spec("trtllm")
    default = run.scheduler(served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "bf16", None,
                                         server=server_flags("trtllm-serve m")))
    assert default.graph_sizes == tuple(range(1, 33)) + (64, 128)
    assert default.graph_padding is False
    trt = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "bf16", None,
                       server=server_flags("trtllm-serve m --backend tensorrt"))
    cfg = run.scheduler(trt)
    assert cfg.graph_sizes == () and trt.engine.cuda_graphs
    # a built engine is the trtllm-engine profile's, kernels and all: not the PyTorch
    # backend's GEMM and attention figures
    engine = catalog.load_engine_spec("trtllm-engine").model()
    assert trt.engine.name == "trtllm-engine"
    assert (trt.engine.gemm_bandwidth_frac, trt.engine.attention_bandwidth_frac,
            trt.engine.attention_fixed_s) == (engine.gemm_bandwidth_frac,
                                              engine.attention_bandwidth_frac, 0.0)
    assert served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "bf16", None,
                        server=server_flags("trtllm-serve m")).engine.attention_fixed_s > 0
    # the PyTorch backend's overlap scheduler (1.0 and later), not a built engine's runtime
    pytorch = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "bf16", None,
                           server=server_flags("trtllm-serve m"))
    assert pytorch.engine.async_scheduling and not trt.engine.async_scheduling
    assert not spec.at_version("0.9.0").model().async_scheduling


def test_estimate_and_plan_take_the_async_scheduling_flag(run_json):
    """vLLM's decode step of Llama-3.1-8B at batch 16 on an H100 is GPU-bound (7.7 ms against a
    host cost of 0.725 ms + 16 x 40.5 us): with async scheduling it takes its GPU time alone,
    with --no-async-scheduling (SGLang's spelling --disable-overlap-schedule too) the host's
    work after it, exactly. plan sizes with it: a slower step never needs fewer replicas."""
    base = ("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "16", "-p", "2048",
            "-o", "256")
    on, off = run_json(*base), run_json(*base, "--no-async-scheduling")
    e = catalog.load_engine("vllm")
    assert on["async_scheduling"] and not off["async_scheduling"]
    # vLLM 0.14 turns it off across pipeline stages (0.15 and later keep it); the JSON says
    # what the layout runs
    assert run_json(*base, "--tp", "1", "--pp", "2", "-e", "vllm@0.14")["async_scheduling"] \
        is False
    assert run_json(*base, "--tp", "1", "--pp", "2")["async_scheduling"] is True
    assert off["tpot_s"] - on["tpot_s"] == pytest.approx(
        e.step_overhead_s + 16 * e.per_sequence_overhead_s, rel=1e-9)
    assert run_json(*base, "--disable-overlap-schedule")["tpot_s"] == off["tpot_s"]
    plan = ("plan", "-m", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1", "--pp", "1",
            "--weights", "bf16", "--kv-cache", "16", "--sim-requests", "100", "--ttft", "2s",
            "--tpot", "30ms", "--rps", "20", "-p", "512", "-o", "128")
    fast, slow = run_json(*plan)[0], run_json(*plan, "--no-async-scheduling")[0]
    assert slow["replicas"] >= fast["replicas"]
    assert slow["p90_tpot_s"] > fast["p90_tpot_s"]
    assert slow["single_request_tpot_s"] > fast["single_request_tpot_s"]
