"""The `vllm` profile's defaults by release, as the released wheels have them (read
2026-12-06, engines_db/vllm.yaml): async scheduling from 0.14, the whole-prompt admission
gate from 0.19, gpu_memory_utilization 0.92 from 0.20, 16,384 tokens a step on GPUs of
160 GiB or more and a 1,024 CUDA-graph cap on Blackwell from 0.28, 64-token KV blocks and
the KV cache sized from measured memory from 0.34, and the speculative methods that keep
async scheduling on, by release."""

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


@pytest.mark.parametrize("version, frac, basis, block", [
    ("0.15", 0.9, "total", 16), ("0.19.1", 0.9, "total", 16), ("0.20", 0.92, "total", 16),
    ("0.33", 0.92, "total", 16), ("0.34", 1.0, "measured", 64), (None, 1.0, "measured", 64)])
def test_memory_fraction_and_block_size_by_release(version, frac, basis, block):
    """gpu_memory_utilization 0.9, 0.92 from 0.20, and from 0.34 unset (1.0) with the KV cache
    sized from measured memory (tests/test_extensible_kv.py)."""
    e = _engine(version, "h100-sxm")
    assert (e.memory_utilization_frac, e.memory_basis, e.block_size) == (frac, basis, block)


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


def test_the_gate_takes_an_idle_prefix_hit_as_blocks_to_take_as_vllm_does():
    """vLLM's can_fit_full_sequence counts a computed block no request holds (in the free
    queue) as one to take, so a hit on an idle prefix saves nothing against free + idle: a
    pool of 48 tokens in blocks of 4, 16 held by another request, an idle cached prefix of
    16; a 36-token prompt on that prefix needs 9 blocks against 8 free (refused), where a
    prefix a running request holds is not free and its hit is subtracted (a 32-token prompt:
    4 blocks to take, 4 free)."""
    from planner.serving.config import SchedulerConfig
    from planner.serving.decoding import DecodePool
    from planner.serving.kv import PagedKV, PrefixCache
    from planner.serving.requests import RequestResult, SimRequest
    from planner.serving.schedulers import ContinuousScheduler

    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8, block_size=4,
                          prefix_caching=True, full_prompt_admission=True)

    def server(held: bool):
        kv = PagedKV(48, 4)
        kv.prefixes = PrefixCache(4)
        kv.free_tokens -= kv.prefixes.warm(0, 16)
        s = ContinuousScheduler(cfg, kv, DecodePool(kv, 4))
        kv.reserve(SimRequest.of(RequestResult(9, 0.0, 16, 100)), 16)
        if held:  # a running request on prefix 0 holds its blocks
            kv.prefixes.pin(SimRequest.of(RequestResult(8, 0.0, 20, 10), prefix=0,
                                          prefix_tokens=16), 16)
        return s, kv

    s, kv = server(held=False)
    q = SimRequest.of(RequestResult(1, 0.0, 36, 10), prefix=0, prefix_tokens=16)
    hit, _ = kv.prefixes.lookup(q)
    assert (kv.free_tokens, sum(kv.prefixes.idle.values()), hit) == (16, 16, 16)
    assert not s._whole_prompt_fits(q, hit)
    s.waiting.append(q)
    assert s.schedule() == []  # it waits
    s, kv = server(held=True)
    q = SimRequest.of(RequestResult(2, 0.0, 32, 10), prefix=0, prefix_tokens=16)
    assert s._whole_prompt_fits(q, kv.prefixes.lookup(q)[0])
    s, kv = server(held=True)
    q = SimRequest.of(RequestResult(3, 0.0, 36, 10), prefix=0, prefix_tokens=16)
    assert not s._whole_prompt_fits(q, kv.prefixes.lookup(q)[0])


@pytest.mark.parametrize("name", ["vllm", "vllm-0.8", "vllm-v0", "sglang", "trtllm"])
def test_a_release_applied_twice_is_that_release(name):
    """at_version leaves a profile that is already a release's as it is: a release-bound
    default, once applied, keeps no release (``validate -e vllm@0.13`` applies the run's
    release again; a default flipped back would have run 0.13 with async scheduling)."""
    spec = catalog.load_engine_spec(name)
    for v in ("0.5.3", "0.5.9", "0.6.2", "0.8.2", "0.10", "0.13", "0.14", "0.18", "0.19",
              "0.27", "0.34", "1.0"):
        once = spec.at_version(v)
        assert once.at_version(v) == once, v
    s = catalog.load_engine_spec("vllm@0.13").as_released("vLLM 0.13.0").serving
    assert not (s.async_scheduling.value or s.async_pipeline.value
                or s.full_prompt_admission.value)


