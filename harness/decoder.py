"""A Llama-shaped decoder stack with random weights and a static, pre-allocated KV cache.

Built from a ``ModelSpec`` (dense, GQA; RMSNorm, gated SiLU MLP, RoPE, lm_head). Weights are
random (never zeros: a zero weight could let a kernel skip work), in bf16 or fp16, or int8
weight-only with per-channel scales where torch has the kernel. Only what timing needs is
modelled: the math is the real shape and the real kernels, not a trained network.

torch is imported by this module: only ``llmplan measure`` reaches it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from planner.core.errors import first_line
from planner.core.specs import ModelSpec

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
RECOMPILE_LIMIT = 64  # graphs of the compiled layer a run may need
BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")


class UnsupportedConfig(Exception):
    """This device or torch build cannot run the requested configuration; say why."""


def _rand(*shape: int, dtype, device, fan_in: int) -> torch.Tensor:
    # uniform in +-1/sqrt(fan_in): non-zero, and activations stay O(1) through the stack
    w = torch.empty(*shape, dtype=torch.float32, device=device).uniform_(-1.0, 1.0)
    return (w / math.sqrt(fan_in)).to(dtype)


FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def fp8_unsupported(device) -> str | None:
    """Why fp8 matmuls cannot run on ``device`` (None when they can)."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no _scaled_mm / float8_e4m3fn"
    dev = torch.device(device)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        if (major, minor) < (8, 9):
            return f"compute capability {major}.{minor} has no fp8 tensor cores (8.9+ has)"
        return None
    try:  # a CPU build may or may not carry a kernel
        a = torch.zeros(1, 16, dtype=torch.float8_e4m3fn, device=dev)
        one = torch.ones((), device=dev)
        b = torch.zeros(16, 16, dtype=torch.float8_e4m3fn, device=dev).t()  # column-major
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as err:
        return f"_scaled_mm has no {dev.type} kernel: {first_line(err)[:120]}"
    return None


INT4_GROUP = 128


def _inner_k_tiles(k: int) -> int:
    return 8 if k % 1024 == 0 else 4 if k % 512 == 0 else 2


def _pack_int4(q: torch.Tensor, device) -> torch.Tensor:
    """q: [n, k] int32 in 0..15, packed for the device's int4 kernel."""
    dev = torch.device(device)
    tiles = _inner_k_tiles(q.shape[1])
    if dev.type == "cuda":
        u8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8).to(dev)
        return torch._convert_weight_to_int4pack(u8, tiles)
    return torch._convert_weight_to_int4pack_for_cpu(q.to(dev), tiles)


def _int4_mm(x: torch.Tensor, w: torch.Tensor, group: int,
             scales_zeros: torch.Tensor) -> torch.Tensor:
    if x.device.type == "cuda":
        return torch._weight_int4pack_mm(x, w, group, scales_zeros)
    return torch._weight_int4pack_mm_for_cpu(x, w, group, scales_zeros)


def _probe_int4(lin) -> None:
    """The int4 kernel must exist for this device (and accept this shape): a recorded skip
    otherwise, not an error at every point."""
    try:
        _int4_mm(torch.zeros(1, lin.k, dtype=lin.scales_zeros.dtype, device=lin.w.device),
                 lin.w, lin.group, lin.scales_zeros)
    except (RuntimeError, NotImplementedError, AttributeError) as err:
        raise UnsupportedConfig(f"int4 weight-only (tinygemm) cannot run here: "
                                f"{type(err).__name__}: {first_line(err)[:160]}") \
            from None


_INT8_OK: dict[tuple, str | None] = {}


def _probe_int8(w: torch.Tensor, scale: torch.Tensor, dtype) -> None:
    """int8 weight-only needs a real kernel for this device and dtype: a build without one
    raises (NotImplementedError, a missing CUDA kernel), which is a recorded skip, not an
    error at every point. Probed once per (device, dtype)."""
    key = (w.device.type, dtype)
    if key not in _INT8_OK:
        try:
            x = torch.zeros(1, w.shape[1], dtype=dtype, device=w.device)
            torch._weight_int8pack_mm(x, w[:8].contiguous(), scale[:8].contiguous())
            _INT8_OK[key] = None
        except (RuntimeError, NotImplementedError) as err:
            _INT8_OK[key] = f"{type(err).__name__}: {first_line(err)[:160]}"
    if _INT8_OK[key]:
        raise UnsupportedConfig(f"int8 weight-only (_weight_int8pack_mm) has no kernel for "
                                f"{w.device.type} {dtype}: {_INT8_OK[key]}")


