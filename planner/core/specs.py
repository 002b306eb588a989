"""Frozen pydantic specs: the model, the hardware, the precision and the workload.

YAML keys carry the vendor's unit where the key says so (``memory_bandwidth_gb_per_s``,
``peak_tflops``); the properties here convert to SI base units (bytes, FLOP/s, bytes/s) in one
place, so the rest of the core only ever sees base units.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planner.core.arith import no_bool_numbers
from planner.core.errors import SpecError, UsageError

GIB = 1024**3
GB = 1e9
TERA = 1e12


# GPU architectures as a hardware file's ``architecture`` names them and an engine profile's
# figures by architecture (``experts_compute_frac``, ``fp8_gemm_row_tiles``, ``unsupported``, ...)
# key them. A name outside this list would match no GPU and apply nowhere, silently, so
# both are checked against it. AMD: CDNA 2 (MI250), 3 (MI300X, MI325X), 4 (MI350, MI355X);
# Intel: Gaudi 2 and 3.
GPU_ARCHITECTURES: tuple[str, ...] = ("volta", "turing", "ampere", "ada", "hopper", "blackwell",
                                      "cdna2", "cdna3", "cdna4", "gaudi2", "gaudi3")


def check_architecture(name: str) -> str:
    """``name`` if it is one of ``GPU_ARCHITECTURES``; else ValueError saying which are."""
    if name not in GPU_ARCHITECTURES:
        hint = "; write it in lower case" if name.lower() in GPU_ARCHITECTURES else ""
        raise ValueError(f"architecture {name!r} is not one of {', '.join(GPU_ARCHITECTURES)}"
                         f"{hint}")
    return name


class DType(str, Enum):
    """Element types for weights, KV cache and arithmetic."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"
    int4 = "int4"
    # OCP Microscaling FP4 (E2M1 elements, one E8M0 scale per block of 32): gpt-oss's experts
    mxfp4 = "mxfp4"


BITS_PER_ELEMENT: dict[DType, int] = {
    DType.fp32: 32,
    DType.bf16: 16,
    DType.fp16: 16,
    DType.fp8: 8,
    DType.int8: 8,
    DType.int4: 4,
    DType.mxfp4: 4,
}
# OCP Microscaling Formats (MX) v1.0 spec, 2023-09: MXFP4 blocks of 32 elements share one
# 8-bit (E8M0) scale: 4 + 8 / 32 = 4.25 bits per weight (the gpt-oss model card's figure)
MX_BLOCK = 32
MX_SCALE_BYTES = 1

WEIGHT_DTYPES = (DType.bf16, DType.fp16, DType.fp8, DType.int8, DType.int4, DType.mxfp4)
KV_DTYPES = (DType.bf16, DType.fp16, DType.fp8, DType.int8)


def dtype_bytes(dtype: DType) -> float:
    """Bytes per element (0.5 for int4)."""
    return BITS_PER_ELEMENT[dtype] / 8


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    _no_bools = field_validator("*", mode="before")(no_bool_numbers)


# --------------------------------------------------------------------------- precision


DEFAULT_GROUP_SIZE = 128  # weights per scale of int8 / int4 (GPTQ's and AWQ's usual groups)


# The MLP's linear layers, as checkpoint keys (planner.core.memory) and operator names
# (planner.core.ops: a dense layer's, the routed experts', the shared experts')
MLP_COMPONENTS = ("mlp/", "moe/", "mlp_", "experts_", "shared_")


