"""Parameters and the operator list of one forward step, counted from the architecture.

``param_breakdown`` counts every tensor of the checkpoint by component (in the manner of
nanoGPT's transformer_sizing notebook) so that totals are sums of parts and can be checked against
the officially reported count. ``step_ops`` lists the operators of one forward step over
``new_tokens`` tokens per sequence (1 for a decode step, the prompt for prefill) with their
FLOPs and the bytes each moves, per GPU under tensor parallelism.

Conventions (all per GPU, per instance; ``Op.count`` says how many instances run per step):
- A matmul of an [M, K] activation by a [K, N] weight costs 2*M*K*N FLOPs and reads the weight
  once per step for the whole batch, plus its activation in and out.
- Attention reads each sequence's own KV cache once (FlashAttention-style, no score matrix in
  memory); ``attention="naive"`` also writes and reads the score and probability matrices.
- Decode: one new token per sequence attends to ``past_tokens + 1`` keys. Prefill is causal:
  token i of n attends to i + 1 keys, n(n+1)/2 in all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from planner.core.arith import vmax, vmin
from planner.core.errors import UsageError
from planner.core.specs import DType, HardwareSpec, ModelSpec, Precision

OpKind = Literal["matmul", "attention", "norm", "elementwise", "allreduce", "host_transfer"]


# --------------------------------------------------------------------------- parameters


def _attention_params(m: ModelSpec) -> dict[str, int]:
    h = m.hidden_size
    if m.mla is not None:
        a, nh = m.mla, m.num_attention_heads
        qk_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        out: dict[str, int] = {}
        if a.q_lora_rank:
            out["q_a_proj"] = h * a.q_lora_rank
            out["q_a_norm"] = a.q_lora_rank
            out["q_b_proj"] = a.q_lora_rank * nh * qk_head
        else:
            out["q_proj"] = h * nh * qk_head
        out["kv_a_proj"] = h * (a.kv_lora_rank + a.qk_rope_head_dim)
        out["kv_a_norm"] = a.kv_lora_rank
        out["kv_b_proj"] = a.kv_lora_rank * nh * (a.qk_nope_head_dim + a.v_head_dim)
        out["o_proj"] = nh * a.v_head_dim * h
        if a.sparse:  # DeepSeek Sparse Attention's lightning indexer (``indexer_params``)
            out.update(indexer_params(m))
        return out
    out = {
        "q_proj": h * m.q_dim,
        "k_proj": h * m.kv_dim,
        "v_proj": h * m.kv_dim,
        "o_proj": m.q_dim * h,
    }
    if m.attention_bias:
        out["qkv_bias"] = m.q_dim + 2 * m.kv_dim
    if m.attention_out_bias:
        out["o_bias"] = h
    if m.qk_norm and m.qk_norm_scope == "layer":  # the whole q and k: split over TP
        out["qk_norm_layer"] = m.q_dim + m.kv_dim
    elif m.qk_norm:  # each head's: one weight of head_dim for q, one for k
        out["qk_norm"] = 2 * m.head_dim_
    if m.attention_sinks:
        out["sinks"] = m.num_attention_heads
    return out


def indexer_params(m: ModelSpec) -> dict[str, int]:
    """One layer's lightning indexer (DeepSeek Sparse Attention), as DeepSeek's reference
    inference code builds it: its queries from the compressed query (``wq_b``: q_lora_rank to
    index_n_heads x index_head_dim), one key a token (``wk``: hidden to index_head_dim, then a
    LayerNorm with its bias, ``k_norm``) and a weight a head for each token (``weights_proj``:
    hidden to index_n_heads)."""
    a, h = m.mla, m.hidden_size
    n, d = a.index_n_heads, a.index_head_dim
    return {"indexer_wq_b": (a.q_lora_rank or h) * n * d, "indexer_wk": h * d,
            "indexer_k_norm": 2 * d, "indexer_weights_proj": h * n}


# Sparse attention's fp8 caches (its index keys, and an fp8 cache's latents) keep one fp32
# scale a block of 128 values (DeepSeek's reference code, ``k_scale_cache``; FlashMLA's
# sparse layout)
FP8_SCALE_BLOCK = 128


def fp8_scaled_bytes(values: int) -> float:
    """Bytes of ``values`` fp8 values with a 4-byte scale a block of FP8_SCALE_BLOCK."""
    return values * 1.0 + 4.0 * -(-values // FP8_SCALE_BLOCK)


def index_key_bytes(m: ModelSpec) -> float:
    """Bytes one token adds to one layer's index key cache (every TP rank holds it whole):
    index_head_dim fp8 values and a 4-byte scale per 128 of them; 0 for dense attention.
    DeepSeek-V3.2: 128 + 4 = 132."""
    if m.mla is None or not m.mla.sparse:
        return 0.0
    return fp8_scaled_bytes(m.mla.index_head_dim)


def _mlp_params(m: ModelSpec, inter: int, bias: bool | None = None) -> dict[str, int]:
    """A (gated) MLP of width ``inter``; ``bias``: its projections carry biases (default: the
    model's ``mlp_bias``)."""
    h = m.hidden_size
    if m.mlp == "gated":
        out = {"gate_up_proj": 2 * h * inter, "down_proj": inter * h}
        bias_n = 2 * inter + h
    else:
        out = {"up_proj": h * inter, "down_proj": inter * h}
        bias_n = inter + h
    if m.mlp_bias if bias is None else bias:
        out["mlp_bias"] = bias_n
    return out


def _expert_split(m: ModelSpec) -> tuple[int, int]:
    """(weights, biases) of one expert (a gated MLP of expert_intermediate_size): the biases
    stay 16-bit when the weights are quantized (gpt-oss's checkpoint), so they are apart."""
    assert m.moe is not None
    p = _mlp_params(m, m.moe.expert_intermediate_size, bias=m.mlp_bias or m.moe.expert_bias)
    b = p.pop("mlp_bias", 0)
    return sum(p.values()), b


def _expert_params(m: ModelSpec) -> int:
    """Parameters of one routed expert, biases included."""
    return sum(_expert_split(m))


def param_breakdown(m: ModelSpec) -> dict[str, int]:
    """Every parameter of the checkpoint, by component; keys are 'component/tensor'."""
    h = m.hidden_size
    norm_params = h * (2 if m.norm == "layernorm" else 1)
    out: dict[str, int] = {"embed/tokens": m.vocab_size * h}
    if m.position_embedding == "learned":
        out["embed/positions"] = m.max_position_embeddings * h
    for k, v in _attention_params(m).items():
        out[f"attention/{k}"] = v * m.num_layers
    out["norms/layers"] = norm_params * m.norms_per_layer * m.num_layers
    if m.num_dense_layers:
        for k, v in _mlp_params(m, m.intermediate_size).items():
            out[f"mlp/{k}"] = v * m.num_dense_layers
    if m.moe is not None:
        e, n_moe = m.moe, m.num_moe_layers
        out["moe/router"] = (h * e.num_experts + (e.num_experts if e.router_bias else 0)) * n_moe
        w, b = _expert_split(m)
        out["moe/routed_experts"] = e.num_experts * w * n_moe
        if b:
            out["moe/routed_expert_bias"] = e.num_experts * b * n_moe
        if e.num_shared_experts:
            out["moe/shared_experts"] = e.num_shared_experts * w * n_moe
            if b:
                out["moe/shared_expert_bias"] = e.num_shared_experts * b * n_moe
    out["norms/final"] = norm_params
    if not m.tie_word_embeddings:
        out["lm_head"] = m.vocab_size * h
    if m.vision_params:  # a vision-language checkpoint's encoder, split and whole
        out["vision/encoder"] = m.vision_params - m.vision_replicated_params
        out["vision/replicated"] = m.vision_replicated_params
    return out


def count_params(m: ModelSpec) -> int:
    return sum(param_breakdown(m).values())


def active_params(m: ModelSpec) -> int:
    """Parameters one token touches: all but the routed experts it is not sent to (and a
    vision encoder, which a text token never runs)."""
    total = count_params(m) - m.vision_params
    if m.moe is None:
        return total
    idle = m.moe.num_experts - m.moe.experts_per_token
    return total - idle * _expert_params(m) * m.num_moe_layers


def flops_per_token_2n(m: ModelSpec) -> float:
    """The 2 x N shortcut, without attention: N counts the active parameters a token multiplies
    by, so the embedding lookup is out and a tied lm_head is in."""
    bd = param_breakdown(m)
    lookup = bd["embed/tokens"] + bd.get("embed/positions", 0)
    tied_head = 0 if "lm_head" in bd else m.vocab_size * m.hidden_size
    return 2.0 * (active_params(m) - lookup + tied_head)


# --------------------------------------------------------------------------- operators


@dataclass(frozen=True, slots=True)
class Op:
    """One operator instance, per GPU. Totals per step are the fields times ``count``."""

    name: str
    kind: OpKind
    count: int
    flops: float
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0  # KV cache read (attention) or written (kv_write)
    act_bytes: float = 0.0  # activations in and out
    dtype: DType = DType.bf16  # type the arithmetic runs in
    comm_bytes: float = 0.0  # all-reduce payload
    weight_dtype: DType | None = None  # storage type of a matmul's weights
    m_rows: float = 0.0  # a matmul's M: the activation rows of each GEMM (tokens per expert)
    kv_group: float = 1.0  # attention: query heads that share each cached KV head
    kv_cache_bytes: float = 0.0  # KV write: the cache held before (a concatenating cache copies it)
    kv_dtype: DType | None = None  # attention: the type of the cache it reads (not MLA's)
    k_dim: float = 0.0  # a matmul's K: the depth each output sums over (input features per GPU)
    fp8_blocks: bool = False  # a matmul's fp8 weights carry a scale per block (128 x 128)
    # a W8A8 fp8 matmul's input takes one scale for the whole tensor, found at run time: a
    # checkpoint's dynamic per-tensor scheme, or weights the engine quantized at load from a
    # 16-bit checkpoint (vLLM's --quantization fp8; ``Precision.fp8_dynamic_tensor``)
    fp8_dynamic_tensor: bool = False
    # the rows of its input a matmul's quantization pass covers, where they are not ``m_rows``
    # (a MoE layer's: its tokens before gate_up, their routed copies before down, once a
    # layer, not per expert); 0: ``m_rows``
    quant_rows: float = 0.0
    # attention: its query heads on this GPU (0: not stated), for a kernel that computes a
    # padded number of them (``Engine.sparse_mla_heads``)
    heads: float = 0.0

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.act_bytes

    @property
    def intensity_flops_per_byte(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")


def check_tp(m: ModelSpec, tp: int) -> None:
    """Tensor parallelism splits heads: tp must divide the heads (and the KV heads, or be a
    multiple of them, in which case KV heads are replicated)."""
    if m.num_attention_heads % tp:
        raise UsageError(f"tp {tp} does not divide {m.name}'s {m.num_attention_heads} "
                         "attention heads", fields=("tp",))
    if m.mla is None and m.num_kv_heads % tp and tp % m.num_kv_heads:
        raise UsageError(f"tp {tp} neither divides nor is a multiple of {m.name}'s "
                         f"{m.num_kv_heads} KV heads", fields=("tp",))
    if m.qk_norm_scope == "layer" and tp > m.num_kv_heads:
        # the k norm's weight is split as kv_dim / tp, narrower than a replicated KV head's
        # keys (vLLM's MiniMaxText01RMSNormTP): the weights load, the forward pass fails
        raise UsageError(f"tp {tp} is above {m.name}'s {m.num_kv_heads} KV heads: its "
                         "per-layer q/k norm splits the k norm's weight over the ranks, "
                         "narrower than a replicated KV head's keys, which vLLM's forward "
                         "pass cannot apply", fields=("tp",))


# The GPU architectures whose kernels serve DeepSeek Sparse Attention: vLLM's FlashMLA
# sparse backend takes compute capability 9 and 10 (flashmla_sparse.py,
# supports_compute_capability; DeepGEMM's fp8 indexer kernels alike), its ROCm AITER sparse
# MLA backend AMD's Instinct GPUs
SPARSE_ATTENTION_ARCHITECTURES = ("hopper", "blackwell", "cdna3")


def check_runs_on(m: ModelSpec, hw: HardwareSpec) -> None:
    """What the model's own kernels need of the GPU: sparse attention's indexer and sparse
    MLA kernels exist for Hopper, Blackwell and CDNA3 GPUs only
    (``SPARSE_ATTENTION_ARCHITECTURES``; a GPU file that names no architecture, where it has
    fp8 tensor cores)."""
    if m.sparse_topk is None:
        return
    arch = (hw.architecture or "").lower()
    fp8 = DType.fp8 in hw.peak_tflops  # the indexer's arithmetic
    if fp8 and (arch in SPARSE_ATTENTION_ARCHITECTURES or not arch):
        return
    if arch and arch not in SPARSE_ATTENTION_ARCHITECTURES:
        what = f"{'an' if arch[0] in 'aeiou' else 'a'} {arch} GPU"
    else:
        what = "a GPU whose file lists no fp8 tensor-core rate"
    raise UsageError(f"{m.name}'s sparse attention runs kernels built for Hopper and Blackwell "
                     f"GPUs (vLLM's FlashMLA sparse backend, the indexer's fp8 DeepGEMM "
                     f"kernels) and AMD's CDNA3: {hw.name} is {what}", fields=("gpu",))


def kv_heads_per_gpu(m: ModelSpec, tp: int) -> float:
    """KV heads held by one GPU; when tp exceeds the KV heads each GPU holds one replica."""
    return max(m.num_kv_heads / tp, 1.0)


def kv_elements_per_token_per_layer(m: ModelSpec, tp: int = 1) -> float:
    """Cached elements per token per layer on one GPU.

    Standard attention: K and V, 2 x kv_heads x head_dim. MLA: the compressed latent plus the
    shared rope key, kv_lora_rank + qk_rope_head_dim, replicated on every TP rank.
    """
    if m.mla is not None:
        return m.mla.kv_lora_rank + m.mla.qk_rope_head_dim
    return 2 * kv_heads_per_gpu(m, tp) * m.head_dim_


def cache_entry_bytes(m: ModelSpec, kv_bytes: float, tp: int = 1) -> float:
    """Bytes of one token's entry in one layer's attention cache on one GPU (what attention
    reads of it): its cached elements (``kv_elements_per_token_per_layer``) at ``kv_bytes``
    each; under sparse attention an fp8 cache is FlashMLA's sparse layout (vLLM's
    ``fp8_ds_mla``, SGLang's alike): the latent in fp8 with a 4-byte scale per 128 of it,
    and the rope key in 16 bits, 512 + 16 + 128 = 656 bytes for DeepSeek-V3.2 (vLLM's
    flashmla_sparse.py: "each token's KV cache is 656 Bytes")."""
    a = m.mla
    if a is not None and a.sparse and kv_bytes == 1:
        return fp8_scaled_bytes(a.kv_lora_rank) + 2.0 * a.qk_rope_head_dim
    return kv_elements_per_token_per_layer(m, tp) * kv_bytes


def kv_bytes_per_token_per_layer(m: ModelSpec, kv_bytes: float, tp: int = 1) -> float:
    """Bytes one token adds to one GPU's cache in one layer: its attention cache entry
    (``cache_entry_bytes``) and a sparse-attention layer's index key (``index_key_bytes``),
    whatever the cache's type."""
    return cache_entry_bytes(m, kv_bytes, tp) + index_key_bytes(m)


def windowed_layers(m: ModelSpec) -> tuple[bool, ...]:
    """Per layer, whether its attention reads a capped span of the cache
    (``ModelSpec.attention_window``): the sliding-window layers, or every layer of a model
    with sparse attention."""
    if m.sparse_topk is not None:
        return (True,) * m.num_layers
    return m.layer_is_sliding


def local_attention_name(m: ModelSpec) -> str:
    """The operator name of the windowed layers' attention: ``attention_sparse`` under sparse
    attention (the top-k tokens its indexer picks), else ``attention_local`` (the window)."""
    return "attention_sparse" if m.sparse_topk is not None else "attention_local"


# the operators that attend over a step's cached tokens, priced per step from its amounts
# (``planner.serving.cost``): full layers', windowed or sparse layers', and sparse
# attention's indexer, which scores every cached token
ATTENTION_OPS = ("attention", "attention_local", "attention_sparse", "dsa_indexer")


def expected_distinct_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected number of experts hit by ``tokens`` tokens each routed to ``top_k`` of them,
    under uniform routing: E x (1 - (1 - k/E)^T). Their weights are what a step reads."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def window_pairs(n, window):
    """sum over p = 1..n of min(p, window): query-key pairs of the first n positions of a
    causal sequence under a sliding window (numbers or arrays)."""
    w = vmin(n, window)
    return w * (w + 1) / 2 + vmax(n - window, 0) * window


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a forward step processes, summed over its sequences: enough to cost it whether its
    sequences are alike (a static batch) or mixed (decodes beside prefill chunks).

    For sequences i adding new_i tokens after past_i cached ones:
    tokens = sum new_i; attn_pairs = sum (new_i x past_i + new_i (new_i + 1) / 2), the
    query-key pairs of causal attention; kv_read_tokens = sum (past_i + new_i), each sequence
    reading its cache once; kv_held_tokens = sum past_i; score_elems = sum new_i (past_i +
    new_i), the naive score matrix; logit_rows: the rows of logits the step computes (a
    sequence that samples a token, or a prompt chunk whose token the engine throws away).

    ``local``: the same step as the model's sliding-window layers see it (their pairs, reads
    and held cache capped by the window); None where no layer slides, or to cost those layers
    as full ones.

    ``prefill_pairs`` and ``prefill_past_tokens``: the share of ``attn_pairs`` and of the
    cached tokens that belongs to prefilling sequences (a prompt or its chunk, not a decode):
    multi-head latent attention runs those in the expanded, per-head form and decodes in the
    latent one (``_attention``); other attention costs both alike.
    """

    tokens: float
    attn_pairs: float
    kv_read_tokens: float
    kv_held_tokens: float
    score_elems: float
    logit_rows: float
    local: StepShape | None = None
    prefill_pairs: float = 0.0
    prefill_past_tokens: float = 0.0

    def scaled(self, f) -> StepShape:
        """The step's amounts times ``f``: a share of its sequences (each amount is a sum over
        them; a share of whole sequences is taken as the same share of each sum)."""
        return StepShape(self.tokens * f, self.attn_pairs * f, self.kv_read_tokens * f,
                         self.kv_held_tokens * f, self.score_elems * f, self.logit_rows * f,
                         None if self.local is None else self.local.scaled(f),
                         self.prefill_pairs * f, self.prefill_past_tokens * f)

    @classmethod
    def uniform(cls, batch, new_tokens, past_tokens, window: int | None = None, *,
                prefill: bool | None = None) -> StepShape:
        """``batch`` sequences, each adding ``new_tokens`` after ``past_tokens`` (numbers or
        broadcastable arrays); ``window``: the sliding window of the model's local layers;
        ``prefill``: whether the sequences are prefilling (None: where they add more than one
        token; a speculative verification adds several and is a decode).

        Under a window W, the token at position p attends to min(p, W) keys; a sequence reads
        min(past + new, W + new - 1) cached keys (its chunk and the W - 1 before it) and holds
        min(past, W) of them."""
        full = cls(tokens=batch * new_tokens,
                   attn_pairs=batch * (new_tokens * past_tokens
                                       + new_tokens * (new_tokens + 1) / 2),
                   kv_read_tokens=batch * (past_tokens + new_tokens),
                   kv_held_tokens=batch * past_tokens,
                   score_elems=batch * new_tokens * (past_tokens + new_tokens),
                   logit_rows=batch)
        filling = (new_tokens > 1) if prefill is None else prefill  # an array where they are
        full = replace(full, prefill_pairs=full.attn_pairs * filling,
                       prefill_past_tokens=full.kv_held_tokens * filling)
        if window is None:
            return full
        span = vmin(past_tokens + new_tokens, window + new_tokens - 1)
        local = cls(tokens=full.tokens,
                    attn_pairs=batch * (window_pairs(past_tokens + new_tokens, window)
                                        - window_pairs(past_tokens, window)),
                    kv_read_tokens=batch * span,
                    kv_held_tokens=batch * vmin(past_tokens, window),
                    score_elems=batch * new_tokens * span,
                    logit_rows=full.logit_rows)
        return replace(full, local=local)


def step_ops(
    m: ModelSpec,
    prec: Precision,
    *,
    batch: int,
    new_tokens: int,
    past_tokens: int,
    tp: int = 1,
    attention: Literal["flash", "naive"] = "flash",
    lm_head_sharded: bool = True,
) -> list[Op]:
    """Operators of one forward step: ``batch`` sequences, each adding ``new_tokens`` tokens
    after ``past_tokens`` cached ones. Decode: new_tokens=1; prefill: new_tokens=prompt.
    ``lm_head_sharded``: the lm_head is split across TP ranks (vLLM) or whole on each."""
    return shape_ops(m, prec, StepShape.uniform(batch, new_tokens, past_tokens,
                                                m.attention_window), tp=tp,
                     attention=attention, lm_head_sharded=lm_head_sharded)


def shape_ops(
    m: ModelSpec,
    prec: Precision,
    shape: StepShape,
    *,
    tp: int = 1,
    attention: Literal["flash", "naive"] = "flash",
    lm_head_sharded: bool = True,
) -> list[Op]:
    """Operators of one forward step of any mix of sequences (see ``StepShape``), in the
    model's order: the embedding; in each layer attention, then the MLP (dense or mixture of
    experts), each behind its norm; then the final norm and the lm_head."""
    check_tp(m, tp)
    s = _Step(m, prec, shape.tokens, tp)
    L = m.num_layers
    return [
        Op("embed", "elementwise", 1, flops=0.0, act_bytes=2.0 * s.T * s.h * s.ab, dtype=s.hdt),
        s.norm("attn_norm", L),
        *_attention_ops(s, shape, attention),
        s.norm("mlp_norm", L),
        *_mlp_ops(s),
        *_head_ops(s, shape.logit_rows, lm_head_sharded),
    ]


class _Step:
    """What every operator of one step is costed from: the model, the precision's byte sizes
    and types, the TP split and ``T``, the tokens the step processes; and the operators built
    alike wherever they occur (matmul, norm, all-reduce, MLP)."""

    __slots__ = ("m", "prec", "T", "tp", "h", "wb", "hb", "ab", "kvb", "cdt", "hdt", "norm_w",
                 "heads")

    def __init__(self, m: ModelSpec, prec: Precision, tokens: float, tp: int):
        self.m, self.prec, self.T, self.tp = m, prec, tokens, tp
        self.h = h = m.hidden_size
        self.wb, self.hb = prec.quantized_bytes_per_param, prec.half_bytes
        self.ab, self.kvb = prec.activation_bytes, prec.kv_bytes
        self.cdt, self.hdt = prec.compute_dtype, prec.half_dtype
        self.norm_w = h * (2 if m.norm == "layernorm" else 1) * self.hb
        self.heads = m.num_attention_heads / tp  # query heads per GPU

    def matmul(self, name: str, count: int, k: int, n: float, *, bias: float = 0.0,
               quantized: bool = True, tokens: float | None = None,
               weights: float | None = None) -> Op:
        """[tokens, k] x [k, n]: the weights read once, the activations in and out."""
        prec = self.prec
        tokens = self.T if tokens is None else tokens
        w_elems = k * n if weights is None else weights
        quantized = quantized and prec.quantizes("experts" if name.startswith("experts_")
                                                 else name)
        return Op(name, "matmul", count, flops=2.0 * tokens * k * n,
                  weight_bytes=w_elems * (self.wb if quantized else self.hb) + bias * self.hb,
                  act_bytes=tokens * (k + n) * self.ab, dtype=self.cdt if quantized else self.hdt,
                  weight_dtype=prec.weights if quantized else self.hdt, m_rows=tokens, k_dim=k,
                  fp8_blocks=quantized and prec.weights == DType.fp8 and prec.fp8_blocks,
                  fp8_dynamic_tensor=quantized and prec.weights == DType.fp8
                  and not prec.fp8_blocks and prec.fp8_dynamic_tensor)

    def norm(self, name: str, count: int) -> Op:
        # read the residual and the branch output, write the sum and its normalized copy
        T, h = self.T, self.h
        return Op(name, "norm", count, flops=8.0 * T * h, weight_bytes=self.norm_w,
                  act_bytes=4.0 * T * h * self.ab, dtype=self.hdt)

    def allreduce(self, name: str, count: int) -> list[Op]:
        """The all-reduce of a row-parallel layer's output under TP; none on one GPU."""
        if self.tp == 1:
            return []
        return [Op(name, "allreduce", count, flops=0.0, comm_bytes=self.T * self.h * self.ab,
                   dtype=self.hdt)]

    def mlp(self, prefix: str, count: int, inter: float, tokens: float | None = None,
            biased: bool | None = None) -> list[Op]:
        """A (gated) MLP of width ``inter`` per GPU applied to ``tokens`` tokens (default: the
        step's), its weights read once (the caller scales the experts' by those reached)."""
        tokens = self.T if tokens is None else tokens
        biased = self.m.mlp_bias if biased is None else biased
        gated = self.m.mlp == "gated"
        up_n = 2 if gated else 1
        h = self.h
        up = self.matmul(f"{prefix}{'gate_up' if gated else 'up'}_proj", count, h, up_n * inter,
                         bias=up_n * inter if biased else 0.0, tokens=tokens)
        act = Op(f"{prefix}act", "elementwise", count, flops=(4.0 if gated else 8.0) * tokens
                 * inter, act_bytes=(up_n + 1) * tokens * inter * self.ab, dtype=self.hdt)
        down = self.matmul(f"{prefix}down_proj", count, inter, h, bias=h if biased else 0.0,
                           tokens=tokens)
        return [up, act, down]