def _int8_mm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, *,
             cast: bool) -> torch.Tensor:
    """int8 weight-only, per output channel scales. ``cast``: as gpt-fast runs it on GPUs
    (quantize.py, WeightOnlyInt8Linear), a cast to 16 bits and a matmul: 18.0 ms a step on
    an H100 (Llama-3.1-8B, batch 1), where torch 2.11 compiled the cast as a kernel of its
    own (each weight read, written in 16 bits, read again: 2.8x bf16's 6.4 ms); aten's
    _weight_int8pack_mm took 64.5 ms (docs/measure.md). Else aten's kernel (CPUs)."""
    if cast:
        return F.linear(x, w.to(x.dtype)) * scale
    return torch._weight_int8pack_mm(x, w, scale)


def linear(args, x: torch.Tensor) -> torch.Tensor:
    """y = x @ W^T for the weights ``args`` (``Linear.args``): 16-bit; int8 weight-only;
    int4 weight-only (tinygemm); fp8 W8A8 with the activations quantized per tensor on the
    fly."""
    if isinstance(args, torch.Tensor):
        return F.linear(x, args)
    kind = args[0]
    shape = x.shape
    if kind == "int8":
        _, w, scale, k, n = args
        y = _int8_mm(x.reshape(-1, k), w, scale, cast=w.device.type == "cuda")
    elif kind == "int4":
        _, w, scales_zeros, group, k, n = args
        y = _int4_mm(x.reshape(-1, k), w, group, scales_zeros)
    else:  # fp8
        _, w, scale, out_dtype, k, n = args
        x2 = x.reshape(-1, k)
        xs = x2.abs().amax().float().clamp(min=1e-12) / FP8_MAX
        x8 = (x2.float() / xs).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(x8, w.t(), scale_a=xs, scale_b=scale, out_dtype=out_dtype)
    return y.reshape(*shape[:-1], n)