class Precision(_Frozen):
    """How weights and KV cache are stored and in which type the matmuls run.

    int8 / int4 weights are weight-only quantized with one scale per ``group_size`` weights
    (GPTQ / AWQ style, fp16 scales of ``scale_bytes`` each), so their matmuls still run in
    16-bit: the weights are dequantized on the fly. fp8 weights run fp8 matmuls (W8A8, per-tensor
    scales, negligible bytes). mxfp4 weights are OCP MXFP4 (blocks of 32 with one byte of
    scale: 0.53125 bytes per weight; ``group_size`` and ``scale_bytes`` do not apply),
    weight-only by default, as vLLM's Triton and Marlin MXFP4 MoE kernels run them on Hopper.
    Quantization covers the decoder's linear layers (``quantized_layers="all"``), only the
    routed experts (``"experts"``: gpt-oss's released checkpoint, attention in bf16), or every
    MLP, dense, shared or routed, with attention in the 16-bit type (``"mlp"``: Meta's
    Llama-3.1-405B-FP8, FBGEMM fp8 in the feed-forward layers alone); embeddings, lm_head,
    norms, biases and MoE routers stay in the 16-bit type, as in common checkpoints.
    """

    weights: DType = DType.bf16
    kv_cache: DType = DType.bf16
    compute: DType | None = None  # None: derived from the weights (see compute_dtype)
    group_size: int = Field(DEFAULT_GROUP_SIZE, gt=0, le=1_000_000)
    scale_bytes: float = Field(2, gt=0, le=64)
    # engine byte accounting: an asymmetric scheme's zero point per group (GPTQ / AWQ pack a
    # 4-bit zero: 0.5 bytes), and whether the lm_head is quantized with the decoder
    zero_point_bytes: float = Field(0.0, ge=0, le=64)
    lm_head_quantized: bool = False
    quantized_layers: Literal["all", "experts", "mlp"] = "all"
    # fp8 weights with a scale per block (DeepSeek-V3's 128 x 128 blocks: 16,384 weights per
    # fp32 scale of ``scale_bytes``) or per output channel; None: one per tensor (no bytes
    # worth counting)
    fp8_scale_group: int | None = Field(None, gt=0, le=10**9)
    # fp8 weights scaled per block (a checkpoint's weight_block_size): the engine runs them
    # through its block-scaled GEMM, which quantizes its input its own way
    # (``Engine.fp8_block_quant_kernels``)
    fp8_blocks: bool = False
    # fp8 W8A8: each input takes one scale for the whole tensor, found at run time (a
    # checkpoint's dynamic per-tensor activation scheme, or weights the engine quantized at
    # load: ``Precision.of(at_load=True)``), so its quantization reads the input once more
    # for the maximum first (``Engine.fp8_dynamic_tensor_reads``); False: a static scale, or
    # one per token or per block, found in the same pass
    fp8_dynamic_tensor: bool = False
    # scales, zero points and the lm_head as a checkpoint stores them (its config.json's
    # quantization_config): the engine's defaults for them (``prepare``) do not apply
    from_checkpoint: bool = False
    # the engine stores the routed experts padded: the hidden size up to a multiple of the
    # first, each TP rank's share of the experts' intermediate size up to one of the second
    # (vLLM's MXFP4 MoE layout, ``Engine.mxfp4_expert_pad``); None: as the checkpoint
    expert_pad: tuple[int, int] | None = None
    # the 16-bit type was left to the engine (vLLM's --dtype auto: no --weights or --dtype
    # given, a 16-bit checkpoint): an engine that falls back to fp16 on a GPU without bf16
    # tensor cores may (``Engine.auto_dtype_fallback``); False: the type was asked for
    auto: bool = False

    @model_validator(mode="after")
    def _check(self) -> Precision:
        if self.weights not in WEIGHT_DTYPES:
            raise ValueError(f"weights precision {self.weights.value} is not one of "
                             f"{', '.join(d.value for d in WEIGHT_DTYPES)}")
        if self.kv_cache not in KV_DTYPES:
            raise ValueError(f"KV-cache precision {self.kv_cache.value} is not one of "
                             f"{', '.join(d.value for d in KV_DTYPES)}")
        return self

    @classmethod
    def of(cls, weights: DType | str, kv_cache: DType | str | None = None,
           group_size: int = DEFAULT_GROUP_SIZE, compute: DType | str | None = None,
           quantized_layers: str = "all", auto: bool = False,
           at_load: bool = False) -> Precision:
        """A precision whose KV cache, when not given, is the 16-bit type of the weights or of
        the matmuls (``compute`` fp16: a T4 or V100 running int8 / int4 weights). ``at_load``:
        the engine quantizes the weights when it loads a checkpoint that stores none of this
        type (``ModelSpec.quantized_at_load``); fp8 ones then take one activation scale per
        tensor found at run time (vLLM's --quantization fp8: ``fp8_dynamic_tensor``)."""
        w = DType(weights)
        c = DType(compute) if compute else None
        kv = DType(kv_cache) if kv_cache else (
            DType.fp16 if DType.fp16 in (w, c) else DType.bf16)
        return cls(weights=w, kv_cache=kv, group_size=group_size, compute=c,
                   quantized_layers=quantized_layers, auto=auto,
                   fp8_dynamic_tensor=at_load and w == DType.fp8)

    def expert_pad_factor(self, m: ModelSpec, tp: int = 1) -> float:
        """Stored over checkpoint bytes (and FLOPs) of a routed expert's matmuls under
        ``expert_pad``: gpt-oss-120b at TP 1 under (256, 128), hidden 2,880 -> 3,072 and
        intermediate 2,880 -> 2,944, is 1.0904."""
        if self.expert_pad is None or m.moe is None:
            return 1.0
        h_mult, i_mult = self.expert_pad
        h, i = m.hidden_size, m.moe.expert_intermediate_size / tp
        return (math.ceil(h / h_mult) * h_mult) * (math.ceil(i / i_mult) * i_mult) / (h * i)

    @property
    def half_dtype(self) -> DType:
        """The 16-bit type of everything that is not quantized (fp16 if asked, else bf16)."""
        return DType.fp16 if DType.fp16 in (self.weights, self.compute) else DType.bf16

    @property
    def compute_dtype(self) -> DType:
        """Type of the decoder matmuls: fp8 for fp8 weights, 16-bit for weight-only int8/int4."""
        if self.compute is not None:
            return self.compute
        if self.weights == DType.fp8:
            return DType.fp8
        return self.half_dtype

    @property
    def quantized_bytes_per_param(self) -> float:
        """Bytes per quantized weight including its share of the group scale.

        int4, group 128, fp16 scales: 0.5 + 2 / 128 = 0.515625 bytes per parameter; with a
        packed 4-bit zero point per group too (GPTQ, AWQ): 0.5 + 2.5 / 128 = 0.51953125.
        """
        b = dtype_bytes(self.weights)
        if self.weights in (DType.int8, DType.int4):
            b += (self.scale_bytes + self.zero_point_bytes) / self.group_size
        elif self.weights == DType.mxfp4:
            b += MX_SCALE_BYTES / MX_BLOCK
        elif self.weights == DType.fp8 and self.fp8_scale_group:
            b += self.scale_bytes / self.fp8_scale_group
        return b

    def quantizes(self, component: str) -> bool:
        """Whether a linear layer of this component (``"experts"`` for the routed experts, a
        checkpoint key, ``mlp/...``, ``moe/...``, ``attention/...``, or an operator's name,
        ``mlp_down_proj``, ``shared_gate_up_proj``, ``qkv_proj``) is stored in the quantized
        type."""
        if self.quantized_layers == "all" or component == "experts":
            return True
        return self.quantized_layers == "mlp" and component.startswith(MLP_COMPONENTS)

    @property
    def half_bytes(self) -> float:
        return dtype_bytes(self.half_dtype)

    @property
    def kv_bytes(self) -> float:
        return dtype_bytes(self.kv_cache)

    @property
    def activation_bytes(self) -> float:
        """Activations stay in the 16-bit type."""
        return dtype_bytes(self.half_dtype)