def _attention_ops(s: _Step, shape: StepShape,
                   attention: Literal["flash", "naive"]) -> list[Op]:
    """Each layer's attention block: the projections, the KV append, attention over the cache
    (full and sliding-window layers apart), the output projection and its all-reduce."""
    m, L, T, tp = s.m, s.m.num_layers, s.T, s.tp
    kv_layer = cache_entry_bytes(m, s.kvb, tp)  # bytes per token, layer and GPU
    if m.mla is None:
        ops, qk_dim, v_dim, o_in = _gqa_projections(s)
    else:
        ops, qk_dim, v_dim, o_in = _mla_projections(s)
    n_local = sum(windowed_layers(m))  # sliding-window layers, or sparse attention's
    n_full = L - n_local
    local = shape.local or shape  # no window shape given: the local layers cost as full ones
    n_slide = m.num_sliding_layers  # sparse attention keeps every token cached
    held = shape.kv_held_tokens if not n_slide else (
        (L - n_slide) * shape.kv_held_tokens + n_slide * local.kv_held_tokens) / L
    if m.qk_norm:  # RMSNorm of each query and key head (or of the whole q and k), before RoPE
        qk_elems = T * (s.heads + kv_heads_per_gpu(m, tp)) * m.head_dim_
        per_layer = m.qk_norm_scope == "layer"
        norm_w = (m.q_dim / tp + kv_heads_per_gpu(m, tp) * m.head_dim_) if per_layer \
            else 2 * m.head_dim_
        ops.append(Op("qk_norm", "norm", L, flops=4.0 * qk_elems,
                      weight_bytes=norm_w * s.hb, act_bytes=2.0 * qk_elems * s.ab,
                      dtype=s.hdt))
        if per_layer and tp > 1:
            # each rank holds a slice of q and of k: their sums of squares, one fp32 figure
            # per token for q and one for k, are all-reduced in one call before the division
            # (vLLM's MiniMaxText01RMSNormTP.forward_qk, used by MiniMax-M2)
            ops.append(Op("allreduce_qk_norm", "allreduce", L, flops=0.0,
                          comm_bytes=2.0 * T * 4, dtype=s.hdt))
    ops.append(Op("rope_kv_write", "elementwise", L, flops=0.0,
                  kv_bytes=T * kv_layer, act_bytes=2.0 * T * (m.q_dim / tp) * s.ab, dtype=s.hdt,
                  kv_cache_bytes=held * kv_layer))
    group = 1.0 if m.mla is not None else s.heads / kv_heads_per_gpu(m, tp)
    dims = dict(qk_dim=qk_dim, v_dim=v_dim, kv_layer=kv_layer, group=group, attention=attention)
    if n_full:
        ops.append(_attention(s, "attention", n_full, shape, **dims))
    if n_local:
        ops.append(_attention(s, local_attention_name(m), n_local, local, **dims))
    if m.sparse_topk is not None:
        ops += _indexer_ops(s, shape)
    ops.append(s.matmul("o_proj", L, o_in / tp, s.h, bias=s.h if m.attention_out_bias else 0.0))
    ops += s.allreduce("allreduce_attn", L)
    return ops


