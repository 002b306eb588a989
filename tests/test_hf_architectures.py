"""Config files read by the model class they run as, and MiniMax-M2's architecture.

A checkpoint under a model_type of its own whose ``architectures`` class is one llmplan models
(moonshotai/Kimi-K2-Instruct: kimi_k2, DeepseekV3ForCausalLM) is read as that class, as vLLM's
and SGLang's model registries load it. MiniMax-M2 (MiniMaxM2ForCausalLM) normalizes each
layer's whole q and whole k (qk_norm_type per_layer): weights of q_dim and kv_dim split over
the TP ranks, and one all-reduce of the ranks' sums of squares a layer. Parameter counts are
derived here by hand from the configs' fields (tests/fixtures/hf/, copies of the official
files; README.md there says where from)."""

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.errors import SpecError, UsageError
from planner.core.memory import offloadable_weight_bytes, weight_bytes_breakdown
from planner.core.ops import (
    StepShape,
    active_params,
    count_params,
    flops_per_token_2n,
    param_breakdown,
    shape_ops,
)
from planner.core.specs import Precision
from planner.io.catalog import load_model, model_from_hf_config
from planner.layouts.pipeline import stage_ops, weights_of_stage
from planner.layouts.speculation import check_method, mtp_layer

HF = Path(__file__).parent / "fixtures" / "hf"


