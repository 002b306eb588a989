"""A Hugging Face ``config.json``'s ``quantization_config`` as a ``CheckpointQuant``: how the
checkpoint stores its weights, in the formats as they ship.

- AWQ (AutoAWQ; vLLM ``awq`` / ``awq_marlin``): ``bits`` 4, ``group_size``, ``zero_point``,
  ``modules_to_not_convert``. int4 in groups, an fp16 scale and a packed 4-bit zero per group
  and column (qzeros int32 [K/g, N/8]): 0.5 + 2.5 / g bytes per weight.
- GPTQ (AutoGPTQ / GPTQModel; vLLM ``gptq_marlin``): ``bits`` 4 or 8, ``group_size`` (-1: one
  group per input row), ``desc_act``, ``sym``, ``lm_head``. An fp16 scale per group; a zero
  point only when asymmetric (vLLM's Marlin path drops a symmetric checkpoint's qzeros once
  loaded: ``marlin_make_empty_g_idx``).
- fp8 (``quant_method: fp8``; DeepSeek-V3): ``weight_block_size`` [128, 128] gives an fp32
  scale (``weight_scale_inv``) per 128 x 128 block; none: one per tensor. W8A8.
- compressed-tensors (llm-compressor): ``config_groups.*.weights`` {``num_bits``, ``type``,
  ``strategy``, ``group_size``, ``symmetric``, ``block_structure``}, ``input_activations``
  (W8A8 when 8-bit, weight-only when null), ``targets``, and the ``ignore`` list.
- bitsandbytes: ``load_in_4bit`` (NF4 / FP4 in blocks of 64 with an fp32 absmax each, or with
  ``bnb_4bit_use_double_quant`` an 8-bit absmax plus an fp32 scale per 256 of them) or
  ``load_in_8bit`` (LLM.int8(): int8 with an fp32 scale per row).
- MXFP4 (gpt-oss): the routed experts; ``modules_to_not_convert`` lists attention, router,
  embeddings and lm_head (vLLM's ``Mxfp4Config`` quantizes only its FusedMoE layers).
- fbgemm_fp8 (Meta's Llama-3.1-405B-FP8; vLLM ``FBGEMMFp8Config``): fp8 weights with an fp32
  scale per output channel, inputs quantized per token at run time (capped by
  ``activation_scale_ub``), the layers ``modules_to_not_convert`` names left in 16-bit. W8A8.

Embeddings, norms and MoE routers stay 16-bit whatever a list says (as in the planner's byte
accounting); attention left in 16-bit in every layer is ``quantized_layers="mlp"`` (in a MoE
model ``"experts"`` when its shared experts or dense MLPs are listed too); an ``lm_head`` in
the list keeps it 16-bit. A config the planner
cannot read gives a ``CheckpointQuant`` whose ``problem`` names the file, the field and what
is wrong; it is raised when the weights' precision is taken from the checkpoint (not when
``--weights`` is given).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from planner.core.specs import CheckpointQuant, DType, ModelSpec

METHODS = ("awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes", "mxfp4", "fbgemm_fp8")
FIELD = "quantization_config"


class _Bad(Exception):
    """A field of quantization_config that cannot be read: (field, problem)."""


def checkpoint_quant(cfg: dict, path: str, *, moe: bool, hidden_size: int,
                     num_layers: int | None = None) -> CheckpointQuant | None:
    """The checkpoint's storage from ``cfg['quantization_config']``; None when there is none.
    ``moe``: the model has routed experts; ``hidden_size``: the input width of most linear
    layers, the group of a per-channel scale; ``num_layers``: the decoder's layers, to tell a
    list naming every layer's attention from one naming some."""
    qc = cfg.get(FIELD)
    if qc is None:
        return None
    method = str(qc.get("quant_method", "?"))[:40] if isinstance(qc, dict) else "?"
    half = _half(cfg)
    try:
        if not isinstance(qc, dict):
            raise _Bad(FIELD, f"expected an object, got {type(qc).__name__}")
        if "quant_method" not in qc and (qc.get("load_in_4bit") or qc.get("load_in_8bit")):
            method = "bitsandbytes"  # written before transformers named its methods
        reader = _READERS.get(method)
        if reader is None:
            raise _Bad(f"{FIELD}.quant_method",
                       f"'{method}' is not supported (supported: {', '.join(METHODS)}); give "
                       "--weights to estimate the checkpoint as one of ours")
        d = reader(qc, moe=moe, hidden_size=hidden_size, half=half, num_layers=num_layers)
        return CheckpointQuant(method=method, file=path, **d)
    except _Bad as bad:
        where, problem = bad.args
        return CheckpointQuant(method=method, file=path, problem=f"{path}: {where}: {problem}")
    except ValidationError as err:  # a size out of range
        e = err.errors()[0]
        return CheckpointQuant(method=method, file=path, problem=(
            f"{path}: {FIELD}: {'.'.join(map(str, e['loc']))}: "
            f"{e['msg'].removeprefix('Value error, ')}"))


