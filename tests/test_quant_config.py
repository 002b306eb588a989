"""Checkpoints as they ship: an HF config.json's quantization_config sets the weights'
precision (AWQ, GPTQ, fp8 blocks, compressed-tensors, bitsandbytes, MXFP4), --weights and
--group-size win over it, and the output says where the precision came from; compare and
calibrate warn where a result file disagrees with the deployment given.

Weight bytes are derived by hand for Llama-3.1-8B's shape (tests/fixtures/hf/llama-3.1-8b.json:
hidden 4096, intermediate 14336, 32 layers, 32 query and 8 KV heads of 128, vocabulary
128,256, lm_head untied):
  per layer, linear: q 4096 x 4096 + k, v 4096 x 1024 each + o 4096 x 4096 = 41,943,040
                     gate, up, down 3 x 4096 x 14336                        = 176,160,768
  32 layers of linear layers: 32 x 218,103,808                             = 6,979,321,856
  embeddings 128,256 x 4096 = 525,336,576; lm_head the same; norms 2 x 4096 x 32 + 4096
  = 266,240: 16-bit bytes 2 x (525,336,576 x 2 + 266,240)                  = 2,101,878,784
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.errors import SpecError
from planner.core.memory import param_breakdown
from planner.core.specs import DType
from planner.io.catalog import load_model, model_from_hf_config

HF = Path(__file__).parent / "fixtures" / "hf"
SERVERS = Path(__file__).parent / "fixtures" / "servers"
LINEAR_8B = 6_979_321_856  # the decoder's linear weights (above)
HALF_8B_BYTES = 2_101_878_784  # embeddings, lm_head and norms in 16-bit
LM_HEAD_8B = 525_336_576
G = ("-g", "h100-sxm")

AWQ = {"bits": 4, "group_size": 128, "modules_to_not_convert": None, "quant_method": "awq",
       "version": "gemm", "zero_point": True}  # hugging-quants/...-AWQ-INT4's, verbatim
GPTQ = {"bits": 4, "group_size": 128, "desc_act": True, "sym": True, "damp_percent": 0.01,
        "true_sequential": True, "quant_method": "gptq", "checkpoint_format": "gptq",
        "model_file_base_name": None, "model_name_or_path": None}
FP8_BLOCK = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
             "weight_block_size": [128, 128]}  # deepseek-ai/DeepSeek-V3's
CT_W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {
                "targets": ["Linear"], "input_activations": None, "output_activations": None,
                "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                            "group_size": 128, "symmetric": True, "dynamic": False,
                            "actorder": None, "block_structure": None, "observer": "minmax"}}},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "quantization_status": "compressed"}
BNB_NF4 = {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
           "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
           "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8",
           "llm_int8_skip_modules": None, "llm_int8_threshold": 6.0}


def _llama(tmp_path: Path, qc: dict | None, name: str = "q", **extra) -> str:
    cfg = json.loads((HF / "llama-3.1-8b.json").read_text())
    if qc is not None:
        cfg["quantization_config"] = qc
    cfg.update(extra)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder / "config.json")


def _weights_bytes(run_json, model: str, *args: str) -> dict:
    return run_json("estimate", "-m", model, *G, *args)


# --------------------------------------------------------------------------- weight bytes


def test_awq_8b_weight_bytes_by_hand(run_json, tmp_path):
    """int4 in groups of 128: half a byte per weight, an fp16 scale (2 bytes) and a packed
    4-bit zero (0.5 bytes) per group: 0.5 + 2.5 / 128 = 66.5 / 128 bytes per weight."""
    d = _weights_bytes(run_json, _llama(tmp_path, AWQ, torch_dtype="float16"))
    quantized = LINEAR_8B // 128 * 66.5  # 54,525,952 groups x 66.5 = 3,625,975,808
    assert d["weights_bytes"] == quantized + HALF_8B_BYTES == 5_727_854_592  # 5.33 GiB
    assert d["weights"] == "int4" and d["weights_source"] == "checkpoint"
    assert d["compute"] == "fp16"  # AWQ kernels run in the checkpoint's float16
    assert "AWQ, group 128" in d["weights_source_detail"]
    # the same file without its quantization_config: every weight in bf16, 14.96 GiB
    bf16 = _weights_bytes(run_json, _llama(tmp_path, None, "plain"))
    assert bf16["weights_bytes"] == 2 * (LINEAR_8B + 2 * LM_HEAD_8B + 266_240) == 16_060_522_496
    assert bf16["weights_source"] == "default"


def test_awq_human_output_says_where_the_precision_came_from(run_cli, tmp_path):
    path = _llama(tmp_path, AWQ)
    code, out, err = run_cli("estimate", "-m", path, *G)
    assert code == 0, err
    flat = "".join(out.split())  # rich folds a long path anywhere
    assert "".join(f"weights: int4 (AWQ, group 128, zero points, from {path} "
                   "quantization_config)".split()) in flat
    assert "5.33 GiB" in out


def test_gptq_symmetric_act_order(run_json, tmp_path):
    """Symmetric GPTQ holds no zero points once loaded (vLLM's Marlin path): 0.5 + 2 / 128
    = 66 / 128 bytes per weight; act-order adds no bytes worth counting."""
    d = _weights_bytes(run_json, _llama(tmp_path, GPTQ))
    assert d["weights_bytes"] == LINEAR_8B // 128 * 66 + HALF_8B_BYTES == 5_700_591_616
    assert d["checkpoint_quantization"]["label"] == "GPTQ, 4-bit, group 128, symmetric, act-order"
    # lm_head: true quantizes the lm_head too: 525,336,576 x 66 / 128 = 270,876,672 bytes
    d = _weights_bytes(run_json, _llama(tmp_path, {**GPTQ, "lm_head": True}, "head"))
    assert d["weights_bytes"] == (LINEAR_8B + LM_HEAD_8B) // 128 * 66 + \
        2 * (LM_HEAD_8B + 266_240) == 4_920_795_136


def test_gptq_8bit_asymmetric(tmp_path):
    m = load_model(_llama(tmp_path, {**GPTQ, "bits": 8, "sym": False, "group_size": 32}))
    p = m.quantization.precision()
    assert p.weights == DType.int8 and p.group_size == 32
    assert p.quantized_bytes_per_param == 1 + (2 + 1) / 32  # an 8-bit zero per group


def test_fp8_block_scales(run_json, tmp_path):
    """One fp32 scale per 128 x 128 block: 1 + 4 / 16,384 bytes per weight; W8A8."""
    d = _weights_bytes(run_json, _llama(tmp_path, FP8_BLOCK))
    assert d["weights_bytes"] == LINEAR_8B + LINEAR_8B // 16384 * 4 + HALF_8B_BYTES \
        == 9_082_904_576
    assert d["weights"] == "fp8" and d["compute"] == "fp8"


def test_deepseek_v3_fp8_every_linear_layer(tmp_path):
    cfg = json.loads((HF / "deepseek-v3.json").read_text())
    cfg["quantization_config"] = FP8_BLOCK
    m = model_from_hf_config(cfg, "deepseek-v3/config.json")
    p = m.quantization.precision()
    assert (p.weights, p.quantized_layers, p.fp8_scale_group, p.lm_head_quantized) == \
        (DType.fp8, "all", 16384, False)


def test_compressed_tensors_int4_ignoring_lm_head(run_json, tmp_path):
    """W4A16, symmetric groups of 128 (no zero points): 0.5 + 2 / 128 bytes per weight, the
    lm_head ignored (16-bit)."""
    d = _weights_bytes(run_json, _llama(tmp_path, CT_W4A16))
    assert d["weights_bytes"] == LINEAR_8B // 128 * 66 + HALF_8B_BYTES == 5_700_591_616
    assert d["checkpoint_quantization"]["lm_head_quantized"] is False
    # without "lm_head" in ignore the lm_head is one more Linear, quantized with the rest
    d = _weights_bytes(run_json, _llama(tmp_path, {**CT_W4A16, "ignore": []}, "all"))
    assert d["weights_bytes"] == 4_920_795_136  # as GPTQ with lm_head: true


def test_compressed_tensors_fp8_dynamic_channel(tmp_path):
    grp = {"targets": ["Linear"],
           "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
           "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                 "dynamic": True}}
    m = load_model(_llama(tmp_path, {"quant_method": "compressed-tensors",
                                     "config_groups": {"group_0": grp},
                                     "ignore": ["lm_head"]}))
    p = m.quantization.precision()
    assert (p.weights, p.compute_dtype, p.fp8_scale_group) == (DType.fp8, DType.fp8, 4096)
    assert not p.fp8_blocks  # a scale per channel: the engine's per-tensor/channel path
    blk = {**grp, "weights": {**grp["weights"], "strategy": "block",
                              "block_structure": [128, 128]}}
    m = load_model(_llama(tmp_path, {"quant_method": "compressed-tensors",
                                     "config_groups": {"group_0": blk}}, "blocks"))
    assert m.quantization.precision().fp8_blocks
    # weight-only fp8 (no input activations): the matmuls in 16-bit
    grp = {**grp, "input_activations": None}
    m = load_model(_llama(tmp_path, {"quant_method": "compressed-tensors",
                                     "config_groups": {"group_0": grp}}, "w8a16"))
    assert m.quantization.precision().compute_dtype == DType.bf16


def test_an_fp8_checkpoints_activation_scheme_says_how_its_inputs_are_scaled(run_json,
                                                                             tmp_path):
    """vLLM finds one scale per input tensor at run time for an fp8 checkpoint whose
    activation_scheme is dynamic and whose weights have no blocks (a whole-tensor maximum
    first: ``fp8_dynamic_tensor``); a static scale, blocks, or compressed-tensors' per-token
    scales take none; its "tensor" strategy with dynamic: true does."""
    def flag(qc, name):
        return load_model(_llama(tmp_path, qc, name)).quantization.precision() \
            .fp8_dynamic_tensor

    fp8 = {"quant_method": "fp8", "fmt": "e4m3"}
    assert flag({**fp8, "activation_scheme": "dynamic"}, "dyn") is True
    assert flag(fp8, "default") is True  # no scheme stated: read as dynamic
    assert flag({**fp8, "activation_scheme": "static"}, "static") is False
    assert flag(FP8_BLOCK, "block") is False
    grp = {"targets": ["Linear"],
           "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
           "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                 "dynamic": True}}

    def ct(act, name):
        return flag({"quant_method": "compressed-tensors",
                     "config_groups": {"group_0": {**grp, "input_activations": act}}}, name)

    assert ct(grp["input_activations"], "token") is False
    assert ct({**grp["input_activations"], "strategy": "tensor"}, "tensor") is True
    assert ct({**grp["input_activations"], "strategy": "tensor", "dynamic": False},
              "tensor-static") is False
    # --json says so, and a static scale's quantization reads each input once: a shorter
    # prefill than the same weights with a scale found at run time
    static = _weights_bytes(run_json, _llama(tmp_path, {**fp8, "activation_scheme": "static"},
                                             "json-static"), "-p", "4096")
    dynamic = _weights_bytes(run_json, _llama(tmp_path, fp8, "json-dyn"), "-p", "4096")
    assert static["checkpoint_quantization"]["fp8_dynamic_tensor"] is False
    assert dynamic["checkpoint_quantization"]["fp8_dynamic_tensor"] is True
    assert static["ttft_s"] < dynamic["ttft_s"]


def test_mxfp4_gpt_oss_experts_only(run_json):
    """gpt-oss-20b's own config: MXFP4 routed experts (4 + 8 / 32 bits: 0.53125 bytes per
    weight), everything else bf16. Routed experts: 24 layers x 32 experts x 3 x 2880 x 2880
    = 19,110,297,600 weights."""
    path = str(HF / "gpt-oss-20b.json")
    # SGLang's profile holds the experts as the checkpoint stores them
    d = _weights_bytes(run_json, path, "-e", "sglang")
    m = load_model(path)
    bd = param_breakdown(m)
    experts = bd["moe/routed_experts"]
    assert experts == 24 * 32 * 3 * 2880 * 2880 == 19_110_297_600
    rest = (sum(bd.values()) - experts) * 2
    assert d["weights_bytes"] == experts * 0.53125 + rest
    assert (d["weights"], d["quantized_layers"], d["weights_source"]) == \
        ("mxfp4", "experts", "checkpoint")
    same = _weights_bytes(run_json, "gpt-oss-20b", "--weights", "mxfp4",
                          "--quantized-layers", "experts", "-e", "sglang")
    assert same["weights_bytes"] == d["weights_bytes"]
    # vLLM (the default profile) pads them for its Marlin MoE kernel: hidden 2,880 -> 3,072,
    # intermediate 2,880 -> 2,944 (engines_db mxfp4_expert_padding)
    padded = _weights_bytes(run_json, path)
    assert padded["weights_bytes"] == pytest.approx(
        experts * 3072 * 2944 / (2880 * 2880) * 0.53125 + rest, rel=1e-12)


def test_built_in_gpt_oss_is_estimated_as_released(run_json):
    """A built-in model whose checkpoint ships quantized carries its config.json's
    quantization_config (models_db), read as that config.json's is: the name and the file
    give the same precision and bytes, and the detail names the official config."""
    for engine in ("sglang", "vllm"):  # held as stored; and padded for vLLM's MoE kernel
        by_name = _weights_bytes(run_json, "gpt-oss-20b", "-e", engine)
        by_file = _weights_bytes(run_json, str(HF / "gpt-oss-20b.json"), "-e", engine)
        assert by_name["weights_bytes"] == by_file["weights_bytes"]
        assert (by_name["weights"], by_name["quantized_layers"], by_name["weights_source"]) \
            == ("mxfp4", "experts", "checkpoint")
    assert "https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json" in \
        by_name["weights_source_detail"]


def test_built_in_gpt_oss_120b_fits_one_h100_as_vllm_loaded_it(run_json):
    """vLLM logged 'Model loading took 65.9651 GiB' for gpt-oss-120b on an H100 running its
    Marlin MXFP4 MoE path (vllm-project/vllm#23278, 2025-08-20); as bf16 it is 218 GiB."""
    d = _weights_bytes(run_json, "gpt-oss-120b")
    assert d["weights_bytes"] / 2**30 == pytest.approx(65.9651, rel=0.005)
    assert d["fits"] is True
    bf16 = _weights_bytes(run_json, "gpt-oss-120b", "--weights", "bf16")
    assert bf16["weights_source"] == "--weights" and bf16["fits"] is False


def test_built_in_deepseek_is_fp8_blocks_as_released():
    """DeepSeek-V3 and -R1 ship FP8 weights with an fp32 scale per 128 x 128 block, W8A8,
    the matmuls' 16-bit type bf16 (torch_dtype)."""
    for name in ("deepseek-v3", "deepseek-r1"):
        m = load_model(name)
        assert m.quantization.file == m.source
        p = m.quantization.precision()
        assert (p.weights, p.compute_dtype, p.quantized_layers, p.fp8_scale_group) == \
            (DType.fp8, DType.fp8, "all", 128 * 128)
        assert p.fp8_blocks  # the engine's block-scaled GEMM path


def test_models_lists_how_each_checkpoint_ships(run_json, run_cli):
    rows = {r["name"]: r for r in run_json("models")}
    assert rows["gpt-oss-120b"]["checkpoint_quantization"] == \
        {"weights": "mxfp4", "quantized_layers": "experts", "label": "MXFP4, experts only"}
    assert rows["deepseek-r1"]["checkpoint_quantization"]["weights"] == "fp8"
    assert rows["llama-3.1-8b"]["checkpoint_quantization"] is None
    code, out, _ = run_cli("models")
    line = next(x for x in out.splitlines() if x.startswith("gpt-oss-20b "))
    assert code == 0 and line.split()[-1] == "mxfp4*"


def test_a_model_files_quantization_config_is_read_as_a_config_jsons(run_cli, tmp_path):
    """A user's model YAML may carry one too: a block llmplan cannot read is one line and
    exit 2 naming that file and the field, unless --weights stands in; null is none."""
    text = (Path(__file__).parent.parent / "models_db" / "llama-3.1-8b.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "quantization_config: {quant_method: hqq, nbits: 4}\n")
    code, out, err = run_cli("estimate", "-m", str(bad), *G)
    lines = err.strip().splitlines()
    assert code == 2 and not out and len(lines) == 1, err
    assert str(bad) in lines[0] and "quantization_config.quant_method:" in lines[0]
    code, _, err = run_cli("estimate", "-m", str(bad), *G, "--weights", "int4")
    assert code == 0, err
    awq = tmp_path / "awq.yaml"
    awq.write_text(text + "torch_dtype: float16\nquantization_config: " + json.dumps(AWQ)
                   + "\n")
    m = load_model(str(awq))
    assert m.quantization.method == "awq" and m.quantization.compute == DType.fp16
    none = tmp_path / "none.yaml"
    none.write_text(text + "quantization_config: null\n")
    assert load_model(str(none)).quantization is None


def test_bitsandbytes_nf4_double_quant(run_json, tmp_path):
    """Blocks of 64 with an 8-bit absmax and an fp32 scale per 256 absmax values:
    0.5 + (1 + 4 / 256) / 64 = 33,808 / 65,536 bytes per weight."""
    d = _weights_bytes(run_json, _llama(tmp_path, BNB_NF4))
    assert d["weights_bytes"] == LINEAR_8B // 65536 * 33808 + HALF_8B_BYTES == 5_702_295_552
    assert d["compute"] == "bf16"
    m = load_model(_llama(tmp_path, {**BNB_NF4, "bnb_4bit_use_double_quant": False}, "fp32"))
    assert m.quantization.precision().quantized_bytes_per_param == 0.5 + 4 / 64
    m = load_model(_llama(tmp_path, {"quant_method": "bitsandbytes", "load_in_8bit": True},
                          "int8"))
    assert m.quantization.precision().weights == DType.int8


# --------------------------------------------------------------------------- precedence


def test_weights_and_group_size_win_over_the_checkpoint(run_json, run_cli, tmp_path):
    path = _llama(tmp_path, AWQ)
    d = _weights_bytes(run_json, path, "--weights", "int8")
    assert (d["weights"], d["weights_source"]) == ("int8", "--weights")
    assert d["checkpoint_quantization"]["used"] is False
    assert d["weight_group_size"] == 128
    # --group-size alone keeps the checkpoint's int4 and zero points: 0.5 + 2.5 / 64
    d = _weights_bytes(run_json, path, "--group-size", "64")
    assert d["weights_source"] == "checkpoint" and d["weight_group_size"] == 64
    assert d["weights_bytes"] == LINEAR_8B // 128 * 69 + HALF_8B_BYTES == 5_864_169_472
    # vLLM's --dtype float16 beside an int4 checkpoint is the matmuls' type, not the weights'
    d = _weights_bytes(run_json, path, "--dtype", "float16")
    assert (d["weights"], d["compute"]) == ("int4", "fp16")
    code, out, _ = run_cli("estimate", "-m", path, *G, "--weights", "bf16")
    assert code == 0 and "(--weights;" in " ".join(out.split())
    # a built-in model has no checkpoint: the default
    assert _weights_bytes(run_json, "llama-3.1-8b")["weights_source"] == "default"


# --------------------------------------------------------------------------- bad configs


@pytest.mark.parametrize("qc,field", [
    ({"quant_method": "hqq", "nbits": 4}, "quantization_config.quant_method"),
    ({**GPTQ, "bits": 3}, "quantization_config.bits"),
    ({**AWQ, "group_size": "128"}, "quantization_config.group_size"),
    ({**FP8_BLOCK, "weight_block_size": [128]}, "quantization_config.weight_block_size"),
    ({**AWQ, "modules_to_not_convert": "lm_head"}, "quantization_config.modules_to_not_convert"),
    ({"quant_method": "compressed-tensors", "config_groups": {
        "g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float",
                                                  "group_size": 16}}}},
     "quantization_config.config_groups.g.weights.type"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "int4"},
     "quantization_config.bnb_4bit_quant_type"),
    ("awq", "quantization_config"),
])
def test_bad_quantization_config_is_one_line_exit_2(run_cli, tmp_path, qc, field):
    path = _llama(tmp_path, qc)
    code, out, err = run_cli("estimate", "-m", path, *G)
    assert code == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and path in lines[0] and f"{field}:" in lines[0], err
    # --weights stands in for a config llmplan cannot read
    code, _, err = run_cli("estimate", "-m", path, *G, "--weights", "int4")
    assert code == 0, err