def _cfg(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


def _read(cfg: dict, name: str = "x.json"):
    return model_from_hf_config(cfg, name)


def _kimi_k2_params() -> int:
    """Kimi-K2-Instruct's config.json, term by term: MLA attention with 64 heads, one dense
    layer then 60 MoE layers of 384 routed experts and one shared expert (width 2048), an
    untied vocabulary of 163,840."""
    h, L, heads, vocab = 7168, 61, 64, 163840
    q_a, kv_a, nope, rope, v = 1536, 512, 128, 64, 128
    attention = (h * q_a + q_a + q_a * heads * (nope + rope) + h * (kv_a + rope) + kv_a
                 + kv_a * heads * (nope + v) + heads * v * h)
    norms = 2 * h
    dense_mlp = 3 * h * 18432
    expert = 3 * h * 2048
    moe = 384 * expert + 1 * expert + 384 * h + 384  # routed, shared, router, its bias
    return (2 * vocab * h + L * (attention + norms) + 1 * dense_mlp + 60 * moe + h)


def _minimax_m2_params() -> int:
    """MiniMax-M2.5's config.json: 62 layers of GQA attention (48 query heads, 8 KV heads of
    128) with a norm over the whole q (6,144) and the whole k (1,024), and 256 experts of width
    1,536 routed with a per-expert bias; no dense MLP; an untied vocabulary of 200,064."""
    h, L, vocab = 3072, 62, 200064
    q, kv = 48 * 128, 8 * 128
    attention = h * q + 2 * h * kv + q * h + (q + kv)
    moe = 256 * 3 * h * 1536 + 256 * h + 256
    return 2 * vocab * h + L * (attention + 2 * h + moe) + h


def _glm45_air_params() -> int:
    """GLM-4.5-Air's config.json: 46 layers of GQA attention (96 query heads of 128 over a
    hidden size of 4,096, 8 KV heads) with q, k and v biases and none on o_proj; one dense
    layer (10,944), then 45 layers of 128 routed experts and one shared (1,408 each), each
    gate with its per-expert correction bias; an untied vocabulary of 151,552."""
    h, L, vocab = 4096, 46, 151552
    q, kv = 96 * 128, 8 * 128
    attention = h * q + 2 * h * kv + q * h + (q + 2 * kv)
    expert = 3 * h * 1408
    moe = 128 * expert + expert + 128 * h + 128
    return 2 * vocab * h + L * (attention + 2 * h) + 3 * h * 10944 + 45 * moe + h


def test_glm45_is_deepseeks_mixture_on_biased_gqa_attention():
    m = _read(_cfg("glm-4.5-air"), "glm-4.5-air.json")
    assert m.architecture == "glm4_moe" and m.mla is None
    assert (m.attention_bias, m.attention_out_bias, m.qk_norm) == (True, False, False)
    assert (m.moe.num_experts, m.moe.num_shared_experts, m.moe.first_dense_layers,
            m.moe.router_bias) == (128, 1, 1, True)
    assert count_params(m) == _glm45_air_params() == 106_852_251_264  # "106B total"
    assert m.mtp_layers == 1  # it ships an MTP layer: --speculative mtp is taken
    check_method(m, "mtp")
    with_norm = _read({**_cfg("glm-4.5-air"), "use_qk_norm": True})  # GLM-4.5 (355B)'s
    assert with_norm.qk_norm and with_norm.qk_norm_scope == "head"
    assert count_params(with_norm) == _glm45_air_params() + 46 * 2 * 128


def test_kimi_k2_is_read_as_the_deepseek_v3_class_it_runs_as():
    m = _read(_cfg("kimi-k2"), "kimi-k2.json")
    assert m.architecture == "deepseek_v3" and m.mla is not None
    assert (m.moe.num_experts, m.moe.num_shared_experts, m.moe.first_dense_layers) == \
        (384, 1, 1)
    assert count_params(m) == _kimi_k2_params() == 1_026_408_232_448  # "1T total parameters"
    assert m.mtp_layers == 0  # num_nextn_predict_layers: 0, where DeepSeek-V3 ships one


def test_mtp_follows_what_the_checkpoint_ships():
    with pytest.raises(UsageError, match="ships no multi-token-prediction layer"):
        check_method(_read(_cfg("kimi-k2")), "mtp")
    check_method(_read(_cfg("deepseek-v3")), "mtp")  # num_nextn_predict_layers: 1
    r1 = load_model("deepseek-r1")
    assert r1.mtp_layers == 1  # stated in models_db, not only implied by the architecture
    check_method(r1, "mtp")
    cfg = {**_cfg("deepseek-v3"), "num_nextn_predict_layers": 0}
    with pytest.raises(UsageError):
        check_method(_read(cfg), "mtp")


def test_a_renamed_model_type_of_a_modelled_class_reads_as_that_class():
    base = _cfg("llama-3.1-8b")
    renamed = {**base, "model_type": "acme_llama", "architectures": ["LlamaForCausalLM"]}
    a, b = _read(base), _read(renamed)
    assert b.architecture == "llama"
    assert a.model_dump(exclude={"source"}) == b.model_dump(exclude={"source"})


@pytest.mark.parametrize("cfg,said", [
    ({"model_type": "acme", "architectures": ["AcmeForCausalLM"]},
     "model_type: 'acme' (architectures 'AcmeForCausalLM') is not supported"),
    ({"model_type": "acme", "architectures": ["LlamaForCausalLM", "MistralForCausalLM"]},
     "is not supported"),  # two classes: which one runs is not said
    ({"model_type": "acme"}, "model_type: 'acme' is not supported"),
    # an architecture not modelled is said first, not a field it would not have read
    ({"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"],
      "time_step_limit": [0.0, math.inf]}, "model_type: 'nemotron_h' (architectures"),
])
def test_a_class_not_modelled_is_refused_naming_it(cfg, said):
    with pytest.raises(SpecError, match=r"^x\.json: ") as err:
        _read(cfg)
    assert said in str(err.value)


def test_minimax_m2_counts_its_parameters_by_hand():
    m = _read(_cfg("minimax-m2.5"), "minimax-m2.5.json")
    assert m.architecture == "minimax_m2" and m.moe.num_experts == 256
    assert m.num_dense_layers == 0 and m.moe.router_bias
    assert m.qk_norm and m.qk_norm_scope == "layer"
    assert count_params(m) == _minimax_m2_params() == 228_689_764_864  # "230B total"
    assert param_breakdown(m)["attention/qk_norm_layer"] == 62 * (6144 + 1024)


