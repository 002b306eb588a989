"""vLLM's --dtype auto on a GPU without bf16 tensor cores: since vLLM 0.9
(vllm-project/vllm#17265) a bf16 checkpoint is served in fp16 on a T4 or V100 with a warning,
where earlier releases (and an explicit bf16) refuse. The profiles that cover those releases
say so (``auto_dtype_fallback``), and every command that leaves the weights' type to the
engine runs the model as vLLM would."""

from __future__ import annotations

import pytest

from planner.core.estimate import auto_dtype
from planner.core.specs import DType, Precision
from planner.io import catalog


def test_the_fallback_is_the_engines_and_only_where_the_gpu_lacks_bf16():
    t4, l4 = catalog.load_hardware("t4"), catalog.load_hardware("l4")
    vllm = catalog.load_engine("vllm")
    p = Precision.of("bf16", auto=True)
    got, note = auto_dtype(t4, p, vllm)
    assert (got.weights, got.kv_cache, got.compute_dtype) == (DType.fp16,) * 3
    assert "no bf16 tensor cores" in note[0]
    assert auto_dtype(l4, p, vllm) == (p, ())  # Ada runs bf16: nothing to fall back from
    assert auto_dtype(t4, Precision.of("bf16"), vllm)[1] == ()  # asked for: refused later
    assert auto_dtype(t4, p, catalog.load_engine("vllm-v0"))[1] == ()  # 0.6-0.8 refuse
    assert catalog.load_engine("vllm-0.8").auto_dtype_fallback == "fp16"
    # weight-only int4: its matmuls run in the 16-bit type, which falls back; an fp8 KV stays
    q, _ = auto_dtype(t4, Precision.of("int4", "fp8", auto=True), vllm)
    assert (q.weights, q.kv_cache, q.compute_dtype) == (DType.int4, DType.fp8, DType.fp16)


def test_estimate_on_a_t4_runs_the_default_as_fp16(run_json, run_cli):
    auto = run_json("estimate", "-m", "llama-3.2-1b", "-g", "t4")
    half = run_json("estimate", "-m", "llama-3.2-1b", "-g", "t4", "--weights", "fp16")
    assert (auto["weights"], auto["kv_cache"], auto["compute"]) == ("fp16", "fp16", "fp16")
    assert auto["tpot_s"] == half["tpot_s"] and auto["ttft_s"] == half["ttft_s"]
    assert any("falls back" in n for n in auto["notes"])
    code, out, _ = run_cli("estimate", "-m", "llama-3.2-1b", "-g", "t4")
    assert code == 0 and "run in fp16: the engine's fallback" in " ".join(out.split())
    # what vLLM itself refuses stays refused, in one line
    for extra in (["--weights", "bf16"], ["--dtype", "bfloat16"], ["-e", "vllm-v0"]):
        code, _, err = run_cli("estimate", "-m", "llama-3.2-1b", "-g", "t4", *extra)
        assert code == 2 and "no bf16 tensor-core rate" in err, extra


def test_sweep_and_plan_size_t4s_as_vllm_serves_them(run_json):
    rows = run_json("sweep", "-m", "llama-3.2-1b", "-g", "t4,l4", "-b", "1,8")
    t4 = [r for r in rows if r["gpu"] == "t4"]
    assert t4 and all(r["supported"] and r["weights"] == "fp16" and r["kv_cache"] == "fp16"
                      for r in t4)
    assert {r["weights"] for r in rows if r["gpu"] == "l4"} == {"bf16"}
    plan = run_json("plan", "-m", "llama-3.1-8b", "-g", "t4", "-p", "512", "-o", "128",
                    "--ttft", "2s", "--tpot", "100ms", "--rps", "1")
    assert plan and all(r["gpu"] == "t4" for r in plan)
    # every row, aggregated or prefill / decode apart, runs its 16-bit parts in fp16
    assert not any("bf16" in f"{r['weights']} {r['kv_cache']}" for r in plan)
    assert "fp16" in {r["weights"] for r in plan}  # two T4s hold the 8B in 16 bits


@pytest.mark.parametrize("flags", [["--weights", "bf16,int4"], ["--compute", "bf16"]])
def test_plan_keeps_an_asked_for_bf16_refused_on_a_t4(run_cli, flags):
    code, _, err = run_cli("plan", "-m", "llama-3.1-8b", "-g", "t4", "-p", "512", "-o", "128",
                           "--ttft", "2s", "--tpot", "100ms", "--rps", "1", *flags)
    assert code == 2 and "bf16 tensor-core rate" in err