def test_problem_raises_spec_error(tmp_path):
    m = load_model(_llama(tmp_path, {"quant_method": "eetq"}))
    with pytest.raises(SpecError, match="quant_method: 'eetq' is not supported"):
        m.quantization.precision()


def test_unmodelled_modules_are_a_note(run_cli, tmp_path):
    path = _llama(tmp_path, {**AWQ, "modules_to_not_convert": ["model.layers.0.mlp.down_proj"]})
    code, out, err = run_cli("estimate", "-m", path, *G)
    assert code == 0, err
    assert "model.layers.0.mlp.down_proj left in 16-bit" in " ".join(out.split())


ATTENTION_8B = 32 * 41_943_040  # q, k, v, o of every layer (above): 1,342,177,280
MLP_8B = 32 * 176_160_768  # gate, up, down: 5,637,144,576
# Meta's Llama-3.1-405B-FP8 scheme (the Llama 3 paper, arXiv 2407.21783, section 6.2: the
# feed-forward layers' weights and activations in fp8, rows scaled, the dynamic scale bounded
# by 1200; self-attention left out), as an fbgemm_fp8 block lists it
FBGEMM = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
          "modules_to_not_convert": [f"model.layers.{i}.self_attn.{p}" for i in range(32)
                                     for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
          + ["lm_head"]}