def model_checkpoint_quant(cfg: dict, path: str, model: ModelSpec) -> CheckpointQuant | None:
    """``checkpoint_quant`` of a config for ``model``'s shape (its experts, hidden size and
    layers): a config.json's, a model file's copy of one, or a served run's checkpoint."""
    return checkpoint_quant(cfg, path, moe=model.moe is not None, hidden_size=model.hidden_size,
                            num_layers=model.num_layers)


def checkpoint_half(cfg: dict) -> DType | None:
    """The 16-bit type a config.json says its checkpoint stores (``torch_dtype``, ``dtype`` in
    newer configs: float16 or bfloat16); None for any other (float32: vLLM's auto picks a
    16-bit type by its own rules, not modelled here) or none."""
    return _half(cfg)


def _half(cfg: dict) -> DType | None:
    """The checkpoint's 16-bit type (``torch_dtype``, ``dtype`` in newer configs): the type
    weight-only kernels compute in (vLLM's dtype auto)."""
    t = cfg.get("torch_dtype", cfg.get("dtype"))
    return {"float16": DType.fp16, "bfloat16": DType.bf16}.get(t) if isinstance(t, str) else None


def _int(qc: dict, key: str, allowed: tuple[int, ...] | None = None, *,
         default: int | None = None, field: str = FIELD) -> int | None:
    v = qc.get(key, default)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise _Bad(f"{field}.{key}", f"expected a whole number, got {v!r:.40}")
    if allowed is not None and v not in allowed:
        raise _Bad(f"{field}.{key}",
                   f"expected {' or '.join(map(str, allowed))}, got {v} (not modelled)")
    return v


def _group(qc: dict, hidden_size: int, *, field: str = FIELD,
           default: int | None = 128) -> tuple[int, str]:
    """Weights per scale and its label; -1 (GPTQ's "one group per input row"): the input
    width, ``hidden_size`` for most layers."""
    g = _int(qc, "group_size", default=default, field=field)
    if g is None or g == -1:
        return hidden_size, "per channel"
    if g <= 0:
        raise _Bad(f"{field}.group_size", f"expected a positive number or -1, got {g}")
    return g, f"group {g}"


def _strings(qc: dict, key: str, field: str = FIELD) -> list[str]:
    v = qc.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _Bad(f"{field}.{key}", f"expected a list of module names, got {v!r:.60}")
    return v


_ATTENTION = ("self_attn", "attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj",
              "qkv_proj", "c_attn")
_ALWAYS_16 = ("embed", "wte", "wpe", "norm", "visual", "vision", "multi_modal_projector",
              "mm_projector")


def _is_router(name: str) -> bool:
    """A MoE router (``mlp.gate``, ``mlp.router``, ``block_sparse_moe.gate``,
    ``shared_expert_gate``), not ``gate_proj``."""
    tail = name.rstrip("$").split(".")[-1]
    return tail in ("gate", "router", "shared_expert_gate") or name.endswith("gate$")


