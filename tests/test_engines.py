"""Engine profiles and achievable ceilings: the databases, the time model, the invariants."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.core.achievable import BANDWIDTH_FRAC, achievable, matmul_frac_for
from planner.core.engine import IDEAL, Engine
from planner.core.estimate import estimate
from planner.core.ops import Op
from planner.core.roofline import Ceilings, ceilings, op_time
from planner.core.specs import DType, Parallelism, Precision, Workload
from planner.io import catalog

ENGINES = catalog.engine_names()
GPUS = catalog.gpu_names()


def test_the_six_profiles_exist():
    assert set(ENGINES) >= {"ideal", "vllm", "sglang", "trtllm", "gpt-fast", "hf-eager"}


@pytest.mark.parametrize("name", ENGINES)
def test_every_engine_parameter_carries_a_source(name):
    spec = catalog.load_engine_spec(name)
    assert spec.source.startswith("http")
    params = spec.parameters()
    assert len(params) >= 25
    for key, p in params.items():
        assert p.source.strip(), f"{name}.{key} has no source"
        # a figure is either sourced as measured / derived, documented as a guess, fitted,
        # or a definition of the ideal bound
        assert p.source.startswith(("http", "definition", "as vLLM", "common", "one kernel",
                                    "symmetric")) or p.estimated or p.fitted_on, (name, key)


@pytest.mark.parametrize("name", ENGINES)
def test_fitted_rows_exist_in_the_dataset(name):
    """A fitted_on entry names a static validation row or a served run (source:run)."""
    rows = {f"{d.source.id}:{r.id}" for d in catalog.load_datasets() for r in d.rows}
    rows |= {f"{d.source.id}:{r.id}" for d, _ in catalog.load_served() for r in d.runs}
    spec = catalog.load_engine_spec(name)
    missing = spec.fitted_rows() - rows
    assert not missing, f"{name} names rows that are not in the dataset: {sorted(missing)[:3]}"


def test_ideal_yaml_is_the_ideal_bound():
    e = catalog.load_engine("ideal")
    assert e.is_ideal
    assert e.time_model_key() == IDEAL.time_model_key()
    assert (e.lm_head_sharded, e.lm_head_quantized, e.zero_point_bytes_per_group) == \
        (IDEAL.lm_head_sharded, IDEAL.lm_head_quantized, IDEAL.zero_point_bytes_per_group)


@pytest.mark.parametrize("name", [n for n in ENGINES if n != "ideal"])
def test_real_engines_are_not_ideal(name):
    assert not catalog.load_engine(name).is_ideal


@pytest.mark.parametrize("model,gpu,tp,weights,batch,p,o", [
    ("llama-3.1-8b", "h100-sxm", 1, "bf16", 16, 2048, 256),
    ("llama-3.1-70b", "h100-sxm", 4, "fp8", 32, 1024, 128),
    ("mixtral-8x7b", "a100-sxm-80gb", 2, "int4", 8, 512, 512),
    ("deepseek-v3", "h200", 8, "fp8", 4, 4096, 64),
])
def test_engine_ideal_reproduces_the_roofline_exactly(model, gpu, tp, weights, batch, p, o):
    m, hw = catalog.load_model(model), catalog.load_hardware(gpu)
    kw = dict(precision=Precision.of(weights), parallelism=Parallelism(tp=tp),
              workload=Workload(batch=batch, prompt_tokens=p, output_tokens=o))
    a = estimate(m, hw, **kw)  # the library default: the built-in IDEAL
    b = estimate(m, hw, engine=catalog.load_engine("ideal"), **kw)
    assert a.ideal is None and b.ideal is None
    assert (a.tpot_s, a.ttft_s, a.memory.total_bytes, a.mbu, a.mfu) == \
        (b.tpot_s, b.ttft_s, b.memory.total_bytes, b.mbu, b.mfu)


def test_readme_example_under_ideal_is_unchanged(run_json):
    # the figures the README printed before engine profiles existed (datasheet roofline)
    d = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "16", "-p", "2048",
                 "-o", "256", "--engine", "ideal")
    assert d["tpot_s"] == pytest.approx(5.9e-3, rel=0.01)
    assert d["ttft_s"] == pytest.approx(0.534, rel=0.01)
    assert d["mbu"] == pytest.approx(0.991, rel=0.002)
    assert d["ideal"]["tpot_s"] == d["tpot_s"]


def test_default_engine_is_vllm_with_the_bound_beside(run_json):
    d = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "16", "-p", "2048",
                 "-o", "256")
    assert d["engine"]["name"] == "vllm"
    assert d["engine"]["ceilings"] == "achievable"
    for k in ("ttft_s", "tpot_s", "latency_s", "throughput_tokens_per_s", "mbu", "mfu"):
        assert k in d and k in d["ideal"]
    assert d["tpot_s"] > d["ideal"]["tpot_s"] * 1.2  # the engine is well off the bound ...
    assert d["mbu"] < 0.85  # ... and its MBU against the datasheet shows it
    assert d["ideal"]["mbu"] > 0.95
    ops = d["operators"]["decode"]
    assert {"bandwidth_frac", "compute_frac", "kernels", "bandwidth_source"} <= set(ops[0])
    assert d["operators"]["decode_fixed_s"] > 0


# --------------------------------------------------------------------------- by hand

H = Engine(name="hand", ceilings="achievable", kernel_gap_s=2e-6, host_launch_s=10e-6,
           gemm_bandwidth_frac=0.8, gemm_compute_frac=0.5, gemm_tile_m=16.0, overlap_frac=0.5,
           kernels=(("matmul", 2.0),), allreduce_latency_s=10e-6, allreduce_bandwidth_frac=0.5)
C = Ceilings(bandwidth_bytes_per_s=1e12, flops_per_s={DType.bf16: 100e12},
             link_bytes_per_s=100e9)


def test_matmul_time_by_hand():
    # M = 4 rows padded to a 16-row tile: 4x the FLOPs. compute = 4 x 8e9 / (100e12 x 0.5)
    # = 640 us; memory = 400e6 B / (1e12 x 0.8) = 500 us; overlap 0.5 hides half the shorter:
    # 640 + 500 - 250 = 890 us; 2 kernels x 2 us = 4 us: 894 us per instance, x3 instances
    op = Op("gemm", "matmul", 3, flops=8e9, weight_bytes=4e8, m_rows=4.0)
    t = op_time(op, C, engine=H)
    assert t.compute_s == pytest.approx(3 * 640e-6)
    assert t.memory_s == pytest.approx(3 * 500e-6)
    assert t.time_s == pytest.approx(3 * 894e-6)
    assert t.overhead_s == pytest.approx(3 * 4e-6)


def test_host_floor_when_not_graphed():
    tiny = Op("tiny", "matmul", 1, flops=2e3, weight_bytes=1e3, m_rows=16.0)
    assert op_time(tiny, C, engine=H, graphed=True).time_s == pytest.approx(4e-6, rel=1e-3)
    assert op_time(tiny, C, engine=H, graphed=False).time_s == pytest.approx(20e-6)


def test_fp8_gemms_pay_their_input_quantization_kernels():
    # W8A8 fp8: 2 kernels of the GEMM + 2 quantizing its input = 4 x 2 us on top of the same
    # roofline time; a weight-only fp8 GEMM (16-bit compute, as on an A100) and a bf16 one
    # launch only their own 2
    e = dataclasses.replace(H, fp8_quant_kernels=2.0)
    c = dataclasses.replace(C, flops_per_s={DType.bf16: 100e12, DType.fp8: 100e12})
    w8a8 = Op("gemm", "matmul", 3, flops=8e9, weight_bytes=4e8, m_rows=4.0, dtype=DType.fp8,
              weight_dtype=DType.fp8)
    weight_only = dataclasses.replace(w8a8, dtype=DType.bf16)
    t, t16 = op_time(w8a8, c, engine=e), op_time(weight_only, c, engine=e)
    assert t.kernels == 3 * 4 and t16.kernels == 3 * 2
    assert t.overhead_s == pytest.approx(3 * 8e-6)
    assert t.time_s - t16.time_s == pytest.approx(3 * 4e-6)
    assert op_time(w8a8, c, engine=H).kernels == 3 * 2  # the default: none counted


def test_fp8_weights_without_fp8_tensor_cores_run_the_marlin_path():
    # an A100 has no fp8 tensor cores: fp8 weights are dequantized in a 16-bit GEMM (vLLM's
    # fp8 Marlin kernel), at the int8 Marlin path's efficiencies, with no input quantization
    e = dataclasses.replace(H, quantized=((DType.int8, (0.5, 0.25)), (DType.fp8, (0.9, 0.9))),
                            fp8_quant_kernels=2.0)
    op = Op("gemm", "matmul", 1, flops=8e9, weight_bytes=4e8, m_rows=16.0, dtype=DType.bf16,
            weight_dtype=DType.fp8)
    t = op_time(op, C, engine=e)
    assert (t.bandwidth_frac, t.compute_frac) == (0.5, 0.25)
    assert t.memory_s == pytest.approx(4e8 / (1e12 * 0.5))
    assert t.kernels == 2  # the GEMM's own
    w8a8 = dataclasses.replace(op, dtype=DType.fp8)
    c = dataclasses.replace(C, flops_per_s={DType.bf16: 100e12, DType.fp8: 100e12})
    assert op_time(w8a8, c, engine=e).bandwidth_frac == 0.9


def test_served_compute_share_slows_every_matmul_alike():
    # a served step's matmuls attain s = 0.5 of their kernels' compute rate: a bf16 GEMM's
    # compute time doubles (0.5 -> 0.25 of 100 TFLOP/s), and so does a quantized one's, at its
    # own path's efficiency (int4: 0.75 -> 0.375); memory time, attention and element-wise
    # kernels are untouched
    e = dataclasses.replace(H, quantized=((DType.int4, (0.9, 0.75)),), overlap_frac=1.0)
    half = dataclasses.replace(e, served_compute_frac=0.5)
    gemm = Op("gemm", "matmul", 1, flops=8e12, weight_bytes=4e8, m_rows=4096.0)
    w4 = dataclasses.replace(gemm, weight_dtype=DType.int4)
    for op, frac in ((gemm, 0.5), (w4, 0.75)):
        t, th = op_time(op, C, engine=e), op_time(op, C, engine=half)
        assert t.compute_frac == frac and th.compute_frac == frac / 2
        assert t.compute_s == pytest.approx(8e12 / (100e12 * frac))
        assert th.compute_s == pytest.approx(2 * t.compute_s)
        assert th.memory_s == t.memory_s
    attn = Op("attn", "attention", 1, flops=8e12, act_bytes=4e8)
    norm = Op("norm", "elementwise", 1, flops=1e9, act_bytes=4e8)
    for op in (attn, norm):
        assert op_time(op, C, engine=half).time_s == op_time(op, C, engine=e).time_s


def test_fused_moe_factor_slows_16_bit_experts_on_its_architectures_only():
    """experts_compute_frac: resolved for the GPU's architecture (1 where it names none),
    applied to a routed expert's 16-bit matmul and nothing else."""
    e = dataclasses.replace(H, quantized=((DType.int4, (0.9, 0.75)),), overlap_frac=1.0,
                            experts_compute_by_arch=(("ampere", 0.5), ("hopper", 0.8)))
    assert e.for_gpu(80e9, "a100", "ampere").experts_compute_frac == 0.5
    assert e.for_gpu(80e9, "h100", "Hopper").experts_compute_frac == 0.8
    assert e.for_gpu(48e9, "l40s", "ada").experts_compute_frac == 1.0
    assert e.for_gpu(48e9, "mine", None).experts_compute_frac == 1.0
    half = e.for_gpu(80e9, "a100", "ampere")
    expert = Op("experts_gate_up_proj", "matmul", 1, flops=8e12, weight_bytes=4e8,
                m_rows=4096.0)
    dense = dataclasses.replace(expert, name="mlp_gate_up_proj")
    w4 = dataclasses.replace(expert, weight_dtype=DType.int4)
    t, th = op_time(expert, C, engine=e.for_gpu(48e9, "l40s", "ada")), \
        op_time(expert, C, engine=half)
    assert th.compute_frac == pytest.approx(t.compute_frac * 0.5)
    assert th.compute_s == pytest.approx(2 * t.compute_s) and th.memory_s == t.memory_s
    for op in (dense, w4):  # a plain GEMM, quantized experts: their own paths
        assert op_time(op, C, engine=half).time_s == op_time(op, C, engine=e).time_s