class Linear:
    """y = x @ W^T, in 16-bit, int8 or int4 weight-only, or fp8 W8A8 (``linear``)."""

    def __init__(self, k: int, n: int, *, weights: str, dtype, device):
        self.k, self.n = k, n
        w = _rand(n, k, dtype=dtype, device=device, fan_in=k)
        if weights == "int8":
            if not hasattr(torch, "_weight_int8pack_mm"):
                raise UnsupportedConfig("this torch has no _weight_int8pack_mm (int8 weight-only)")
            scale = w.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0
            self.w = (w.float() / scale[:, None]).round().clamp(-128, 127).to(torch.int8)
            self.scale = scale.to(dtype)
            self.int8 = True
            if torch.device(device).type != "cuda":  # CUDA runs a cast and a 16-bit matmul
                _probe_int8(self.w, self.scale, dtype)
        elif weights == "fp8":
            # W8A8 as vLLM and TensorRT-LLM run fp8 checkpoints: e4m3 weights with one
            # scale per tensor, activations quantized per tensor on the fly, torch._scaled_mm
            why = fp8_unsupported(device)
            if why:
                raise UnsupportedConfig(why)
            ws = w.float().abs().amax().clamp(min=1e-12) / FP8_MAX
            self.w = (w.float() / ws).to(torch.float8_e4m3fn)  # [n, k]: column-major B
            self.scale = ws.reshape(())
            self.int8, self.fp8, self.out_dtype = False, True, dtype
            # torch checks k and n for multiples of 16, not the rows. The rows are not padded:
            # vLLM once padded its torch._scaled_mm inputs to 17 rows where cuBLAS ran faster,
            # but on an H100 (torch 2.11) one row runs as fast as 16 (Llama-3.1-8B's qkv 12.8
            # against 12.7 us; benchmarks/results/h100-sxm-2026-11-27/micro.jsonl), and the
            # pad and its slice had made a batch-1 step 1.2 ms slower than a batch-16 one
        elif weights == "int4":
            # weight-only int4 as gpt-fast and torchao run it (tinygemm): groups of 128 along
            # k, a bf16 scale and zero per group, w = (q - 8) x scale + zero
            g = next((g for g in (INT4_GROUP, 64, 32) if k % g == 0), k)  # the kernel's sizes
            wg = w.float().reshape(n, k // g, g)
            lo, hi = wg.amin(-1), wg.amax(-1)
            scale = ((hi - lo) / 15).clamp(min=1e-8)
            zero = lo + 8 * scale
            q = ((wg - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32)
            self.scales_zeros = torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous()
            self.w = _pack_int4(q.reshape(n, k), device)
            self.group, self.int8, self.int4, self.fp8 = g, False, True, False
            self.dequantized = None
            _probe_int4(self)
        elif weights in ("bf16", "fp16"):
            self.w, self.int8 = w, False
        else:
            raise UnsupportedConfig(f"{weights} weights are not implemented by this harness "
                                    "version (bf16, fp16, fp8, int8 and int4 are)")
        if weights != "fp8":
            self.fp8 = False
        if weights != "int4":
            self.int4 = False

    @property
    def args(self):
        """The weights as ``linear`` takes them: the bare tensor for 16-bit weights, else a
        tuple (format, tensors, constants). Tensors and plain constants only, so one
        compiled layer serves every layer of any weight format without recompiling."""
        if self.int8:
            return ("int8", self.w, self.scale, self.k, self.n)
        if self.int4:
            return ("int4", self.w, self.scales_zeros, self.group, self.k, self.n)
        if self.fp8:
            return ("fp8", self.w, self.scale, self.out_dtype, self.k, self.n)
        return self.w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self.args, x)

    @property
    def nbytes(self) -> int:
        if self.int4:  # two weights a byte, whatever layout the kernel packs them in
            return self.n * self.k // 2 + self.scales_zeros.numel() * \
                self.scales_zeros.element_size()
        extra = self.scale.numel() * self.scale.element_size() if self.int8 or self.fp8 else 0
        return self.w.numel() * self.w.element_size() + extra


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(max_pos: int, head_dim: int, device, dtype, theta: float = 500000.0):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    t = torch.arange(max_pos, device=device).float()
    f = torch.outer(t, inv)  # [pos, hd/2]
    return torch.cos(f).to(dtype), torch.sin(f).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, T, H, hd]; cos/sin: [T, hd/2] or [B, T, hd/2]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    if cos.dim() == 2:
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    else:
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


def _apply(lin, x: torch.Tensor) -> torch.Tensor:
    """A projection: a ``Linear`` (eager), or its ``args`` (the compiled path, where one
    function serves every layer without recompiling), or a MoE block (eager)."""
    return linear(lin, x) if isinstance(lin, (torch.Tensor, tuple)) else lin(x)


def layer_math(x: torch.Tensor, attn_norm, qkv, o, mlp_norm, gate_up, down,
               k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, pos: int, nh: int, nkv: int, hd: int, sdpa) -> torch.Tensor:
    """One decoder layer on ``x`` [B, T, h] whose tokens sit at pos..pos+T-1: the new K and
    V are written into the cache in place, attention reads the ``pos + T`` cached tokens."""
    B, T, _ = x.shape
    y = rms_norm(x, attn_norm)
    q, k, v = _apply(qkv, y).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
    q, k, v = q.view(B, T, nh, hd), k.view(B, T, nkv, hd), v.view(B, T, nkv, hd)
    c, s = cos[pos:pos + T], sin[pos:pos + T]
    q, k = apply_rope(q, c, s), apply_rope(k, c, s)
    k_cache[:B, pos:pos + T] = k.to(k_cache.dtype)
    v_cache[:B, pos:pos + T] = v.to(v_cache.dtype)
    keys = k_cache[:B, :pos + T].transpose(1, 2).to(x.dtype)  # [B, KV, S, hd]
    vals = v_cache[:B, :pos + T].transpose(1, 2).to(x.dtype)
    att = sdpa(q.transpose(1, 2), keys, vals, causal=T > 1 and pos == 0)
    x = x + _apply(o, att.transpose(1, 2).reshape(B, T, nh * hd))
    if down is None:  # a mixture of experts: routing, the experts and any shared expert
        return x + gate_up(rms_norm(x, mlp_norm))
    gate, up = _apply(gate_up, rms_norm(x, mlp_norm)).chunk(2, dim=-1)
    return x + _apply(down, F.silu(gate) * up)