_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
_ROUTED = re.compile(r"(?:^|\.)experts\.")  # mlp.experts.7.gate_proj, not shared_experts.
# a MoE model's MLPs that are not its routed experts: shared experts, a dense layer's MLP
_NOT_ROUTED = ("shared_expert", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
               "mlp.gate_up_proj")


def _left_16bit(names: list[str], *, moe: bool, key: str,
                num_layers: int | None) -> dict[str, Any]:
    """What a list of modules left in 16-bit (``modules_to_not_convert``, compressed-tensors'
    ``ignore``) means here: quantized_layers, lm_head_listed (True if listed) and notes
    on names the planner does not model.

    Attention is left in 16-bit when a name says so for every layer: a name without a layer
    index (``self_attn``, ``re:.*self_attn.*``), or names that enumerate every one of the
    model's ``num_layers``. Some layers' alone (the first and last, as some releases keep) are
    noted and counted as quantized, since the planner's precision is one per component, not
    per layer. A MoE model whose list leaves attention out keeps every other MLP quantized
    (``mlp``: its shared experts, its dense layers' MLPs) unless the list names those too
    (``experts``: the routed experts alone)."""
    attention_all = lm_head = not_routed = False
    attention_layers: set[int] = set()
    unmodelled = []
    for raw in names:
        n = raw.removeprefix("re:").lower().replace("\\.", ".")  # a pattern's escaped dots
        if "lm_head" in n:
            lm_head = True
        elif _is_router(n) or any(a in n for a in _ALWAYS_16):
            continue  # 16-bit in the planner's accounting anyway (a vision tower's attention)
        elif any(a in n for a in _ATTENTION):
            index = _LAYER_INDEX.search(n)
            if index is None:
                attention_all = True
            else:
                attention_layers.add(int(index.group(1)))
        elif moe and not _ROUTED.search(n) and any(a in n for a in _NOT_ROUTED):
            not_routed = True
        else:
            unmodelled.append(raw)
    if not attention_all and attention_layers:
        if num_layers is not None and attention_layers >= set(range(num_layers)):
            attention_all = True
        else:  # named first: the notes show three names and count the rest
            indices = sorted(attention_layers)
            of = f" of {num_layers}" if num_layers is not None else ""
            unmodelled.insert(0, f"attention of {len(indices)}{of} layers ("
                              + ", ".join(map(str, indices[:4]))
                              + (", ..." if len(indices) > 4 else "") + ")")
    notes = []
    if unmodelled:
        shown = ", ".join(unmodelled[:3]) + (f" (+{len(unmodelled) - 3} more)"
                                              if len(unmodelled) > 3 else "")
        notes.append(f"{FIELD}.{key}: {shown} left in 16-bit, counted as quantized "
                     "(weights a little low)")
    if not attention_all:
        layers = "all"
        if not_routed:
            notes.append(f"{FIELD}.{key}: shared experts or dense MLPs left in 16-bit with "
                         "attention quantized, counted as quantized (weights a little low)")
    else:
        layers = "experts" if moe and not_routed else "mlp"
    return {"quantized_layers": layers, "lm_head_listed": lm_head, "notes": tuple(notes)}


def _weight_only(half: DType | None) -> DType | None:
    """Weight-only kernels compute in the checkpoint's 16-bit type; fp16 is named, bf16 is
    the default."""
    return DType.fp16 if half == DType.fp16 else None


def _awq(qc: dict, *, moe: bool, hidden_size: int, half,
         num_layers: int | None) -> dict:
    _int(qc, "bits", (4,), default=4)
    g, glabel = _group(qc, hidden_size)
    zero = qc.get("zero_point", True)
    if not isinstance(zero, bool):
        raise _Bad(f"{FIELD}.zero_point", f"expected true or false, got {zero!r:.40}")
    left = _left_16bit(_strings(qc, "modules_to_not_convert"), moe=moe, num_layers=num_layers,
                       key="modules_to_not_convert")
    return {"weights": DType.int4, "group_size": g, "zero_point_bytes": 0.5 if zero else 0.0,
            "compute": _weight_only(half), "quantized_layers": left["quantized_layers"],
            "details": (glabel, "zero points" if zero else "symmetric"),
            "notes": left["notes"]}