class CheckpointQuant(_Frozen):
    """How a checkpoint stores its weights, as its config.json's ``quantization_config``
    says (read by ``planner.io.catalog``): the storage type, its scales and zero points, which
    layers it covers and whether the lm_head is among them. ``problem``: why the config cannot
    be used (an unknown ``quant_method``, a malformed field), raised only when the weights'
    precision is taken from it, so that ``--weights`` can still stand in for it."""

    method: str  # quant_method as written: awq, gptq, fp8, compressed-tensors, ...
    file: str  # the config.json it was read from
    weights: DType | None = None
    group_size: int | None = Field(None, gt=0, le=10**9)  # int8 / int4: weights per scale
    scale_bytes: float = Field(2, gt=0, le=64)
    zero_point_bytes: float = Field(0.0, ge=0, le=64)
    fp8_scale_group: int | None = Field(None, gt=0, le=10**9)
    fp8_blocks: bool = False  # fp8: a scale per block (weight_block_size, block_structure)
    fp8_dynamic_tensor: bool = False  # fp8 W8A8: one activation scale per tensor, at run time
    compute: DType | None = None  # None: 16-bit for weight-only int, fp8 for fp8
    quantized_layers: Literal["all", "experts", "mlp"] = "all"
    lm_head_quantized: bool = False
    details: tuple[str, ...] = ()  # what the label says beside the method: "group 128", ...
    notes: tuple[str, ...] = ()  # what is read but not modelled
    problem: str | None = None

    @property
    def label(self) -> str:
        """"AWQ, group 128, zero points": the method and what sets its bytes."""
        name = {"awq": "AWQ", "gptq": "GPTQ", "fp8": "FP8", "mxfp4": "MXFP4",
                "fbgemm_fp8": "FBGEMM FP8",
                "bitsandbytes": "bitsandbytes"}.get(self.method, self.method)
        return ", ".join((name, *self.details))

    def precision(self, kv_cache: DType | str | None = None, *,
                  group_size: int | None = None,
                  quantized_layers: str | None = None) -> Precision:
        """The precision the checkpoint ships, with a user's ``--kv-cache``, ``--group-size``
        and ``--quantized-layers experts`` or ``mlp`` over it; a ``SpecError`` (``problem``)
        when the config cannot say."""
        if self.problem is not None or self.weights is None:
            raise SpecError(self.problem or f"{self.file}: quantization_config: no weight type")
        p = Precision.of(self.weights, kv_cache, compute=self.compute)
        return p.model_copy(update={
            "group_size": group_size or self.group_size or DEFAULT_GROUP_SIZE,
            "scale_bytes": self.scale_bytes, "zero_point_bytes": self.zero_point_bytes,
            "fp8_scale_group": self.fp8_scale_group, "fp8_blocks": self.fp8_blocks,
            "fp8_dynamic_tensor": self.fp8_dynamic_tensor,
            "lm_head_quantized": self.lm_head_quantized,
            "quantized_layers": quantized_layers if quantized_layers in ("experts", "mlp")
            else self.quantized_layers,
            "from_checkpoint": True})

    def shipped(self, kv_cache: DType | str | None = None, *, compute: DType | str | None = None,
                group_size: int | None = None, quantized_layers: str | None = None,
                auto: bool = True) -> Precision:
        """The checkpoint run as it ships, as a command without --weights takes it
        (``precision``), with the matmuls' type a user's ``--compute`` names, else ``auto``
        (the 16-bit type left to the engine: vLLM's --dtype auto)."""
        p = self.precision(kv_cache, group_size=group_size, quantized_layers=quantized_layers)
        return p.model_copy(update={"compute": DType(compute)} if compute else {"auto": auto})


# --------------------------------------------------------------------------- model


def moe_layer_range(num_layers: int, first_dense: int, step: int) -> range:
    """The MoE layers of a model: after its ``first_dense`` dense layers, every ``step``-th
    layer ((i - first_dense + 1) % step == 0), the others dense."""
    return range(first_dense + step - 1, num_layers, step)