def _indexer_ops(s: _Step, shape: StepShape) -> list[Op]:
    """DeepSeek Sparse Attention's lightning indexer in each layer, on every TP rank whole
    (each rank picks the same top-k for its heads): its projections (the queries from the
    compressed query, one key and a weight a head for each token), the new keys' LayerNorm,
    rotary embedding, fp8 quantization and write to the index key cache
    (``index_key_bytes`` a token), then ``dsa_indexer``: every new token's scores over every
    cached token, QK^T in fp8 over ``index_n_heads`` heads of ``index_head_dim`` (2 x heads x
    dims FLOPs a pair) and their ReLU'd weighted sum over the heads (2 x heads), written as
    an fp32 logit a pair that the top-k selection reads back (8 bytes a pair: vLLM's
    DeepGEMM fp8_mqa_logits, then its top-k), the whole cache of index keys read once a
    sequence. The top-k (``index_topk`` tokens) is what the sparse
    attention then reads (``local_attention_name``)."""
    m, a, L, T = s.m, s.m.mla, s.m.num_layers, s.T
    n, d = a.index_n_heads, a.index_head_dim
    key = index_key_bytes(m)
    ops = [s.matmul("indexer_q_proj", L, a.q_lora_rank or s.h, n * d),
           s.matmul("indexer_k_proj", L, s.h, d),
           s.matmul("indexer_weights_proj", L, s.h, n, quantized=False),
           Op("indexer_k_write", "elementwise", L, flops=8.0 * T * d,
              weight_bytes=2 * d * s.hb, kv_bytes=T * key,
              act_bytes=T * d * s.ab + T * (n * d) * (s.ab + 1.0), dtype=s.hdt)]
    pairs = shape.attn_pairs
    ops.append(Op("dsa_indexer", "attention", L, flops=2.0 * n * (d + 1) * pairs,
                  kv_bytes=shape.kv_read_tokens * key,
                  act_bytes=T * n * (d * 1.0 + 4.0) + 8.0 * pairs,
                  dtype=DType.fp8))
    return ops