class Experts:
    """A MoE MLP as Mixtral and Qwen-MoE run it: a router picks the top-k experts of each
    token (softmax over the k logits), tokens are grouped by expert and each expert's gated
    MLP runs on its group (one matmul pair per expert that received tokens, as the engines'
    grouped GEMMs do), the results are scattered back weighted; shared experts, where the
    model has them, run on every token. Random routing over random tokens spreads the load
    as the planner's expected-experts model assumes. 16-bit weights; eager (the group sizes
    are read on the host)."""

    def __init__(self, h: int, moe, *, weights: str, dtype, device):
        if weights not in ("bf16", "fp16"):
            raise UnsupportedConfig(f"MoE experts run 16-bit weights in this harness version, "
                                    f"not {weights}")
        e, ie = moe.num_experts, moe.expert_intermediate_size
        self.h, self.k, self.e = h, moe.experts_per_token, e
        self.router = _rand(e, h, dtype=dtype, device=device, fan_in=h)
        self.gate_up = _rand(e, 2 * ie, h, dtype=dtype, device=device, fan_in=h)
        self.down = _rand(e, h, ie, dtype=dtype, device=device, fan_in=ie)
        self.shared = None
        if moe.num_shared_experts:
            width = moe.num_shared_experts * ie
            self.shared = (Linear(h, 2 * width, weights=weights, dtype=dtype, device=device),
                           Linear(width, h, weights=weights, dtype=dtype, device=device))

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        shape = y.shape
        y2 = y.reshape(-1, self.h)
        top, idx = F.linear(y2, self.router).float().topk(self.k, dim=-1)
        w = top.softmax(-1).to(y.dtype).reshape(-1)
        flat = idx.reshape(-1)
        order = flat.argsort()
        tok = order // self.k  # the token of each (token, expert) pair, grouped by expert
        counts = torch.bincount(flat, minlength=self.e).tolist()
        xs = y2[tok]
        out = torch.empty_like(xs)
        start = 0
        for ex, c in enumerate(counts):
            if c:
                g, u = F.linear(xs[start:start + c], self.gate_up[ex]).chunk(2, dim=-1)
                out[start:start + c] = F.linear(F.silu(g) * u, self.down[ex])
            start += c
        res = torch.zeros_like(y2).index_add_(0, tok, out * w[order, None])
        if self.shared is not None:
            g, u = self.shared[0](y2).chunk(2, dim=-1)
            res = res + self.shared[1](F.silu(g) * u)
        return res.reshape(shape)

    @property
    def nbytes(self) -> int:
        own = sum(t.numel() * t.element_size() for t in (self.router, self.gate_up, self.down))
        return own + (sum(lin.nbytes for lin in self.shared) if self.shared else 0)


