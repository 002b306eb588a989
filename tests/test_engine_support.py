"""Weights an engine does not run on some GPU architectures (engines_db ``unsupported``):
refused by name with the engine's own reason and its source, skipped by sweep and plan."""

from __future__ import annotations

import pytest

from planner.core.errors import UsageError
from planner.core.estimate import prepare
from planner.core.specs import Options, Precision
from planner.io import catalog


def test_every_rule_names_architectures_hardware_db_has():
    archs = {catalog.load_hardware(g).architecture.lower() for g in catalog.gpu_names()}
    for name in catalog.engine_names():
        for u in catalog.load_engine_spec(name).unsupported:
            assert set(a.lower() for a in u.architectures) <= archs, (name, u.architectures)


@pytest.mark.parametrize("engine,gpu,weights,layers,refused", [
    # TensorRT-LLM: FP8 from Ada on (its support matrix); MXFP4 experts not on SM80 (its error)
    ("trtllm", "a100-sxm-80gb", "fp8", "all", True),
    ("trtllm", "a10", "fp8", "all", True),
    ("trtllm", "l40s", "fp8", "all", False),
    ("trtllm", "h100-sxm", "fp8", "all", False),
    ("trtllm", "a100-sxm-80gb", "mxfp4", "experts", True),
    ("trtllm", "a100-sxm-80gb", "mxfp4", "all", False),  # the rule covers the experts only
    ("trtllm", "h100-sxm", "mxfp4", "experts", False),
    ("trtllm", "a100-sxm-80gb", "int4", "all", False),
    # vLLM: fp8 weight-only through Marlin from Ampere on; nothing below
    ("vllm", "a100-sxm-80gb", "fp8", "all", False),
    ("vllm", "t4", "fp8", "all", True),
    ("vllm-v0", "v100-sxm2-32gb", "fp8", "all", True),
    ("vllm", "t4", "mxfp4", "experts", True),
    ("vllm", "a100-sxm-80gb", "mxfp4", "experts", False),
    # profiles that state no rule refuse nothing
    ("sglang", "t4", "fp8", "all", False),
    ("ideal", "a100-sxm-80gb", "fp8", "all", False),
])
def test_refusal_by_weights_layers_and_architecture(engine, gpu, weights, layers, refused):
    e, hw = catalog.load_engine(engine), catalog.load_hardware(gpu)
    assert (e.refusal(weights, layers, hw.architecture) is not None) is refused


def test_estimate_refuses_in_one_line_naming_the_source(run_cli):
    # gpt-oss ships MXFP4 experts, its default: TensorRT-LLM 1.2 refused them on an A100
    code, out, err = run_cli("estimate", "-m", "gpt-oss-20b", "-g", "a100-sxm-80gb",
                             "-e", "trtllm")
    lines = err.strip().splitlines()
    assert code == 2 and not out and len(lines) == 1, err
    assert "TensorRT-LLM does not run mxfp4 (routed experts) weights on a100-sxm-80gb" in err
    assert "WFP4A16 MoE is unsupported on SM80" in err and "gpustack" in err
    code, _, err = run_cli("estimate", "-m", "gpt-oss-20b", "-g", "a100-sxm-80gb",
                           "-e", "trtllm", "--weights", "bf16")
    assert code == 0, err
    code, _, err = run_cli("estimate", "-m", "gpt-oss-20b", "-g", "h100-sxm", "-e", "trtllm")
    assert code == 0, err


def test_prepare_raises_before_any_ceiling():
    hw = catalog.load_hardware("t4")
    with pytest.raises(UsageError, match=r"vLLM does not run fp8 weights on t4 \(turing\)"):
        prepare(hw, Precision.of("fp8", compute="fp16"), None, Options(),
                catalog.load_engine("vllm"))


def test_sweep_marks_the_row_and_plan_skips_it(run_json, run_cli):
    rows = run_json("sweep", "-m", "llama-3.1-8b", "-g", "a100-sxm-80gb,h100-sxm",
                    "-e", "trtllm", "--weights", "bf16,fp8", "--batch", "1")
    by = {(r["gpu"], r["weights"]): r for r in rows}
    assert by[("a100-sxm-80gb", "fp8")]["supported"] is False
    assert "support matrix" in by[("a100-sxm-80gb", "fp8")]["note"]
    assert all(by[k]["supported"] for k in by if k != ("a100-sxm-80gb", "fp8"))
    plan = run_json("plan", "-m", "llama-3.1-8b", "-g", "a100-sxm-80gb,h100-sxm", "-e",
                    "trtllm", "--weights", "bf16,fp8", "--ttft", "2s", "--tpot", "100ms",
                    "--rps", "1", "--tp", "1")
    rows = plan["rows"] if isinstance(plan, dict) else plan
    assert rows and ("a100-sxm-80gb", "fp8") not in {(r["gpu"], r["weights"]) for r in rows}
    assert ("a100-sxm-80gb", "bf16") in {(r["gpu"], r["weights"]) for r in rows}


@pytest.mark.parametrize("archs", [["volta", "turnig"], ["Volta"], ["hopper", ""]])
def test_a_rule_naming_no_known_architecture_is_refused(archs):
    """A misspelt or capitalised architecture would match no GPU and the rule would never
    refuse anything: the profile is refused instead, naming the field."""
    spec = catalog.load_engine_spec("vllm")
    data = spec.model_dump(exclude_none=True)
    data["unsupported"][0]["architectures"] = archs
    with pytest.raises(ValueError, match=r"unsupported\.0\.architectures"):
        type(spec).model_validate(data)