def _gqa_projections(s: _Step) -> tuple[list[Op], int, int, int]:
    """Q, K and V in one matmul (grouped-query attention); (ops, q.k and v head dims, width
    into o_proj)."""
    m = s.m
    qkv_n = m.q_dim / s.tp + 2 * kv_heads_per_gpu(m, s.tp) * m.head_dim_
    qkv = s.matmul("qkv_proj", m.num_layers, s.h, qkv_n,
                   bias=qkv_n if m.attention_bias else 0.0)
    return [qkv], m.head_dim_, m.head_dim_, m.q_dim


def _mla_projections(s: _Step) -> tuple[list[Op], int, int, int]:
    """Multi-head latent attention (DeepSeek-V2/V3) as vLLM runs it; (ops, q.k and v head
    dims in the latent space, width into o_proj)."""
    m, a, L = s.m, s.m.mla, s.m.num_layers
    qk_head = a.qk_nope_head_dim + a.qk_rope_head_dim
    # the down-projections are small and replicated on every rank (as in vLLM)
    q_down = a.q_lora_rank or 0
    ops = [s.matmul("mla_down_proj", L, s.h, q_down + a.kv_lora_rank + a.qk_rope_head_dim)]
    if a.q_lora_rank:
        ops.append(s.matmul("mla_q_up_proj", L, a.q_lora_rank, s.heads * qk_head))
    else:
        ops.append(s.matmul("q_proj", L, s.h, s.heads * qk_head))
    # kv_b_proj, absorbed into the query (nope part) and the output (v part): the same
    # weights and 2 x T x params FLOPs whether absorbed (decode) or not (prefill)
    ops.append(s.matmul("mla_kv_up_proj", L, a.kv_lora_rank,
                        s.heads * (a.qk_nope_head_dim + a.v_head_dim)))
    # absorbed attention (a decode) works in the latent space: scores over kv_lora + rope
    # dims, values are the latent itself; a prefill's attention is costed in the expanded
    # form (``_attention``)
    return (ops, a.kv_lora_rank + a.qk_rope_head_dim, a.kv_lora_rank,
            m.num_attention_heads * a.v_head_dim)