class MoESpec(_Frozen):
    """Mixture of experts: routed experts (top-k per token) plus optional shared experts."""

    num_experts: int = Field(gt=0, le=1_000_000)
    experts_per_token: int = Field(gt=0, le=1_000_000)
    expert_intermediate_size: int = Field(gt=0, le=10_000_000)
    num_shared_experts: int = Field(0, ge=0, le=1_000_000)
    # First layers that keep a dense MLP (DeepSeek-V3: first_k_dense_replace = 3).
    first_dense_layers: int = Field(0, ge=0, le=100_000)
    # After those, every layer_step-th layer is a MoE layer and the others dense (Llama-4
    # Maverick's interleave_moe_layer_step 2: layers 1, 3, 5, ...); 1: every layer
    layer_step: int = Field(1, ge=1, le=100_000)
    router_bias: bool = False  # DeepSeek-V3's e_score_correction_bias, gpt-oss's router bias
    expert_bias: bool = False  # biases on each expert's projections (gpt-oss)

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token exceeds num_experts")
        return self


# MLASpec's fields of DeepSeek Sparse Attention's indexer, named as config.json names them
INDEXER_FIELDS = ("index_topk", "index_n_heads", "index_head_dim")


class MLASpec(_Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank Q and a compressed KV cache."""

    q_lora_rank: int | None = Field(None, gt=0, le=1_000_000)  # None: plain q_proj
    kv_lora_rank: int = Field(gt=0, le=1_000_000)
    qk_nope_head_dim: int = Field(gt=0, le=1_000_000)
    qk_rope_head_dim: int = Field(gt=0, le=1_000_000)
    v_head_dim: int = Field(gt=0, le=1_000_000)
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): a lightning indexer of
    # ``index_n_heads`` heads of ``index_head_dim`` scores every cached token for each query
    # token (fp8), and the attention proper reads the ``index_topk`` best of them; None: dense
    index_topk: int | None = Field(None, gt=0, le=1_000_000_000)
    index_n_heads: int | None = Field(None, gt=0, le=1_000_000)
    index_head_dim: int | None = Field(None, gt=0, le=1_000_000)

    @model_validator(mode="after")
    def _check(self) -> MLASpec:
        missing = [f for f in INDEXER_FIELDS if getattr(self, f) is None]
        if missing and len(missing) != len(INDEXER_FIELDS):
            raise ValueError(f"sparse attention's indexer needs index_topk, index_n_heads and "
                             f"index_head_dim together; {', '.join(sorted(missing))} missing")
        return self

    @property
    def sparse(self) -> bool:
        """DeepSeek Sparse Attention: an indexer picks the tokens each query attends to."""
        return self.index_topk is not None


class ChatTemplate(_Frozen):
    """What the model's chat template adds around one user message: a chat-completions
    request's prompt reaches the engine as ``tokens`` more than the message itself (the turn
    markers, the assistant's generation prompt, a default system message where the template
    writes one), ``prefix_tokens`` of them before the message. Benchmark clients count the
    message only. ``renderer``: how a server writes it: ``jinja``, the template's Jinja source
    rendered through the tokenizer (Hugging Face's apply_chat_template), or ``harmony``,
    OpenAI's harmony format, which vLLM renders with the openai_harmony library for gpt-oss and
    never parses as Jinja (``planner.core.engine.EngineSpec.chat_template_parse_us``)."""

    tokens: int = Field(ge=0, le=1_000_000)
    # of those, the ones before the message: the same in every request (a default system
    # message), so a prefix cache computes them once
    prefix_tokens: int = Field(0, ge=0, le=1_000_000)
    renderer: Literal["jinja", "harmony"] = "jinja"
    source: str = Field(min_length=1)  # the template (tokenizer_config.json, chat_template)
    date: str | None = None
    estimated: bool = False
    note: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ChatTemplate:
        if self.prefix_tokens > self.tokens:
            raise ValueError(f"chat_template.prefix_tokens ({self.prefix_tokens:,}) exceeds "
                             f"chat_template.tokens ({self.tokens:,})")
        return self


class ModelSpec(_Frozen):
    """A decoder-only transformer, described by the fields of its official config."""

    name: str
    display_name: str | None = None
    architecture: str  # HF model_type: llama, mistral, mixtral, qwen2, gemma2, phi3, gpt2, ...
    source: str = Field(min_length=1)  # URL of the official config
    # upper bounds far beyond any model keep a typo (1e20) from overflowing the arithmetic
    vocab_size: int = Field(gt=0, le=100_000_000)
    hidden_size: int = Field(gt=0, le=1_000_000)
    num_layers: int = Field(gt=0, le=100_000)
    num_attention_heads: int = Field(gt=0, le=100_000)
    num_kv_heads: int = Field(gt=0, le=100_000)
    head_dim: int | None = Field(None, gt=0, le=100_000)  # None: hidden / attention heads
    intermediate_size: int = Field(gt=0, le=10_000_000)  # dense MLP width
    max_position_embeddings: int = Field(gt=0, le=1_000_000_000)
    tie_word_embeddings: bool = False
    mlp: Literal["gated", "plain"] = "gated"  # gated: SwiGLU/GeGLU, 3 matrices; plain: 2
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"  # layernorm carries a bias too
    norms_per_layer: int = Field(2, gt=0, le=100)  # Gemma-2 has 4 (pre/post attention and MLP)
    position_embedding: Literal["rope", "learned"] = "rope"
    attention_bias: bool = False  # bias on q, k, v (Qwen2) ...
    attention_out_bias: bool = False  # ... and on o_proj (GPT-2)
    mlp_bias: bool = False
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    # Sliding-window attention: a layer marked "sliding" attends to (and caches) the last
    # ``sliding_window`` tokens only. The pattern repeats over the layers from layer 0
    # (Gemma-2: [sliding, full]; Gemma-3: 5 x sliding, full); no pattern: every layer slides.
    sliding_window: int | None = Field(None, gt=0, le=1_000_000_000)
    sliding_window_pattern: tuple[Literal["sliding", "full"], ...] | None = Field(
        None, min_length=1, max_length=100_000)
    qk_norm: bool = False  # RMSNorm over each head's q and k (Qwen3, Gemma-3)
    # what one qk_norm normalizes: "head", each head's q and k apart (a weight of head_dim
    # each, every TP rank holding it whole); "layer", the layer's whole q and whole k
    # (MiniMax-M2's, as vLLM builds it: weights of q_dim and kv_dim, split over the TP
    # ranks, so each rank's sums of squares are all-reduced before it divides by them)
    qk_norm_scope: Literal["head", "layer"] = "head"
    # the multi-token-prediction layers the checkpoint ships (DeepSeek-V3's
    # num_nextn_predict_layers); None: the architecture's own (planner.layouts.speculation)
    mtp_layers: int | None = Field(None, ge=0, le=1_000)
    attention_sinks: bool = False  # a learned sink logit per head and layer (gpt-oss)
    # A vision-language checkpoint's vision encoder (Qwen3-VL's ViT and its patch mergers):
    # its weights, held beside the decoder's in 16 bits. The requests modelled are text, which
    # never run it, so it costs memory, not time. ``vision_params``: all of its weights;
    # ``vision_replicated_params``: those every TP rank holds whole (the patch and position
    # embeddings, the norms, the row-parallel layers' biases), the rest split over the ranks as
    # vLLM's vision blocks split their linear layers
    vision_params: int = Field(0, ge=0, le=10**13)
    vision_replicated_params: int = Field(0, ge=0, le=10**13)
    # a multimodal checkpoint read as its language model alone, its encoder not counted (one
    # whose layout is not modelled here: Kimi-K2.5's MoonViT, Llama-4's vision model)
    vision_uncounted: bool = False
    # The officially reported counts (None for a bare config.json, which states none).
    official_params: int | None = Field(None, gt=0, le=10**14)  # 100 trillion
    official_active_params: int | None = Field(None, gt=0, le=10**14)
    # what the source's active count covers: every parameter a token touches, or all but the
    # input embedding table (gpt-oss's model card counts the unembedding only)
    official_active_params_scope: Literal["all", "no_embedding"] = "all"
    official_params_source: str | None = None
    # how the checkpoint stores its weights (an HF config's quantization_config); None:
    # the 16-bit type, or whatever --weights says
    quantization: CheckpointQuant | None = None
    # the 16-bit type its config.json says the checkpoint stores (torch_dtype float16 or
    # bfloat16), the default weights where nothing else says (vLLM's --dtype auto); None:
    # not stated (bf16 then)
    torch_dtype: Literal["fp16", "bf16"] | None = None
    # the tokens its chat template adds to one user message (None: not recorded)
    chat_template: ChatTemplate | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) is not a "
                             f"multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) is not a multiple of "
                             f"num_attention_heads ({self.num_attention_heads}); set head_dim")
        if self.moe and self.moe.first_dense_layers > self.num_layers:
            raise ValueError("moe.first_dense_layers exceeds num_layers")
        if self.sliding_window_pattern and self.sliding_window is None:
            raise ValueError("sliding_window_pattern is given without sliding_window")
        if self.sliding_window is not None and self.mla is not None:
            raise ValueError("sliding_window with MLA attention is not modelled")
        if self.qk_norm_scope == "layer" and not self.qk_norm:
            raise ValueError("qk_norm_scope layer is given without qk_norm")
        if self.vision_replicated_params > self.vision_params:
            raise ValueError("vision_replicated_params exceeds vision_params")
        return self

    def quantized_at_load(self, weights: DType | str) -> bool:
        """``weights`` asked of this model are quantized by the engine when it loads the
        checkpoint, which stores none of that type (16-bit, or another type; vLLM's
        --quantization over it); False where its quantization_config stores them."""
        q = self.quantization
        return q is None or q.problem is not None or q.weights != DType(weights)

    def precision_of(self, weights: DType | str, kv_cache: DType | str | None = None,
                     group_size: int = DEFAULT_GROUP_SIZE, compute: DType | str | None = None,
                     quantized_layers: str = "all", auto: bool = False) -> Precision:
        """``Precision.of`` for ``weights`` asked of this model (a command's --weights, a
        budget's or a plan's): the engine quantizes them at load where the checkpoint
        stores none of them (``quantized_at_load``)."""
        return Precision.of(weights, kv_cache, group_size, compute, quantized_layers,
                            auto=auto, at_load=self.quantized_at_load(weights))

    @property
    def layer_is_sliding(self) -> tuple[bool, ...]:
        """Per layer, whether it attends over the sliding window only."""
        if self.sliding_window is None:
            return (False,) * self.num_layers
        pat = self.sliding_window_pattern or ("sliding",)
        return tuple(pat[i % len(pat)] == "sliding" for i in range(self.num_layers))

    @property
    def num_sliding_layers(self) -> int:
        return sum(self.layer_is_sliding)

    @property
    def sparse_topk(self) -> int | None:
        """The tokens each query attends to under DeepSeek Sparse Attention (its indexer's
        top-k), or None for dense attention."""
        return self.mla.index_topk if self.mla is not None else None

    @property
    def attention_window(self) -> int | None:
        """The most cached tokens one query attends to in the layers that cap it: the sliding
        window, or sparse attention's top-k (which, unlike a window, keeps every token
        cached: the indexer chooses among them all); None where attention is full."""
        return self.sliding_window if self.sliding_window is not None else self.sparse_topk

    @property
    def head_dim_(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim_

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim_

    @property
    def _moe_layers(self) -> range:
        e = self.moe
        return range(0) if e is None else \
            moe_layer_range(self.num_layers, e.first_dense_layers, e.layer_step)

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i runs the mixture of experts (else the dense MLP)."""
        return i in self._moe_layers

    @property
    def moe_layer_indices(self) -> tuple[int, ...]:
        return tuple(self._moe_layers)

    @property
    def num_moe_layers(self) -> int:
        return len(self._moe_layers)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def label(self) -> str:
        return self.display_name or self.name