def test_minimax_m2_norms_q_and_k_on_each_rank_and_all_reduces_their_sums():
    m = _read(_cfg("minimax-m2.5"))
    prec = Precision.of("bf16")
    shape = StepShape.uniform(16, 1, 1024)  # 16 decodes
    for tp in (1, 2, 8):
        ops = {o.name: o for o in shape_ops(m, prec, shape, tp=tp)}
        # each rank's slice of the q and k norms' weights, 2 bytes each
        assert ops["qk_norm"].weight_bytes == (6144 + 1024) / tp * 2
        if tp == 1:
            assert "allreduce_qk_norm" not in ops
        else:  # one fp32 sum for q and one for k per token, every layer
            ar = ops["allreduce_qk_norm"]
            assert (ar.count, ar.comm_bytes) == (62, 2 * 16 * 4)
    # a per-head norm (Qwen3) has no such call
    q = load_model("qwen3-8b")
    assert "allreduce_qk_norm" not in {o.name for o in shape_ops(q, prec, shape, tp=8)}


@settings(max_examples=30, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8, 16]), q_heads=st.sampled_from([16, 32, 48, 64]),
       kv_heads=st.sampled_from([2, 4, 8, 16]), head_dim=st.sampled_from([64, 128]))
def test_the_layer_norms_weights_are_split_over_the_ranks_and_add_up(tp, q_heads, kv_heads,
                                                                     head_dim):
    """Whatever the shape, the TP ranks' shares of a per-layer q/k norm's weights add up to
    the checkpoint's, and a TP above the KV heads (which would replicate them) is refused, as
    vLLM cannot load it; a per-head norm (Qwen3's) is held whole on every rank."""
    m = _read({**_cfg("minimax-m2.5"), "num_attention_heads": q_heads,
               "num_key_value_heads": kv_heads, "head_dim": head_dim})
    prec = Precision.of("bf16")
    n = param_breakdown(m)["attention/qk_norm_layer"]
    assert n == 62 * (q_heads + kv_heads) * head_dim
    shape = StepShape.uniform(4, 1, 256)
    if tp > kv_heads or q_heads % tp:
        with pytest.raises(UsageError, match="tp"):
            shape_ops(m, prec, shape, tp=tp)
        return
    assert weight_bytes_breakdown(m, prec, tp=tp)["attention/qk_norm_layer"] * tp == n * 2
    ops = {o.name: o for o in shape_ops(m, prec, shape, tp=tp)}
    assert ops["qk_norm"].weight_bytes * tp == (q_heads + kv_heads) * head_dim * 2
    q = load_model("qwen3-8b")
    if 32 % tp == 0 and (8 % tp == 0 or tp % 8 == 0):
        assert weight_bytes_breakdown(q, prec, tp=tp)["attention/qk_norm"] == \
            36 * 2 * 128 * 2  # every rank holds each head's two norms whole


@pytest.mark.parametrize("field,value,said", [
    ("shared_intermediate_size", 1024, "a shared expert is not modelled"),
    ("attn_type_list", [0, 1] * 31, "linear attention"),
    ("attn_type_list", "all", "linear attention"),
    ("use_routing_bias", "yes", "use_routing_bias: expected true or false"),
])
def test_a_minimax_field_not_modelled_is_refused(field, value, said):
    with pytest.raises(SpecError, match=said):
        _read({**_cfg("minimax-m2.5"), field: value})


def test_minimax_is_read_as_vllm_builds_it_not_as_its_flags_say():
    """vLLM's MiniMaxM2ForCausalLM reads neither use_qk_norm nor qk_norm_type (its per-layer
    norms are always there), passes no sliding window, and puts no bias on o_proj."""
    base = _read(_cfg("minimax-m2.5"))
    for change in ({"use_qk_norm": False}, {"qk_norm_type": "per_head"},
                   {"sliding_window": 4096}):
        assert _read({**_cfg("minimax-m2.5"), **change}) == base
    biased = _read({**_cfg("minimax-m2.5"), "attention_bias": True})
    assert (biased.attention_bias, biased.attention_out_bias) == (True, False)
    assert count_params(biased) - count_params(base) == 62 * (6144 + 2 * 1024)