def test_fp8_moe_factor_slows_fp8_experts_on_its_architectures_only():
    """experts_fp8_compute_frac: resolved for the GPU's architecture (1 where it names none),
    applied to a routed expert's matmul in fp8 weights and fp8 arithmetic, by hand: compute
    8e12 / (200e12 x 0.9 x 0.4) = 111 us, 0.4 of the unfactored 44.4 us. Not to 16-bit
    experts, a plain fp8 GEMM, or fp8 weights computed in 16 bits (W8A16, an A100's)."""
    c = dataclasses.replace(C, flops_per_s={DType.bf16: 100e12, DType.fp8: 200e12})
    e = dataclasses.replace(H, quantized=((DType.fp8, (0.9, 0.9)), (DType.int8, (0.8, 0.7))),
                            overlap_frac=1.0, experts_fp8_compute_by_arch=(("hopper", 0.4),))
    slow, other = e.for_gpu(80e9, "h100", "hopper"), e.for_gpu(48e9, "l40s", "ada")
    assert (slow.experts_fp8_compute_frac, other.experts_fp8_compute_frac) == (0.4, 1.0)
    assert slow.experts_compute_frac == 1.0  # the 16-bit factor is another field
    fp8 = Op("experts_gate_up_proj", "matmul", 1, flops=8e12, weight_bytes=4e8,
             m_rows=4096.0, dtype=DType.fp8, weight_dtype=DType.fp8)
    t, ts = op_time(fp8, c, engine=other), op_time(fp8, c, engine=slow)
    assert t.compute_s == pytest.approx(8e12 / (200e12 * 0.9))
    assert ts.compute_s == pytest.approx(8e12 / (200e12 * 0.9 * 0.4))
    assert ts.memory_s == t.memory_s
    w8a16 = dataclasses.replace(fp8, dtype=DType.bf16)  # an A100's: the int8 path's rates
    assert op_time(w8a16, c, engine=other).compute_s == pytest.approx(8e12 / (100e12 * 0.7))
    for op in (dataclasses.replace(fp8, dtype=DType.bf16, weight_dtype=DType.bf16),
               dataclasses.replace(fp8, name="mlp_gate_up_proj"), w8a16):
        assert op_time(op, c, engine=slow).time_s == op_time(op, c, engine=other).time_s
    assert slow.time_model_key() != dataclasses.replace(
        slow, experts_fp8_compute_frac=1.0).time_model_key()


def _sourced_and_shown(spec, row: dict, field: str, value: dict) -> None:
    """A profile's figure by architecture: ``value`` in its file, taken from aiconfigurator's
    tables, and the same in `engines --json`."""
    assert getattr(spec, field).value == value
    assert "aiconfigurator" in getattr(spec, field).source
    assert row[field] == value


def test_the_fp8_moe_factors_of_the_profiles_are_sourced_and_shown(run_json):
    rows = {r["name"]: r for r in run_json("engines", "--json")}
    for name in ("vllm", "vllm-0.8"):
        spec = catalog.load_engine_spec(name)
        _sourced_and_shown(spec, rows[name], "experts_fp8_compute_frac", {"hopper": 0.64})
        _sourced_and_shown(spec, rows[name], "experts_fp8_k_half", {"hopper": 900})
        e = catalog.load_engine(name).for_gpu(80e9, "h100-sxm", "hopper")
        assert (e.experts_k_half, e.experts_fp8_k_half) == (500, 900)
        assert rows[name]["experts_compute_frac"] == spec.experts_compute_frac.value
        _sourced_and_shown(spec, rows[name], "experts_k_half", {"hopper": 500, "ada": 1000})
    # SGLang's and TensorRT-LLM's tables give no one figure across shapes (docs/validation.md)
    for name in ("sglang", "trtllm"):
        assert rows[name]["experts_fp8_compute_frac"] == {}
        assert rows[name]["experts_k_half"] == {} == rows[name]["experts_fp8_k_half"]
    assert rows["trtllm"]["experts_compute_frac"] == {}


