"""What the tables say a step's host cost adds: all of the engine's fixed cost where the host
works in series with the GPU (vllm-v0), and under async scheduling (vllm, sglang) only the part
that outlasts the GPU's work. The timing line's parts and the operator table's rows must add up
to the step time the estimate reports."""

from __future__ import annotations

import re

import pytest

from planner.core.estimate import estimate
from planner.core.specs import Parallelism, Workload
from planner.io import catalog


def _est(model: str, engine: str, batch: int = 1):
    return estimate(catalog.load_model(model), catalog.load_hardware("h100-sxm"),
                    workload=Workload(batch=batch, prompt_tokens=1024, output_tokens=256),
                    engine=catalog.load_engine(engine))


def test_async_scheduling_hides_the_fixed_cost_under_a_long_step():
    """Llama-3.1-8B at batch 1: about 5 ms of GPU work a step against vLLM's 768 us of host
    work, which runs beside it: the step is its operators' sum, and the overhead on its
    path is the device's alone: 323 kernels at 2.06 us each (the profile's kernel_gap_us) and
    32 attention calls at 8.2 us each (attention_fixed_us on Hopper)."""
    e = catalog.load_engine("vllm")
    d = _est("llama-3.1-8b", "vllm").decode
    assert d.overlapped
    assert d.fixed_s == pytest.approx(e.step_overhead_s + e.per_sequence_overhead_s)
    assert d.exposed_host_s == 0.0
    assert d.time_s == pytest.approx(sum(t.time_s for t in d.ops))
    assert d.overhead_s == pytest.approx(323 * 2.06e-6 + 32 * 8.2e-6, rel=1e-3)


def test_in_series_the_whole_fixed_cost_is_on_the_path():
    """vLLM 0.6 (vllm-v0) schedules in series: its step and per-sequence cost, all paid."""
    e = catalog.load_engine("vllm-v0")
    d = _est("llama-3.1-8b", "vllm-v0").decode
    assert not d.overlapped
    assert d.exposed_host_s == d.fixed_s
    assert d.fixed_s == pytest.approx(e.step_overhead_s + e.per_sequence_overhead_s)
    assert d.time_s == pytest.approx(sum(t.time_s for t in d.ops) + d.fixed_s)


def test_a_short_step_waits_for_the_host_beyond_the_gpu():
    """The 4-layer test model's GPU work is far under vLLM's 768 us of host work a step:
    the step takes the host's time, and the exposed part is what the GPU's work leaves."""
    d = _est("tiny-llama-test", "vllm").decode
    gpu = sum(t.time_s for t in d.ops)
    assert d.overlapped and gpu < d.fixed_s
    assert d.time_s == pytest.approx(d.fixed_s)
    assert d.exposed_host_s == pytest.approx(d.fixed_s - gpu)


def _seconds(text: str) -> float:
    value, unit = text.split()
    return float(value.replace(",", "")) * {"s": 1.0, "ms": 1e-3, "µs": 1e-6}[unit]