def test_estimate_of_both_through_the_cli(run_json):
    k = run_json("estimate", "-m", str(HF / "kimi-k2.json"), "-g", "h200", "--tp", "8")
    assert k["params"] == _kimi_k2_params() and k["weights"] == "fp8"  # its quantization_config
    assert k["kv_cache_bytes_per_token"] == 61 * (512 + 64) * 2  # MLA's latent, bf16
    d = run_json("estimate", "-m", str(HF / "minimax-m2.5.json"), "-g", "h200", "--tp", "8",
                 "--explain")
    assert d["params"] == _minimax_m2_params() and d["weights"] == "fp8"
    names = {o["name"]: o for o in d["operators"]["decode"]}
    assert names["allreduce_qk_norm"]["count"] == 62 and names["allreduce_qk_norm"]["time_s"] > 0


def _qwen3_vl_vision_params() -> tuple[int, int]:
    """Qwen3-VL-8B's vision_config, term by term: a Conv3d patch embedding (3 channels x 2
    frames x 16 x 16 pixels into 1,152, with a bias) and 2,304 learned positions; 27 blocks
    of two LayerNorms, a qkv projection and an output projection with biases and an MLP of
    4,304 with biases; a patch merger of the 2 x 2 merged patches (4,608) into the language
    model's 4,096, and three deepstack mergers the same with their norm over 4,608. Held
    whole on every rank: the embeddings, the norms, the row-parallel biases."""
    h, i, depth, merged, out = 1152, 4304, 27, 1152 * 4, 4096
    embed = 3 * 2 * 16 * 16 * h + h + 2304 * h
    split = depth * (3 * h * h + 3 * h + h * h + h * i + i + i * h) + \
        4 * (merged * merged + merged + merged * out)
    whole = embed + depth * (4 * h + 2 * h) + (2 * h + out) + 3 * (2 * merged + out)
    return split + whole, whole


def _qwen3_8b_text_params() -> int:
    """Its language model: Qwen3-8B's shape (36 layers of 4,096, 32 query and 8 KV heads of
    128 with per-head q/k norms, an MLP of 12,288), untied, a vocabulary of 151,936."""
    h, L, vocab, q, kv = 4096, 36, 151936, 32 * 128, 8 * 128
    layer = h * q + 2 * h * kv + q * h + 2 * 128 + 3 * h * 12288 + 2 * h
    return 2 * vocab * h + L * layer + h


def test_qwen3_vl_counts_its_language_model_and_its_vision_encoder():
    m = _read(_cfg("qwen3-vl-8b"), "qwen3-vl-8b.json")
    vision, whole = _qwen3_vl_vision_params()
    assert m.architecture == "qwen3_vl" and m.qk_norm and not m.tie_word_embeddings
    assert (m.vision_params, m.vision_replicated_params) == (vision, whole)
    # the model card's "8.77B params", to the parameter by hand
    assert count_params(m) == _qwen3_8b_text_params() + vision == 8_767_123_696
    assert active_params(m) == _qwen3_8b_text_params()  # a text token never runs the encoder
    text_only = m.model_copy(update={"vision_params": 0, "vision_replicated_params": 0})
    assert flops_per_token_2n(m) == flops_per_token_2n(text_only)
    moe = _read(_cfg("qwen3-vl-30b-a3b"))
    assert moe.architecture == "qwen3_vl_moe" and moe.moe.num_experts == 128
    assert moe.vision_params == 538_631_408  # the same encoder into 2,048, depth 27
    assert count_params(moe) == 31_070_754_032  # its card's "31.1B"


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_vision_encoder_is_in_16_bits_split_over_tp_on_every_stage(tp):
    m = _read(_cfg("qwen3-vl-8b"))
    vision, whole = _qwen3_vl_vision_params()
    for weights in ("bf16", "fp8"):
        bd = weight_bytes_breakdown(m, Precision.of(weights), tp=tp)
        assert bd["vision/encoder"] == (vision - whole) * 2 / tp
        assert bd["vision/replicated"] == whole * 2
    p = Precision.of("bf16")
    first = weights_of_stage(m, p, tp, 0, 18, True, False)
    second = weights_of_stage(m, p, tp, 18, 36, False, True)
    text = m.model_copy(update={"vision_params": 0, "vision_replicated_params": 0})
    # vLLM builds the encoder on every pipeline rank, though only the first runs it
    for got, start, end, first_, last in ((first, 0, 18, True, False),
                                           (second, 18, 36, False, True)):
        assert got - weights_of_stage(text, p, tp, start, end, first_, last) == \
            ((vision - whole) / tp + whole) * 2
    # vLLM's --cpu-offload-gb moves decoder layers, not the encoder; an MTP drafter has none
    assert offloadable_weight_bytes(m, p, tp=tp) == offloadable_weight_bytes(text, p, tp=tp)
    assert mtp_layer(m).vision_params == 0