def test_fused_moe_factors_of_the_profiles_are_sourced_and_checked():
    spec = catalog.load_engine_spec("vllm")
    f = spec.experts_compute_frac
    # every NVIDIA class aiconfigurator times vLLM's MoE layer on (A100, L40S, H100/H200, B200)
    assert set(f.value) == {"ampere", "ada", "hopper", "blackwell"}
    assert "aiconfigurator" in f.source
    # with a depth (Hopper, Ada) the factor is the rate as K grows, above 1 there; at the
    # widest expert the tables time (16,384) the kernel stays under the achievable rate
    # (gemm_compute_frac 0.9 of it); without one (Ampere, Blackwell) it is under 1
    for gpu in ("a100-sxm-80gb", "l40s", "h100-sxm", "b200"):
        arch = catalog.load_hardware(gpu).architecture
        e = catalog.load_engine("vllm").for_gpu(80e9, gpu, arch)
        wide = 16384 / (16384 + e.experts_k_half)
        assert e.experts_compute_frac * wide * e.gemm_compute_frac < 1
        assert e.experts_k_half or e.experts_compute_frac < 1
    assert all(0 < v <= 1.1 for v in f.value.values())


def test_a_fused_moe_gemm_keeps_k_over_k_plus_the_depth_of_its_rate():
    """experts_k_half: a routed expert's GEMM of depth K computes at K / (K + k_half) of its
    lane's rate, by hand: K 500 against 500 halves it (compute 8e12 / (100e12 x 0.5 x 0.8
    x 0.5) = 0.4 s); K 1,500: 0.75. 16-bit and fp8 experts alike; not a plain GEMM, not
    MXFP4 / int4 experts (other kernels), not a matmul whose depth is not stated, not an
    architecture the profile names none for, not a lane whose factor the profile does not
    state for the architecture (the depth is derived with it: Ada's fp8 experts here)."""
    c = dataclasses.replace(C, flops_per_s={DType.bf16: 100e12, DType.fp8: 200e12})
    e = dataclasses.replace(H, quantized=((DType.fp8, (0.9, 0.9)), (DType.int4, (0.9, 0.75))),
                            overlap_frac=1.0,
                            experts_compute_by_arch=(("ada", 0.8), ("hopper", 0.8)),
                            experts_fp8_compute_by_arch=(("hopper", 0.5),),
                            experts_k_half_by_arch=(("ada", 500.0), ("hopper", 500.0)))
    hop, ada = e.for_gpu(80e9, "h100", "hopper"), e.for_gpu(48e9, "l40s", "ada")
    other = e.for_gpu(80e9, "a100", "ampere")
    assert (hop.experts_k_half, hop.experts_fp8_k_half) == (500.0, 500.0)
    assert (ada.experts_k_half, ada.experts_fp8_k_half) == (500.0, 0.0)
    assert (other.experts_k_half, other.experts_fp8_k_half) == (0.0, 0.0)
    op = Op("experts_down_proj", "matmul", 1, flops=8e12, weight_bytes=4e8, m_rows=4096.0,
            k_dim=500.0)
    assert op_time(op, c, engine=hop).compute_s == pytest.approx(8e12 / (100e12 * 0.2))
    deep = dataclasses.replace(op, k_dim=1500.0)
    assert op_time(deep, c, engine=hop).compute_s == pytest.approx(
        8e12 / (100e12 * 0.5 * 0.8 * 0.75))
    fp8 = dataclasses.replace(op, dtype=DType.fp8, weight_dtype=DType.fp8)
    assert op_time(fp8, c, engine=hop).compute_s == pytest.approx(
        8e12 / (200e12 * 0.9 * 0.5 * 0.5))
    assert op_time(fp8, c, engine=hop).compute_s == pytest.approx(
        2 * op_time(fp8, c, engine=dataclasses.replace(hop, experts_fp8_k_half=0.0)).compute_s)
    # Ada: the 16-bit lane at its factor and depth, the fp8 lane at neither
    assert op_time(op, c, engine=ada).compute_s == pytest.approx(8e12 / (100e12 * 0.2))
    assert op_time(fp8, c, engine=ada).compute_s == pytest.approx(8e12 / (200e12 * 0.9))
    for same in (dataclasses.replace(op, name="mlp_down_proj"),
                 dataclasses.replace(op, weight_dtype=DType.int4, dtype=DType.bf16),
                 dataclasses.replace(op, k_dim=0.0)):
        assert op_time(same, c, engine=hop).compute_s == op_time(
            same, c, engine=dataclasses.replace(hop, experts_k_half=0.0)).compute_s
    assert op_time(op, c, engine=other).compute_s == pytest.approx(8e12 / (100e12 * 0.5))
    for field in ("experts_k_half", "experts_fp8_k_half"):
        assert hop.time_model_key() != dataclasses.replace(
            hop, **{field: 0.0}).time_model_key()
    # the fp8 lane's own depth where the profile states one; the 16-bit lane keeps its own
    own = dataclasses.replace(e, experts_fp8_k_half_by_arch=(("ada", 700.0), ("hopper", 1500.0)))
    hop8, ada8 = own.for_gpu(80e9, "h100", "hopper"), own.for_gpu(48e9, "l40s", "ada")
    assert (hop8.experts_k_half, hop8.experts_fp8_k_half) == (500.0, 1500.0)
    assert (ada8.experts_k_half, ada8.experts_fp8_k_half) == (500.0, 0.0)  # no fp8 factor
    assert op_time(fp8, c, engine=hop8).compute_s == pytest.approx(
        8e12 / (200e12 * 0.9 * 0.5 * 0.25))  # 500 / (500 + 1,500)
    assert op_time(op, c, engine=hop8).compute_s == pytest.approx(8e12 / (100e12 * 0.2))


_FRACS = ["experts_compute_frac", "experts_fp8_compute_frac", "gemm_bandwidth_arch_frac",
          "attention_bandwidth_arch_frac", "fp8_kv_attention_compute_frac"]
_BAD_FRACS = [{}, {"ampere": 0.0}, {"ampere": 3.0}, {"ampere": float("nan")},
              {"Ampere": 0.9},  # for_gpu looks architectures up in lower case
              {"hoper": 0.9}]  # a misspelt name would never apply
# a GEMM depth (experts_k_half): positive, finite, at most 100,000 elements
_BAD_DEPTHS = [{}, {"hopper": 0}, {"hopper": -5}, {"hopper": float("nan")}, {"hopper": 1e6},
               {"Hopper": 500}, {"hoper": 500}]


@pytest.mark.parametrize("field, bad", [(f, b) for f in _FRACS for b in _BAD_FRACS]
                         + [(f, b) for f in ("experts_k_half", "experts_fp8_k_half")
                            for b in _BAD_DEPTHS])
def test_a_factor_by_architecture_is_refused_where_it_cannot_apply(field, bad):
    spec = catalog.load_engine_spec("vllm")
    data = spec.model_dump(exclude_none=True)
    data[field]["value"] = bad
    with pytest.raises(ValueError, match=field):
        type(spec).model_validate(data)


def test_gemm_bandwidth_factor_slows_16_bit_gemms_on_its_architectures_only():
    """gemm_bandwidth_arch_frac: resolved for the GPU's architecture (1 where it names none),
    applied to a plain 16-bit GEMM's bandwidth and nothing else: not a routed expert (its
    fused kernel), a quantized GEMM, attention or a norm."""
    e = dataclasses.replace(H, quantized=((DType.int4, (0.9, 0.75)),), overlap_frac=1.0,
                            gemm_bandwidth_by_arch=(("ampere", 0.5), ("ada", 0.8)))
    assert e.for_gpu(80e9, "a100", "Ampere").gemm_bandwidth_arch_frac == 0.5
    assert e.for_gpu(48e9, "l40s", "ada").gemm_bandwidth_arch_frac == 0.8
    assert e.for_gpu(80e9, "h100", "hopper").gemm_bandwidth_arch_frac == 1.0
    assert e.for_gpu(48e9, "mine", None).gemm_bandwidth_arch_frac == 1.0
    half, ref = e.for_gpu(80e9, "a100", "ampere"), e.for_gpu(80e9, "h100", "hopper")
    # one decode token through a 400 MB projection: its time is the weights' streaming
    gemm = Op("mlp_gate_up_proj", "matmul", 1, flops=4e8, weight_bytes=4e8, m_rows=1.0)
    t, th = op_time(gemm, C, engine=ref), op_time(gemm, C, engine=half)
    assert th.memory_s == pytest.approx(2 * t.memory_s) and th.compute_s == t.compute_s
    assert th.time_s > 1.9 * t.time_s
    expert = dataclasses.replace(gemm, name="experts_gate_up_proj")
    w4 = dataclasses.replace(gemm, weight_dtype=DType.int4)
    attn = Op("attn", "attention", 1, flops=8e9, act_bytes=4e8)
    norm = Op("norm", "elementwise", 1, flops=1e9, act_bytes=4e8)
    for op in (expert, w4, attn, norm):
        assert op_time(op, C, engine=half).time_s == op_time(op, C, engine=ref).time_s