def _operator_rows(out: str, title: str) -> tuple[float, float]:
    """(the rows' times summed, the total row's time) of one --explain operator table."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows, total = 0.0, None
    for line in lines[start + 4:]:
        m = re.search(r"(\d[\d,.]*(?:e-?\d+)? (?:s|ms|µs))\s+[\d.]+%", line)
        if m is None:
            continue
        t = _seconds(m.group(1))
        if line.startswith("total"):
            total = t
            break
        rows += t
    return rows, total


@pytest.mark.parametrize("model,engine,text", [
    ("llama-3.1-8b", "vllm",
     "323 kernels + operators' own 262 µs; its 768 µs of host work (per step and per request)"
     " runs beside"),
    ("llama-3.1-8b", "vllm-v0", "323 kernels + host work 2.77 ms (per step and per request)"),
    ("tiny-llama-test", "vllm", "beyond the GPU's (async scheduling; 768 µs in all)"),
])
def test_the_tables_add_up_to_the_step(run_cli, model, engine, text):
    code, out, err = run_cli("estimate", "-m", model, "-g", "h100-sxm", "-e", engine, "-b",
                             "1", "-p", "1024", "-o", "256", "--explain")
    assert code == 0, err
    flat = " ".join(out.split())
    assert text in flat
    rows, total = _operator_rows(out, "Decode step operators")
    assert rows == pytest.approx(total, rel=0.02)  # each row printed to 3 figures


def test_the_legend_names_the_gemm_factor_where_the_gpu_takes_one(run_cli):
    """vLLM's 16-bit GEMMs stream at 0.9 of the profile's share on an A100 (Ampere): --explain
    says so beside the eff BW column it changes (0.988 x 0.9 = 89%), and says nothing on an
    H100, where the factor is 1."""
    code, out, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "a100-sxm-80gb",
                             "--explain")
    assert code == 0, err
    flat = " ".join(out.split())
    assert "eff BW is the profile's times 0.9 on this GPU's architecture" in flat
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("mlp_gate_up_proj")]
    assert rows and all(r[6] == "89%" for r in rows)
    code, out, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--explain")
    assert code == 0 and "gemm_bandwidth_arch_frac" not in " ".join(out.split())


@pytest.mark.parametrize("args, shown, hidden", [
    # Qwen3-30B-A3B's GEMM depths: gate_up its hidden size, 2,048 / 2,548 = 0.80; down its
    # expert width, 768 / 1,268 = 0.61 (engines_db experts_k_half: 500 on Hopper)
    (("qwen3-30b-a3b", "h100-sxm"), "also times 1.06 on this GPU's architecture: the "
     "engine's fused MoE kernel against its plain GEMMs (experts_compute_frac); and K / "
     "(K + 500) for its GEMM's depth K, the kernel's fixed work per output tile "
     "(gate_up_proj 0.80, down_proj 0.61; experts_k_half)", "experts_fp8_compute_frac"),
    # at TP 4 the down projection sums over 768 / 4 = 192: 192 / 692 = 0.28
    (("qwen3-30b-a3b", "h100-sxm", "--tp", "4"), "(gate_up_proj 0.80, down_proj 0.28; "
     "experts_k_half)", "experts_fp8_compute_frac"),
    # fp8 experts: the fp8 lane's own depth (experts_fp8_k_half 900): 2,048 / 2,948 = 0.69,
    # 768 / 1,668 = 0.46
    (("qwen3-30b-a3b", "h100-sxm", "--weights", "fp8"), "also times 0.64 on this GPU's "
     "architecture: the engine's fused MoE kernel against its plain GEMMs "
     "(experts_fp8_compute_frac); and K / (K + 900) for its GEMM's depth K, the kernel's "
     "fixed work per output tile (gate_up_proj 0.69, down_proj 0.46; experts_fp8_k_half)",
     "(experts_compute_frac)"),
    # the B200: a factor (0.74), no depth (FlashInfer's MoE kernel there)
    (("qwen3-30b-a3b", "b200"), "also times 0.74", "experts_k_half"),
    # the L40S's fp8 experts: no fp8 factor stated for Ada, so not its depth either
    (("qwen3-30b-a3b", "l40s", "--weights", "fp8"), "", "a routed expert's"),
    # fp8 weights computed in 16 bits on an A100 take the W8A16 path: neither factor
    (("qwen3-30b-a3b", "a100-sxm-80gb", "--weights", "fp8"), "", "a routed expert's"),
    (("llama-3.1-8b", "h100-sxm"), "", "a routed expert's"),
    (("llama-3.1-8b", "h100-sxm", "-e", "vllm-0.8"), "times 0.617, the share this release "
     "line's served steps attain (served_compute_frac)", "a routed expert's"),
])
def test_the_legend_names_the_matmul_factors_that_apply(run_cli, args, shown, hidden):
    """--explain says which of the profile's factors multiply a matmul's eff FLOP: the served
    share where the profile states one, and for a MoE model the fused kernel's for its
    experts' type on this GPU, and names none that does not apply."""
    code, out, err = run_cli("estimate", "-m", args[0], "-g", args[1], *args[2:], "--explain")
    assert code == 0, err
    flat = " ".join(out.split())
    assert shown in flat and hidden not in flat
    assert ("served_compute_frac" in flat) == ("vllm-0.8" in args)


def test_each_operator_names_what_sets_its_time():
    """Llama-3.1-8B at batch 1 under vLLM: a layer's norm moves 41 kB (1.31 MB over 32
    layers), 0.02 us at the achievable bandwidth against its kernel's fixed 2.06 us, so its
    kernel's fixed cost sets its time (latency); the gate/up GEMM reads 235 MB a layer,
    81 us, far above its 2 us (memory). The step's total is what takes most of it: memory.
    Its prefill of 1,024 tokens is compute-bound in the GEMMs."""
    e = _est("llama-3.1-8b", "vllm")
    ops = {t.op.name: t for t in e.decode.ops}
    assert ops["attn_norm"].bound == "latency"
    assert ops["mlp_gate_up_proj"].bound == "memory"
    assert e.decode.limiter == "memory"
    assert {t.op.name: t.bound for t in e.prefill.ops}["mlp_gate_up_proj"] == "compute"