def _gptq(qc: dict, *, moe: bool, hidden_size: int, half,
          num_layers: int | None) -> dict:
    bits = _int(qc, "bits", (4, 8), default=4)
    g, glabel = _group(qc, hidden_size)
    sym = qc.get("sym", True)
    act = qc.get("desc_act", False)
    head = qc.get("lm_head", False)
    for key, v in (("sym", sym), ("desc_act", act), ("lm_head", head)):
        if not isinstance(v, bool):
            raise _Bad(f"{FIELD}.{key}", f"expected true or false, got {v!r:.40}")
    left = _left_16bit(_strings(qc, "modules_to_not_convert"), moe=moe, num_layers=num_layers,
                       key="modules_to_not_convert")
    return {"weights": DType.int4 if bits == 4 else DType.int8, "group_size": g,
            "zero_point_bytes": 0.0 if sym else bits / 8, "compute": _weight_only(half),
            "quantized_layers": left["quantized_layers"],
            "lm_head_quantized": head and not left["lm_head_listed"],
            "details": (f"{bits}-bit", glabel, "symmetric" if sym else "zero points",
                        *(("act-order",) if act else ())), "notes": left["notes"]}


def _fp8(qc: dict, *, moe: bool, hidden_size: int, half,
         num_layers: int | None) -> dict:
    block = qc.get("weight_block_size")
    d: dict[str, Any] = {"weights": DType.fp8, "details": ("per-tensor scales",)}
    if block is not None:
        if not (isinstance(block, list) and len(block) == 2 and all(
                isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise _Bad(f"{FIELD}.weight_block_size",
                       f"expected two positive whole numbers, got {block!r:.40}")
        # one fp32 scale (weight_scale_inv) per block
        d.update(fp8_scale_group=block[0] * block[1], scale_bytes=4, fp8_blocks=True,
                 details=(f"blocks of {block[0]} x {block[1]}",))
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise _Bad(f"{FIELD}.activation_scheme",
                   f"expected dynamic or static, got {scheme!r:.40}")
    # vLLM's Fp8LinearMethod: a dynamic scheme without blocks takes one scale per input
    # tensor at run time (with blocks, one per token and 128 of K)
    d["fp8_dynamic_tensor"] = block is None and scheme == "dynamic"
    names = _strings(qc, "modules_to_not_convert") + _strings(qc, "ignored_layers")
    left = _left_16bit(names, moe=moe, num_layers=num_layers, key="modules_to_not_convert")
    return {**d, "quantized_layers": left["quantized_layers"], "notes": left["notes"]}


def _fbgemm_fp8(qc: dict, *, moe: bool, hidden_size: int, half,
                num_layers: int | None) -> dict:
    if moe:  # vLLM's FBGEMMFp8Config quantizes linear layers only: a FusedMoE layer's stay 16-bit
        raise _Bad(f"{FIELD}.quant_method", "fbgemm_fp8 on a mixture-of-experts model (its "
                   "experts left in 16-bit) is not modelled; give --weights")
    ub = qc.get("activation_scale_ub")
    if ub is None:  # vLLM's FBGEMMFp8Config.from_config reads it with get_from_keys
        raise _Bad(f"{FIELD}.activation_scale_ub", "missing (vLLM requires it for fbgemm_fp8)")
    if isinstance(ub, bool) or not isinstance(ub, (int, float)) or not ub > 0:
        raise _Bad(f"{FIELD}.activation_scale_ub", f"expected a positive number, got {ub!r:.40}")
    left = _left_16bit(_strings(qc, "modules_to_not_convert"), moe=moe, num_layers=num_layers,
                       key="modules_to_not_convert")
    # an fp32 scale per output channel: one per row of K weights, K the hidden size for most
    # layers; the input's scale is per token, found in the pass that quantizes it
    return {"weights": DType.fp8, "fp8_scale_group": hidden_size, "scale_bytes": 4,
            "details": ("per channel", "per-token inputs"),
            "quantized_layers": left["quantized_layers"], "notes": left["notes"]}


def _mxfp4(qc: dict, *, moe: bool, hidden_size: int, half,
           num_layers: int | None) -> dict:
    if not moe:
        raise _Bad(f"{FIELD}.quant_method", "mxfp4 quantizes a MoE model's experts (vLLM's "
                   "Mxfp4Config); this model has none")
    _left_16bit(_strings(qc, "modules_to_not_convert"), moe=moe, num_layers=num_layers,
                key="modules_to_not_convert")
    return {"weights": DType.mxfp4, "quantized_layers": "experts",
            "compute": _weight_only(half), "details": ("experts only",)}


def _bitsandbytes(qc: dict, *, moe: bool, hidden_size: int, half,
                  num_layers: int | None) -> dict:
    four, eight = qc.get("load_in_4bit", False), qc.get("load_in_8bit", False)
    for key, v in (("load_in_4bit", four), ("load_in_8bit", eight)):
        if not isinstance(v, bool):
            raise _Bad(f"{FIELD}.{key}", f"expected true or false, got {v!r:.40}")
    if four == eight:
        raise _Bad(f"{FIELD}.load_in_4bit",
                   "expected exactly one of load_in_4bit and load_in_8bit to be true")
    left = _left_16bit(_strings(qc, "llm_int8_skip_modules"), moe=moe, num_layers=num_layers,
                       key="llm_int8_skip_modules")
    common = {"quantized_layers": left["quantized_layers"], "notes": left["notes"]}
    if eight:  # LLM.int8(): int8 rows with an fp32 scale each (SCB)
        return {**common, "weights": DType.int8, "group_size": hidden_size, "scale_bytes": 4,
                "compute": _weight_only(half), "details": ("LLM.int8()", "fp32 row scales")}
    kind = qc.get("bnb_4bit_quant_type", "fp4")
    if kind not in ("nf4", "fp4"):
        raise _Bad(f"{FIELD}.bnb_4bit_quant_type", f"expected nf4 or fp4, got {kind!r:.40}")
    double = qc.get("bnb_4bit_use_double_quant", False)
    if not isinstance(double, bool):
        raise _Bad(f"{FIELD}.bnb_4bit_use_double_quant",
                   f"expected true or false, got {double!r:.40}")
    compute = {"float16": DType.fp16, "bfloat16": DType.bf16}.get(
        qc.get("bnb_4bit_compute_dtype")) or _weight_only(half)
    # blocks of 64 with an fp32 absmax; double quant: an 8-bit absmax and one fp32 scale per
    # 256 absmax values (bitsandbytes' nested quantization)
    scale = 1 + 4 / 256 if double else 4
    return {**common, "weights": DType.int4, "group_size": 64, "scale_bytes": scale,
            "compute": compute,
            "details": (kind.upper(), "blocks of 64",
                        "double quant" if double else "fp32 absmax")}


def _compressed_tensors(qc: dict, *, moe: bool, hidden_size: int, half,
                        num_layers: int | None) -> dict:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _Bad(f"{FIELD}.config_groups", "expected an object of one or more groups")
    schemes = {}
    experts_only = True
    for name, grp in groups.items():
        field = f"{FIELD}.config_groups.{name}"
        if not isinstance(grp, dict) or not isinstance(grp.get("weights"), dict):
            raise _Bad(f"{field}.weights", "expected an object")
        schemes[name] = _ct_scheme(grp, field, hidden_size, half)
        targets = _strings(grp, "targets", field)
        experts_only &= bool(targets) and all("expert" in t.lower() for t in targets)
    first = next(iter(schemes.values()))
    if any(s != first for s in schemes.values()):
        raise _Bad(f"{FIELD}.config_groups", f"{len(schemes)} groups store weights "
                   "differently; one scheme per checkpoint is modelled: give --weights")
    left = _left_16bit(_strings(qc, "ignore"), moe=moe, num_layers=num_layers,
                       key="ignore")
    layers = "experts" if (experts_only and moe) else left["quantized_layers"]
    return {**first, "quantized_layers": layers,
            # the lm_head is a Linear: quantized with the rest unless ignored
            "lm_head_quantized": layers == "all" and not left["lm_head_listed"],
            "notes": left["notes"]}


def _ct_scheme(grp: dict, field: str, hidden_size: int, half) -> dict:
    """One compressed-tensors group's weights: fp8 (W8A8 when its input activations are 8-bit
    too, else weight-only), int8 or int4 with scales per group, channel or tensor."""
    w = grp["weights"]
    wf = f"{field}.weights"
    bits = _int(w, "num_bits", (4, 8), field=wf)
    kind = w.get("type", "int")
    if kind not in ("int", "float"):
        raise _Bad(f"{wf}.type", f"expected int or float, got {kind!r:.40}")
    if bits is None:
        raise _Bad(f"{wf}.num_bits", "missing required field")
    strategy = w.get("strategy", "tensor")
    act = grp.get("input_activations")
    act_bits = act.get("num_bits") if isinstance(act, dict) else None
    if kind == "float" and bits == 4:
        raise _Bad(f"{wf}.type", "4-bit float (NVFP4 / MXFP4 groups) is not modelled; give "
                   "--weights")
    if kind == "float":
        d: dict[str, Any] = {"weights": DType.fp8, "details": ("FP8",)}
        if strategy == "block":
            blk = w.get("block_structure")
            if not (isinstance(blk, list) and len(blk) == 2 and all(
                    isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in blk)):
                raise _Bad(f"{wf}.block_structure",
                           f"expected two positive whole numbers, got {blk!r:.40}")
            d.update(fp8_scale_group=blk[0] * blk[1], scale_bytes=4, fp8_blocks=True,
                     details=("FP8", f"blocks of {blk[0]} x {blk[1]}"))
        elif strategy == "channel":
            d.update(fp8_scale_group=hidden_size, details=("FP8", "per channel"))
        elif strategy != "tensor":
            raise _Bad(f"{wf}.strategy", f"expected tensor, channel or block, got "
                       f"{strategy!r:.40}")
        if act_bits != 8:  # weight-only fp8 (FP8 Marlin): 16-bit matmuls
            d["compute"] = half or DType.bf16
            d["details"] += ("weight-only",)
        else:  # one input scale per tensor, found at run time (not per token, not static)
            d["fp8_dynamic_tensor"] = (strategy != "block"
                                       and act.get("strategy", "tensor") == "tensor"
                                       and act.get("dynamic") is True)
        return d
    if strategy == "group":
        g, glabel = _group(w, hidden_size, field=wf, default=None)
    elif strategy in ("channel", "tensor"):
        g, glabel = hidden_size, f"per {strategy}"
    else:
        raise _Bad(f"{wf}.strategy", f"expected group, channel or tensor, got {strategy!r:.40}")
    sym = w.get("symmetric", True)
    if not isinstance(sym, bool):
        raise _Bad(f"{wf}.symmetric", f"expected true or false, got {sym!r:.40}")
    w8a8 = bits == 8 and act_bits == 8
    return {"weights": DType.int4 if bits == 4 else DType.int8, "group_size": g,
            "zero_point_bytes": 0.0 if sym else bits / 8,
            "compute": DType.int8 if w8a8 else _weight_only(half),
            "details": (f"W{bits}A{8 if w8a8 else 16}", glabel,
                        "symmetric" if sym else "zero points")}


_READERS = {"awq": _awq, "gptq": _gptq, "fp8": _fp8, "mxfp4": _mxfp4,
            "fbgemm_fp8": _fbgemm_fp8,
            "bitsandbytes": _bitsandbytes, "compressed-tensors": _compressed_tensors}