def _attention(s: _Step, name: str, count: int, sh: StepShape, *, qk_dim: int, v_dim: int,
               kv_layer: float, group: float, attention: Literal["flash", "naive"]) -> Op:
    """Attention of the step's queries over ``sh``'s keys: QK^T and PV, 2 x pairs x (qk + v)
    FLOPs a head; each sequence reads its cache once."""
    T, heads, ab = s.T, s.heads, s.ab
    flops = 2.0 * heads * sh.attn_pairs * (qk_dim + v_dim)
    a = s.m.mla
    if a is not None:
        # vLLM's and SGLang's MLA backends (and TensorRT-LLM's context phase) run a prefill
        # in the expanded form: kv_b_proj turns the cached latents back into per-head keys
        # (nope + rope dims) and values, and attention runs over those, 3.4x fewer FLOPs a
        # pair than the latent form for DeepSeek-V3. The new tokens' expansion is the
        # mla_kv_up_proj matmul; a chunk's cached context is expanded here.
        mha = a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim
        flops += 2.0 * heads * sh.prefill_pairs * (mha - qk_dim - v_dim)
        flops += 2.0 * sh.prefill_past_tokens * a.kv_lora_rank * heads * (
            a.qk_nope_head_dim + a.v_head_dim)
    kv = sh.kv_read_tokens * kv_layer  # each sequence reads its cache once
    act = 2.0 * T * heads * (qk_dim + v_dim) * ab  # q in, out out
    if attention == "naive":
        # the [new, past+new] score matrix and its softmax, written and read once each
        act += 4.0 * heads * sh.score_elems * ab
    # MLA's latent cache is read by other kernels (FlashMLA, ...) than the ones whose fp8
    # pace the engine profiles state (Engine.fp8_kv_attention_bytes_per_s)
    return Op(name, "attention", count, flops=flops, kv_bytes=kv, act_bytes=act, dtype=s.hdt,
              kv_group=group, kv_dtype=None if a is not None else s.prec.kv_cache,
              heads=heads)