@pytest.mark.parametrize("change,said", [
    ({"vision_config": None}, "vision_config: expected the vision encoder's fields"),
    ({"vision_config": {"depth": 27}}, "vision_config.hidden_size: expected a whole number"),
    ({"text_config": 5}, "text_config: expected the language model's fields"),
])
def test_a_qwen3_vl_config_missing_its_parts_is_refused_naming_them(change, said):
    cfg = {**_cfg("qwen3-vl-8b"), **change}
    with pytest.raises(SpecError, match=said):
        _read(cfg)
    bad = _cfg("qwen3-vl-8b")
    bad["vision_config"] = {**bad["vision_config"], "depth": 1.5}
    with pytest.raises(SpecError, match=r"vision_config\.depth"):
        _read(bad)


def test_qwen3_vl_through_the_cli(run_json):
    d = run_json("estimate", "-m", str(HF / "qwen3-vl-8b.json"), "-g", "h100-sxm")
    vision, _ = _qwen3_vl_vision_params()
    assert d["params"] == 8_767_123_696 and d["active_params"] == _qwen3_8b_text_params()
    text = run_json("estimate", "-m", str(HF / "qwen3-8b.json"), "-g", "h100-sxm")
    # the same decoder as Qwen3-8B's: the same step, the encoder's weights on top
    assert d["tpot_s"] == text["tpot_s"]
    assert d["weights_bytes"] - text["weights_bytes"] == vision * 2
    assert any("vision encoder's 0.58B parameters" in n for n in d["notes"])
    assert not any("vision" in n for n in text["notes"])


def test_kimi_k25_is_read_as_its_language_model_with_its_experts_as_stored():
    """Kimi-K2.5 wraps Kimi-K2's DeepseekV3ForCausalLM in a vision-language config whose
    text_config also says how the checkpoint stores it (compressed-tensors int4 in groups of
    32 for the routed experts, the rest 16-bit); its MoonViT encoder is not counted, and the
    output says so."""
    m = _read(_cfg("kimi-k2.5"), "kimi-k2.5.json")
    assert m.architecture == "deepseek_v3" and m.vision_uncounted and not m.vision_params
    assert count_params(m) == _kimi_k2_params()
    q = m.quantization
    assert (q.weights.value, q.group_size, q.quantized_layers) == ("int4", 32, "experts")
    assert not _read(_cfg("kimi-k2")).vision_uncounted  # a text checkpoint has none


def test_kimi_k25_through_the_cli(run_json):
    d = run_json("estimate", "-m", str(HF / "kimi-k2.5.json"), "-g", "b200", "--tp", "8")
    assert d["weights"] == "int4" and d["params"] == _kimi_k2_params()
    assert any("encoder is not counted" in n for n in d["notes"])


def _siglip_params(text_hidden: int) -> tuple[int, int]:
    """Gemma-3's vision_config, term by term: SigLIP's Conv2d patch embedding (3 channels x
    14 x 14 pixels into 1,152, with a bias) and 64 x 64 positions; 27 blocks of two
    LayerNorms, q, k, v and output projections with biases and an MLP of 4,304 with biases; a
    final LayerNorm; the projector, 1,152 x the text hidden size and an RMSNorm of 1,152.
    Whole on every rank: embeddings, norms, the row-parallel biases, the projector."""
    h, i, L = 1152, 4304, 27
    embed = 3 * 14 * 14 * h + h + 64 * 64 * h
    split = L * (3 * (h * h + h) + h * h + h * i + i + i * h)
    whole = embed + L * 6 * h + 2 * h + (h * text_hidden + h)
    return split + whole, whole