def test_fbgemm_fp8_quantizes_the_mlp_alone(run_json, tmp_path):
    """FBGEMM fp8 with attention left in 16-bit: the MLP's weights in fp8 with an fp32 scale
    per output channel (one per row of 4,096 inputs, 14,336 for down: counted per hidden
    size, 4 / 4096 bytes a weight), attention, embeddings, lm_head and norms in bf16."""
    d = _weights_bytes(run_json, _llama(tmp_path, FBGEMM))
    assert d["weights"] == "fp8" and d["weights_source"] == "checkpoint"
    assert d["weights_bytes"] == pytest.approx(
        MLP_8B * (1 + 4 / 4096) + 2 * ATTENTION_8B + HALF_8B_BYTES, rel=1e-12)
    assert "FBGEMM FP8, per channel" in d["weights_source_detail"]
    q = load_model(_llama(tmp_path, FBGEMM, "again")).quantization.precision()
    assert q.quantized_layers == "mlp" and not q.fp8_dynamic_tensor and not q.fp8_blocks
    # the matmuls follow the bytes: attention's in bf16, the MLP's in fp8
    ops = {o["name"]: o for o in d["operators"]["decode"]}
    assert ops["qkv_proj"]["dtype"] == ops["o_proj"]["dtype"] == "bf16"
    assert ops["mlp_gate_up_proj"]["dtype"] == ops["mlp_down_proj"]["dtype"] == "fp8"
    assert ops["mlp_down_proj"]["weight_bytes"] == pytest.approx(
        14_336 * 4_096 * (1 + 4 / 4096) * 32)


