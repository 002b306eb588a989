"""TensorRT-LLM's two profiles (issue 24 §1): `trtllm`, the PyTorch backend of 1.0 and later
(trtllm-serve's default), and `trtllm-engine`, the TensorRT engines of 0.x (and 1.x's
--backend tensorrt), which keeps the fit on the 0.8 / 0.9 tables."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.core.engine import release_in
from planner.core.errors import LlmplanError
from planner.io import catalog

DATA = Path(__file__).resolve().parents[1] / "planner" / "data"

FITTED = ("step_overhead_us", "prefill_step_overhead_us", "gemm_compute_frac", "overlap_frac")


@pytest.mark.parametrize("ref, name", [("trtllm@0.9.0", "trtllm-engine"),
                                       ("trtllm@0.12", "trtllm-engine"),
                                       ("trtllm@1.0", "trtllm"), ("trtllm@1.2.0", "trtllm")])
def test_a_release_picks_its_backends_profile(ref, name):
    """Before 1.0 trtllm-serve ran a TensorRT engine; from 1.0 the PyTorch backend."""
    assert catalog.load_engine_spec(ref).name == name


def test_a_release_before_the_engines_fit_is_refused_naming_both_spans():
    with pytest.raises(LlmplanError, match=r"trtllm-engine: 0\.9 - 1\.0; trtllm: 1\.0 - latest"):
        catalog.load_engine_spec("trtllm@0.8")


def test_the_backend_profile_carries_the_engines_fit_and_takes_its_own_kernels():
    """The fitted step costs and compute shares are the engines' (no run of the PyTorch backend
    is fitted), each saying so and naming the same rows; the kernel figures differ where
    aiconfigurator's tables of the PyTorch backend say so: decode GEMMs at 0.967 of the copy
    ceiling (0.9, a guess, in the engines'), decode attention at 0.915 (1, fitted), 15.3 us a
    call on Hopper (none)."""
    new, old = catalog.load_engine_spec("trtllm"), catalog.load_engine_spec("trtllm-engine")
    for field in FITTED:
        a, b = getattr(new, field), getattr(old, field)
        assert a.value == b.value and a.fitted_on == b.fitted_on and a.fitted_on, field
        assert "carried over from trtllm-engine.yaml" in a.note, field
    assert new.quantized["fp8"].compute_frac.value == old.quantized["fp8"].compute_frac.value
    assert (new.gemm_bandwidth_frac.value, old.gemm_bandwidth_frac.value) == (0.967, 0.9)
    assert (new.attention_bandwidth_frac.value, old.attention_bandwidth_frac.value) == (0.915, 1)
    assert not new.attention_bandwidth_frac.fitted_on and old.attention_bandwidth_frac.fitted_on
    assert new.attention_fixed_us.value == {"ampere": 19.9, "hopper": 15.3, "blackwell": 10.7}
    assert old.attention_fixed_us is None
    for f in ("gemm_bandwidth_frac", "gemm_bandwidth_arch_frac", "attention_bandwidth_frac",
              "attention_bandwidth_arch_frac", "attention_fixed_us"):
        spec = getattr(new, f)
        assert "aiconfigurator" in spec.source and "not fitted" in spec.note, f


def test_what_only_the_pytorch_backend_does_is_not_in_the_engines_profile():
    """Captured CUDA-graph sizes, the overlap scheduler and the fp8 GEMM's input-quantization
    kernels (each from 1.0 in the backend's profile) and the MLA figure from the 1.3 tables."""
    new, old = catalog.load_engine_spec("trtllm"), catalog.load_engine_spec("trtllm-engine")
    assert new.serving.cuda_graph_sizes is not None and old.serving.cuda_graph_sizes is None
    assert new.serving.async_scheduling is not None and old.serving.async_scheduling is None
    assert new.fp8_quant_kernels is not None and old.fp8_quant_kernels is None
    assert new.operator_fixed_us.value == {"mla_kv_up_proj": 6} and old.operator_fixed_us is None
    # the engines' scheduler otherwise as before: no-evict admission, 8,192 tokens a step
    assert old.serving.capacity_policy.value == new.serving.capacity_policy.value
    assert old.serving.max_num_batched_tokens.value == 8192


def test_no_attention_share_passes_the_copy_ceiling_on_any_architecture():
    """The A100's table reads the cache at 1.254 of the H100's share, above hardware_db's
    achievable copy rate there: the factor is held where the share reaches 1."""
    e = catalog.load_engine_spec("trtllm").model()
    for arch in ("ampere", "ada", "hopper", "blackwell"):
        g = e.for_gpu(80e9, "x", arch)
        assert g.attention_bandwidth_frac * g.attention_bandwidth_arch_frac <= 1.0, arch
        assert g.gemm_bandwidth_frac * g.gemm_bandwidth_arch_frac <= 1.0, arch


def test_the_validation_sources_name_the_profile_of_their_backend():
    """The 0.x static tables were TensorRT engines; GPUStack's TensorRT-LLM runs (1.0.0 and
    1.2.0rc1) the PyTorch backend, the profile each run's release picks."""
    for v in ("0.5.0", "0.6.1", "0.8.0", "0.9.0"):
        src = yaml.safe_load((DATA / "validation" / f"trtllm-v{v}.yaml").read_text())
        assert src["source"]["engine"] == "trtllm-engine", v
    served = yaml.safe_load((DATA / "served" / "gpustack-perf-lab.yaml").read_text())
    trt = [r for r in served["runs"] if r.get("engine", served["source"]["engine"]) == "trtllm"]
    assert len(trt) == 22
    for r in trt:
        release = release_in(r["engine_version"], "trtllm")
        assert release is not None, r["id"]
        assert catalog.load_engine_spec(f"trtllm@{release}").name == "trtllm", r["id"]
