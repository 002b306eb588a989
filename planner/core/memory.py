"""Device memory: weights, KV cache, peak activations, reserve; what fits and the largest batch.

Everything is per GPU: under tensor parallelism linear layers, embeddings and lm_head are split
across the ``tp`` ranks, norms and MoE routers are replicated, and so are the small MLA
down-projections (as vLLM does).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.arith import floor_nonneg, vmax, vmin
from planner.core.engine import IDEAL, MEMORY_BASES, Engine
from planner.core.ops import kv_bytes_per_token_per_layer, param_breakdown
from planner.core.specs import GIB, HardwareSpec, ModelSpec, Options, Precision

# Checkpoint tensors that weight quantization covers (the decoder's linear layers).
_QUANTIZED = {
    "attention/q_proj", "attention/k_proj", "attention/v_proj", "attention/o_proj",
    "attention/q_a_proj", "attention/q_b_proj", "attention/kv_a_proj", "attention/kv_b_proj",
    # sparse attention's indexer: DeepSeek-V3.2 stores wq_b and wk in fp8, weights_proj in
    # bf16 and k_norm in fp32 (its checkpoint's tensors)
    "attention/indexer_wq_b", "attention/indexer_wk",
    "mlp/gate_up_proj", "mlp/up_proj", "mlp/down_proj",
    "moe/routed_experts", "moe/shared_experts",
}
# The routed experts' tensors: split over expert-parallel GPUs.
ROUTED = ("moe/routed_experts", "moe/routed_expert_bias")
# Tensors every TP rank holds whole.
_REPLICATED = {
    "norms/layers", "norms/final", "attention/q_a_norm", "attention/kv_a_norm", "moe/router",
    "attention/q_a_proj", "attention/kv_a_proj", "attention/qk_norm", "vision/replicated",
    # sparse attention's indexer, whole on every rank (vLLM's and SGLang's ReplicatedLinear)
    "attention/indexer_wq_b", "attention/indexer_wk", "attention/indexer_k_norm",
    "attention/indexer_weights_proj",
}


def weight_bytes_breakdown(m: ModelSpec, prec: Precision, *, tp: int = 1,
                           lm_head_sharded: bool = True) -> dict[str, float]:
    """Bytes per GPU of each checkpoint component (see ``param_breakdown`` for the keys).
    The lm_head is quantized when ``prec.lm_head_quantized`` and split across the TP ranks
    when ``lm_head_sharded`` (the engine's byte accounting)."""
    out: dict[str, float] = {}
    for key, n in param_breakdown(m).items():
        quantized = (key in _QUANTIZED or (key == "lm_head" and prec.lm_head_quantized)) and \
            prec.quantizes("experts" if key == "moe/routed_experts" else key)
        per_param = prec.quantized_bytes_per_param if quantized else prec.half_bytes
        replicated = key in _REPLICATED or (key == "lm_head" and not lm_head_sharded)
        if key == "moe/routed_experts":  # as the engine lays them out (``expert_pad``)
            n = n * prec.expert_pad_factor(m, tp)
        out[key] = n * per_param / (1 if replicated else tp)
    return out


def weight_bytes(m: ModelSpec, prec: Precision, *, tp: int = 1,
                 lm_head_sharded: bool = True) -> float:
    return sum(weight_bytes_breakdown(m, prec, tp=tp, lm_head_sharded=lm_head_sharded).values())


def resident_weight_bytes(m: ModelSpec, prec: Precision, *, tp: int = 1,
                          lm_head_sharded: bool = True, options: Options | None = None) -> float:
    """Weight bytes one GPU holds: its share of the checkpoint less what the options keep in
    host memory (``Options.cpu_offload_bytes``, vLLM's cpu_offload_gb)."""
    off = (options or Options()).cpu_offload_bytes
    return weight_bytes(m, prec, tp=tp, lm_head_sharded=lm_head_sharded) - off


def offloadable_weight_bytes(m: ModelSpec, prec: Precision, *, tp: int = 1,
                             lm_head_sharded: bool = True) -> float:
    """Weight bytes per GPU that vLLM's cpu_offload_gb can move to host memory: the decoder
    layers' (its ``make_layers`` offloads layer by layer; embeddings, the final norm and the
    lm_head stay on the GPU)."""
    bd = weight_bytes_breakdown(m, prec, tp=tp, lm_head_sharded=lm_head_sharded)
    return sum(v for k, v in bd.items()
               if k not in ("embed/tokens", "embed/positions", "norms/final", "lm_head")
               and not k.startswith("vision/"))


def kv_cache_bytes_per_token(m: ModelSpec, prec: Precision, *, tp: int = 1) -> float:
    """KV bytes one token adds to one GPU's cache in every layer (below any sliding window).

    2 x layers x kv_heads x head_dim x bytes (K and V), or for MLA
    layers x (kv_lora_rank + qk_rope_head_dim) x bytes, with sparse attention's index key in
    each layer beside it (``planner.core.ops.index_key_bytes``). Llama-2-13B-like, 16-bit, 20
    layers of 5120: 2 x 5120 x 20 x 2 = 409,600 bytes (the background notes' "400 kb")."""
    return m.num_layers * kv_bytes_per_token_per_layer(m, prec.kv_bytes, tp)


def kv_cache_bytes(m: ModelSpec, prec: Precision, *, batch: int, seq_len: int,
                   tp: int = 1, layers: range | None = None) -> float:
    """KV cache of ``batch`` sequences of ``seq_len`` tokens on one GPU, in every layer or in
    ``layers`` (a pipeline stage's). A sliding-window layer holds only the last
    ``sliding_window`` tokens of each sequence, as engines with a hybrid KV cache allocate it
    (vLLM 0.10 and later, SGLang, TensorRT-LLM): Gemma-2-9B at 8,192 tokens holds 21 full
    layers x 8,192 + 21 local layers x 4,096 tokens."""
    per_layer = kv_bytes_per_token_per_layer(m, prec.kv_bytes, tp)
    layers = range(m.num_layers) if layers is None else layers
    sliding = m.layer_is_sliding
    n_local = sum(1 for i in layers if sliding[i])
    if not n_local:
        return batch * seq_len * len(layers) * per_layer
    held = (len(layers) - n_local) * seq_len + n_local * vmin(seq_len, m.sliding_window)
    return batch * held * per_layer


def _activation_terms(m: ModelSpec, prec: Precision, *, tp: int) -> tuple[float, float, float]:
    """(bytes per token in flight, bytes of logits per sequence, naive-attention bytes per
    token in flight per key) for ``activation_bytes``."""
    ab = prec.activation_bytes
    heads = m.num_attention_heads / tp
    kv_heads = max(m.num_kv_heads / tp, 1.0)
    if m.mla is None:
        attn_elems = (2 * heads + 2 * kv_heads) * m.head_dim_
    else:
        a = m.mla
        attn_elems = (heads * (a.qk_nope_head_dim + a.qk_rope_head_dim) * 2
                      + heads * a.v_head_dim + a.kv_lora_rank + a.qk_rope_head_dim)
    up_n = 3 if m.mlp == "gated" else 2  # gate, up and their product (or up and act)
    mlp_elems = 0.0
    if m.num_dense_layers:
        mlp_elems = up_n * m.intermediate_size / tp
    if m.moe is not None:
        e = m.moe
        moe_elems = up_n * e.expert_intermediate_size / tp * (
            e.experts_per_token + e.num_shared_experts)
        mlp_elems = max(mlp_elems, moe_elems)
    per_token = (2 * m.hidden_size + max(attn_elems, mlp_elems)) * ab
    return per_token, m.vocab_size / tp * 4, 2 * heads * ab


def activation_bytes(m: ModelSpec, prec: Precision, *, batch: int, prompt_tokens: int,
                     tp: int = 1, attention: str = "flash",
                     chunk_tokens: int | None = None) -> float:
    """Peak activation memory during the prefill of ``batch`` prompts, per GPU.

    The live set of one layer at its widest point, for the tokens of one forward pass
    (min(batch x prompt, chunk_tokens) with chunked prefill): the residual stream and its
    normalized copy (2h per token) plus the larger of the attention stage (q, k, v and the
    attention output) and the MLP stage (gate and up, and their product; for MoE, k routed
    copies of each token plus the shared experts). Then the fp32 logits of the last token of
    each sequence. With naive attention the score and probability matrices of one layer are
    live too: 2 x heads x (tokens in flight) x prompt x bytes, the O(N^2) term FlashAttention
    removes.
    """
    per_token, logits, naive = _activation_terms(m, prec, tp=tp)
    T = batch * prompt_tokens
    if chunk_tokens is not None:
        T = vmin(T, chunk_tokens)
    peak = T * per_token + batch * logits
    if attention == "naive":
        peak = peak + naive * T * prompt_tokens
    return peak


# vLLM 0.34's extensible KV cache (the "measured" basis) keeps free, beyond the activation peak
# A of its profiling step (a full step of max_num_batched_tokens), a margin of
# max(floor, share x A); the profile states both (``MemoryFraction.margin_floor_gib``,
# ``margin_of_activations``: 1 GiB on CUDA, 3 on ROCm, and 0.75). The margin is CUDA's
# floor for a caller that gives none.
MEASURED_MARGIN_BYTES = 1 * GIB


def measured_margin_bytes(engine: Engine | None, profile_activation_bytes) -> float:
    """The margin the engine keeps free on the measured basis, max(floor, share x A), A the
    activations of its profiling step, the floor as ``Engine.for_gpu`` resolved it for the
    GPU's maker."""
    e = engine or IDEAL
    return vmax(e.memory_margin_floor_bytes, e.memory_margin_frac * profile_activation_bytes)


def step_activation_bytes(m: ModelSpec, prec: Precision, *, max_num_seqs: int,
                          step_tokens: int, tp: int = 1, attention: str = "flash") -> float:
    """The activations of a full step: ``step_tokens`` tokens over ``max_num_seqs``
    sequences, what an engine sizes its KV pool after (``kv_capacity_tokens``)."""
    return activation_bytes(m, prec, batch=max_num_seqs,
                            prompt_tokens=max(1, -(-step_tokens // max_num_seqs)), tp=tp,
                            attention=attention, chunk_tokens=step_tokens)


def profile_activation_bytes(m: ModelSpec, prec: Precision, *, tp: int = 1,
                             engine: Engine | None = None, options: Options | None = None):
    """The activations of the step the engine profiles its memory with: a full step of its
    max_num_batched_tokens tokens over max_num_seqs sequences."""
    e, o = engine or IDEAL, options or Options()
    return step_activation_bytes(m, prec, max_num_seqs=e.max_num_seqs,
                                 step_tokens=e.max_num_batched_tokens, tp=tp,
                                 attention=o.attention)


def measured_cap_bytes(capacity_bytes, frac: float, margin_bytes):
    """What weights, activations, reserve and KV cache may fill on the measured basis: f of
    the GPU's memory, and the memory less the margin kept free."""
    return vmin(capacity_bytes * frac, capacity_bytes - margin_bytes)


def memory_share(o: Options, engine: Engine | None, capacity_bytes: float) -> tuple[float, str]:
    """(fraction, basis) of the memory the engine sizes its KV cache from: the fraction the
    options give (``--memory-utilization``), else the engine's default on a GPU of
    ``capacity_bytes`` (``Engine.memory_frac_for``), on the engine's basis
    (``planner.core.engine.MEMORY_BASES``), or for a fraction a server's flag gave, on that
    server's (``Options.memory_utilization_basis``)."""
    e = engine or IDEAL
    frac = o.memory_utilization_frac
    if frac is None:
        return e.memory_frac_for(capacity_bytes), e.memory_basis
    basis = o.memory_utilization_basis or e.memory_basis
    if basis == "total" and e.memory_basis == "measured":  # vLLM's flag, read at 0.34
        basis = "measured"
    return frac, basis


def kv_budget_bytes(capacity_bytes, *, weights_bytes, activation_bytes, reserve_bytes,
                    frac: float, basis: str, margin_bytes=MEASURED_MARGIN_BYTES,
                    pool_bytes=None, cap_bytes=None):
    """Bytes of one GPU's memory the engine gives its KV cache, C capacity, W weights, A
    activations, R reserve (CUDA context, workspaces), f the fraction, by its basis:

        total     f C - W - A - R                       vLLM's gpu_memory_utilization
        measured  min(f C, C - M) - W - A - R           the same from vLLM 0.34 (f 1.0)
        static    min(f (C - R) - W, C - W - A - R)     SGLang's mem_fraction_static
        free      f (C - W - A - R)                     TensorRT-LLM's free_gpu_memory_fraction

    vLLM caps everything it allocates at f C; from 0.34 its extensible KV cache is sized from
    the memory measured after warm-up and CUDA-graph capture, within f C (its default f 1.0)
    and keeping free a margin M = max(1 GiB, 0.75 A), A its profiling step's activations
    (``margin_bytes``: ``memory_terms``); SGLang's fraction covers the weights and the
    KV pool only, of the memory free once the CUDA context is up, leaving the rest (1 - f) to
    activations and CUDA graphs; TensorRT-LLM gives the KV cache f of what is free after the
    weights and a profiled forward pass.

    A pool given outright (``pool_bytes``, vLLM's kv_cache_memory_bytes) replaces all of
    that, fraction and basis; a cap (``cap_bytes``: SGLang's max_total_tokens, TensorRT-LLM's
    max_tokens, in bytes) keeps the smaller. ``pool_limits`` gives both from the options, the
    pool 0 where it has no room (vLLM fails to allocate it). Numbers or arrays (a sweep)."""
    W, A, R, C = weights_bytes, activation_bytes, reserve_bytes, capacity_bytes
    if pool_bytes is not None:
        budget = pool_bytes
    elif basis == "total":
        budget = C * frac - W - A - R
    elif basis == "measured":
        budget = measured_cap_bytes(C, frac, margin_bytes) - W - A - R
    elif basis == "static":
        budget = vmin(frac * (C - R) - W, C - W - A - R)
    elif basis == "free":
        budget = frac * (C - W - A - R)
    else:
        raise ValueError(f"memory basis {basis!r} is not one of {', '.join(MEMORY_BASES)}")
    return budget if cap_bytes is None else vmin(budget, cap_bytes)


def pool_limits(o: Options, per_token_bytes, *, capacity_bytes, rest_bytes) -> dict:
    """``kv_budget_bytes``'s ``pool_bytes`` and ``cap_bytes`` from the options
    (``Options.kv_cache_memory_bytes``, ``Options.kv_cache_max_tokens``), the cap in bytes at
    ``per_token_bytes`` of KV cache a token takes on one GPU. A pool given outright is 0 where
    it has no room beside ``rest_bytes`` in ``capacity_bytes``: the weights, the reserve and
    the activations of the engine's profiling step (vLLM still profiles a full step of
    max-num-batched-tokens with it), one rule wherever the pool is sized."""
    cap, pool = o.kv_cache_max_tokens, o.kv_cache_memory_bytes
    if pool is not None:
        pool = pool * (rest_bytes + pool <= capacity_bytes)
    return {"pool_bytes": pool, "cap_bytes": None if cap is None else cap * per_token_bytes}


def usable_bytes(capacity_bytes, *, weights_bytes, activation_bytes, reserve_bytes,
                 frac: float, basis: str, margin_bytes=MEASURED_MARGIN_BYTES,
                 pool_bytes=None, cap_bytes=None):
    """Memory the deployment may fill: its weights, activations and reserve plus the KV
    budget (``kv_budget_bytes``); f C on vLLM's basis, less 0.34's margin on its measured one."""
    if pool_bytes is None and cap_bytes is None:
        if basis == "total":
            return capacity_bytes * frac
        if basis == "measured":
            return measured_cap_bytes(capacity_bytes, frac, margin_bytes)
    return weights_bytes + activation_bytes + reserve_bytes + kv_budget_bytes(
        capacity_bytes, weights_bytes=weights_bytes, activation_bytes=activation_bytes,
        reserve_bytes=reserve_bytes, frac=frac, basis=basis, margin_bytes=margin_bytes,
        pool_bytes=pool_bytes, cap_bytes=cap_bytes)


@dataclass(frozen=True)
class MemoryTerms:
    """How the engine sizes one GPU's memory: its fraction and basis (``memory_share``), the
    margin it keeps free on the measured basis (0 on every other, where none applies), and
    the pool given outright or the cap on it (``pool_limits``). ``memory_terms`` reads them
    once for a GPU; ``usable_bytes`` and ``kv_budget_bytes`` then take them as they are."""

    frac: float
    basis: str
    margin_bytes: float = 0.0
    pool_bytes: float | None = None
    cap_bytes: float | None = None

    def usable_bytes(self, capacity_bytes, **rest):
        """``usable_bytes`` on these terms (``weights_bytes``, ``activation_bytes``,
        ``reserve_bytes`` as it takes them)."""
        return usable_bytes(capacity_bytes, **rest, **self._given())

    def kv_budget_bytes(self, capacity_bytes, **rest):
        """``kv_budget_bytes`` on these terms (the same arguments)."""
        return kv_budget_bytes(capacity_bytes, **rest, **self._given())

    def _given(self) -> dict:
        return {"frac": self.frac, "basis": self.basis, "margin_bytes": self.margin_bytes,
                "pool_bytes": self.pool_bytes, "cap_bytes": self.cap_bytes}


def memory_terms(o: Options, engine: Engine | None, *, capacity_bytes, weights_bytes,
                 profile_act_bytes, per_token_bytes) -> MemoryTerms:
    """The ``MemoryTerms`` of one GPU of ``capacity_bytes`` holding ``weights_bytes``, beside
    ``profile_act_bytes``, the activations of the step the engine profiles its memory with
    (a full step: the measured basis's margin and a given pool's room both rest on it), with
    ``per_token_bytes`` of KV cache a token on that GPU (a cap's bytes). One place decides
    the fraction, the basis, the margin and the pool, for every layout."""
    frac, basis = memory_share(o, engine, capacity_bytes)
    margin = measured_margin_bytes(engine, profile_act_bytes) if basis == "measured" else 0.0
    lim = pool_limits(o, per_token_bytes, capacity_bytes=capacity_bytes,
                      rest_bytes=weights_bytes + o.reserve_bytes + profile_act_bytes)
    return MemoryTerms(frac, basis, margin, **lim)


def memory_terms_of(m: ModelSpec, prec: Precision, o: Options, engine: Engine | None, *,
                    capacity_bytes, weights_bytes, tp: int = 1,
                    per_token_bytes=None) -> MemoryTerms:
    """``memory_terms`` for a GPU of ``m`` beside the engine's own profiling step
    (``profile_activation_bytes``); ``per_token_bytes`` None: every layer's KV bytes."""
    per = kv_cache_bytes_per_token(m, prec, tp=tp) if per_token_bytes is None \
        else per_token_bytes
    return memory_terms(o, engine, capacity_bytes=capacity_bytes, weights_bytes=weights_bytes,
                        profile_act_bytes=profile_activation_bytes(m, prec, tp=tp,
                                                                   engine=engine, options=o),
                        per_token_bytes=per)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory of one deployment, in bytes."""

    weights_bytes: float
    kv_cache_bytes: float
    activation_bytes: float
    reserve_bytes: float
    capacity_bytes: float
    usable_bytes: float  # what the engine's memory fraction lets it fill (``usable_bytes``)
    max_batch: int  # largest batch that fits at this context (an array in a sweep)
    utilization_frac: float = 0.9  # the engine's memory fraction and its basis
    utilization_basis: str = "total"
    offloaded_weights_bytes: float = 0.0  # kept in host memory (not in weights_bytes)
    # the KV cache given outright as sized (``pool_limits``: 0 where it has no room); None:
    # none given
    kv_pool_bytes: float | None = None

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_bytes + self.reserve_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    @property
    def used_frac(self) -> float:
        return self.total_bytes / self.capacity_bytes


def _largest_batch(free, kv, logits, per_token, prompt_tokens, chunk):
    """Largest B with B x (kv + logits) + A(B) <= free, A(B) the prefill activations: linear
    in B until the chunk is full (B x prompt >= chunk), constant after; solved in both regions,
    keeping the one that holds."""
    unchunked = floor_nonneg(free / (kv + logits + prompt_tokens * per_token))
    if chunk is None:
        return unchunked
    chunked = floor_nonneg((free - chunk * per_token) / (kv + logits))
    # the chunk is full once batch x prompt reaches it
    saturated = (chunk / prompt_tokens) * (kv + logits + prompt_tokens * per_token) <= free
    return saturated * vmax(chunked, chunk // prompt_tokens) + (1 - saturated) * unchunked


def max_batch(m: ModelSpec, hw: HardwareSpec, prec: Precision, *, prompt_tokens: int,
              output_tokens: int, tp: int = 1, options: Options | None = None,
              lm_head_sharded: bool = True, engine: Engine | None = None) -> int:
    """Largest batch whose weights, KV cache (prompt + output tokens per sequence), prefill
    activations and reserve fit in the memory the engine lets them use (``kv_budget_bytes``:
    its memory fraction on its basis).

    Memory is B x (kv + logits) + A(B) with A linear in B until the prefill chunk is full and
    constant after (``_largest_batch``). On TensorRT-LLM's basis the KV cache may take f of
    what the rest leaves: B x kv / f + B x logits + A(B) <= C - W - R; on SGLang's, B x kv <=
    f (C - R) - W as well as everything within C. A pool given outright (P, vLLM's
    kv_cache_memory_bytes) holds B x kv <= P, the rest within C: B x logits + A(B) <= C - W -
    R - P; a cap on the pool's tokens (SGLang's max_total_tokens) bounds B x kv as well. Token
    counts may be arrays (a sweep); the result is then an array."""
    o = options or Options()
    C, R = hw.memory_bytes, o.reserve_bytes
    W = resident_weight_bytes(m, prec, tp=tp, lm_head_sharded=lm_head_sharded, options=o)
    terms = memory_terms_of(m, prec, o, engine, capacity_bytes=C, weights_bytes=W, tp=tp)
    frac, basis = terms.frac, terms.basis
    per_token, logits, naive = _activation_terms(m, prec, tp=tp)
    if o.attention == "naive":
        per_token = per_token + naive * prompt_tokens
    kv = kv_cache_bytes(m, prec, batch=1, seq_len=prompt_tokens + output_tokens, tp=tp)
    chunk = o.prefill_chunk_tokens
    if terms.pool_bytes is not None:
        P = terms.pool_bytes
        n = vmin(floor_nonneg(P / kv),
                 _largest_batch(C - W - R - P, 0.0, logits, per_token, prompt_tokens, chunk))
    elif basis == "total":
        n = _largest_batch(C * frac - W - R, kv, logits, per_token, prompt_tokens, chunk)
    elif basis == "measured":  # within f C and within C less the profiling step's margin
        cap = measured_cap_bytes(C, frac, terms.margin_bytes)
        n = _largest_batch(cap - W - R, kv, logits, per_token, prompt_tokens, chunk)
    elif basis == "free":
        n = _largest_batch(C - W - R, kv / frac, logits, per_token, prompt_tokens, chunk)
    else:  # static: the pool's own bound, and everything within the GPU
        n = vmin(floor_nonneg((frac * (C - R) - W) / kv),
                 _largest_batch(C - W - R, kv, logits, per_token, prompt_tokens, chunk))
    if terms.cap_bytes is not None:
        n = vmin(n, floor_nonneg(terms.cap_bytes / kv))
    return int(n) if isinstance(n, float) else n


def kv_capacity_tokens(m: ModelSpec, hw: HardwareSpec, prec: Precision, *, tp: int = 1,
                       options: Options | None = None, lm_head_sharded: bool = True,
                       max_num_seqs: int = 256, step_tokens: int = 8192,
                       engine: Engine | None = None) -> int:
    """Tokens of KV cache a serving replica holds: the engine's KV budget (``kv_budget_bytes``:
    its memory fraction on its basis, less the weights held on the GPU, the activations of a
    full step of ``step_tokens`` tokens over ``max_num_seqs`` sequences and the reserve) over
    the KV bytes of one token (vLLM, SGLang and TensorRT-LLM size their pools so)."""
    o = options or Options()
    return serving_kv_tokens(
        hw.memory_bytes, o, engine,
        weights_bytes=resident_weight_bytes(m, prec, tp=tp, lm_head_sharded=lm_head_sharded,
                                            options=o),
        step_act_bytes=step_activation_bytes(m, prec, max_num_seqs=max_num_seqs,
                                                    step_tokens=step_tokens, tp=tp,
                                                    attention=o.attention),
        per_token_bytes=kv_cache_bytes_per_token(m, prec, tp=tp))


def serving_kv_tokens(capacity_bytes, o: Options, engine: Engine | None, *, weights_bytes,
                      step_act_bytes, per_token_bytes) -> int:
    """Tokens of KV cache one GPU of a serving replica holds: the engine's KV budget
    (``kv_budget_bytes`` on its basis, with its measured margin and the options' pool or cap,
    all beside ``step_act_bytes``, the activations of a full step, the one the engine
    profiles) over the ``per_token_bytes`` a token takes on that GPU. Every layout's coster
    sizes its GPUs' pools here."""
    terms = memory_terms(o, engine, capacity_bytes=capacity_bytes, weights_bytes=weights_bytes,
                         profile_act_bytes=step_act_bytes, per_token_bytes=per_token_bytes)
    budget = terms.kv_budget_bytes(capacity_bytes, weights_bytes=weights_bytes,
                                   activation_bytes=step_act_bytes,
                                   reserve_bytes=o.reserve_bytes)
    return max(0, int(budget // per_token_bytes))


@dataclass(frozen=True)
class KVConcurrency:
    """How many requests of one length the KV cache holds, paged or contiguous."""

    capacity_tokens: int
    paged: int  # blocks of block_size tokens, as the request grows
    contiguous: int  # max_model_len reserved per request
    paged_used_frac: float  # tokens held / tokens reserved, over a request's generation
    contiguous_used_frac: float
    block_size: int
    max_model_len: int


def sliding_share(m: ModelSpec) -> tuple[float, int] | None:
    """(share of the layers with a sliding window, the window), or None where none slides."""
    n = m.num_sliding_layers
    return None if not n else (n / m.num_layers, m.sliding_window)


def kv_cache_groups(m: ModelSpec) -> tuple[int, int, int] | None:
    """vLLM's hybrid KV cache groups for a model whose layers mix full and sliding-window
    attention: (layers per group, full-attention groups, sliding-window groups); None where no
    layer slides or every one does (one kind of layer: one group).

    As vLLM's ``_get_kv_cache_groups_uniform_page_size`` (vllm/v1/core/kv_cache_utils.py)
    forms them: a group holds as many layers as the kind with fewer has (as many as the kind
    with more, where that is under 1.5 times the other), each kind split into whole groups,
    the last padded with empty layers. Every group's block is the same memory (block_size
    tokens in that many layers) and all share one block pool. gpt-oss-120b, 18 full and 18
    sliding layers: (18, 1, 1); Gemma-3-27B, 10 full and 52 sliding: (10, 1, 6), two of the
    sixth group's ten layers padding."""
    sliding = m.num_sliding_layers
    full = m.num_layers - sliding
    if not sliding or not full:
        return None
    fewer, more = min(sliding, full), max(sliding, full)
    per_group = more if more < 1.5 * fewer else fewer
    return per_group, -(-full // per_group), -(-sliding // per_group)


def kv_concurrency(capacity_tokens: int, *, prompt_tokens: int, output_tokens: int,
                   block_size: int = 16, max_model_len: int = 131072,
                   sliding: tuple[float, int] | None = None) -> KVConcurrency:
    """Requests of ``prompt_tokens`` + ``output_tokens`` that fit at once: paged, each holds
    whole blocks of its full length; contiguous, each reserves ``max_model_len``. The used
    fraction is the mean over the generation (prompt + output / 2 tokens held).

    ``sliding`` = (share of the layers that slide, window): those layers hold the window's
    blocks and the one being written, so a request costs the full-layer share of its length
    plus the sliding share of at most window + block_size tokens (``capacity_tokens`` counts
    tokens cached in every layer)."""
    def blocks(n: float) -> float:
        return -(-n // block_size) * block_size

    full = blocks(prompt_tokens + output_tokens)
    reserve = max_model_len
    if sliding is not None:
        frac, window = sliding
        full = (1 - frac) * full + frac * min(full, blocks(window) + block_size)
        reserve = (1 - frac) * reserve + frac * min(reserve, window)
    held = prompt_tokens + output_tokens / 2
    blocks_mean = blocks(held)
    return KVConcurrency(capacity_tokens, int(capacity_tokens // full),
                         int(capacity_tokens // reserve), held / blocks_mean,
                         held / max_model_len, block_size, max_model_len)


def memory_plan(m: ModelSpec, hw: HardwareSpec, prec: Precision, *, batch: int,
                prompt_tokens: int, output_tokens: int, tp: int = 1,
                options: Options | None = None, lm_head_sharded: bool = True,
                engine: Engine | None = None) -> MemoryPlan:
    o = options or Options()
    w = resident_weight_bytes(m, prec, tp=tp, lm_head_sharded=lm_head_sharded, options=o)
    act = activation_bytes(m, prec, batch=batch, prompt_tokens=prompt_tokens, tp=tp,
                           attention=o.attention, chunk_tokens=o.prefill_chunk_tokens)
    terms = memory_terms_of(m, prec, o, engine, capacity_bytes=hw.memory_bytes,
                            weights_bytes=w, tp=tp)
    return MemoryPlan(
        weights_bytes=w,
        kv_cache_bytes=kv_cache_bytes(m, prec, batch=batch,
                                      seq_len=prompt_tokens + output_tokens, tp=tp),
        activation_bytes=act,
        reserve_bytes=o.reserve_bytes,
        capacity_bytes=hw.memory_bytes,
        usable_bytes=terms.usable_bytes(hw.memory_bytes, weights_bytes=w, activation_bytes=act,
                                        reserve_bytes=o.reserve_bytes),
        max_batch=max_batch(m, hw, prec, prompt_tokens=prompt_tokens,
                            output_tokens=output_tokens, tp=tp, options=o,
                            lm_head_sharded=lm_head_sharded, engine=engine),
        utilization_frac=terms.frac, utilization_basis=terms.basis,
        offloaded_weights_bytes=o.cpu_offload_bytes, kv_pool_bytes=terms.pool_bytes,
    )


__all__ = [
    "KVConcurrency", "MemoryPlan", "activation_bytes", "kv_budget_bytes", "kv_cache_bytes",
    "kv_cache_bytes_per_token", "kv_cache_groups", "kv_capacity_tokens", "kv_concurrency",
    "max_batch",
    "MemoryTerms", "memory_plan", "memory_share", "memory_terms", "memory_terms_of",
    "offloadable_weight_bytes", "pool_limits",
    "resident_weight_bytes", "serving_kv_tokens",
    "sliding_share", "usable_bytes", "weight_bytes", "weight_bytes_breakdown",
]