def test_quantized_layers_mlp_is_a_flag_and_a_dense_configs_attention_list(run_json, tmp_path):
    """--quantized-layers mlp asks what such a checkpoint stores; a dense model's fp8 config
    that leaves its attention out is read as it (it was counted as all layers, with a note)."""
    flag = _weights_bytes(run_json, "llama-3.1-8b", "--weights", "fp8",
                          "--quantized-layers", "mlp")
    assert flag["weights_bytes"] == pytest.approx(
        MLP_8B + 2 * ATTENTION_8B + HALF_8B_BYTES, rel=1e-12)  # per-tensor scales: no bytes
    left = {**FP8_BLOCK, "modules_to_not_convert": ["self_attn"]}
    d = _weights_bytes(run_json, _llama(tmp_path, left))
    assert d["weights_bytes"] == pytest.approx(
        MLP_8B * (1 + 4 / 16384) + 2 * ATTENTION_8B + HALF_8B_BYTES, rel=1e-12)
    # the MLP in fp8 alone decodes faster than bf16 and slower than every layer in fp8
    tpot = [run_json("estimate", "-m", "llama-3.1-8b", *G, "--weights", w, *extra)["tpot_s"]
            for w, extra in (("bf16", ()), ("fp8", ("--quantized-layers", "mlp")),
                             ("fp8", ()))]
    assert tpot[0] > tpot[1] > tpot[2]