def test_vllm_gemm_bandwidth_factors_are_sourced_and_slow_the_ampere_decode():
    """The vllm profile's factors (benchmarks/aiconfigurator_gemm.py on aiconfigurator's vLLM
    GEMM tables): Hopper, the reference, keeps 1; Llama-3.1-8B's batch-1 decode on an A100,
    all but its KV read and fixed costs a 16-bit GEMM's weights, slows by nearly 1 / 0.90."""
    spec = catalog.load_engine_spec("vllm")
    f = spec.gemm_bandwidth_arch_frac
    assert "aiconfigurator" in f.source and "hopper" not in f.value
    assert f.value == {"ampere": 0.90, "ada": 0.88, "blackwell": 0.95}
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("a100-sxm-80gb")
    w = Workload(batch=1, prompt_tokens=128, output_tokens=128)

    def tpot(s):
        return estimate(m, hw, workload=w, engine=s.model()).tpot_s

    flat = spec.model_copy(update={"gemm_bandwidth_arch_frac": None})
    assert 1.08 < tpot(spec) / tpot(flat) < 1 / 0.90


def test_served_compute_share_is_validated_and_defaults_to_one():
    spec = catalog.load_engine_spec("vllm-0.8")
    assert 0.3 <= spec.model().served_compute_frac < 1  # fitted on served runs
    assert catalog.load_engine("vllm").served_compute_frac == 1.0  # none stated: the kernels'
    data = spec.model_dump(exclude_none=True)
    for bad in (0.0, 1.5, -0.2):
        data["served_compute_frac"]["value"] = bad
        with pytest.raises(ValueError, match="served_compute_frac"):
            type(spec).model_validate(data)


def test_trtllms_capture_sizes_start_at_1_0_and_a_rule_must_capture_something():
    """Before 1.0 trtllm-serve ran a TensorRT engine by default ('Default is cpp path'): no
    PyTorch-backend capture sizes. A capture rule with neither sizes nor steps would capture
    nothing while reading as "any batch graphed": refused in one line naming the field."""
    for release, captured in (("0.12", False), ("0.19.1", False), ("1.0", True), ("1.2", True)):
        e = catalog.load_engine_spec(f"trtllm@{release}").model()
        assert (e.graph_rule is not None) == captured, release
        assert e.graph_padding == (not captured), release
    spec = catalog.load_engine_spec("trtllm")
    data = spec.model_dump(exclude_none=True, by_alias=True)
    del data["serving"]["cuda_graph_sizes"]["sizes"]
    with pytest.raises(ValueError, match="give sizes or steps"):
        type(spec).model_validate(data)
    data["serving"]["cuda_graph_sizes"]["sizes"] = [1, 2]
    data["serving"]["cuda_graph_sizes"]["since"] = "one"
    with pytest.raises(ValueError, match="since"):
        type(spec).model_validate(data)


@pytest.mark.parametrize("engine,per_gemm", [("vllm", 2), ("sglang", 1), ("trtllm", 3),
                                             ("trtllm@0.9", 0)])
def test_llama_fp8_decode_step_launches_the_quantizing_kernels(engine, per_gemm):
    # Llama-3.1-8B: 32 layers x 4 fp8 GEMMs (QKV, o, gate_up, down); the lm_head stays 16-bit.
    # TensorRT-LLM's PyTorch backend (1.0 on) counts its fp8 GEMM's fixed cost as 3; a built
    # TensorRT engine (0.9) fuses the quantization
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    e = catalog.load_engine(engine)
    w = Workload(batch=8, prompt_tokens=512, output_tokens=64)

    def kernels(weights):
        r = estimate(m, hw, precision=Precision(weights=weights), workload=w, engine=e)
        return sum(t.kernels for t in r.decode.ops)

    assert kernels(DType.fp8) - kernels(DType.bf16) == 32 * 4 * per_gemm


def test_allreduce_by_hand():
    # ring over 4 GPUs: 2 x 3/4 x 8 MB / (100 GB/s x 0.5) + 10 us = 240 + 10 us
    op = Op("ar", "allreduce", 1, flops=0.0, comm_bytes=8e6)
    assert op_time(op, C, tp=4, engine=H).time_s == pytest.approx(250e-6)


def test_pcie_groups_above_two_pay_nccls_ring_latency():
    # 8 PCIe GPUs: the engine's own all-reduce does not run there; NCCL's ring takes 2 x 7 hops
    # of 3.2 us = 44.8 us; 2 GPUs keep the engine's 10 us; NVLink keeps it at every size
    op = Op("ar", "allreduce", 1, flops=0.0, comm_bytes=0.0)
    pcie = dataclasses.replace(C, pcie_only=True)
    assert op_time(op, pcie, tp=8, engine=H).time_s == pytest.approx(44.8e-6)
    assert op_time(op, pcie, tp=4, engine=H).time_s == pytest.approx(19.2e-6)
    assert op_time(op, pcie, tp=2, engine=H).time_s == pytest.approx(10e-6)
    assert op_time(op, C, tp=8, engine=H).time_s == pytest.approx(10e-6)


@pytest.mark.parametrize("gpu,pcie", [("l40s", True), ("h100-pcie", True), ("h100-sxm", False),
                                      ("a100-sxm-80gb", False)])
def test_pcie_only_is_read_from_the_interconnect_for_real_engines_only(gpu, pcie):
    hw = catalog.load_hardware(gpu)
    assert ceilings(hw, engine=catalog.load_engine("vllm")).pcie_only is pcie
    assert ceilings(hw, engine=IDEAL).pcie_only is False  # the ideal bound has no fallback


def test_gqa_without_kv_reuse_reads_kv_per_query_head():
    op = Op("attention", "attention", 1, flops=1.0, kv_bytes=1e9, kv_group=4.0)
    reuse = op_time(op, C, engine=Engine(name="a", attention_bandwidth_frac=1.0))
    no = op_time(op, C, engine=Engine(name="b", gqa_kv_reuse=False))
    assert no.memory_s == pytest.approx(4 * reuse.memory_s)


# --------------------------------------------------------------------------- hardware


@pytest.mark.parametrize("name", GPUS)
def test_every_gpu_has_a_sourced_achievable_block(name):
    hw = catalog.load_hardware(name)
    a = hw.achievable
    assert a is not None and hw.memory_type and hw.architecture
    figs = [a.memory_bandwidth_gb_per_s, *a.matmul_tflops.values()]
    for f in figs:
        assert f.source.strip() and (f.source.startswith("http") or f.estimated)
    assert set(a.matmul_tflops) == set(hw.peak_tflops)
    # a real kernel never beats the datasheet
    assert a.memory_bandwidth_gb_per_s.value <= hw.memory_bandwidth_gb_per_s
    for dt, f in a.matmul_tflops.items():
        assert f.value <= hw.peak_tflops[dt] * 1.0001, (name, dt)


@pytest.mark.parametrize("name", GPUS)
def test_estimated_fractions_match_the_documented_table(name):
    hw = catalog.load_hardware(name)
    a = hw.achievable
    bw = a.memory_bandwidth_gb_per_s
    if bw.estimated and (bw.method or "").startswith("fraction"):
        assert bw.value == round(hw.memory_bandwidth_gb_per_s * BANDWIDTH_FRAC[hw.memory_type])
    for dt, f in a.matmul_tflops.items():
        if f.estimated and (f.method or "").startswith("fraction"):
            assert f.value == pytest.approx(hw.peak_tflops[dt]
                                            * matmul_frac_for(hw.architecture, dt), abs=0.06)


def test_a_gpu_without_achievable_figures_gets_the_documented_fractions(gpu):
    hw = gpu("h100-sxm").model_copy(update={"achievable": None})
    a = achievable(hw)
    assert a.bandwidth_bytes_per_s == pytest.approx(3350e9 * BANDWIDTH_FRAC["HBM3"])
    assert a.flops[DType.bf16][0] == pytest.approx(989.4e12 * 0.80)
    assert a.notes and a.bandwidth_source == "estimated"


# --------------------------------------------------------------------------- invariants

MODELS = ["llama-3.1-8b", "mixtral-8x7b", "llama-3.1-70b", "deepseek-v3", "qwen2.5-7b"]
HW = ["h100-sxm", "a100-sxm-80gb", "l40s", "h200", "mi300x"]
PRECS = [Precision(), Precision.of("fp8", "fp8"), Precision.of("int4"), Precision.of("int8")]
REAL = [n for n in ENGINES if n != "ideal"]
_cache: dict = {}


