"""vLLM's --performance-mode (0.17 and later, PR #34936): throughput doubles the default
scheduler limits, interactivity captures CUDA graphs at every decode batch of 1-32, balanced
changes nothing; the limits a server is given stand, and engines or releases without the
option refuse it in one line. Sizes are worked out by hand from vLLM's capture rule:
[1, 2, 4] (interactivity: 1..min(max, 32)) + range(8, min(max + 1, 256), 8) +
range(256, max + 1, 16), max = min(2 x max_num_seqs, 512, max_num_batched_tokens)."""

from __future__ import annotations

import pytest

from planner.cli.compare import served_setup
from planner.cli.flags import server_flags
from planner.core.errors import LlmplanError, UsageError
from planner.core.specs import DType
from planner.io import catalog
from planner.serving import run
from planner.serving.config import SchedulerConfig

GIB = 2**30
ARGS = ("-m", "llama-3.1-8b", "--num-requests", "40", "-p", "256", "-o", "32")
# vLLM's capture sizes at max 512, by hand
STEPS = tuple(range(8, 256, 8)) + tuple(range(256, 513, 16))
BALANCED = (1, 2, 4) + STEPS
INTERACTIVE = tuple(range(1, 33)) + tuple(range(40, 256, 8)) + tuple(range(256, 513, 16))


def _vllm(gpu_gib: float = 80, name: str = "NVIDIA H100 80GB HBM3", version: str | None = None):
    spec = catalog.load_engine_spec("vllm" if version is None else f"vllm@{version}")
    return spec.model().for_gpu(gpu_gib * GIB, name, "hopper")


def _cfg(engine, mode, **given) -> SchedulerConfig:
    return SchedulerConfig.for_engine(engine.in_mode(mode), memory_bytes=80 * GIB, **given)


@pytest.mark.parametrize("mode, seqs, tokens", [
    (None, 1024, 8192), ("balanced", 1024, 8192), ("interactivity", 1024, 8192),
    ("throughput", 2048, 16384)])
def test_throughput_doubles_the_large_gpu_defaults(mode, seqs, tokens):
    cfg = _cfg(_vllm(), mode)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (seqs, tokens)


def test_throughput_doubles_the_small_gpu_defaults_after_they_are_picked():
    """An A100 takes vLLM's smaller defaults (256 / 2,048), which throughput doubles."""
    a100 = _vllm(80, "NVIDIA A100-SXM4-80GB")
    assert (_cfg(a100, None).max_num_seqs, _cfg(a100, None).max_num_batched_tokens) == \
        (256, 2048)
    cfg = _cfg(a100, "throughput")
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (512, 4096)


def test_interactivity_captures_every_small_batch():
    assert _cfg(_vllm(), None).graph_sizes == BALANCED
    assert _cfg(_vllm(), "balanced").graph_sizes == BALANCED
    assert _cfg(_vllm(), "throughput").graph_sizes == BALANCED  # 512 is the cap either way
    assert _cfg(_vllm(), "interactivity").graph_sizes == INTERACTIVE
    assert len(INTERACTIVE) == 32 + 27 + 17


def test_interactivity_stops_at_the_largest_captured_size():
    """--max-num-seqs 8: the largest captured size is 2 x 8 = 16, so 1..16, no more."""
    assert _cfg(_vllm(), "interactivity", max_num_seqs=8).graph_sizes == tuple(range(1, 17))
    assert _cfg(_vllm(), None, max_num_seqs=8).graph_sizes == (1, 2, 4, 8, 16)


def test_limits_given_stand_under_throughput():
    cfg = _cfg(_vllm(), "throughput", max_num_seqs=128)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (128, 16384)


@pytest.mark.parametrize("engine, version", [("vllm", "0.15"), ("vllm-v0", None),
                                             ("sglang", None), ("trtllm", None)])
def test_engines_without_the_option_refuse_it(engine, version):
    spec = catalog.load_engine_spec(engine if version is None else f"{engine}@{version}")
    with pytest.raises(UsageError, match="an option of vLLM 0.17 and later"):
        spec.model().in_mode("throughput")


def test_the_option_starts_at_017():
    assert _vllm(version="0.17").performance_modes is not None
    assert _vllm(version="0.16").performance_modes is None


def test_an_unknown_mode_is_refused():
    with pytest.raises(UsageError, match="'fast' is not one of balanced, interactivity"):
        _vllm().in_mode("fast")