# --------------------------------------------------------------------------- hardware


class Interconnect(_Frozen):
    """GPU-to-GPU link. The datasheet's figure is usually the bidirectional total per GPU."""

    kind: str
    bandwidth_gb_per_s: float = Field(gt=0, le=1_000_000)
    bidirectional: bool = True  # True: the figure counts both directions

    @property
    def unidirectional_bytes_per_s(self) -> float:
        return self.bandwidth_gb_per_s * GB / (2 if self.bidirectional else 1)


class InterNode(_Frozen):
    """The network between nodes of a common instance type, per GPU: each GPU's own NIC
    (InfiniBand or RoCE), so ``bandwidth_gb_per_s`` is one GPU's share, one direction."""

    kind: str  # infiniband-ndr, roce, efa, ...
    bandwidth_gb_per_s: float = Field(gt=0, le=1_000_000)  # per GPU, one direction
    latency_us: float | None = Field(None, gt=0, le=1_000_000)
    source: str = Field(min_length=1)
    date: str | None = None
    estimated: bool = False
    note: str | None = None


class Node(_Frozen):
    """A server of this GPU: how many GPUs share the intra-node link, and the network
    between such servers (of the named instance type)."""

    gpus_per_node: int = Field(gt=0, le=1024)
    instance: str | None = None  # AWS p5.48xlarge, Azure ND H100 v5, DGX H100, ...
    inter_node: InterNode | None = None
    source: str = Field(min_length=1)
    date: str | None = None