def _sdpa_any(q, k, v, *, causal: bool):
    """SDPA with torch's own backend choice (the compiled path: no backend context)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                          enable_gqa=q.shape[1] != k.shape[1])


@dataclass
class Layer:
    attn_norm: torch.Tensor
    qkv: Linear
    o: Linear
    mlp_norm: torch.Tensor
    gate_up: Linear | Experts
    down: Linear | None  # None: gate_up is the layer's Experts


class Decoder:
    """``layers`` distinct decoder layers of ``model``'s shape, embeddings and lm_head.

    KV cache: one [batch, max_tokens, kv_heads, head_dim] tensor for K and one for V per layer,
    allocated once. ``decode_step`` appends one token per sequence at ``pos`` and attends to
    ``pos + 1`` cached tokens; ``prefill`` runs ``prompt`` tokens per sequence causally.
    """

    def __init__(self, model: ModelSpec, *, layers: int | None, batch: int, max_tokens: int,
                 weights: str = "bf16", kv_dtype: str = "bf16", device: str = "cpu",
                 attention_backend: str = "auto", compile: bool = False):
        if model.mla is not None:
            raise UnsupportedConfig(f"{model.name}: the harness decoder runs GQA attention "
                                    "(no MLA yet)")
        if model.mlp != "gated" or model.norm != "rmsnorm":
            raise UnsupportedConfig(f"{model.name}: the harness decoder is Llama-shaped "
                                    "(gated MLP, RMSNorm)")
        self.model = model
        self.n_layers = layers or model.num_layers
        self.device = torch.device(device)
        act = DTYPES["fp16" if weights == "fp16" else "bf16"]
        self.act_dtype = act
        self.kv_dtype = DTYPES.get(kv_dtype)
        if self.kv_dtype is None:
            raise UnsupportedConfig(f"KV cache {kv_dtype} is not implemented by this harness "
                                    "version (bf16, fp16 are)")
        h, hd = model.hidden_size, model.head_dim_
        self.h, self.hd = h, hd
        self.nh, self.nkv = model.num_attention_heads, model.num_kv_heads
        self.batch, self.max_tokens = batch, max_tokens
        dev = self.device
        self.embed = _rand(model.vocab_size, h, dtype=act, device=dev, fan_in=1)
        self.layers = []
        moe = model.moe
        for i in range(self.n_layers):
            if moe is not None and model.is_moe_layer(i):
                gate_up, down = Experts(h, moe, weights=weights, dtype=act, device=dev), None
            else:
                gate_up = Linear(h, 2 * model.intermediate_size, weights=weights, dtype=act,
                                 device=dev)
                down = Linear(model.intermediate_size, h, weights=weights, dtype=act,
                              device=dev)
            self.layers.append(Layer(
                attn_norm=torch.ones(h, dtype=act, device=dev),
                qkv=Linear(h, (self.nh + 2 * self.nkv) * hd, weights=weights, dtype=act,
                           device=dev),
                o=Linear(self.nh * hd, h, weights=weights, dtype=act, device=dev),
                mlp_norm=torch.ones(h, dtype=act, device=dev), gate_up=gate_up, down=down))
        self.final_norm = torch.ones(h, dtype=act, device=dev)
        self.lm_head = _rand(model.vocab_size, h, dtype=act, device=dev, fan_in=h)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.cos = self.sin = None
        self.alloc_cache(batch, max_tokens)
        self.backend = self._pick_backend(attention_backend)
        # torch.compile of one layer (fused element-wise kernels, as gpt-fast and the engines
        # run it), reused by every layer: dynamic shapes, so batch, context and position do
        # not recompile. Dense models, any weight format (the quantizing of fp8 activations
        # fuses with its neighbours as vLLM's fused quant kernels do); MoE runs eagerly, and
        # ``mode_reason`` says why.
        self.compiled = None
        self.mode = "eager"
        self.mode_reason: str | None = None
        if compile and moe is not None:
            self.mode_reason = "MoE runs eagerly (group sizes are read on the host)"
        elif compile:
            # every (batch, prompt or decode, first position) combination a sweep visits is
            # a graph of its own: past dynamo's default limit of 8 the layer would silently
            # run eagerly while its records said "compiled" (seen on an H100, 2026-11-27)
            cfg = torch._dynamo.config
            name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
            setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))
            self.compiled = torch.compile(layer_math, dynamic=True)
            self.mode = "compiled"
            self.backend = "auto (compiled: torch's choice)"

    def alloc_cache(self, batch: int, max_tokens: int) -> None:
        """A fresh KV cache of ``batch`` x ``max_tokens`` (random contents: only its size and
        layout matter for timing); the previous one is freed first."""
        w = self.model.sliding_window
        if w is not None and max_tokens > w:
            raise UnsupportedConfig(f"{self.model.name}: the harness decoder attends over the "
                                    f"whole context (no sliding window yet); contexts up to "
                                    f"{w:,} tokens are measured alike by both")
        self.free_cache()
        shape = (batch, max_tokens, self.nkv, self.hd)
        dev = self.device
        self.k_cache = [_rand(*shape, dtype=self.kv_dtype, device=dev, fan_in=1)
                        for _ in range(self.n_layers)]
        self.v_cache = [_rand(*shape, dtype=self.kv_dtype, device=dev, fan_in=1)
                        for _ in range(self.n_layers)]
        self.batch, self.max_tokens = batch, max_tokens
        self.cos, self.sin = rope_tables(max_tokens, self.hd, dev, self.act_dtype)

    def free_cache(self) -> None:
        self.k_cache, self.v_cache = [], []

    # ----------------------------------------------------------------------------- helpers
    def _pick_backend(self, want: str) -> str:
        """auto: FlashAttention where it runs (compute capability 8.0 and later), the
        memory-efficient kernel on older GPUs (T4, V100), torch's math path on a CPU."""
        if want not in BACKENDS:
            raise UnsupportedConfig(f"attention backend {want!r} is not one of "
                                    f"{', '.join(BACKENDS)}")
        if self.device.type != "cuda":
            if want not in ("auto", "math"):
                raise UnsupportedConfig(f"attention backend {want} needs a CUDA device")
            return "math"
        if want != "auto":
            return want
        major, _ = torch.cuda.get_device_capability(self.device)
        return "flash" if major >= 8 else "efficient"

    def _sdpa(self, q, k, v, *, causal: bool):
        # q: [B, H, T, hd]; k, v: [B, KV, S, hd]
        rep = self.nh // self.nkv
        if self.device.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            backend = {"flash": SDPBackend.FLASH_ATTENTION,
                       "efficient": SDPBackend.EFFICIENT_ATTENTION,
                       "math": SDPBackend.MATH,
                       "cudnn": SDPBackend.CUDNN_ATTENTION}[self.backend]
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                      enable_gqa=rep > 1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=rep > 1)

    @property
    def weight_bytes(self) -> int:
        per_layer = sum(lin.nbytes for lyr in self.layers
                        for lin in (lyr.qkv, lyr.o, lyr.gate_up, lyr.down) if lin is not None)
        norms = (2 * self.n_layers + 1) * self.h * self.embed.element_size()
        return per_layer + norms + self.lm_head.numel() * self.lm_head.element_size()

    @property
    def param_bytes(self) -> int:
        """Every weight held, the embedding table included (the memory model's figure;
        ``weight_bytes`` counts what a decode step reads)."""
        return self.weight_bytes + self.embed.numel() * self.embed.element_size()

    def kv_bytes(self, batch: int, tokens: int) -> int:
        return 2 * self.n_layers * batch * tokens * self.nkv * self.hd * \
            self.k_cache[0].element_size()

    # ----------------------------------------------------------------------------- forward
    def forward(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """tokens: [B, T] ids written at positions pos..pos+T-1; returns last-token logits."""
        x = self.embed[tokens]  # [B, T, h]
        for i, lyr in enumerate(self.layers):
            if self.compiled is not None:
                x = self.compiled(x, lyr.attn_norm, lyr.qkv.args, lyr.o.args, lyr.mlp_norm,
                                  lyr.gate_up.args, lyr.down.args, self.k_cache[i],
                                  self.v_cache[i],
                                  self.cos, self.sin, pos, self.nh, self.nkv, self.hd,
                                  _sdpa_any)
            else:
                x = layer_math(x, lyr.attn_norm, lyr.qkv, lyr.o, lyr.mlp_norm, lyr.gate_up,
                               lyr.down, self.k_cache[i], self.v_cache[i], self.cos, self.sin,
                               pos, self.nh, self.nkv, self.hd, self._sdpa)
        x = rms_norm(x[:, -1:], self.final_norm)
        return F.linear(x, self.lm_head).float()  # [B, 1, vocab]

    def decode_step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        return self.forward(tokens, pos)

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward(tokens, 0)
