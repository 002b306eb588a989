"""MXFP4 weights and quantizing only a MoE model's routed experts (gpt-oss's checkpoint)."""

from __future__ import annotations

import pytest

from planner.core.memory import param_breakdown, weight_bytes, weight_bytes_breakdown
from planner.core.ops import decode_ops
from planner.core.specs import GIB, DType, Precision
from planner.io import catalog

# OCP Microscaling Formats v1.0: 32 FP4 (E2M1) elements share one E8M0 byte:
# 4 + 8 / 32 = 4.25 bits = 0.53125 bytes per weight (the gpt-oss model card's "4.25 bits")
MXFP4_BYTES = 0.53125
GPT_OSS = Precision(weights=DType.mxfp4, quantized_layers="experts")


def test_mxfp4_bytes_per_weight():
    assert Precision(weights=DType.mxfp4).quantized_bytes_per_param == MXFP4_BYTES
    # the group options of int4 do not apply to MX blocks
    assert Precision(weights=DType.mxfp4, group_size=64,
                     scale_bytes=4).quantized_bytes_per_param == MXFP4_BYTES
    assert Precision(weights=DType.mxfp4).compute_dtype == DType.bf16  # weight-only


@pytest.mark.parametrize("name,gib", [
    # gpt-oss model card (OpenAI, arXiv 2508.10925, 2025-08), checkpoint sizes 60.8 GiB and
    # 12.8 GiB, as quoted by https://fitmygpu.com/models/gpt-oss-120b (the card itself could
    # not be opened from here): MXFP4 MoE weights, everything else bf16
    ("gpt-oss-120b", 60.8), ("gpt-oss-20b", 12.8),
])
def test_gpt_oss_checkpoint_size(name, gib):
    m = catalog.load_model(name)
    assert weight_bytes(m, GPT_OSS) / GIB == pytest.approx(gib, rel=0.005)


def test_experts_only_leaves_the_rest_16_bit_by_hand():
    m = catalog.load_model("gpt-oss-20b")
    parts = param_breakdown(m)
    bd = weight_bytes_breakdown(m, GPT_OSS)
    assert bd["moe/routed_experts"] == parts["moe/routed_experts"] * MXFP4_BYTES
    for key in ("attention/q_proj", "attention/o_proj", "embed/tokens", "lm_head"):
        if key in parts:
            assert bd[key] == parts[key] * 2
    everything = weight_bytes_breakdown(m, Precision(weights=DType.mxfp4))
    assert everything["attention/o_proj"] == parts["attention/o_proj"] * MXFP4_BYTES
    # the operators read what memory holds: experts in mxfp4, attention in bf16
    ops = {op.name: op for op in decode_ops(m, GPT_OSS, batch=1, context_tokens=100)}
    assert ops["o_proj"].weight_dtype == DType.bf16 and ops["o_proj"].dtype == DType.bf16
    assert any(op.weight_dtype == DType.mxfp4 for n, op in ops.items()
               if n.startswith("experts_"))


def test_mxfp4_takes_the_engines_int4_path():
    eng = catalog.load_engine("vllm")
    assert eng.quant_fracs(DType.mxfp4) == eng.quant_fracs(DType.int4) is not None