# --------------------------------------------------------------------------- compare


def _result(tmp_path: Path, **changes) -> str:
    d = json.loads((SERVERS / "vllm_bench_serve.json").read_text())
    d.update(changes)
    p = tmp_path / "r.json"
    p.write_text(json.dumps(d))
    return str(p)


def test_compare_warns_on_model_and_tp(run_cli, tmp_path):
    r = _result(tmp_path, model_id="meta-llama/Llama-3.1-70B-Instruct", tp="2")
    code, out, err = run_cli("compare", r, "-m", "llama-3.1-8b", *G)
    assert code == 0, err
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 2
    assert "'meta-llama/Llama-3.1-70B-Instruct', not llama-3.1-8b" in warnings[0]
    assert "--metadata says TP 2; the prediction uses --tp 1" in warnings[1]
    code, out, err = run_cli("compare", r, "-m", "llama-3.1-8b", *G, "--strict")
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "(+1 more)" in err


def test_compare_agrees_quietly(run_cli):
    """The fixtures' own model (an -Instruct variant of the same name), TP, precision and
    engine (the SGLang file's server_info is an SGLang server's)."""
    for f, engine in (("vllm_bench_serve.json", "vllm"), ("sglang_bench_serving.jsonl",
                                                          "sglang")):
        code, _, err = run_cli("compare", str(SERVERS / f), "-m", "llama-3.1-8b", *G, "-e",
                               engine, "--strict")
        assert code == 0 and "warning" not in err, err