def test_gemma3_multimodal_counts_its_siglip_encoder():
    m = _read(_cfg("gemma-3-27b"))
    vision, whole = _siglip_params(5376)
    assert (m.vision_params, m.vision_replicated_params) == (vision, whole)
    assert not m.vision_uncounted
    # the encoder alone is the Gemma 3 report's "417M" (table 1); the checkpoint 27.4B
    assert vision - (1152 * 5376 + 1152) == 416_866_032
    assert count_params(m) == 27_432_406_640
    # the report: 417M + 1,416M + 25,600M
    assert count_params(m) == pytest.approx(27_433e6, rel=1e-4)
    # the built-ins carry the same figures (their text_config alike: test_cli's match)
    for name, hidden in (("gemma-3-27b", 5376), ("gemma-3-4b", 2560)):
        b = load_model(name)
        assert (b.vision_params, b.vision_replicated_params) == _siglip_params(hidden)
    headed = _cfg("gemma-3-27b")
    headed["vision_config"] = {**headed["vision_config"], "vision_use_head": True}
    # vLLM's gemma3_mm builds SigLIP without its pooling head whatever the flag says
    assert _read(headed).vision_params == vision
    untied = {**_cfg("gemma-3-27b"), "tie_word_embeddings": False}
    assert count_params(_read(untied)) == count_params(m) + 262208 * 5376  # the top level's
    assert not load_model("qwen3-8b").vision_uncounted


def test_any_encoder_beside_the_language_model_is_said_to_be_left_out():
    """A wrapper's other encoders (an audio_config, say) are not counted either, and said so;
    a wrapper of the language model alone has nothing to say."""
    text = _cfg("qwen3-8b")
    audio = {"model_type": "acme_audio", "architectures": ["AcmeAudioForConditionalGeneration"],
             "text_config": text, "audio_config": {"d_model": 1280, "encoder_layers": 32}}
    assert _read(audio).vision_uncounted
    assert not _read({"model_type": "acme_wrap", "text_config": text}).vision_uncounted


def test_a_wrappers_own_tie_word_embeddings_wins_over_its_text_configs():
    # vLLM copies the top level's flag into the text config (vllm/config/vllm.py, 0.19.1)
    cfg = _cfg("qwen3-vl-8b")
    cfg["text_config"] = {**cfg["text_config"], "tie_word_embeddings": True}
    assert not _read(cfg).tie_word_embeddings  # the top level says false
    cfg.pop("tie_word_embeddings")
    assert _read(cfg).tie_word_embeddings  # none there: the text config's


def _llama4_params(moe_layers: int, dense_layers: int, experts: int) -> int:
    """Llama-4's language model: 48 layers of GQA attention (40 query heads and 8 KV heads of
    128 over 5,120, no biases, a weightless q/k norm); MoE layers of `experts` routed experts
    and one shared expert, each of width 8,192, with a router without bias; dense layers of
    16,384; an untied vocabulary of 202,048."""
    h, vocab = 5120, 202048
    attention = 2 * h * 40 * 128 + 2 * h * 8 * 128
    expert = 3 * h * 8192
    moe = experts * expert + expert + experts * h
    return (2 * vocab * h + 48 * (attention + 2 * h) + moe_layers * moe
            + dense_layers * 3 * h * 16384 + h)


def test_llama4_scout_and_maverick_count_by_hand():
    scout = _read(_cfg("llama-4-scout"), "llama-4-scout.json")
    # named llama4, the class the engines' rules know it by (SGLang's MoE runner rule)
    assert scout.architecture == "llama4" and scout.num_moe_layers == 48
    text_only = {**_cfg("llama-4-scout")["text_config"], "architectures": ["Llama4ForCausalLM"]}
    assert _read(text_only).architecture == "llama4_text"
    assert count_params(scout) == _llama4_params(48, 0, 16) == 107_769_861_120
    mav = _read(_cfg("llama-4-maverick"))
    assert mav.moe_layer_indices == tuple(range(1, 48, 2))  # interleave_moe_layer_step 2
    assert count_params(mav) == _llama4_params(24, 24, 128) == 400_711_848_960  # "400B"
    for m in (scout, mav):  # "17B active" (a token's routed expert, the shared one)
        assert active_params(m) == pytest.approx(17e9, rel=0.02)
        # chunked attention in three of four layers, NoPE global every fourth
        assert (m.sliding_window, m.sliding_window_pattern) == (
            8192, ("sliding", "sliding", "sliding", "full"))
        assert not m.qk_norm  # a weightless L2 norm