def _mlp_ops(s: _Step) -> list[Op]:
    """The MLP blocks: the dense layers', then the mixture-of-experts layers'."""
    m, ops = s.m, []
    if m.num_dense_layers:
        ops += s.mlp("mlp_", m.num_dense_layers, m.intermediate_size / s.tp)
        ops += s.allreduce("allreduce_mlp", m.num_dense_layers)
    if m.moe is not None:
        ops += _moe_ops(s)
    return ops


def _moe_ops(s: _Step) -> list[Op]:
    """The router, the routed experts (each token's top k; the weights of every expert the
    step reaches are read), any shared experts, and the all-reduce."""
    e, n_moe, T = s.m.moe, s.m.num_moe_layers, s.T
    ops = [s.matmul("moe_router", n_moe, s.h, e.num_experts, quantized=False,
                    bias=e.num_experts if e.router_bias else 0.0)]
    inter = e.expert_intermediate_size / s.tp
    hit = expected_distinct_experts(e.num_experts, e.experts_per_token, T)
    routed_tokens = T * e.experts_per_token
    pad = s.prec.expert_pad_factor(s.m, s.tp)  # the engine's padded layout: more to read
    for op in s.mlp("experts_", n_moe, inter, tokens=routed_tokens,
                    biased=s.m.mlp_bias or e.expert_bias):
        if op.kind == "matmul":  # weights of every expert the batch reaches
            op = Op(op.name, op.kind, op.count, op.flops * pad,
                    weight_bytes=op.weight_bytes * pad * hit,
                    act_bytes=op.act_bytes, dtype=op.dtype, weight_dtype=op.weight_dtype,
                    m_rows=routed_tokens / vmax(hit, 1e-30),  # 0 rows in an empty step
                    k_dim=op.k_dim, fp8_blocks=op.fp8_blocks,
                    fp8_dynamic_tensor=op.fp8_dynamic_tensor,
                    # the layer quantizes its tokens once before gate_up, their routed
                    # copies' intermediate once before down
                    quant_rows=routed_tokens if op.name == "experts_down_proj" else T)
        ops.append(op)
    if e.num_shared_experts:
        ops += s.mlp("shared_", n_moe, e.num_shared_experts * inter)
    ops += s.allreduce("allreduce_moe", n_moe)
    return ops