def test_sglang_server_info_quantization_disagrees(run_cli, tmp_path):
    line = json.loads((SERVERS / "sglang_bench_serving.jsonl").read_text().splitlines()[0])
    line["server_info"].update(quantization="fp8", kv_cache_dtype="fp8_e4m3")
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps(line) + "\n")
    code, _, err = run_cli("compare", str(p), "-m", "llama-3.1-8b", *G, "-e", "sglang")
    assert code == 0
    assert "server_info says weights --quantization fp8 (fp8); the prediction uses bf16 " \
        "(default)" in " ".join(err.split())
    assert "KV cache fp8_e4m3" in err
    code, _, err = run_cli("compare", str(p), "-m", "llama-3.1-8b", *G, "--weights", "fp8",
                           "--kv-cache", "fp8", "-e", "sglang", "--strict")
    assert code == 0, err


def test_impossible_mbu_is_flagged(run_cli, run_json, tmp_path):
    """A 3 ms TPOT for Llama-3.1-8B in bf16 on one H100: 16 GB of weights in 3 ms is
    5.4 TB/s, above its 3.35 TB/s."""
    r = _result(tmp_path, mean_tpot_ms=3.0)
    code, out, err = run_cli("compare", r, "-m", "llama-3.1-8b", *G)
    assert code == 0
    assert "MBU impossible" in " ".join(out.split())
    assert "is impossible" in err and "deployment given is probably wrong" in " ".join(
        err.split())
    (run,) = run_json("compare", r, "-m", "llama-3.1-8b", *G)["runs"]
    assert run["mbu"] > 1 and run["mbu_impossible"] is True
    code, _, err = run_cli("compare", r, "-m", "llama-3.1-8b", *G, "--strict")
    assert code == 2 and "MBU" in err and len(err.strip().splitlines()) == 1
    # the same run against int4 weights is possible: the warning goes
    code, out, err = run_cli("compare", r, "-m", "llama-3.1-8b", *G, "--weights", "int4")
    assert "MBU impossible" not in " ".join(out.split()) and "is impossible" not in err


def test_calibrate_strict_refuses_a_disagreeing_file(run_cli, tmp_path):
    r = _result(tmp_path, tp="4")
    code, _, err = run_cli("calibrate", r, "-m", "llama-3.1-8b", *G, "--out",
                           str(tmp_path / "p.yaml"), "--strict")
    assert code == 2 and "TP 4" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.yaml").exists()


def test_simulate_and_plan_take_the_checkpoints_precision(run_json, tmp_path):
    """An AWQ checkpoint simulates as int4 with its own group (64 here, not the default 128),
    --dtype float16 beside it sets the matmuls and not the weights, and the JSON says where the
    precision came from; plan sizes the checkpoint as it ships unless --weights is given."""
    qc = {**AWQ, "group_size": 64}
    path = _llama(tmp_path, qc)
    sim = ("simulate", "-m", path, *G, "-n", "20", "-p", "128", "-o", "16")
    d = run_json(*sim)
    assert d["weights"] == "int4" and d["weights_source"] == "checkpoint"
    assert d["weight_group_size"] == 64
    f16 = run_json(*sim, "--dtype", "float16")
    assert f16["weights"] == "int4"
    over = run_json(*sim, "--weights", "bf16")
    assert over["weights"] == "bf16" and over["weights_source"] == "--weights"
    assert over["kv_capacity_tokens"] < d["kv_capacity_tokens"]  # 16-bit weights leave less


def test_plan_sizes_a_quantized_checkpoint_as_it_ships(run_cli, tmp_path):
    path = _llama(tmp_path, AWQ)
    args = ("plan", "-m", path, *G, "--rps", "2", "-p", "512", "-o", "128", "--ttft", "2s",
            "--tpot", "100ms", "--json")
    code, out, err = run_cli(*args)
    assert code == 0, err
    rows = json.loads(out)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert rows and {r["weights"] for r in rows} == {"int4"}
    assert "from" in err and "quantization_config" in err
    code, out, err = run_cli(*args, "--weights", "bf16,int4")
    rows = json.loads(out)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    # a disaggregated row reads prefill/decode where its two sides' weights differ
    assert code == 0 and {w for r in rows for w in r["weights"].split("/")} == {"bf16", "int4"}