def _est(engine, m, g, b, p, o, prec, tp=1):
    key = (engine, m, g)
    if key not in _cache:
        _cache[key] = (catalog.load_engine(engine), catalog.load_model(m),
                       catalog.load_hardware(g))
    e, mm, hw = _cache[key]
    # a pair the engine does not run (TensorRT-LLM's fp8 on an A100: engines_db
    # ``unsupported``) is refused, not estimated (tests/test_engine_support.py)
    assume(e.refusal(prec.weights.value, prec.quantized_layers, hw.architecture) is None)
    return estimate(mm, hw, engine=e, precision=prec, parallelism=Parallelism(tp=tp),
                    workload=Workload(batch=b, prompt_tokens=p, output_tokens=o))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(REAL), st.sampled_from(MODELS), st.sampled_from(HW),
       st.integers(1, 512), st.integers(1, 16384), st.integers(1, 2048), st.sampled_from(PRECS),
       st.sampled_from([1, 2, 8]))
def test_no_engine_beats_the_ideal_on_any_operator(engine, m, g, b, p, o, prec, tp):
    if m == "mixtral-8x7b" and tp == 8 or m == "qwen2.5-7b" and tp == 8:
        tp = 2
    e = _est(engine, m, g, b, p, o, prec, tp)
    bound = e.bound_estimate
    assert bound is not e
    for step, ideal_step in ((e.decode, bound.decode), (e.prefill, bound.prefill)):
        for t, ti in zip(step.ops, ideal_step.ops, strict=True):
            assert t.op.name == ti.op.name
            assert t.time_s >= ti.time_s * (1 - 1e-12), (t.op.name, t.time_s, ti.time_s)
    assert e.tpot_s > bound.tpot_s and e.ttft_s > bound.ttft_s
    assert 0 < e.mbu <= 1 and 0 < e.mfu <= 1 and 0 < e.prefill_mfu <= 1
    assert e.mbu < bound.mbu


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(REAL), st.sampled_from(MODELS), st.sampled_from(HW),
       st.integers(1, 511), st.integers(1, 16384), st.integers(1, 2048), st.sampled_from(PRECS))
def test_step_time_monotone_in_batch_and_context_for_every_engine(engine, m, g, b, p, o, prec):
    a = _est(engine, m, g, b, p, o, prec)
    nb = _est(engine, m, g, b + 1, p, o, prec)
    nc = _est(engine, m, g, b, p + 64, o, prec)
    # within rounding, not to the last bit: where a step's host work hides its GPU work (vllm's
    # 43.1 us a running request, 508 of them), a longer context sums the same seconds in
    # another order (Qwen2.5-7B on an H100, batch 508: 0.021299000000000002 s at 8 tokens,
    # 0.021299 at 72)
    lo = 1 - 1e-12
    assert nb.tpot_s >= a.tpot_s * lo and nb.ttft_s >= a.ttft_s * lo
    assert nc.tpot_s >= a.tpot_s * lo and nc.ttft_s >= a.ttft_s * lo


def test_a_host_bound_step_is_monotone_to_rounding():
    """The case hypothesis found: vllm, Qwen2.5-7B, H100 SXM, batch 508, 7-token prompts. The
    step is the host's (508 running requests), so 64 more tokens of context leave TPOT as it
    was, within rounding, and one more request adds its host cost."""
    prec = Precision()
    a = _est("vllm", "qwen2.5-7b", "h100-sxm", 508, 7, 2, prec)
    nc = _est("vllm", "qwen2.5-7b", "h100-sxm", 508, 71, 2, prec)
    nb = _est("vllm", "qwen2.5-7b", "h100-sxm", 509, 7, 2, prec)
    assert nc.tpot_s == pytest.approx(a.tpot_s, rel=1e-12)
    assert nb.tpot_s - a.tpot_s == pytest.approx(43.1e-6, rel=1e-6)  # vllm's per request


def test_engine_byte_accounting_changes_memory(model, gpu):
    m, hw = model("llama-3.1-8b"), gpu("a100-sxm-80gb")
    w = Workload(batch=1, prompt_tokens=5, output_tokens=200)
    tp2 = Parallelism(tp=2)
    # gpt-fast replicates the lm_head under TP and quantizes it with the rest
    gf = estimate(m, hw, workload=w, parallelism=tp2, precision=Precision.of("int8"),
                  engine=catalog.load_engine("gpt-fast"))
    vl = estimate(m, hw, workload=w, parallelism=tp2, precision=Precision.of("int8"),
                  engine=catalog.load_engine("vllm"))
    head = 128256 * 4096
    from planner.core.memory import weight_bytes_breakdown
    gfb = weight_bytes_breakdown(m, gf.precision, tp=2, lm_head_sharded=False)
    vlb = weight_bytes_breakdown(m, vl.precision, tp=2, lm_head_sharded=True)
    # gpt-fast: int8 head, one fp16 scale and one bf16 zero per 128 weights, whole on each GPU;
    # vLLM: a 16-bit head split in two
    assert gfb["lm_head"] == head * (1 + 4 / 128)
    assert vlb["lm_head"] == head * 2 / 2
    assert gf.memory.weights_bytes == sum(gfb.values())
    assert vl.memory.weights_bytes == sum(vlb.values())
    assert gf.precision.zero_point_bytes == 2 and vl.precision.zero_point_bytes == 0.5
    assert math.isclose(vl.precision.quantized_bytes_per_param, 1 + 2.5 / 128)


@pytest.mark.slow
def test_engine_option_on_every_predicting_command(run_cli, run_json, tmp_path):
    ideal = run_json("sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "1,64",
                     "--engine", "ideal")
    vllm = run_json("sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "1,64")
    assert {r["engine"] for r in ideal} == {"ideal"} and {r["engine"] for r in vllm} == {"vllm"}
    for a, b in zip(ideal, vllm, strict=True):
        assert b["tpot_s"] > a["tpot_s"] and b["ideal_tpot_s"] == pytest.approx(a["tpot_s"])
    code, out, err = run_cli("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--ttft", "2s",
                             "--tpot", "30ms", "--rps", "2", "--engine", "gpt-fast", "--json")
    assert code == 0, err
    code, out, err = run_cli("report", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--engine",
                             "trtllm", "--out", str(tmp_path))
    assert code == 0, err
    import csv

    with (tmp_path / "llama-3.1-8b_h100-sxm_bf16_roofline.csv").open() as f:
        assert {r["engine"] for r in csv.DictReader(f)} == {"trtllm"}


def test_engine_files_that_are_not_profiles(run_cli, tmp_path):
    raw = tmp_path / "raw.yaml"
    raw.write_bytes(b"name: \xff\n")
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--engine",
                           str(raw))
    assert code == 2 and "not UTF-8" in err
    spec = (catalog.db_dir("engines_db") / "vllm.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(spec.replace("gemm_bandwidth_frac:\n  value: 0.988",
                                "gemm_bandwidth_frac:\n  value: 1.5"))
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--engine",
                           str(bad))
    assert code == 2 and "gemm_bandwidth_frac.value" in err


def test_engines_listing_shows_the_served_compute_share(run_json, run_cli):
    rows = {r["name"]: r for r in run_json("engines")}
    r = rows["vllm-0.8"]
    spec = catalog.load_engine_spec("vllm-0.8")
    assert r["gemm_compute_frac"] == spec.gemm_compute_frac.value
    assert r["served_compute_frac"] == spec.served_compute_frac.value
    assert rows["vllm"]["served_compute_frac"] == 1.0  # none stated: the kernels' own rate
    assert rows["vllm"]["gemm_bandwidth_arch_frac"] == {"ada": 0.88, "ampere": 0.9,
                                                        "blackwell": 0.95}
    assert rows["vllm-0.8"]["gemm_bandwidth_arch_frac"] == {}  # none named: 1 everywhere
    code, out, _ = run_cli("engines")
    line = next(x for x in out.splitlines() if x.startswith("vllm-0.8 "))
    assert code == 0 and f"{r['gemm_compute_frac'] * r['served_compute_frac']:.0%}" in line