# the operators of a step's sampling, after the decoder stack (``_head_ops``)
SAMPLING_OPS = ("final_norm", "lm_head")


def is_routed(op: Op) -> bool:
    """The routed experts' operators and the MoE output's all-reduce (``_moe_ops``): what an
    expert-parallel layout runs apart from the rest of the step (``planner.layouts.expert``)."""
    return op.name.startswith("experts_") or op.name == "allreduce_moe"


def _head_ops(s: _Step, rows: float, lm_head_sharded: bool) -> list[Op]:
    """The final norm and the lm_head, only for the last token of each of the ``rows``
    sequences that sample this step."""
    h = s.h
    norm = Op(SAMPLING_OPS[0], "norm", 1, flops=8.0 * rows * h, weight_bytes=s.norm_w,
              act_bytes=2.0 * rows * h * s.ab, dtype=s.hdt)
    vocab = s.m.vocab_size / (s.tp if lm_head_sharded else 1)
    lm = s.matmul(SAMPLING_OPS[1], 1, h, vocab, quantized=s.prec.lm_head_quantized, tokens=rows)
    # logits are written in fp32 for sampling
    return [norm, Op(lm.name, lm.kind, 1, lm.flops, weight_bytes=lm.weight_bytes,
                     act_bytes=rows * h * s.ab + rows * vocab * 4, dtype=lm.dtype,
                     weight_dtype=lm.weight_dtype, m_rows=rows, k_dim=lm.k_dim,
                     fp8_blocks=lm.fp8_blocks, fp8_dynamic_tensor=lm.fp8_dynamic_tensor)]