class Price(_Frozen):
    usd_per_gpu_hour: float = Field(gt=0, le=10_000)
    source: str = Field(min_length=1)
    date: str = Field(min_length=1)
    note: str | None = None
    # the price set it comes from (planner/data/prices) and what in it: "AWS p5.48xlarge"
    price_set: str | None = None
    label: str | None = None


class SourcedFigure(_Frozen):
    """A measured (or, with ``estimated``, a documented-fraction) figure and its source."""

    value: float = Field(gt=0, allow_inf_nan=False)
    source: str = Field(min_length=1)
    date: str | None = None
    method: str | None = None
    estimated: bool = False
    note: str | None = None


class HostLink(_Frozen):
    """The GPU's link to its host's memory, one direction (PCIe, or NVLink-C2C to a Grace CPU):
    what weights kept in host memory cross every forward pass (vLLM's cpu_offload_gb).
    ``bandwidth_gb_per_s`` is the datasheet's figure for one direction; ``achievable`` what a
    pinned host-to-device copy reaches (published, or a documented fraction marked
    ``estimated``: planner/core/achievable.py)."""

    kind: str  # pcie5-x16, pcie4-x16, nvlink-c2c, ...
    bandwidth_gb_per_s: float = Field(gt=0, le=1_000_000)  # one direction
    source: str = Field(min_length=1)
    date: str | None = None
    estimated: bool = False
    note: str | None = None
    achievable: SourcedFigure | None = None

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_gb_per_s * GB


class Achievable(_Frozen):
    """What a published benchmark reaches on this GPU: copy bandwidth and the best dense
    matmul rate per precision (mamf-finder's "maximum achievable matmul FLOPS")."""

    memory_bandwidth_gb_per_s: SourcedFigure
    matmul_tflops: dict[DType, SourcedFigure] = Field(default_factory=dict)


