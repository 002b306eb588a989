"""A calibration's measured fixed costs of a matmul and a decode attention kernel: how the
harness derives them, how the roofline and the simulator charge them, and the kernel
micro-benchmark script that measured them on an H100 (benchmarks/gpu_micro.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness.bench import Timing, buffers_beyond_l2, time_chain
from harness.calibrate import _excess, fixed_costs
from planner.core.estimate import prepare
from planner.core.ops import StepShape, decode_ops, prefill_ops
from planner.core.roofline import ceilings, op_time, step_time
from planner.core.specs import Calibration, DType, Options, Precision
from planner.io import catalog
from planner.serving.cost import StepCoster

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "benchmarks" / "results" / "h100-sxm-2026-11-27"


def _cal(**extra) -> Calibration:
    return Calibration(device="h100-sxm", memory_bandwidth_gb_per_s=3000.0,
                       matmul_tflops={DType.bf16: 700.0}, kernel_overhead_us=1.0, **extra)


def test_buffers_beyond_l2_cover_four_caches():
    l2 = 50 << 20
    assert buffers_beyond_l2(32 << 20, l2) == 7  # 200 MiB / 32 MiB, rounded up
    assert buffers_beyond_l2(1 << 30, l2) == 4  # never fewer than four
    assert buffers_beyond_l2(1 << 10, l2) == 512  # nor more than the cap
    assert buffers_beyond_l2(1 << 30, l2, at_least=2) == 2
    with pytest.raises(ValueError):
        buffers_beyond_l2(0, l2)


def test_time_chain_reports_per_call_figures():
    calls = [lambda: sum(range(2000))] * 8
    t = time_chain(calls, kind="cpu", budget_s=0.02)
    one = time_chain(calls[:1], kind="cpu", budget_s=0.02)
    assert "chain of 8" in t.method
    assert t.min_s <= t.median_s <= t.p90_s
    # per call: eight calls in a chain take about what one takes alone, not eight times it
    assert t.median_s < 4 * one.median_s
    with pytest.raises(ValueError):
        time_chain([], kind="cpu")


def _pt(seconds: float, nbytes: float) -> dict:
    return {"bytes": nbytes, "per_call": Timing(seconds, seconds, seconds, seconds, seconds,
                                                10, "x").as_dict()}


def test_excess_is_the_median_time_beyond_the_bytes():
    bw = 1e9  # 1,000 bytes take 1 us
    pts = [_pt(3e-6, 1000), _pt(5e-6, 1000), _pt(1e-6, 2000)]  # excess 2, 4, -1 us
    assert _excess(pts, bw) == pytest.approx(2e-6)
    assert _excess([_pt(1e-6, 5000)], bw) == 0.0  # faster than the bandwidth: no fixed cost
    assert _excess([], bw) is None


def test_fixed_costs_run_on_a_cpu():
    bw = 20e9
    got = fixed_costs("cpu", bw, 0.01, matmuls=((256, 256), (256, 512)),
                      attention=((1, 64),))
    assert [(p["k"], p["n"]) for p in got["matmul"]] == [(256, 256), (256, 512)]
    assert got["matmul"][0]["bytes"] == 2 * 256 * 256 + 2 * (256 + 256)
    assert got["matmul"][0]["buffers"] == buffers_beyond_l2(2 * 256 * 256, 1 << 20)
    assert got["attention"][0]["bytes"] == 2 * 2 * 8 * 64 * 128 + 2 * 2 * 32 * 128
    assert got["matmul_overhead_s"] == _excess(got["matmul"], bw) >= 0
    assert got["attention_overhead_s"] == _excess(got["attention"], bw) >= 0


def test_the_calibration_charges_matmuls_and_attention_their_own_fixed_cost():
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    prec = Precision()
    ops = decode_ops(m, prec, batch=1, context_tokens=512)
    plain = step_time(ops, ceilings(hw, _cal()))
    own = step_time(ops, ceilings(hw, _cal(matmul_overhead_us=6.0, attention_overhead_us=8.0)))
    n_mm = sum(t.kernels for t in plain.ops if t.op.kind == "matmul")
    n_attn = sum(t.kernels for t in plain.ops if t.op.kind == "attention")
    assert n_mm == 4 * m.num_layers + 1 and n_attn == m.num_layers  # by hand: 4 projections
    # each kernel of its kind now costs 6 (8) us where the empty kernel's 1 us stood
    assert own.time_s - plain.time_s == pytest.approx(n_mm * 5e-6 + n_attn * 7e-6, rel=1e-9)
    # other kernels keep the empty kernel's cost
    for a, b in zip(plain.ops, own.ops, strict=True):
        if a.op.kind not in ("matmul", "attention"):
            assert a.time_s == b.time_s


def test_kernel_overhead_flag_replaces_every_measured_cost():
    """--kernel-overhead-us replaces each kernel's cost, measured or the profile's; device
    time the profile adds to an operator beyond its kernels (an attention call's on Hopper)
    stays."""
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    vllm = catalog.load_engine("vllm").for_gpu(hw.memory_bytes, hw.name, hw.architecture)
    o = Options(kernel_overhead_s=3e-6)
    ops = decode_ops(m, Precision(), batch=1, context_tokens=512)
    c = ceilings(hw, _cal(matmul_overhead_us=6.0, attention_overhead_us=8.0), o, vllm)
    assert c.matmul_overhead_s is None and c.attention_overhead_s is None
    for op in ops:
        t = op_time(op, c, options=o, engine=vllm)
        assert t.overhead_s == pytest.approx(t.kernels * 3e-6 + t.fixed_s)
        assert t.fixed_s == pytest.approx(op.count * 8.2e-6 if op.kind == "attention" else 0.0)


def test_fp8_quantize_kernels_keep_the_plain_cost():
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    vllm = catalog.load_engine("vllm")
    assert vllm.fp8_quant_kernels > 0
    prec = Precision(weights=DType.fp8, compute=DType.fp8)
    cal = _cal(matmul_overhead_us=6.0).model_copy(
        update={"matmul_tflops": {DType.bf16: 700.0, DType.fp8: 1200.0}})
    c = ceilings(hw, cal, Options(), vllm)
    op = next(o for o in decode_ops(m, prec, batch=1, context_tokens=512)
              if o.name == "o_proj")
    t = op_time(op, c, engine=vllm)
    k = vllm.kernels_for(op.name, op.kind)
    q = vllm.fp8_quant_kernels
    assert t.kernels == pytest.approx((k + q) * op.count)
    assert t.overhead_s == pytest.approx((k * 6e-6 + q * 1e-6) * op.count)


def test_the_simulator_charges_the_measured_attention_cost():
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    ideal = catalog.load_engine("ideal")
    cal = _cal(matmul_overhead_us=6.0, attention_overhead_us=8.0)
    prep = prepare(hw, Precision(), cal, Options(), ideal)
    coster = StepCoster(m, hw, prep, Options())
    got = coster.step_time(StepShape.uniform(1, 1, 511), sequences=1, prefill=False)
    want = step_time(decode_ops(m, Precision(), batch=1, context_tokens=512),
                     prep.ceilings, engine=ideal).time_s
    assert got == pytest.approx(want, rel=1e-6)
    plain = StepCoster(m, hw, replace(prep, ceilings=replace(prep.ceilings,
                                                             attention_overhead_s=None)),
                       Options())
    before = plain.step_time(StepShape.uniform(1, 1, 511), sequences=1, prefill=False)
    assert got - before == pytest.approx(m.num_layers * 7e-6, rel=1e-6)


def test_the_h100_micro_benchmark_agrees_with_the_figures_quoted():
    """docs/measure.md quotes these from the committed records: recomputed here."""
    recs = [json.loads(x) for x in (H100 / "micro.jsonl").read_text().splitlines()]
    bw = 2977.983759070339e9  # that GPU's calibrated copy rate (calibration.yaml)
    one = [r for r in recs if r["family"] == "gemm" and r["dtype"] == "bf16"
           and r["tokens"] == 1]
    assert len(one) == 10
    pts = [{"bytes": r["bytes"], "per_call": {"median_s": r["per_call_s"]}} for r in one]
    assert _excess(pts, bw) * 1e6 == pytest.approx(4.6, abs=0.1)
    attn = [r for r in recs if r["family"] == "attention" and r.get("phase") == "decode"
            and r["model"] == "llama-3.1-8b" and (r["batch"], r["context"]) in
            ((1, 512), (1, 2048), (8, 512), (8, 2048))]
    pts = [{"bytes": r["bytes"], "per_call": {"median_s": r["per_call_s"]}} for r in attn]
    assert _excess(pts, bw) * 1e6 == pytest.approx(7.3, abs=0.1)


def _micro(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_micro.py"), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_gpu_micro_runs_on_a_cpu(tmp_path):
    out = tmp_path / "m.jsonl"
    r = _micro("-m", "tiny-llama-test", "--device", "cpu", "--tokens", "1,4", "-b", "1",
               "-c", "64", "--prefill", "64", "--copy-sizes", "65536,1048576",
               "--dtypes", "bf16", "--budget-s", "0.01", "--out", str(out))
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    fams = [x["family"] for x in recs]
    assert fams.count("copy") == 2 and fams.count("gemm") == 10 and fams.count("attention") == 2
    g = next(x for x in recs if x["family"] == "gemm" and x["op"] == "o_proj"
             and x["tokens"] == 4)
    m = catalog.load_model("tiny-llama-test")
    k = m.num_attention_heads * m.head_dim_
    assert (g["k"], g["n"]) == (k, m.hidden_size)
    assert g["flops"] == 2 * 4 * k * m.hidden_size
    assert g["bytes"] == 2 * k * m.hidden_size + 2 * 4 * (k + m.hidden_size)
    assert all(x["per_call_s"] > 0 for x in recs)
    assert "fixed cost" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["-m", "no-such-model"], "no-such-model"),
    (["--tokens", "0"], "--tokens"),
    (["--budget-s", "nan"], "--budget-s"),
    (["--families", "copy,disk"], "--families"),
    (["--budget-s", "abc"], "--budget-s: invalid float value"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_gpu_micro_bad_input_is_one_line(args, needle):
    r = _micro("--device", "cpu", *args)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_second_h100_lease_is_predicted_as_recorded():
    """The harness-2 calibration loads, and today's planner predicts each recorded point
    exactly as the device run did: the records and the code that made them agree."""
    from harness.measure import predict

    cal = catalog.load_calibration(H100 / "calibration-v2.yaml")
    assert cal.matmul_overhead_us == pytest.approx(3.41, abs=0.01)
    assert cal.attention_overhead_us == pytest.approx(7.25, abs=0.01)
    hw = catalog.load_hardware("h100-sxm")
    c = ceilings(hw, cal)
    recs = [json.loads(x) for x in (H100 / "llama-3.1-8b-bf16-v2.jsonl").read_text()
            .splitlines()]
    errs = []
    for r in recs:
        cf = r["config"]
        m = catalog.load_model(cf["model"])
        p = predict(m, Precision(), c, batch=cf["batch"], context=cf["context"])
        assert p["tpot_s"] == pytest.approx(r["prediction"]["calibrated"]["tpot_s"], rel=1e-9)
        if r["status"] == "ok":
            errs.append(r["error"]["calibrated"]["tpot_frac"])
    assert len(errs) == 7
    errs.sort(key=abs)
    assert abs(errs[3]) == pytest.approx(0.107, abs=0.001)  # the docs' median


def test_the_h200_and_the_h100_run_model_shaped_matmuls_alike():
    """docs/measure.md (#h200) and hardware_db/h200.yaml's note quote these medians."""
    import statistics

    def median_tflops(path: Path, dtype: str) -> float:
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        rates = [r["flops"] / r["per_call_s"] / 1e12 for r in recs
                 if r["family"] == "gemm" and r["dtype"] == dtype and r["tokens"] >= 512]
        assert len(rates) == 50
        return statistics.median(rates)

    h200 = ROOT / "benchmarks" / "results" / "h200-2026-11-27" / "micro-h200.jsonl"
    assert round(median_tflops(h200, "bf16")) == round(median_tflops(H100 / "micro.jsonl",
                                                                      "bf16")) == 679
    assert round(median_tflops(h200, "fp8")) == 1176
    assert round(median_tflops(H100 / "micro.jsonl", "fp8")) == 1217


@pytest.mark.parametrize("path,matmul_us,attention_us,empty_us", [
    (H100 / "calibration-v2.yaml", 3.41, 7.25, 1.25),
    (H100 / "calibration-h100-c.yaml", 3.36, 7.25, 1.32),
    (ROOT / "benchmarks" / "results" / "h200-2026-11-27" / "calibration-h200.yaml", 3.59, 7.46,
     1.24),
])
def test_the_recorded_calibrations_hold_the_quoted_fixed_costs(path, matmul_us, attention_us,
                                                                empty_us):
    """docs/measure.md and the SGLang / TensorRT-LLM kernel costs quote these; each is the
    median excess of its own recorded chains, recomputed here."""
    cal = catalog.load_calibration(path)
    assert cal.matmul_overhead_us == pytest.approx(matmul_us, abs=0.01)
    assert cal.attention_overhead_us == pytest.approx(attention_us, abs=0.01)
    assert cal.kernel_overhead_us == pytest.approx(empty_us, abs=0.01)
    fixed = cal.details["fixed"]
    bw = cal.memory_bandwidth_gb_per_s * 1e9
    assert _excess(fixed["matmul"], bw) * 1e6 == pytest.approx(matmul_us, abs=0.01)
    assert _excess(fixed["attention"], bw) * 1e6 == pytest.approx(attention_us, abs=0.01)


def _o_proj_fp8(engine):
    """Llama-3.1-8B's fp8 o_proj at batch 1 on an H100 under ``engine``: (its time, the same
    GEMM with no kernels beside it)."""
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    prec = Precision(weights=DType.fp8, compute=DType.fp8)
    c = ceilings(hw, None, Options(), engine)
    op = next(o for o in decode_ops(m, prec, batch=1, context_tokens=512)
              if o.name == "o_proj")
    return (op_time(op, c, engine=engine).time_s,
            op_time(op, c, engine=replace(engine, fp8_quant_kernels=0.0)).time_s, c)


def test_trtllm_fp8_gemms_pay_three_plain_kernels_from_the_pytorch_backend_on():
    """TensorRT-LLM 1.x's fp8 GEMM (FP8QDQLinearMethod: the input's quantization, then
    cuBLASLt) starts about 10 us above a 16-bit one in aiconfigurator's tables: 3 kernels of
    the profile's plain cost, 3.4 us each, per fp8 GEMM of 32 layers' o_proj. Releases
    before 1.0 (a built TensorRT engine, which fuses the quantization) and --backend
    tensorrt take none."""
    from planner.cli.compare import served_setup
    from planner.cli.flags import server_flags

    spec = catalog.load_engine_spec("trtllm")
    q = spec.fp8_quant_kernels
    assert (q.value, q.block, q.dense_only, q.since) == (3, 1, True, "1.0")
    now, bare, c = _o_proj_fp8(spec.model())
    e = spec.model()
    # and the input's quantization pass: one read of 4,096 16-bit values and their fp8 copy
    quant = 32 * 4096 * 3 / (c.bandwidth_bytes_per_s * e.elementwise_bandwidth_frac)
    assert now - bare == pytest.approx(3 * 32 * c.kernel_cost_s("plain", e) + quant)
    assert c.kernel_cost_s("plain", spec.model()) == pytest.approx(3.4e-6)
    old = spec.at_version("0.9.0").model()
    assert old.fp8_quant_kernels == 0.0 and old.fp8_block_quant_kernels == 0.0
    assert spec.at_version("1.2.0").model().fp8_quant_kernels == 3.0
    trt = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "fp8", None,
                       server=server_flags("trtllm-serve m --backend tensorrt"))
    pt = served_setup("llama-3.1-8b", "h100-sxm", spec, 1, "fp8", None,
                      server=server_flags("trtllm-serve m"))
    assert (trt.engine.fp8_quant_kernels, trt.engine.fp8_block_quant_kernels) == (0.0, 0.0)
    assert trt.engine.fp8_input_reads == trt.engine.fp8_dynamic_tensor_reads == 0.0
    assert (pt.engine.fp8_quant_kernels, pt.engine.fp8_block_quant_kernels) == (3.0, 1.0)
    # vLLM's two quantization kernels hold at every release, and for every lane
    vllm = catalog.load_engine_spec("vllm")
    v = vllm.at_version("0.9.0").model()
    assert (v.fp8_quant_kernels, v.fp8_block_quant_kernels, v.fp8_quant_dense_only) == \
        (2.0, 2.0, False)


def _deepseek_decode(engine):
    """DeepSeek-V3 as its checkpoint ships (fp8 in 128 x 128 blocks) at TP 8 on an H200,
    batch 1: {operator: (kernels, block-scaled)} of a decode step under ``engine``."""
    from planner.cli.options import precision_of
    from planner.core.estimate import estimate
    from planner.core.specs import Parallelism, Workload

    m, hw = catalog.load_model("deepseek-v3"), catalog.load_hardware("h200")
    prec = precision_of(m, None)
    assert prec.fp8_blocks and prec.weights == DType.fp8
    r = estimate(m, hw, precision=prec, parallelism=Parallelism(tp=8), engine=engine,
                 workload=Workload(batch=1, prompt_tokens=1024, output_tokens=64))
    return {t.op.name: (t.kernels, t.op.fp8_blocks) for t in r.decode.ops}


def test_block_scaled_fp8_takes_the_block_lanes_kernels_and_experts_none_in_trtllm():
    """A block-scaled checkpoint's GEMMs (TensorRT-LLM's FP8BlockScalesLinearMethod: one
    fp8_quantize_1x128 kernel, then the block-scaled GEMM) pay the block lane's 1 kernel, not
    the per-tensor lane's 3; the routed experts' fused MoE kernel quantizes inside itself
    (dense_only) and pays none. vLLM charges its 2 everywhere, as before."""
    trt = catalog.load_engine("trtllm")
    bare = replace(trt, fp8_quant_kernels=0.0, fp8_block_quant_kernels=0.0)
    got, base = _deepseek_decode(trt), _deepseek_decode(bare)
    extra = {n: got[n][0] - base[n][0] for n in got}
    assert all(got[n][1] for n in ("o_proj", "mla_q_up_proj", "shared_down_proj",
                                   "experts_down_proj"))
    assert extra["o_proj"] == 61 and extra["mla_q_up_proj"] == 61  # 1 a layer, 61 layers
    assert extra["shared_gate_up_proj"] == 58  # the 58 MoE layers' shared expert
    assert extra["experts_gate_up_proj"] == extra["experts_down_proj"] == 0
    assert extra["lm_head"] == 0  # 16-bit
    vllm = catalog.load_engine("vllm")
    vb = replace(vllm, fp8_quant_kernels=0.0, fp8_block_quant_kernels=0.0)
    v, v0 = _deepseek_decode(vllm), _deepseek_decode(vb)
    assert v["experts_down_proj"][0] - v0["experts_down_proj"][0] == 2 * 58
    assert v["o_proj"][0] - v0["o_proj"][0] == 2 * 61


def _fp8_prefill_o_proj(engine, prec, tokens=2048):
    """Llama-3.1-8B's o_proj (K 4,096) in a prefill of ``tokens`` on an H100 under ``engine``
    at ``prec``: (its time, its time with no input quantization pass, the ceilings)."""
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    c = ceilings(hw, None, Options(), engine)
    op = next(o for o in prefill_ops(m, prec, batch=1, prompt_tokens=tokens)
              if o.name == "o_proj")
    bare = replace(engine, fp8_input_reads=0.0, fp8_dynamic_tensor_reads=0.0)
    return op_time(op, c, engine=engine), op_time(op, c, engine=bare), c


def test_a_w8a8_gemm_reads_its_16_bit_input_once_more_to_quantize_it():
    """vLLM's Fp8LinearMethod quantizes each fp8 GEMM's input in a pass of its own before
    the GEMM: a static scale (or one per token or per block) reads the 16-bit input once and
    writes its fp8 copy, 3 bytes a value; a scale per tensor found at run time
    (--quantization fp8 over a 16-bit checkpoint) reads it twice first, 5 bytes. By hand,
    2,048 tokens x 4,096 values x 32 layers, at the profile's elementwise share of the
    bandwidth, in series with the GEMM."""
    vllm = catalog.load_engine("vllm")
    assert (vllm.fp8_input_reads, vllm.fp8_dynamic_tensor_reads) == (1.0, 2.0)
    static = Precision.of("fp8")
    online = Precision.of("fp8", at_load=True)
    assert online.fp8_dynamic_tensor and not static.fp8_dynamic_tensor
    assert not Precision.of("int4", at_load=True).fp8_dynamic_tensor
    for prec, per_value in ((static, 3), (online, 5)):
        t, bare, c = _fp8_prefill_o_proj(vllm, prec)
        want = 32 * 2048 * 4096 * per_value / (
            c.bandwidth_bytes_per_s * vllm.elementwise_bandwidth_frac)
        assert t.time_s - bare.time_s == pytest.approx(want, rel=1e-9)
        assert t.memory_s - bare.memory_s == pytest.approx(want, rel=1e-9)
        assert t.compute_s == bare.compute_s
    # --weights fp8 over a 16-bit checkpoint is quantized at load (vLLM's --quantization
    # fp8), not over one that stores fp8; block-scaled weights (a scale per token and 128
    # values) read once even with the flag
    assert catalog.load_model("llama-3.1-8b").quantized_at_load("fp8")
    ds = catalog.load_model("deepseek-v3")
    assert not ds.quantized_at_load("fp8") and ds.quantized_at_load("int4")
    blocks = online.model_copy(update={"fp8_blocks": True})
    t, bare, c = _fp8_prefill_o_proj(vllm, blocks)
    assert t.time_s - bare.time_s == pytest.approx(
        32 * 2048 * 4096 * 3 / (c.bandwidth_bytes_per_s * vllm.elementwise_bandwidth_frac))
    # 16-bit GEMMs have no pass; nor the ideal engine, which states no reads, nor
    # TensorRT-LLM before 1.0 (a built engine fuses the quantization). SGLang finds a
    # dynamic scale per token in its one pass
    bf16 = Precision(weights=DType.bf16)
    t, bare, _ = _fp8_prefill_o_proj(vllm, bf16)
    assert t.time_s == bare.time_s
    ideal = catalog.load_engine("ideal")
    t, bare, _ = _fp8_prefill_o_proj(ideal, online)
    assert ideal.fp8_input_reads == 0.0 and t.time_s == bare.time_s
    sgl = catalog.load_engine("sglang")
    assert (sgl.fp8_input_reads, sgl.fp8_dynamic_tensor_reads) == (1.0, 1.0)
    trt = catalog.load_engine_spec("trtllm")
    assert trt.model().fp8_input_reads == 1.0
    old = trt.at_version("0.9.0").model()
    assert old.fp8_input_reads == old.fp8_dynamic_tensor_reads == 0.0


def test_a_moe_layer_quantizes_its_tokens_once_not_per_expert():
    """vLLM's fused MoE path quantizes the layer's tokens once before the experts' gate_up
    and their routed copies' intermediate once before down, not once per expert they reach:
    Qwen3-30B-A3B (hidden 2,048, experts 768 wide, 8 of 128 a token) in a prefill of 2,048
    tokens at --quantization fp8's 5 bytes a value, by hand: 2,048 x 2,048 x 5 and
    2,048 x 8 x 768 x 5 bytes a layer. TensorRT-LLM's fused MoE op quantizes inside itself
    (dense_only): none."""
    from planner.core.roofline import fp8_input_quant_s

    m, hw = catalog.load_model("qwen3-30b-a3b"), catalog.load_hardware("h100-sxm")
    assert (m.hidden_size, m.moe.expert_intermediate_size, m.moe.experts_per_token) == \
        (2048, 768, 8)
    vllm = catalog.load_engine("vllm")
    c = ceilings(hw, None, Options(), vllm)
    prec = Precision.of("fp8", at_load=True)
    ops = {o.name: o for o in prefill_ops(m, prec, batch=1, prompt_tokens=2048)}
    bw = c.bandwidth_bytes_per_s * vllm.elementwise_bandwidth_frac
    assert fp8_input_quant_s(ops["experts_gate_up_proj"], c, vllm) == pytest.approx(
        2048 * 2048 * 5 / bw)
    assert fp8_input_quant_s(ops["experts_down_proj"], c, vllm) == pytest.approx(
        2048 * 8 * 768 * 5 / bw)
    bare = replace(vllm, fp8_input_reads=0.0, fp8_dynamic_tensor_reads=0.0)
    t, t0 = (op_time(ops["experts_down_proj"], c, engine=e) for e in (vllm, bare))
    assert t.time_s - t0.time_s == pytest.approx(m.num_moe_layers * 2048 * 8 * 768 * 5 / bw)
    trt = catalog.load_engine("trtllm")
    assert trt.fp8_quant_dense_only
    assert fp8_input_quant_s(ops["experts_gate_up_proj"], c, trt) == 0.0
    assert fp8_input_quant_s(ops["o_proj"], c, trt) > 0.0


def test_a_since_that_is_not_a_release_is_refused():
    import yaml
    from pydantic import ValidationError

    from planner.core.engine import EngineSpec

    doc = yaml.safe_load((ROOT / "engines_db" / "trtllm.yaml").read_text())
    doc["fp8_quant_kernels"]["since"] = "one"
    with pytest.raises(ValidationError) as err:
        EngineSpec.model_validate(doc)
    assert [e["loc"] for e in err.value.errors()] == [("fp8_quant_kernels", "since")]
    doc["fp8_quant_kernels"]["since"] = "1.0"
    doc["fp8_quant_kernels"]["block"] = -1
    with pytest.raises(ValidationError, match="fp8_quant_kernels.block"):
        EngineSpec.model_validate(doc)
    doc["fp8_quant_kernels"]["block"] = 1
    for field, bad in (("input_reads", -1), ("input_reads", float("nan")),
                       ("dynamic_tensor_reads", 9)):
        with pytest.raises(ValidationError, match=f"fp8_quant_kernels.{field}"):
            EngineSpec.model_validate({**doc, "fp8_quant_kernels": {
                **doc["fp8_quant_kernels"], field: bad}})


def test_plan_prices_a_checkpoint_as_it_ships(run_json):
    """plan without --weights runs a quantized checkpoint as it ships: its own scales, so
    DeepSeek-V3's block-scaled GEMMs take TensorRT-LLM's block lane (1 kernel) in the search
    as in estimate, where rebuilding the precision from the weight type alone gave them the
    per-tensor lane's 3. A type the checkpoint does not store, or released False, is built
    from the type alone."""
    from planner.search.sweep import grid_precision

    m = catalog.load_model("deepseek-v3")
    p = grid_precision(m, DType.fp8, released=True)
    assert p.fp8_blocks and p.from_checkpoint and p.fp8_scale_group == 128 * 128
    assert not grid_precision(m, DType.fp8).fp8_blocks
    assert not grid_precision(m, DType.bf16, released=True).from_checkpoint
    rows = run_json("plan", "-m", "deepseek-v3", "-g", "h200", "--tp", "8", "-e", "trtllm",
                    "--ttft", "5s", "--tpot", "100ms", "--rps", "1", "--scheduler", "static",
                    "-p", "512", "-o", "128")
    one = next(r for r in rows if r["batch"] == 1 and r["tp"] == 8 and r["ep"] == 1
               and r["kv_cache"] == "bf16")
    est = run_json("estimate", "-m", "deepseek-v3", "-g", "h200", "-tp", "8", "-e", "trtllm",
                   "-b", "1", "-p", "512", "-o", "128")
    assert one["tpot_s"] == pytest.approx(est["tpot_s"], rel=1e-6)
    per_tensor = run_json("estimate", "-m", "deepseek-v3", "-g", "h200", "-tp", "8", "-e",
                          "trtllm", "-b", "1", "-p", "512", "-o", "128", "--weights", "fp8")
    assert per_tensor["tpot_s"] > 1.2 * est["tpot_s"]