def test_a_named_release_is_said_where_the_profile_is_printed(run_cli):
    """`--engine vllm@0.18` runs 0.18's defaults and says so in estimate's engine line; the
    profile's own text follows."""
    code, out, _ = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e",
                           "vllm@0.18")
    assert code == 0 and "engine: vLLM (release 0.18; 0.12 and later" in " ".join(out.split())
    spec = catalog.load_engine_spec("vllm@v0.18.1")
    assert spec.engine_version.startswith("release 0.18.1; ")
    assert spec.release == "0.18.1" and SPEC.release is None
    assert spec.model_copy(update={"engine_version": SPEC.engine_version, "release": None}) == \
        SPEC.at_version("0.18.1")


def test_simulate_and_plan_name_the_release_too(run_cli, run_json):
    """simulate's header and --json, and plan's table, name the release --engine vllm@X.Y
    picked (the profile's name alone said "vllm" for every release); a plain profile name
    has none."""
    args = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "20",
            "--request-rate", "4")
    d = run_json(*args, "-e", "vllm@0.15")
    assert (d["engine"], d["engine_release"]) == ("vllm", "0.15")
    assert run_json(*args)["engine_release"] is None
    code, out, _ = run_cli(*args, "-e", "vllm@0.15")
    assert code == 0 and "engine vllm@0.15," in " ".join(out.split())
    est = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", "vllm@0.15")
    assert est["engine"]["release"] == "0.15"
    code, out, _ = run_cli("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", "vllm@0.15",
                           "--ttft", "1", "--tpot", "0.05", "--rps", "2", "--sim-requests", "60")
    assert code == 0 and "engine vllm@0.15" in " ".join(out.split())
    rows = run_json("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", "vllm@0.15", "--ttft",
                    "1", "--tpot", "0.05", "--rps", "2", "--tp", "1", "--pp", "1",
                    "--sim-requests", "30")
    assert rows and {(r["engine"], r["engine_release"]) for r in rows} == {("vllm", "0.15")}


def test_a_profile_file_does_not_state_a_release(run_cli, tmp_path):
    """release is what --engine FAMILY@RELEASE picked, not a field a profile file sets: one
    line, exit 2, naming the file and field."""
    import yaml

    data = yaml.safe_load((catalog.db_dir("engines_db") / "vllm.yaml").read_text())
    data["release"] = "0.15"
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump(data))
    code, out, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", str(f))
    assert code == 2 and out == ""
    assert f"{f}: release: set by --engine FAMILY@RELEASE" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("command", ["estimate", "simulate", "plan"])
def test_async_scheduling_asked_for_under_pp_is_refused_before_0_15(run_cli, command):
    """vLLM 0.11-0.14 stop at start-up where --async-scheduling is given with
    pipeline_parallel_size > 1 (left to the default they run PP without it); from 0.15 it
    runs. One line, exit 2, naming the flag, the release and vLLM's message."""
    args = {"estimate": ("-b", "4"), "simulate": ("-n", "10"),
            "plan": ("--ttft", "5", "--tpot", "0.2", "--rps", "1", "--tp", "2", "--sim-requests",
                     "30")}[command]
    base = (command, "-m", "llama-3.1-70b", "-g", "h100-sxm", "--pp", "2", *args)
    if command != "plan":
        base += ("--tp", "2")
    for engine in ("vllm@0.13", "vllm@0.10"):
        code, out, err = run_cli(*base, "-e", engine, "--async-scheduling")
        assert code == 2 and len(err.splitlines()) == 1, err
        assert "--async-scheduling with --pp 2" in err and "not yet compatible" in err
    code, _, err = run_cli(*base, "-e", "vllm@0.13")  # the default: PP without it
    assert code == 0, err
    code, _, err = run_cli(*base, "-e", "vllm@0.15", "--async-scheduling")
    assert code == 0, err


def test_plan_leaves_out_the_pipeline_layouts_vllm_refuses_with_async_scheduling(run_cli):
    """plan's default --pp 1,2 with --async-scheduling on 0.13: the PP 2 layouts are left out
    (vLLM would not start them), said on stderr; the plan of PP 1 stands."""
    args = ("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--ttft", "1", "--tpot", "0.05",
            "--rps", "2", "--tp", "1", "--sim-requests", "30", "-e", "vllm@0.13",
            "--async-scheduling")
    code, out, err = run_cli(*args)
    assert code == 0, err
    assert "left out, --pp 2" in " ".join(err.split()) and "refuses --async-scheduling" in \
        " ".join(err.split())
    code, out, err = run_cli(*args, "--json")
    assert code == 0 and "left out" not in err