class MeasuredAllreduce(_Frozen):
    """An engine's own tensor-parallel all-reduce timed on this GPU, in one server: the
    latency of a bf16 all-reduce of each message size over 2, 4 and 8 GPUs, replayed from a
    CUDA graph (``graph_us``) and launched eagerly (``eager_us``; absent where one timing
    covers both). Where an engine of this family runs on this GPU with a TP size timed here,
    these times replace the link-bandwidth formula (``planner.core.roofline``)."""

    engine_version: str = Field(min_length=1)  # the release that was timed
    device: str | None = None  # the device name the timing run reported
    source: str = Field(min_length=1)
    path: str | None = None  # the table within the source
    date: str | None = None
    note: str | None = None
    message_bytes: list[int]
    graph_us: dict[int, list[float]]
    eager_us: dict[int, list[float]] | None = None

    @model_validator(mode="after")
    def _check(self) -> MeasuredAllreduce:
        b = self.message_bytes
        if len(b) < 2 or b[0] <= 0 or any(b[i + 1] <= b[i] for i in range(len(b) - 1)):
            raise ValueError("message_bytes must be two or more positive sizes, increasing")
        for mode, rows in (("graph_us", self.graph_us), ("eager_us", self.eager_us or {})):
            for tp, us in rows.items():
                if tp < 2:
                    raise ValueError(f"{mode}.{tp}: an all-reduce needs 2 GPUs or more")
                if len(us) != len(b):
                    raise ValueError(f"{mode}.{tp}: {len(us)} latencies for {len(b)} sizes")
                if any(not (0 < v < 1e9) for v in us):
                    raise ValueError(f"{mode}.{tp}: latencies must be positive microseconds")
        return self


class HardwareSpec(_Frozen):
    """One accelerator, as its datasheet describes it. Peak rates are dense (no sparsity)."""

    name: str
    display_name: str
    vendor: str
    source: str = Field(min_length=1)  # datasheet URL
    memory_gib: float = Field(gt=0, le=100_000)
    memory_bandwidth_gb_per_s: float = Field(gt=0, le=1_000_000)
    peak_tflops: dict[DType, float]  # dense tensor-core TFLOP/s (TOPS for int8) per type
    interconnect: Interconnect
    host_link: HostLink | None = None  # None: unknown (no --cpu-offload-gb)
    node: Node | None = None  # None: a single GPU or an unknown server
    tdp_w: float | None = Field(None, gt=0, le=100_000)  # None where no datasheet gives it
    price: Price | None = None
    # why it has no price in the price set it was loaded with (set by the loader)
    price_missing: str | None = None
    memory_type: str | None = None  # HBM2e, HBM3, GDDR6, ...: picks the estimated fraction
    architecture: str | None = None  # one of GPU_ARCHITECTURES: ampere, hopper, cdna3, ...
    achievable: Achievable | None = None
    # engine family (vllm, sglang, trtllm) -> its own all-reduce timed on this GPU
    allreduce_measured: dict[str, MeasuredAllreduce] = Field(default_factory=dict)
    notes: str | None = None

    @field_validator("architecture")
    @classmethod
    def _known_architecture(cls, v: str | None) -> str | None:
        return v if v is None else check_architecture(v)

    @model_validator(mode="after")
    def _check(self) -> HardwareSpec:
        if not self.peak_tflops:
            raise ValueError("peak_tflops lists no precision")
        for dt, v in self.peak_tflops.items():
            if not 0 < v <= 10_000_000:
                raise ValueError(f"peak_tflops.{dt.value} must be positive and at most 1e7, "
                                 f"got {v}")
        a = self.achievable
        if a is not None:  # a benchmark cannot beat the datasheet (5% for clock boost)
            if a.memory_bandwidth_gb_per_s.value > 1.05 * self.memory_bandwidth_gb_per_s:
                raise ValueError(f"achievable.memory_bandwidth_gb_per_s: "
                                 f"{a.memory_bandwidth_gb_per_s.value:g} GB/s exceeds the "
                                 f"datasheet's memory_bandwidth_gb_per_s, "
                                 f"{self.memory_bandwidth_gb_per_s:g} GB/s (one of the two "
                                 "is wrong)")
            for dt, fig in a.matmul_tflops.items():
                peak = self.peak_tflops.get(dt)
                if peak is not None and fig.value > 1.05 * peak:
                    raise ValueError(f"achievable.matmul_tflops.{dt.value}: {fig.value:g} "
                                     f"TFLOP/s exceeds the datasheet's dense "
                                     f"peak_tflops.{dt.value}, {peak:g} (one of the two is "
                                     "wrong)")
        h = self.host_link
        if h is not None and h.achievable is not None and \
                h.achievable.value > 1.05 * h.bandwidth_gb_per_s:
            raise ValueError(f"host_link.achievable: {h.achievable.value:g} exceeds the "
                             f"datasheet's {h.bandwidth_gb_per_s:g} GB/s")
        return self

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gb_per_s * GB

    def peak_flops_per_s(self, dtype: DType) -> float:
        """Dense peak for matmuls in ``dtype``; an error names what the datasheet has."""
        if dtype not in self.peak_tflops:
            have = ", ".join(d.value for d in self.peak_tflops)
            hint = ("run it in fp16: --weights fp16 (vLLM's --dtype half, as vLLM itself asks "
                    "on such GPUs) or --compute fp16"
                    if dtype is DType.bf16 and DType.fp16 in self.peak_tflops else
                    "choose another precision, or say what the matmuls run in with --compute")
            raise UsageError(f"{self.name} has no {dtype.value} tensor-core rate "
                             f"(its datasheet lists: {have}); {hint}")
        return self.peak_tflops[dtype] * TERA