def test_interleaved_moe_layers_land_on_their_pipeline_stages():
    mav = _read(_cfg("llama-4-maverick"))
    p = Precision.of("bf16")
    ops = shape_ops(mav, p, StepShape.uniform(4, 1, 512))
    for start, end in ((0, 12), (12, 30), (30, 48)):
        stage = {o.name: o.count for o in stage_ops(ops, mav, start, end, start == 0,
                                                    end == 48)}
        moe = sum(1 for i in range(start, end) if i % 2 == 1)
        assert stage["experts_gate_up_proj"] == moe
        assert stage["mlp_gate_up_proj"] == (end - start) - moe
    w = [weights_of_stage(mav, p, 1, a, b, a == 0, b == 48) for a, b in ((0, 24), (24, 48))]
    assert sum(w) == pytest.approx(sum(weight_bytes_breakdown(mav, p).values()))
    # the first half holds layers 1, 3, ..., 23 of the experts: half of them, not all
    assert w[0] == pytest.approx(w[1], rel=0.05)


@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 80), first=st.integers(0, 10), step=st.integers(1, 5))
def test_the_moe_layer_count_is_the_layers_that_run_it(layers, first, step):
    """However the dense and MoE layers interleave, the count the operators take is the
    layers the model marks MoE, and the dense ones are the rest."""
    base = _read(_cfg("llama-4-maverick"))
    first = min(first, layers)
    m = base.model_copy(update={"num_layers": layers, "sliding_window": None,
                                "sliding_window_pattern": None, "moe": base.moe.model_copy(
                                    update={"first_dense_layers": first, "layer_step": step})})
    marked = [i for i in range(layers) if m.is_moe_layer(i)]
    assert m.num_moe_layers == len(marked) and m.num_dense_layers == layers - len(marked)
    assert list(m.moe_layer_indices) == marked
    ops = {o.name: o.count for o in shape_ops(m, Precision.of("bf16"),
                                               StepShape.uniform(2, 1, 64))}
    assert ops.get("experts_gate_up_proj", 0) == len(marked)
    assert ops.get("mlp_gate_up_proj", 0) == layers - len(marked)


def test_llama4_reads_as_vllm_builds_it():
    base = _read(_cfg("llama-4-scout"))
    text = _cfg("llama-4-scout")
    text["text_config"] = {**text["text_config"], "attention_bias": True, "no_rope_layers": []}
    assert _read(text) == base  # vLLM builds no attention bias; [] is the default pattern
    every8 = _cfg("llama-4-scout")
    every8["text_config"] = {**every8["text_config"], "no_rope_layer_interval": 8}
    assert _read(every8).sliding_window_pattern == ("sliding",) * 7 + ("full",)
    with_vision = {**_cfg("llama-4-scout"), "vision_config": {"hidden_size": 1408}}
    assert _read(with_vision).vision_uncounted and not base.vision_uncounted


def test_qwen3_moe_sparse_steps_and_deepseek_frequencies():
    q = _cfg("qwen3-30b-a3b")
    m = _read({**q, "decoder_sparse_step": 2})  # MoE on layers 1, 3, 5, ...
    assert m.moe_layer_indices == tuple(range(1, 48, 2))
    last = _read({**q, "mlp_only_layers": [0, 1, 2]})
    assert (last.moe.first_dense_layers, last.moe.layer_step) == (3, 1)
    with pytest.raises(SpecError, match="mlp_only_layers"):
        _read({**q, "mlp_only_layers": [5]})  # a dense layer amid the experts
    with pytest.raises(SpecError, match="moe_layer_freq"):
        _read({**_cfg("deepseek-v3"), "moe_layer_freq": 2})