def test_a_server_command_sets_the_mode_beneath_its_own_limits():
    spec = catalog.load_engine_spec("vllm")
    s = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "bf16", None,
                     server=server_flags("vllm serve m --performance-mode=throughput "
                                         "--max-num-seqs 64"))
    cfg = run.scheduler(s)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (64, 16384)
    i = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "bf16", None,
                     server=server_flags("vllm serve m --performance-mode interactivity"))
    assert run.scheduler(i).graph_sizes == INTERACTIVE
    with pytest.raises(LlmplanError, match="'latency' is not one of"):
        server_flags("vllm serve m --performance-mode latency")


def test_a_replay_under_an_engine_without_the_option_keeps_that_engines_defaults():
    """validate replays a run with the ideal engine too: the flag is dropped there."""
    from types import SimpleNamespace

    from planner.cli.validate import replay_setup

    traffic = SimpleNamespace(server_command="vllm serve m --performance-mode throughput")
    entry = SimpleNamespace(traffic=traffic, model="llama-3.1-8b", gpu="h100-sxm", tp=1,
                            weights=DType.bf16, kv_cache=None, checkpoint=None)
    ideal = replay_setup(entry, catalog.load_engine_spec("ideal"))
    assert run.scheduler(ideal).max_num_seqs == ideal.engine.max_num_seqs
    vllm = replay_setup(entry, catalog.load_engine_spec("vllm"))
    assert run.scheduler(vllm).max_num_seqs == 2048


def test_simulate_reports_the_mode_and_the_limits(run_json):
    d = run_json("simulate", *ARGS, "-g", "a100-sxm-80gb", "--performance-mode", "throughput")
    assert (d["performance_mode"], d["max_num_seqs"], d["max_num_batched_tokens"]) == \
        ("throughput", 512, 4096)
    d = run_json("simulate", *ARGS, "-g", "a100-sxm-80gb")
    assert (d["performance_mode"], d["max_num_seqs"], d["max_num_batched_tokens"]) == \
        (None, 256, 2048)


def test_interactivity_pads_a_small_decode_batch_less(run_json):
    """A closed loop of 5 clients decodes in batches of 5: balanced replays the graph of 8,
    interactivity the graph of 5, so its decode steps are faster; throughput, whose larger
    limits five clients never reach and whose captured sizes are balanced's, changes
    nothing."""
    base = ("simulate", *ARGS, "-g", "h100-sxm", "--max-concurrency", "5")
    five = run_json(*base)["mean_tpot_ms"]
    assert run_json(*base, "--performance-mode", "interactivity")["mean_tpot_ms"] < five
    assert run_json(*base, "--performance-mode", "throughput")["mean_tpot_ms"] == \
        pytest.approx(five, rel=1e-12)


@pytest.mark.parametrize("engine, says", [
    ("vllm@0.15", "(vllm, a release before 0.17) has none"),
    ("sglang", "(sglang) has none"),
])
def test_simulate_refuses_the_mode_in_one_line(engine, says, run_cli):
    code, out, err = run_cli("simulate", *ARGS, "-g", "h100-sxm", "-e", engine,
                             "--performance-mode", "throughput")
    assert code == 2 and says in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


PLAN = ("plan", "-m", "llama-3.1-8b", "--ttft", "1", "--tpot", "0.05", "--rps", "20", "-p",
        "1000", "-o", "200", "-g", "h100-sxm", "--tp", "1", "--weights", "bf16", "--kv-cache",
        "16", "--disaggregated", "off", "--sim-requests", "100")


def test_plan_sizes_replicas_under_the_mode(run_json):
    """At 20 req/s over a few replicas no running set nears 1,024: throughput's doubled
    limits size the same replicas, and the rows say the limit the replicas ran with."""
    base = run_json(*PLAN)
    fast = run_json(*PLAN, "--performance-mode", "throughput")
    assert {r["batch"] for r in base} == {1024} and {r["batch"] for r in fast} == {2048}
    assert [r["replicas"] for r in fast] == [r["replicas"] for r in base]


@pytest.mark.parametrize("extra, says", [
    (("-e", "sglang"), "(sglang) has none"),
    (("--scheduler", "static"), "--performance-mode: sized with --scheduler continuous only"),
])
def test_plan_refuses_the_mode_in_one_line(extra, says, run_cli):
    code, _, err = run_cli(*PLAN, *extra, "--performance-mode", "throughput")
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