# --------------------------------------------------------------------------- calibration


class Calibration(_Frozen):
    """Measured ceilings of one device (written by ``llmplan measure --calibrate``)."""

    device: str
    memory_bandwidth_gb_per_s: float = Field(gt=0, le=1_000_000)
    matmul_tflops: dict[DType, float] = Field(default_factory=dict)
    kernel_overhead_us: float = Field(0.0, ge=0, le=1_000_000)
    # What a memory-bound matmul and a decode attention kernel pay beyond their bytes at the
    # measured bandwidth (harness 2 and later; None: the empty kernel's cost above stands
    # for them): the median excess of kernels timed back to back in a CUDA graph, each
    # reading its own weights or cache from memory, as a decode step's layers do
    matmul_overhead_us: float | None = Field(None, ge=0, le=1_000_000)
    attention_overhead_us: float | None = Field(None, ge=0, le=1_000_000)
    # measured all-reduce (`llmplan measure --collectives`): t = 2 (n-1)/n x S / bus + latency
    allreduce_latency_us: float | None = Field(None, gt=0, le=1_000_000)
    allreduce_bus_gb_per_s: float | None = Field(None, gt=0, le=1_000_000)

    @model_validator(mode="after")
    def _rates(self) -> Calibration:
        for dt, v in self.matmul_tflops.items():
            if not 0 < v <= 10_000_000:
                raise ValueError(f"matmul_tflops.{dt.value} must be positive, got {v}")
        return self
    created: str | None = None
    harness_version: str | None = None
    details: dict = Field(default_factory=dict)


# --------------------------------------------------------------------------- workload


MAX_COUNT = 1_000_000_000


class Workload(_Frozen):
    """A static batch: ``batch`` sequences of ``prompt_tokens`` in, ``output_tokens`` out."""

    # Bounds: a billion sequences or tokens is beyond any deployment, and keeps every
    # product of sizes inside a float.
    # The one default workload of every command: vLLM's random dataset's 1024 prompt tokens,
    # and 256 out (a chat answer's length, as the serving commands always used).
    batch: int = Field(1, gt=0, le=MAX_COUNT)
    prompt_tokens: int = Field(1024, gt=0, le=MAX_COUNT)
    output_tokens: int = Field(256, gt=0, le=MAX_COUNT)

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


class Parallelism(_Frozen):
    tp: int = Field(1, gt=0, le=100_000)


class Options(_Frozen):
    """Knobs of the performance model, each with a documented default."""

    time_model: Literal["roofline", "additive"] = "roofline"
    attention: Literal["flash", "naive"] = "flash"
    # a fixed cost per kernel over the engine profile's (None: the profile's; 0: none)
    kernel_overhead_s: float | None = Field(None, ge=0, le=1.0)
    # CUDA context, cuBLAS/NCCL workspaces and allocator slack (a 1 GiB default: a CUDA
    # context alone takes 300-500 MiB on recent drivers).
    reserve_bytes: float = Field(1 * GIB, ge=0)
    # The engine's memory fraction (vLLM's gpu_memory_utilization, SGLang's mem_fraction_static,
    # TensorRT-LLM's free_gpu_memory_fraction), on the engine's basis
    # (planner.core.engine.MEMORY_BASES); None: the engine's default.
    memory_utilization_frac: float | None = Field(None, gt=0, le=1)
    # what that fraction is of where a server's own flag gave it (a replayed run's: a
    # trtllm-serve free_gpu_memory_fraction is of free memory whichever engine replays it);
    # None: the engine's basis
    memory_utilization_basis: Literal["total", "static", "free", "measured"] | None = None
    # Weight bytes per GPU kept in host memory and brought over the host link every forward
    # pass (vLLM's cpu_offload_gb, in bytes): that much less on the GPU, that much more KV.
    cpu_offload_bytes: float = Field(0.0, ge=0)
    # The KV pool given outright, per GPU (vLLM's kv_cache_memory_bytes, 0.11 and later):
    # exactly this much, whatever the memory fraction says; a pool the weights, activations
    # and reserve leave no room for does not start. None: sized from the memory fraction.
    kv_cache_memory_bytes: float | None = Field(None, gt=0, allow_inf_nan=False)
    # At most this many tokens in the KV pool, the engine's own sizing capped (SGLang's
    # max_total_tokens, TensorRT-LLM's kv_cache_config.max_tokens). None: no cap.
    kv_cache_max_tokens: int | None = Field(None, gt=0)
    # Tokens prefilled per forward pass (vLLM's max_num_batched_tokens with chunked prefill;
    # 8192 is its V1 default for serving). Bounds prefill activations; None: the whole batch
    # at once. TTFT is still the time of all the batch's prefill FLOPs and bytes.
    prefill_chunk_tokens: int | None = Field(8192, gt=0)
    # Expert parallelism: the busiest GPU's routed token-expert pairs over the mean (max / mean
    # load, >= 1); None: the published default of planner.layouts.expert (EXPERT_IMBALANCE).
    # Uniform routing's expected maximum stays the floor.
    expert_imbalance: float | None = Field(None, ge=1, allow_inf_nan=False)