def test_a_configs_torch_dtype_is_the_default_16_bit_type(run_json, run_cli, tmp_path):
    """Llama-2-7b-hf's config.json says torch_dtype float16: estimated in fp16 (vLLM's
    --dtype auto), so a T4 (no bf16 tensor cores) takes it as it takes --weights fp16;
    --dtype auto keeps it, --weights bf16 sets it aside. A bfloat16 or absent torch_dtype
    is bf16, as before; a model YAML may carry it in the config's spelling."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
           "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 32, "max_position_embeddings": 4096, "vocab_size": 32000,
           "rms_norm_eps": 1e-5, "_name_or_path": "meta-llama/Llama-2-7b-hf"}
    f16, b16, none = (tmp_path / n / "config.json" for n in ("f16", "b16", "none"))
    for path, dt in ((f16, "float16"), (b16, "bfloat16"), (none, None)):
        path.parent.mkdir()
        path.write_text(json.dumps({**cfg, **({"torch_dtype": dt} if dt else {})}))
    assert run_json("estimate", "-m", str(f16), "-g", "h100-sxm")["weights"] == "fp16"
    assert run_json("estimate", "-m", str(f16), "-g", "h100-sxm", "--dtype",
                    "auto")["weights"] == "fp16"
    assert run_json("estimate", "-m", str(f16), "-g", "h100-sxm", "--weights",
                    "bf16")["weights"] == "bf16"
    assert run_json("estimate", "-m", str(b16), "-g", "h100-sxm")["weights"] == "bf16"
    assert run_json("estimate", "-m", str(none), "-g", "h100-sxm")["weights"] == "bf16"
    t4 = run_json("estimate", "-m", str(f16), "-g", "t4")
    assert t4["weights"] == "fp16" and t4["compute"] == "fp16"
    # bf16 on a T4: vLLM 0.9+ falls back to fp16 (tests/test_auto_dtype.py); vLLM 0.6-0.8
    # still refuse it, naming the way out
    assert run_json("estimate", "-m", str(none), "-g", "t4")["weights"] == "fp16"
    code, _, err = run_cli("estimate", "-m", str(none), "-g", "t4", "-e", "vllm-v0")
    assert code == 2 and "fp16" in err
    y = tmp_path / "m.yaml"
    y.write_text(yaml.safe_dump({"name": "l2", "architecture": "llama", "source": "x",
                                 "vocab_size": 32000, "hidden_size": 4096, "num_layers": 32,
                                 "num_attention_heads": 32, "num_kv_heads": 32,
                                 "intermediate_size": 11008, "max_position_embeddings": 4096,
                                 "torch_dtype": "float16"}))
    assert run_json("estimate", "-m", str(y), "-g", "h100-sxm")["weights"] == "fp16"
    # float32 beside a quantization_config (an AWQ copy of a float32 config): no 16-bit type
    # stated, the AWQ weights read as before, bf16 the type they compute in
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
           "version": "gemm"}
    y.write_text(yaml.safe_dump({**yaml.safe_load(y.read_text()), "torch_dtype": "float32",
                                 "quantization_config": awq}))
    d = run_json("estimate", "-m", str(y), "-g", "h100-sxm")
    assert d["weights"] == "int4" and d["compute"] == "bf16"


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["llama-3.1-8b", "qwen3-32b", "mixtral-8x7b", "deepseek-v3",
                             "gpt-oss-20b", "llama-3.1-405b"]),
       weights=st.sampled_from(["fp8", "int8", "int4", "mxfp4"]), tp=st.sampled_from([1, 2, 8]))
def test_quantizing_fewer_layers_never_holds_fewer_bytes(name, weights, tp):
    """Every linear layer quantized holds the fewest bytes, the MLP layers alone fewer than
    the 16-bit checkpoint and more than every layer (attention stays 16-bit); a MoE model's
    routed experts alone no fewer than every MLP (its shared experts and dense layers stay
    16-bit, where it has them)."""
    from planner.core.memory import weight_bytes
    from planner.core.specs import Precision

    m = load_model(name)
    got = {q: weight_bytes(m, Precision.of(weights, quantized_layers=q), tp=tp)
           for q in ("all", "mlp", "experts")}
    half = weight_bytes(m, Precision.of("bf16"), tp=tp)
    assert got["all"] < got["mlp"] < half
    if m.moe is not None:
        assert got["mlp"] <= got["experts"] <= half


def test_mlp_layers_on_moe_and_mla_models_by_operator(run_json):
    """Under --quantized-layers mlp the MLP's operators (a dense layer's, the shared experts',
    the routed experts') take the weights' type and every attention projection, MLA's
    included (mla_q_up_proj ends in up_proj), the router and the lm_head stay 16-bit."""
    for name, attention in (("deepseek-v3", {"mla_down_proj", "mla_q_up_proj",
                                             "mla_kv_up_proj", "o_proj"}),
                            ("qwen3-30b-a3b", {"qkv_proj", "o_proj"})):
        d = run_json("estimate", "-m", name, "-g", "h200", "--tp", "8", "--weights", "fp8",
                     "--quantized-layers", "mlp")
        ops = {o["name"]: o for o in d["operators"]["decode"] if o["kind"] == "matmul"}
        assert attention <= set(ops), (name, sorted(ops))
        for n, o in ops.items():
            mlp = n.startswith(("mlp_", "experts_", "shared_"))
            assert o["dtype"] == ("fp8" if mlp else "bf16"), (name, n, o["dtype"])
        assert any(n.startswith("experts_") for n in ops)


def test_a_vision_towers_attention_and_fbgemm_on_moe(tmp_path):
    """A list naming only a vision tower's attention leaves the decoder's quantized (it stays
    16-bit in the planner's accounting anyway); fbgemm_fp8 on a MoE model (vLLM quantizes no
    FusedMoE layer under it) is refused with the field named."""
    from planner.io.quant_config import checkpoint_quant

    q = checkpoint_quant({"quantization_config": {**FP8_BLOCK, "modules_to_not_convert": [
        "model.vision_tower.layers.0.self_attn.q_proj", "visual.blocks.0.attn.qkv"]}},
        "c.json", moe=False, hidden_size=4096)
    assert q.problem is None and q.quantized_layers == "all"
    q = checkpoint_quant({"quantization_config": FBGEMM}, "c.json", moe=True, hidden_size=4096)
    assert q.problem and "quantization_config.quant_method" in q.problem and "fbgemm" in q.problem


def test_which_layers_a_list_leaves_in_16bit(tmp_path):
    """Attention left in 16-bit in every layer (a name without a layer index, or every
    index) is ``mlp``; in some layers alone it is noted and counted as quantized (one
    precision per component, not per layer). A MoE model's list leaving attention out keeps
    its shared experts and dense MLPs quantized (``mlp``) unless it names them too
    (``experts``)."""
    from planner.io.quant_config import checkpoint_quant

    def read(names, *, moe=False, num_layers=32):
        return checkpoint_quant({"quantization_config": {**FP8_BLOCK,
                                                         "modules_to_not_convert": names}},
                                "c.json", moe=moe, hidden_size=4096, num_layers=num_layers)

    every = [f"model.layers.{i}.self_attn.{p}" for i in range(32) for p in ("q_proj", "o_proj")]
    assert read(every).quantized_layers == "mlp" and not read(every).notes
    assert read(["re:.*self_attn.*"]).quantized_layers == "mlp"
    # a pattern's escaped dots name a layer as plainly
    assert read([r"re:model\.layers\.0\.self_attn\..*"]).quantized_layers == "all"
    ends = [f"model.layers.{i}.self_attn.q_proj" for i in (0, 31)]
    q = read(ends)
    assert q.problem is None and q.quantized_layers == "all"
    assert "attention of 2 of 32 layers (0, 31) left in 16-bit, counted as quantized" \
        in " ".join(q.notes)
    # named before other modules, which the note shows three of and counts the rest
    mlps = [f"model.layers.{i}.mlp.down_proj" for i in range(4)]
    assert "attention of 2 of 32 layers (0, 31)" in " ".join(read(mlps + ends).notes)
    # one layer short of all of them is still some
    assert read(every[:-2]).quantized_layers == "all"
    # a 33-layer model: 32 names do not cover it
    assert read(every, num_layers=33).quantized_layers == "all"
    # MoE (DeepSeek's names): attention out, shared experts and dense MLPs quantized -> mlp
    assert read(["self_attn"], moe=True).quantized_layers == "mlp"
    shared = ["self_attn", "model.layers.3.mlp.shared_experts.down_proj",
              "model.layers.0.mlp.gate_proj"]
    assert read(shared, moe=True).quantized_layers == "experts"
    # a routed expert's name is not a shared expert's or a dense MLP's
    routed = ["self_attn", "model.layers.3.mlp.experts.0.gate_proj"]
    q = read(routed, moe=True)
    assert q.quantized_layers == "mlp" and "experts.0.gate_proj" in " ".join(q.notes)
    # shared experts out with attention quantized: counted as quantized, said so
    q = read(["model.layers.3.mlp.shared_experts.down_proj"], moe=True)
    assert q.quantized_layers == "all" and "shared experts or dense MLPs" in " ".join(q.notes)


def test_which_layers_reach_the_weight_bytes(run_json, tmp_path):
    """Llama-3.1-8B's config with its first and last layers' attention left out: weighed as
    every layer quantized (the note says so), the same bytes as no list at all."""
    ends = {**FP8_BLOCK, "modules_to_not_convert": [
        f"model.layers.{i}.self_attn.{p}" for i in (0, 31)
        for p in ("q_proj", "k_proj", "v_proj", "o_proj")]}
    some = _weights_bytes(run_json, _llama(tmp_path, ends))
    none = _weights_bytes(run_json, _llama(tmp_path, FP8_BLOCK, "plain"))
    assert some["weights_bytes"] == none["weights_bytes"]
    assert load_model(_llama(tmp_path, ends, "again")).quantization.precision().quantized_layers \
        == "all"


def test_fbgemm_fp8_needs_its_activation_bound():
    """vLLM's FBGEMMFp8Config reads activation_scale_ub as a required key: a block without it
    is refused with the field named."""
    from planner.io.quant_config import checkpoint_quant

    block = {k: v for k, v in FBGEMM.items() if k != "activation_scale_ub"}
    q = checkpoint_quant({"quantization_config": block}, "c.json", moe=False, hidden_size=4096)
    assert q.problem == ("c.json: quantization_config.activation_scale_ub: missing (vLLM "
                         "requires it for fbgemm_fp8)")