def test_an_eager_moe_layer_pays_the_engines_host_time_once_a_layer():
    """moe_layer_host_us: an eager pass (a prefill) of a MoE model cannot take less than the
    host's time on its MoE layers, one charge a layer; a graphed decode step does not pay it,
    nor a prefill replayed from piecewise graphs (SGLang 0.5.10 and later), and neither does a
    dense model."""
    base = dataclasses.replace(catalog.load_engine("sglang@0.5.9"), moe_layer_host_s=0.0,
                               host_launch_s=0.0)
    assert not base.prefill_graphs
    slow = dataclasses.replace(base, moe_layer_host_s=2e-3)
    hw = catalog.load_hardware("h100-sxm")

    def run(e, name):
        return estimate(catalog.load_model(name), hw, engine=e, precision=Precision(),
                        parallelism=Parallelism(tp=1),
                        workload=Workload(batch=1, prompt_tokens=1, output_tokens=4))

    moe = catalog.load_model("qwen3-30b-a3b")
    a, b = run(base, "qwen3-30b-a3b"), run(slow, "qwen3-30b-a3b")
    # one token reads a few GB at most: the host's 48 x 2 ms is the floor
    assert moe.num_moe_layers == 48 and a.prefill.time_s < 0.05
    assert b.prefill.time_s >= 48 * 2e-3
    assert b.decode.time_s == a.decode.time_s  # replayed from a graph
    charged = [t for t in b.prefill.ops if t.time_s != next(
        u for u in a.prefill.ops if u.op.name == t.op.name).time_s]
    assert [t.op.name for t in charged] == ["experts_down_proj"]
    dense = run(slow, "llama-3.1-8b"), run(base, "llama-3.1-8b")
    assert dense[0].prefill.time_s == dense[1].prefill.time_s
    graphed = dataclasses.replace(slow, prefill_graphs=True)
    assert graphed.prefill_graph_rule is not None
    assert run(graphed, "qwen3-30b-a3b").prefill.time_s < 0.05
    data = catalog.load_engine_spec("sglang").model_dump(exclude_none=True)
    data["moe_layer_host_us"]["value"] = -1.0
    with pytest.raises(ValueError, match="moe_layer_host_us"):
        type(catalog.load_engine_spec("sglang")).model_validate(data)


@pytest.mark.parametrize("bad", [{}, {"hopper": 0.0}, {"hopper": -5.0},
                                 {"hopper": float("inf")}, {"Hopper": 1956.0}])
def test_an_fp8_cache_pace_is_refused_where_it_cannot_apply(bad):
    spec = catalog.load_engine_spec("vllm")
    data = spec.model_dump(exclude_none=True)
    data["fp8_kv_attention_gb_per_s"]["value"] = bad
    with pytest.raises(ValueError, match="fp8_kv_attention_gb_per_s"):
        type(spec).model_validate(data)


def _on_hopper_and_ada(**fields) -> tuple[Engine, Engine]:
    """H with ``fields`` (figures by architecture), resolved for an H100 and an L40S."""
    e = dataclasses.replace(H, **fields)
    return e.for_gpu(80e9, "h100", "hopper"), e.for_gpu(48e9, "l40s", "ada")


def test_an_fp8_cache_is_read_no_faster_than_the_engines_pace_on_its_architecture():
    """fp8_kv_attention_gb_per_s, resolved for the GPU's architecture (none where it names
    none): an attention op reading an fp8 cache takes its cache bytes at the pace where that is
    under the bandwidth's share, its queries and outputs at the bandwidth's; a 16-bit cache,
    an MLA latent cache (kv_dtype None) and a GPU of another architecture are unchanged."""
    hop, ada = _on_hopper_and_ada(overlap_frac=1.0, attention_bandwidth_frac=0.9,
                                  fp8_kv_attention_by_arch=(("hopper", 600e9),))
    assert hop.fp8_kv_attention_bytes_per_s == 600e9 and ada.fp8_kv_attention_bytes_per_s == 0
    # 6e8 bytes of fp8 cache and 1e8 of queries and outputs, 1 TB/s at 0.9
    fp8 = Op("attention", "attention", 1, flops=1e6, kv_bytes=6e8, act_bytes=1e8,
             kv_dtype=DType.fp8)
    t = op_time(fp8, C, engine=hop)
    assert t.memory_s == pytest.approx(1e8 / 0.9e12 + 6e8 / 600e9)  # 1.111 ms by hand
    assert t.bandwidth_frac == pytest.approx(7e8 / 1.1111e9, rel=1e-4)  # of all its bytes
    # a pace under half the 16-bit share: the cache takes the 16-bit time, never more
    slow = dataclasses.replace(hop, fp8_kv_attention_bytes_per_s=100e9)
    assert op_time(fp8, C, engine=slow).memory_s == pytest.approx(1e8 / 0.9e12 + 12e8 / 0.9e12)
    unpaced = op_time(fp8, C, engine=ada)
    assert unpaced.memory_s == pytest.approx(7e8 / 0.9e12)
    for kv in (DType.bf16, None):
        op = dataclasses.replace(fp8, kv_dtype=kv)
        assert op_time(op, C, engine=hop).memory_s == pytest.approx(7e8 / 0.9e12)
    # a pace above the bandwidth's share changes nothing
    fast = dataclasses.replace(hop, fp8_kv_attention_bytes_per_s=2e12)
    assert op_time(fp8, C, engine=fast).memory_s == pytest.approx(7e8 / 0.9e12)


def test_the_attention_op_names_its_cache_type_but_not_mlas():
    from planner.core.ops import step_ops

    for name, kv, want in (("llama-3.1-8b", "fp8", DType.fp8), ("llama-3.1-8b", "bf16", DType.bf16),
                           ("deepseek-v3", "fp8", None)):
        m = catalog.load_model(name)
        prec = Precision.of("fp8" if name == "deepseek-v3" else "bf16", kv)
        attn = [op for op in step_ops(m, prec, batch=4, new_tokens=1, past_tokens=512, tp=8)
                if op.kind == "attention"]
        assert attn and all(op.kv_dtype == want for op in attn)


def test_vllm_fp8_cache_pace_slows_a_hopper_decode_and_not_a_16_bit_one():
    """The vllm profile's paces (benchmarks/aiconfigurator_attention.py on vLLM 0.24's
    kernels): 2,128 GB/s on Hopper, under the H100's 2.9 TB/s copy rate, so Qwen3-8B's decode
    at 64 x 768 tokens with an fp8 cache slows; with a bf16 cache, or on an L40S (no pace named
    for Ada), it does not."""
    spec = catalog.load_engine_spec("vllm")
    assert spec.fp8_kv_attention_gb_per_s.value == {"hopper": 2128, "blackwell": 5244}
    assert "aiconfigurator" in spec.fp8_kv_attention_gb_per_s.source
    flat = spec.model_copy(update={"fp8_kv_attention_gb_per_s": None})
    m = catalog.load_model("qwen3-8b")
    w = Workload(batch=64, prompt_tokens=512, output_tokens=256)

    def tpot(s, gpu, kv):
        return estimate(m, catalog.load_hardware(gpu), workload=w, engine=s.model(),
                        precision=Precision.of("bf16", kv)).tpot_s

    slow = tpot(spec, "h100-sxm", "fp8") / tpot(flat, "h100-sxm", "fp8")
    assert 1.03 < slow < 2900 / 2128
    assert tpot(spec, "h100-sxm", "bf16") == tpot(flat, "h100-sxm", "bf16")
    assert tpot(spec, "l40s", "fp8") == tpot(flat, "l40s", "fp8")


def test_engines_listing_shows_the_fp8_cache_paces(run_json):
    rows = {r["name"]: r for r in run_json("engines")}
    assert rows["vllm"]["fp8_kv_attention_gb_per_s"] == {"blackwell": 5244.0, "hopper": 2128.0}
    assert rows["vllm"]["attention_bandwidth_arch_frac"] == {"ada": 0.9, "ampere": 0.89,
                                                             "blackwell": 0.97}
    assert rows["sglang"]["attention_bandwidth_arch_frac"] == {}
    assert rows["vllm"]["fp8_kv_attention_compute_frac"] == {"ada": 0.93, "blackwell": 0.98,
                                                              "hopper": 0.88}
    assert rows["sglang"]["fp8_kv_attention_compute_frac"] == {}
    assert rows["sglang"]["fp8_kv_attention_gb_per_s"] == {}  # none named: the bandwidth alone