def test_the_host_sets_an_eager_moe_prefill():
    """SGLang before 0.5.10 runs a prefill outside CUDA graphs, and a MoE layer's set-up on
    the host (moe_layer_host_us, on the experts' down-projection) outlasts the GPU's work
    for a 1,024-token prompt of gpt-oss-120b on 8 H100s: the host sets that operator's time
    and most of the pass's; a decode step at batch 1, replayed from a graph, is mostly its
    kernels' fixed costs. From 0.5.10 the same prefill replays piecewise graphs, and the
    host sets neither."""
    hw = catalog.load_hardware("h100-sxm")

    def run(engine):
        return estimate(catalog.load_model("gpt-oss-120b"), hw,
                        workload=Workload(batch=1, prompt_tokens=1024, output_tokens=256),
                        parallelism=Parallelism(tp=8), engine=catalog.load_engine(engine))

    e = run("sglang@0.5.9")
    down = next(t for t in e.prefill.ops if t.op.name == "experts_down_proj")
    host_us = catalog.load_engine("sglang").moe_layer_host_s * 1e6
    assert down.bound == "host"
    assert down.time_s / down.op.count >= host_us * 1e-6
    assert e.prefill.limiter == "host"
    assert e.decode.limiter == "latency"
    allreduce = next(t for t in e.decode.ops if t.op.kind == "allreduce")
    assert allreduce.bound == "comm"
    graphed = run("sglang@0.5.12")
    down = next(t for t in graphed.prefill.ops if t.op.name == "experts_down_proj")
    assert down.bound != "host" and graphed.prefill.limiter != "host"
    assert graphed.prefill.time_s < e.prefill.time_s / 2


@pytest.mark.parametrize("args, shown, hidden", [
    # TensorRT-LLM 1.x, per tensor: 3 (its cuBLASLt fp8 GEMM's fixed cost counted in kernels)
    (("llama-3.1-8b", "h100-sxm", "-e", "trtllm", "--weights", "fp8"), "each per-tensor fp8 "
     "matmul's kernels include 3 of the plain cost beside it", "dense_only"),
    # vLLM: its 2 quantization kernels, experts included
    (("qwen3-30b-a3b", "h100-sxm", "--weights", "fp8"), "each per-tensor fp8 matmul's kernels "
     "include 2 of the plain cost", "dense_only"),
    # DeepSeek-V3's checkpoint, block-scaled: 1, its experts none
    (("deepseek-v3", "h200", "-tp", "8", "-e", "trtllm"), "each block-scaled fp8 matmul's "
     "kernels include 1 of the plain cost beside it: its input's quantization, or its GEMM's "
     "fixed cost counted in kernels (fp8_quant_kernels.block), none for the routed experts' "
     "fused MoE kernel (dense_only)", "per-tensor"),
    # and the quantization's pass: --weights fp8 is vLLM's --quantization fp8, two reads
    (("llama-3.1-8b", "h100-sxm", "--weights", "fp8"), "each 16-bit input value read twice "
     "and written once in fp8 (fp8_quant_kernels.dynamic_tensor_reads", "input_reads)"),
    # TensorRT-LLM's static scale: one
    (("llama-3.1-8b", "h100-sxm", "-e", "trtllm", "--weights", "fp8"), "each 16-bit input "
     "value read once and written once in fp8 (fp8_quant_kernels.input_reads)", "twice"),
    # before 1.0 (a TensorRT engine) none, and 16-bit weights none
    (("llama-3.1-8b", "h100-sxm", "-e", "trtllm@0.9", "--weights", "fp8"), "", "fp8_quant"),
    (("llama-3.1-8b", "h100-sxm", "-e", "trtllm"), "", "fp8_quant"),
])
def test_the_legend_names_the_fp8_kernels_where_they_apply(run_cli, args, shown, hidden):
    code, out, err = run_cli("estimate", "-m", args[0], "-g", args[1], *args[2:], "--explain")
    assert code == 0, err
    flat = " ".join(out.split())
    assert shown in flat and hidden not in flat
