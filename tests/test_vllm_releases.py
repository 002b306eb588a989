"""The `vllm` profile's defaults by release, as the released wheels have them (read
2026-12-06, engines_db/vllm.yaml): async scheduling from 0.14, the whole-prompt admission
gate from 0.19, gpu_memory_utilization 0.92 from 0.20, 16,384 tokens a step on GPUs of
160 GiB or more and a 1,024 CUDA-graph cap on Blackwell from 0.28, 64-token KV blocks from
0.34, and the speculative methods that keep async scheduling on, by release."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from planner.core.engine import MemoryFraction, NumSince, SpeculativeMethods
from planner.io import catalog

SPEC = catalog.load_engine_spec("vllm")


def _engine(version: str | None, gpu: str):
    spec = SPEC if version is None else SPEC.at_version(version)
    hw = catalog.load_hardware(gpu)
    return spec.model().for_gpu(hw.memory_bytes, hw.name, hw.architecture)


@pytest.mark.parametrize("version, on", [("0.12", False), ("0.13.0", False), ("0.14", True),
                                         ("0.19.1", True), (None, True)])
def test_async_scheduling_is_the_default_from_0_14(version, on):
    spec = SPEC if version is None else SPEC.at_version(version)
    assert spec.serving.async_scheduling.value is on
    assert spec.model().async_scheduling is on


@pytest.mark.parametrize("version, frac, block", [("0.15", 0.9, 16), ("0.19.1", 0.9, 16),
                                                  ("0.20", 0.92, 16), ("0.33", 0.92, 16),
                                                  ("0.34", 0.92, 64), (None, 0.92, 64)])
def test_memory_fraction_and_block_size_by_release(version, frac, block):
    e = _engine(version, "h100-sxm")
    assert (e.memory_utilization_frac, e.block_size) == (frac, block)


@pytest.mark.parametrize("version, gpu, tokens, seqs, cap", [
    ("0.27", "b200", 8192, 1024, 512),
    ("0.28", "b200", 16384, 1024, 1024),  # >= 160 GiB, and SM100's graph cap
    (None, "b300", 16384, 1024, 1024),
    ("0.28", "mi300x", 16384, 1024, 512),  # 192 GB, not Blackwell
    ("0.28", "h200", 8192, 1024, 512),  # 141 GB
    ("0.28", "a100-sxm-80gb", 2048, 256, 512),
    ("0.28", "l40s", 2048, 256, 512)])
def test_batch_defaults_and_graph_cap_by_gpu_and_release(version, gpu, tokens, seqs, cap):
    e = _engine(version, gpu)
    assert (e.max_num_batched_tokens, e.max_num_seqs) == (tokens, seqs)
    assert e.graph_rule[2] == cap


def test_the_largest_decode_batch_replays_a_graph_on_a_b200_from_0_28():
    from planner.serving.config import SchedulerConfig

    hw = catalog.load_hardware("b200")
    for version, largest in (("0.27", 512), ("0.28", 1024)):
        e = _engine(version, "b200")
        cfg = SchedulerConfig.for_engine(e, memory_bytes=hw.memory_bytes)
        # min(2 x 1,024 sequences, the cap), captured by 16 above 256
        assert cfg.graph_sizes[-1] == largest
        assert (1008 in cfg.graph_sizes) is (largest == 1024)


@pytest.mark.parametrize("version, methods", [
    ("0.15", ("eagle", "eagle3", "mtp")),
    ("0.27", ("eagle", "eagle3", "mtp")),
    ("0.28", ("eagle", "eagle3", "mtp", "draft-model")),
    ("0.34", ("eagle", "eagle3", "mtp", "draft-model", "ngram"))])
def test_the_speculative_methods_async_scheduling_keeps_by_release(version, methods):
    e = SPEC.at_version(version).model()
    assert e.async_speculation == methods
    assert e.for_speculation("draft-model").async_scheduling is ("draft-model" in methods)
    assert e.for_speculation("ngram").async_scheduling is ("ngram" in methods)


def test_a_release_bound_default_names_its_earlier_value():
    with pytest.raises(ValidationError, match="since and before together"):
        NumSince(value=64, since="0.34", source="x")
    with pytest.raises(ValidationError, match="since and before together"):
        MemoryFraction(basis="total", value=0.92, before=0.9, source="x")
    with pytest.raises(ValidationError, match="joined: ngram is not in value"):
        SpeculativeMethods(value=("eagle",), joined=(("ngram", "0.34"),), source="x")
    note = SPEC.at_version("0.19").memory_fraction.note
    assert note.startswith("releases before 0.20")


def test_a_waiting_request_is_admitted_only_where_its_whole_prompt_fits_from_0_19(run_json):
    """vLLM 0.19's scheduler_reserve_full_isl: on a KV pool of 22,704 tokens, six prompts of
    12,000 tokens (chunks of 8,192) all at once. 0.18 admits the second request's first
    chunk beside the first prompt's last one (4,400 tokens fit), then has to preempt it when
    its next chunk does not: five preemptions over the run. 0.19 admits it only once its
    whole prompt fits, so one request runs at a time and none is preempted."""
    args = ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "12000", "-o", "200",
            "-n", "6", "--memory-utilization", "0.25", "--max-model-len", "16384"]
    old = run_json(*args, "-e", "vllm@0.18")
    new = run_json(*args, "-e", "vllm@0.19")
    assert old["kv_capacity_tokens"] == new["kv_capacity_tokens"] == 22_704
    assert (old["preemptions"], old["max_running_requests"]) == (5, 2)
    assert (new["preemptions"], new["max_running_requests"]) == (0, 1)
    assert new["mean_e2el_ms"] < old["mean_e2el_ms"]  # no prefill recomputed


def test_async_scheduling_stays_on_under_pipeline_parallelism_from_0_15(run_json):
    """vLLM 0.14 turns async scheduling off under pipeline parallelism; 0.15 and later keep
    it, so a pipeline-parallel step's host work runs beside its GPU work there too."""
    for version, on in (("0.14", False), ("0.15", True), ("0.34", True)):
        assert SPEC.at_version(version).model().overlaps_host(pp=2) is on
    assert not catalog.load_engine("vllm-0.8").overlaps_host(pp=2)
    args = ("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "-pp", "2", "-b", "8")
    old, new = (run_json(*args, "-e", f"vllm@{v}") for v in ("0.14", "0.15"))
    assert (old["async_scheduling"], new["async_scheduling"]) == (False, True)
    assert new["tpot_s"] < old["tpot_s"]
    # one stage: on from 0.14 either way
    one = [run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", f"vllm@{v}")
           for v in ("0.14", "0.15")]
    assert one[0]["tpot_s"] == one[1]["tpot_s"] and one[0]["async_scheduling"]