def test_attention_bandwidth_factor_slows_attention_on_its_architectures_only():
    """attention_bandwidth_arch_frac: resolved for the GPU's architecture (1 where it names
    none), applied to attention's bandwidth share and nothing else; an fp8 cache's pace, where
    lower, still bounds it."""
    e = dataclasses.replace(H, overlap_frac=1.0, attention_bandwidth_frac=0.9,
                            attention_bandwidth_by_arch=(("ampere", 0.5),),
                            fp8_kv_attention_by_arch=(("ampere", 300e9),))
    # (0.3 of the bandwidth is above half the 0.45 share: the pace holds)
    amp, hop = e.for_gpu(80e9, "a100", "ampere"), e.for_gpu(80e9, "h100", "hopper")
    assert amp.attention_bandwidth_arch_frac == 0.5 and hop.attention_bandwidth_arch_frac == 1
    attn = Op("attention", "attention", 1, flops=1e6, kv_bytes=6e8, act_bytes=1e8,
              kv_dtype=DType.bf16)
    assert op_time(attn, C, engine=amp).memory_s == pytest.approx(7e8 / 0.45e12)
    assert op_time(attn, C, engine=hop).memory_s == pytest.approx(7e8 / 0.9e12)
    gemm = Op("mlp_gate_up_proj", "matmul", 1, flops=4e8, weight_bytes=4e8, m_rows=1.0)
    assert op_time(gemm, C, engine=amp).time_s == op_time(gemm, C, engine=hop).time_s
    fp8 = dataclasses.replace(attn, kv_dtype=DType.fp8)  # 0.3 of the bandwidth < 0.45
    assert op_time(fp8, C, engine=amp).memory_s == pytest.approx(1e8 / 0.45e12 + 6e8 / 300e9)


def test_vllm_attention_factors_are_sourced_and_hopper_keeps_one():
    spec = catalog.load_engine_spec("vllm")
    f = spec.attention_bandwidth_arch_frac
    assert f.value == {"ampere": 0.89, "ada": 0.90, "blackwell": 0.97}
    assert "aiconfigurator" in f.source and "hopper" not in f.value
    m, hw = catalog.load_model("qwen2.5-7b"), catalog.load_hardware("a100-sxm-80gb")
    w = Workload(batch=64, prompt_tokens=1500, output_tokens=128)
    flat = spec.model_copy(update={"attention_bandwidth_arch_frac": None})

    def tpot(s):
        return estimate(m, hw, workload=w, engine=s.model()).tpot_s

    assert 1.01 < tpot(spec) / tpot(flat) < 1 / 0.89


@pytest.mark.parametrize("gpu", GPUS)
def test_an_fp8_cache_is_never_slower_than_a_16_bit_one(gpu):
    """On every GPU in the database, vllm's decode with an fp8 KV cache takes no longer than
    with a 16-bit one (its pace on an H200 is under half the 16-bit rate there: capped)."""
    from planner.core.errors import UsageError

    hw = catalog.load_hardware(gpu)
    m = catalog.load_model("llama-3.1-8b")
    w = Workload(batch=32, prompt_tokens=4096, output_tokens=256)

    def tpot(kv):
        return estimate(m, hw, workload=w, engine=catalog.load_engine("vllm"),
                        precision=Precision.of("bf16", kv)).tpot_s

    try:
        fp8 = tpot("fp8")
    except UsageError:
        pytest.skip("vLLM runs no fp8 KV cache there")
    assert fp8 <= tpot("bf16")


def test_the_fp8_cache_pace_is_part_of_the_time_model_key():
    e = catalog.load_engine("vllm")
    paced = e.for_gpu(80e9, "h100", "hopper")
    unpaced = dataclasses.replace(paced, fp8_kv_attention_bytes_per_s=0.0)
    assert paced.time_model_key() != unpaced.time_model_key()


def test_simulate_reads_an_fp8_cache_at_the_pace(run_json, tmp_path):
    """The simulator's step costs (planner/serving/cost.py) take the pace: the vllm profile on
    an H100 decodes slower with an fp8 cache than a copy of it without the pace, and the same
    with a 16-bit cache."""
    import yaml

    from planner.io.catalog import db_dir

    data = yaml.safe_load((db_dir("engines_db") / "vllm.yaml").read_text())
    del data["fp8_kv_attention_gb_per_s"]
    unpaced = tmp_path / "vllm-unpaced.yaml"
    unpaced.write_text(yaml.safe_dump(data))
    args = ["simulate", "-m", "qwen3-8b", "-g", "h100-sxm", "-n", "300", "--request-rate", "20",
            "-p", "1024", "-o", "256"]

    def tpot(engine, kv):
        return run_json(*args, "--engine", engine, "--kv-cache", kv)["mean_tpot_ms"]

    assert tpot("vllm", "fp8") > 1.03 * tpot(str(unpaced), "fp8")
    assert tpot("vllm", "bf16") == tpot(str(unpaced), "bf16")


def test_attention_over_an_fp8_cache_computes_at_the_engines_factor():
    """fp8_kv_attention_compute_frac, resolved for the architecture: a prefill's attention
    over an fp8 cache, compute-bound, takes 1 / factor the time; over a 16-bit cache, or an
    MLA latent one (kv_dtype None), or on an architecture not named, the same as before."""
    hop, ada = _on_hopper_and_ada(overlap_frac=1.0, attention_compute_frac=0.8,
                                  fp8_kv_attention_compute_by_arch=(("hopper", 0.5),))
    assert hop.fp8_kv_attention_compute_frac == 0.5 and ada.fp8_kv_attention_compute_frac == 1
    # 8e12 FLOPs at 100 TFLOP/s x 0.8: 100 ms; the bytes are far less
    fp8 = Op("attention", "attention", 1, flops=8e12, kv_bytes=1e8, act_bytes=1e8,
             kv_dtype=DType.fp8)
    assert op_time(fp8, C, engine=hop).compute_s == pytest.approx(8e12 / (100e12 * 0.8 * 0.5))
    for op, eng in ((fp8, ada), (dataclasses.replace(fp8, kv_dtype=DType.bf16), hop),
                    (dataclasses.replace(fp8, kv_dtype=None), hop)):
        assert op_time(op, C, engine=eng).compute_s == pytest.approx(8e12 / (100e12 * 0.8))


def test_vllm_fp8_cache_prefill_factor_lengthens_a_hopper_prefill_only():
    spec = catalog.load_engine_spec("vllm")
    f = spec.fp8_kv_attention_compute_frac
    assert f.value == {"hopper": 0.88, "ada": 0.93, "blackwell": 0.98}
    assert "aiconfigurator" in f.source
    flat = spec.model_copy(update={"fp8_kv_attention_compute_frac": None})
    m = catalog.load_model("llama-3.1-8b")
    w = Workload(batch=8, prompt_tokens=8192, output_tokens=64)

    def est(s, kv):
        return estimate(m, catalog.load_hardware("h100-sxm"), workload=w, engine=s.model(),
                        precision=Precision.of("bf16", kv))

    # attention is about a seventh of this prefill, so slower by a few percent, never by more
    # than its own 1 / 0.88
    assert 1.01 < est(spec, "fp8").ttft_s / est(flat, "fp8").ttft_s < 1 / 0.88
    assert est(spec, "bf16").ttft_s == est(flat, "bf16").ttft_s


def test_an_mxfp4_moe_layer_pays_its_kernel_paths_fixed_time_once():
    """mxfp4_moe_fixed_us: a MoE layer of MXFP4 routed experts takes that much device time
    beyond its operators' on a GPU of an architecture the profile names, charged once a layer
    (on the expert down-projection): 20 us on Hopper adds 20 us x the layer count to a step,
    by hand; nothing on the gate/up projection, on 16-bit or int4 experts, or on Ampere."""
    e = dataclasses.replace(H, mxfp4_moe_fixed_by_arch=(("hopper", 20e-6),))
    hop, amp = e.for_gpu(80e9, "h100", "hopper"), e.for_gpu(80e9, "a100", "ampere")
    assert (hop.mxfp4_moe_fixed_s, amp.mxfp4_moe_fixed_s) == (20e-6, 0.0)
    down = Op("experts_down_proj", "matmul", 24, flops=1e9, weight_bytes=1e7, m_rows=4.0,
              dtype=DType.bf16, weight_dtype=DType.mxfp4)
    plain = dataclasses.replace(hop, mxfp4_moe_fixed_s=0.0)
    t, t0 = op_time(down, C, engine=hop), op_time(down, C, engine=plain)
    assert t.time_s - t0.time_s == pytest.approx(24 * 20e-6)
    assert t.fixed_s - t0.fixed_s == pytest.approx(24 * 20e-6)
    assert t.overhead_s - t0.overhead_s == pytest.approx(24 * 20e-6)
    for same in (dataclasses.replace(down, name="experts_gate_up_proj"),
                 dataclasses.replace(down, weight_dtype=DType.bf16),
                 dataclasses.replace(down, weight_dtype=DType.int4)):
        assert op_time(same, C, engine=hop).time_s == op_time(same, C, engine=plain).time_s
    assert op_time(down, C, engine=amp).time_s == op_time(down, C, engine=plain).time_s
    assert hop.time_model_key() != plain.time_model_key()
    # eager (no CUDA graph): device time, not the host's, so the launch floor and the
    # host's launches are those without it
    from planner.core.roofline import launch_time_s

    te, te0 = (op_time(down, C, engine=x, graphed=False) for x in (hop, plain))
    assert te.host_floor_s == te0.host_floor_s > 0
    assert launch_time_s([te], hop) == launch_time_s([te0], plain)
    assert te.fixed_s - te0.fixed_s == pytest.approx(24 * 20e-6)