def test_cli(run_json, run_cli):
    d = run_json("estimate", "-m", "gpt-oss-120b", "-g", "h100-sxm", "--weights", "mxfp4",
                 "--quantized-layers", "experts")
    # one H100 holds gpt-oss-120b as released (the model card's claim), in vLLM's Marlin
    # layout (engines_db mxfp4_expert_padding): 65.9 GiB, as vLLM logged (65.97,
    # vllm-project/vllm#23278); SGLang's profile holds the checkpoint's 60.8
    assert d["fits"] and d["weights_bytes"] / GIB == pytest.approx(65.97, rel=0.005)
    d = run_json("estimate", "-m", "gpt-oss-120b", "-g", "h100-sxm", "--weights", "mxfp4",
                 "--quantized-layers", "experts", "-e", "sglang")
    assert d["fits"] and d["weights_bytes"] / GIB == pytest.approx(60.8, rel=0.005)
    assert d["weights"] == "mxfp4" and d["compute"] == "bf16"
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                           "--quantized-layers", "experts")
    assert code == 2 and "no routed experts" in err
    rows = run_json("sweep", "-m", "gpt-oss-20b,llama-3.1-8b", "-g", "h100-sxm", "--weights",
                    "mxfp4", "--quantized-layers", "experts")
    by = {r["model"]: r for r in rows}
    assert by["gpt-oss-20b"]["supported"] and not by["llama-3.1-8b"]["supported"]
    # 12.8 GiB of checkpoint, its experts x 3,072 x 2,944 / 2,880^2 in vLLM's layout
    assert by["gpt-oss-20b"]["weights_bytes"] / GIB == pytest.approx(13.67, rel=0.002)
    # the harness has no MXFP4 kernel: refused before any calibration, not skipped per point
    code, _, err = run_cli("measure", "-m", "tiny-llama-test", "--weights", "mxfp4")
    assert code == 2 and "'mxfp4' is not one of" in err


def test_plan_takes_quantized_layers(run_json):
    rows = run_json("plan", "-m", "gpt-oss-120b", "-g", "h100-sxm", "--weights", "mxfp4",
                    "--quantized-layers", "experts", "-p", "1024", "-o", "128", "--ttft", "5s",
                    "--tpot", "100ms", "--rps", "1", "--tp", "1", "--pp", "1", "--ep", "1")
    # one H100 holds gpt-oss-120b as released, so a one-GPU replica meets these targets
    best = rows[0]
    assert (best["tp"], best["num_gpus"], best["weights"]) == (1, 1, "mxfp4")
    assert best["meets_targets"]


def test_budget_quantized_layers(run_cli, tmp_path):
    import json

    b = tmp_path / "b.yaml"
    dep = """  - model: gpt-oss-120b
    gpu: h100-sxm
    weights: mxfp4
    quantized_layers: {q}
    workload: {{batch: 8, prompt_tokens: 1024, output_tokens: 128}}
    limits: {{fits: true, memory_frac: 90%}}
"""
    b.write_text("deployments:\n" + dep.format(q="experts") + dep.format(q="all"))
    code, out, err = run_cli("check", str(b), "--json")
    assert code == 0, err
    frac = {r["deployment"]: r["predicted"] for r in json.loads(out)["results"]
            if r["limit"] == "memory_frac"}
    # experts only: attention and the rest stay bf16, so the replica holds more than with all
    # linear layers in mxfp4; the labels tell the two apart
    assert frac["gpt-oss-120b on 1xh100-sxm mxfp4 experts"] > \
        frac["gpt-oss-120b on 1xh100-sxm mxfp4"]
    b.write_text("deployments:\n" + dep.format(q="experts").replace("gpt-oss-120b",
                                                                      "llama-3.1-8b"))
    code, _, err = run_cli("check", str(b))
    assert code == 2 and "no routed experts" in err


@pytest.mark.parametrize("name", ["gpt-oss-120b", "gpt-oss-20b", "mixtral-8x7b"])
def test_the_experts_operators_read_what_memory_holds(name):
    """At a batch that reaches every expert, the expert operators read exactly the routed
    experts memory holds: the weights in mxfp4 and gpt-oss's expert biases in bf16 (kept
    apart from the quantized weights, as the checkpoint keeps them)."""
    m = catalog.load_model(name)
    bd = weight_bytes_breakdown(m, GPT_OSS)
    ops = decode_ops(m, GPT_OSS, batch=1_000_000, context_tokens=100)
    read = sum(op.weight_bytes * op.count for op in ops if op.name.startswith("experts_"))
    assert read == pytest.approx(bd["moe/routed_experts"] + bd.get("moe/routed_expert_bias", 0))
    if name.startswith("gpt-oss"):
        parts = param_breakdown(m)
        assert bd["moe/routed_expert_bias"] == parts["moe/routed_expert_bias"] * 2