def decode_ops(m: ModelSpec, prec: Precision, *, batch: int, context_tokens: int, tp: int = 1,
               attention: Literal["flash", "naive"] = "flash",
               lm_head_sharded: bool = True) -> list[Op]:
    """One decode step: each sequence appends its token to ``context_tokens - 1`` cached ones."""
    return step_ops(m, prec, batch=batch, new_tokens=1, past_tokens=context_tokens - 1, tp=tp,
                    attention=attention, lm_head_sharded=lm_head_sharded)


def prefill_ops(m: ModelSpec, prec: Precision, *, batch: int, prompt_tokens: int, tp: int = 1,
                attention: Literal["flash", "naive"] = "flash",
                lm_head_sharded: bool = True) -> list[Op]:
    """The prefill of ``batch`` prompts of ``prompt_tokens`` each, in one causal pass."""
    return step_ops(m, prec, batch=batch, new_tokens=prompt_tokens, past_tokens=0, tp=tp,
                    attention=attention, lm_head_sharded=lm_head_sharded)


def host_transfer_ops(offload_bytes: float, passes: float = 1) -> list[Op]:
    """The weights one GPU keeps in host memory (vLLM's cpu_offload_gb), brought over the host
    link in each of ``passes`` forward passes: every pass reads them, and vLLM's offloaded
    layers copy their parameters to the GPU (or read them in place over unified addressing)
    before computing (vllm/model_executor/models/utils.py ``maybe_offload_to_cpu``). Timed
    by ``planner.core.roofline.op_time`` at the link's bandwidth, in series with the step.
    None without offloading."""
    if not offload_bytes:
        return []
    return [Op("weights_from_host", "host_transfer", passes, flops=0.0,
               comm_bytes=offload_bytes)]


def total_flops(ops: list[Op]) -> float:
    return sum(o.flops * o.count for o in ops)