def test_a_gqa_attention_call_pays_its_backends_fixed_time():
    """attention_fixed_us: each call of a GQA / MHA attention layer (full or sliding-window,
    decode or prefill) takes that much device time beyond its kernels' on a GPU of an
    architecture the profile names: 8 us on Hopper adds 32 x 8 us to 32 layers' attention,
    by hand; nothing on MLA's attention (no cache type: its block has its own), on the KV
    write, or on an architecture not named."""
    e = dataclasses.replace(H, attention_fixed_by_arch=(("hopper", 8e-6),))
    hop, amp = e.for_gpu(80e9, "h100", "hopper"), e.for_gpu(80e9, "a100", "ampere")
    assert (hop.attention_fixed_s, amp.attention_fixed_s) == (8e-6, 0.0)
    attn = Op("attention", "attention", 32, flops=1e9, kv_bytes=1e6, act_bytes=1e4,
              kv_dtype=DType.bf16)
    plain = dataclasses.replace(hop, attention_fixed_s=0.0)
    for op in (attn, dataclasses.replace(attn, name="attention_local")):
        t, t0 = op_time(op, C, engine=hop), op_time(op, C, engine=plain)
        assert t.time_s - t0.time_s == pytest.approx(32 * 8e-6)
        assert t.fixed_s - t0.fixed_s == pytest.approx(32 * 8e-6)
    for same in (dataclasses.replace(attn, kv_dtype=None),  # MLA's
                 Op("rope_kv_write", "elementwise", 32, flops=0.0, kv_bytes=1e4)):
        assert op_time(same, C, engine=hop).time_s == op_time(same, C, engine=plain).time_s
    assert op_time(attn, C, engine=amp).time_s == op_time(attn, C, engine=plain).time_s
    assert hop.time_model_key() != plain.time_model_key()


def test_the_attention_fixed_time_of_the_profiles_is_sourced_and_shown(run_json):
    """vllm's figures by architecture, derived from aiconfigurator's decode attention tables
    (benchmarks/aiconfigurator_attention.py --derive-fixed), carried to vllm-0.8 (the same
    FlashAttention backend); SGLang's own from its tables, on Hopper alone; TensorRT-LLM's
    PyTorch backend its own (not the TensorRT engines' profile); the others state none.
    Llama-3.1-8B's decode step at batch 1 on an H100 pays it on each of its 32 layers (its
    simulated step too, to the bit); on a GPU of an architecture not named, nothing."""
    rows = {r["name"]: r for r in run_json("engines", "--json")}
    spec = catalog.load_engine_spec("vllm")
    vllm_us = {"ampere": 17.5, "ada": 3.4, "hopper": 8.2, "blackwell": 5.8}
    _sourced_and_shown(spec, rows["vllm"], "attention_fixed_us", vllm_us)
    assert "--derive-fixed" in spec.attention_fixed_us.note
    old = catalog.load_engine_spec("vllm-0.8")
    _sourced_and_shown(old, rows["vllm-0.8"], "attention_fixed_us", vllm_us)
    assert "carried over from vllm.yaml" in old.attention_fixed_us.note
    sgl = catalog.load_engine_spec("sglang")
    _sourced_and_shown(sgl, rows["sglang"], "attention_fixed_us", {"hopper": 4.6})
    assert "--engine sglang --derive-fixed" in sgl.attention_fixed_us.note
    trt = catalog.load_engine_spec("trtllm")  # the PyTorch backend's own, from its tables
    _sourced_and_shown(trt, rows["trtllm"], "attention_fixed_us",
                       {"ampere": 19.9, "hopper": 15.3, "blackwell": 10.7})
    assert "--engine trtllm --derive-fixed" in trt.attention_fixed_us.note
    for name in ("vllm-v0", "trtllm-engine", "gpt-fast", "hf-eager", "ideal"):
        assert rows[name]["attention_fixed_us"] == {}
    from planner.cli.compare import served_setup
    from planner.core.ops import StepShape, step_ops
    from planner.core.roofline import step_time
    from planner.serving.cost import StepCoster

    dep = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, DType.bf16, None)
    assert dep.engine.attention_fixed_s == pytest.approx(8.2e-6)
    ops = step_ops(dep.model, dep.precision, batch=1, new_tokens=1, past_tokens=1024)
    c = dep.prepared.ceilings
    with_it = step_time(ops, c, options=dep.options, engine=dep.engine).time_s
    without = step_time(ops, c, options=dep.options, engine=dataclasses.replace(
        dep.engine, attention_fixed_s=0.0)).time_s
    assert with_it - without == pytest.approx(32 * 8.2e-6)
    coster = StepCoster(dep.model, dep.hardware, dep.prepared, dep.options)
    fixed = dep.engine.step_overhead_s + dep.engine.per_sequence_overhead_s
    assert coster.step_time(StepShape.uniform(1, 1, 1024), sequences=1, prefill=False) == \
        pytest.approx(step_time(ops, c, options=dep.options, engine=dep.engine,
                                fixed_s=fixed).time_s, rel=1e-12)
    # SGLang's Hopper figure on an H100, in the static step and the simulator's alike (its
    # overlap scheduler hides host work, not this); an A100 (Ampere, not stated) pays none
    for gpu, want in (("h100-sxm", 4.6e-6), ("a100-sxm-80gb", 0.0)):
        dep = served_setup("llama-3.1-8b", gpu, sgl, 1, DType.bf16, None)
        assert dep.engine.attention_fixed_s == pytest.approx(want)
        c = dep.prepared.ceilings
        without = dataclasses.replace(dep.engine, attention_fixed_s=0.0)
        assert step_time(ops, c, options=dep.options, engine=dep.engine).time_s - step_time(
            ops, c, options=dep.options, engine=without).time_s == pytest.approx(32 * want)
        sim = [StepCoster(dep.model, dep.hardware, prep, dep.options).step_time(
                   StepShape.uniform(1, 1, 1024), sequences=1, prefill=False)
               for prep in (dep.prepared, dataclasses.replace(dep.prepared, engine=without))]
        assert sim[0] - sim[1] == pytest.approx(32 * want, abs=1e-12)


def test_the_mxfp4_moe_fixed_time_of_the_profiles_is_sourced_and_shown(run_json):
    rows = {r["name"]: r for r in run_json("engines", "--json")}
    for name in ("vllm", "vllm-0.8"):
        spec = catalog.load_engine_spec(name)
        _sourced_and_shown(spec, rows[name], "mxfp4_moe_fixed_us", {"hopper": 20})
        assert "--derive-mxfp4-fixed" in spec.mxfp4_moe_fixed_us.note
    for name in ("sglang", "trtllm", "vllm-v0"):
        assert rows[name]["mxfp4_moe_fixed_us"] == {}
    # gpt-oss-20b's decode step on an H100 pays it on each of its 24 MoE layers; on an A100
    # (Marlin) and with the experts upcast to 16 bits, nothing
    from planner.cli.compare import served_setup
    from planner.core.ops import step_ops
    from planner.core.roofline import step_time

    def step(gpu, weights):
        dep = served_setup("gpt-oss-20b", gpu, catalog.load_engine_spec("vllm"), 1, weights,
                           None, quantized_layers="experts")
        ops = step_ops(dep.model, dep.precision, batch=1, new_tokens=1, past_tokens=1024)
        c = dep.prepared.ceilings
        return (step_time(ops, c, options=dep.options, engine=dep.engine).time_s,
                step_time(ops, c, options=dep.options, engine=dataclasses.replace(
                    dep.engine, mxfp4_moe_fixed_s=0.0)).time_s)

    with_it, without = step("h100-sxm", DType.mxfp4)
    assert with_it - without == pytest.approx(24 * 20e-6)
    for gpu, weights in (("a100-sxm-80gb", DType.mxfp4), ("h100-sxm", DType.bf16)):
        with_it, without = step(gpu, weights)
        assert with_it == without
