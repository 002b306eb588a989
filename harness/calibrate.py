"""Measured ceilings of the device: memory bandwidth, matmul rate per precision, launch cost.

- Bandwidth: a large device-to-device copy (bytes read + bytes written) and a read-dominated
  reduction (bytes read); the ceiling is the better of the two.
- Matmul: C = A @ B at several large square shapes (the ceiling: the best) and at the model's
  own decode shapes (M = batch; recorded as an efficiency table), per precision: bf16, fp16,
  and fp8 through torch._scaled_mm where the device has fp8 tensor cores (compute capability
  8.9 or later). A precision the device or torch cannot run is recorded with the reason.
- Launch cost: the time of one tiny kernel, replayed from a CUDA graph on GPU (what the decode
  step pays per kernel under graphs), or one eager tiny op on CPU.
- Fixed costs (GPU): what a one-token matmul and a decode attention kernel pay beyond their
  bytes at the measured bandwidth, timed as chains of kernels on distinct weights or caches
  (``fixed_costs``); the calibrated prediction charges them per kernel of their kind.

The profile is what ``llmplan estimate --calibration`` reads (planner.core.specs.Calibration).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from harness.bench import (
    NOISY_REPEAT,
    NOISY_SPREAD,
    busy_hint,
    drift,
    load_average,
    spread_reason,
    time_fn,
    timing_spread,
)
from harness.device import DeviceInfo, now_iso
from planner.core.errors import first_line

HARNESS_VERSION = "2"  # bump when the measurement method changes (2: fixed costs)


def _sizes(kind: str, quick: bool) -> dict:
    """Copy size, the square matmul sizes tried (smallest first; each is kept only while one
    call stays under ``call_s``), and the seconds of repetitions per timing."""
    if kind == "cuda":
        return {"bw_bytes": (1 << 28) if quick else (1 << 31),
                "square": (4096,) if quick else (4096, 8192), "call_s": 1.0,
                "budget_s": 0.2 if quick else 0.5}
    return {"bw_bytes": (1 << 25) if quick else (1 << 28),
            "square": (256, 512) if quick else (256, 512, 1024, 2048),
            "call_s": 0.02 if quick else 0.15, "budget_s": 0.1 if quick else 0.3}


def needed_dtypes(weights: list[str]) -> tuple[str, ...]:
    """The matmul precisions a measurement of these weight precisions runs: 16-bit weights
    in their own type, int8 / int4 weight-only in bf16 (dequantized), fp8 in fp8 beside bf16
    (attention and the head stay 16-bit, and the prediction prices them at bf16's rate)."""
    out: list[str] = []
    for w in weights:
        for dt in {"fp16": ("fp16",), "fp8": ("fp8", "bf16")}.get(w, ("bf16",)):
            if dt not in out:
                out.append(dt)
    return tuple(out)


def measure_bandwidth(kind: str, n_bytes: int, budget_s: float) -> dict:
    dev = "cuda" if kind == "cuda" else "cpu"
    n = n_bytes // 2
    src = torch.randn(n, device=dev, dtype=torch.float32).to(torch.bfloat16)
    dst = torch.empty_like(src)
    copy = time_fn(lambda: dst.copy_(src), kind=kind, budget_s=budget_s, use_graph=False)
    read = time_fn(lambda: src.sum(dtype=torch.float32), kind=kind, budget_s=budget_s,
                   use_graph=False)
    copy_bw = 2 * src.nbytes / copy.median_s  # read + write
    read_bw = src.nbytes / read.median_s
    return {"copy_bytes_per_s": copy_bw, "read_bytes_per_s": read_bw,
            "bytes": n_bytes, "copy": copy.as_dict(), "read": read.as_dict(),
            "best_bytes_per_s": max(copy_bw, read_bw)}


def _fp8_ok(kind: str) -> str | None:
    """Why fp8 matmuls cannot be timed here (None when they can): the decoder's own test,
    so the calibration and the measured points agree on what runs."""
    from harness.decoder import fp8_unsupported

    return fp8_unsupported("cuda" if kind == "cuda" else "cpu")


def matmul_rate(kind: str, dtype: str, m: int, k: int, n: int, budget_s: float) -> dict:
    dev = "cuda" if kind == "cuda" else "cpu"
    if dtype == "fp8":
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major B
        one = torch.ones((), device=dev)

        def fn():
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        td = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        a = torch.randn(m, k, device=dev, dtype=td)
        b = torch.randn(k, n, device=dev, dtype=td)

        def fn():
            return a @ b
    t = time_fn(fn, kind=kind, budget_s=budget_s, use_graph=False)
    return {"dtype": dtype, "m": m, "k": k, "n": n, "flops_per_s": 2 * m * k * n / t.median_s,
            "timing": t.as_dict()}


# Decode matmuls of one token, (k, n) of the bf16 weight: the projections of Llama-3.1-8B
# (qkv, o, down, gate_up) and 70B (o, gate_up), 32 MiB to 0.9 GiB, so the line through them
# spans the weights a step reads. Decode attention: (batch, context) at 32 query heads,
# 8 KV heads of 128 (both models' shape), short caches where the fixed cost dominates.
FIXED_MATMULS = {"cuda": ((4096, 4096), (4096, 6144), (14336, 4096), (4096, 28672),
                          (8192, 8192), (8192, 57344)),
                 "cpu": ((512, 512), (512, 2048), (1024, 2048))}
FIXED_ATTENTION = {"cuda": ((1, 512), (1, 2048), (8, 512), (8, 2048)),
                   "cpu": ((1, 64), (1, 256))}
ATTN_HEADS = (32, 8, 128)  # query heads, KV heads, head size


def _excess(points: list[dict], bandwidth_bytes_per_s: float) -> float | None:
    """The median of each kernel's time beyond its bytes at the measured bandwidth (not
    below 0): the fixed cost the calibrated prediction adds per kernel of its kind."""
    import statistics

    extra = [p["per_call"]["median_s"] - p["bytes"] / bandwidth_bytes_per_s for p in points]
    return max(0.0, statistics.median(extra)) if extra else None


def kv_cache_bytes(batch: int, context: int, heads: tuple[int, int, int]) -> int:
    """The bf16 K and V one decode attention reads: ``heads`` is (query heads, KV heads,
    head size)."""
    _, nkv, hd = heads
    return 2 * 2 * batch * nkv * context * hd


def decode_attention_chain(batch: int, context: int, heads: tuple[int, int, int],
                           buffers: int, *, kind: str, budget_s: float):
    """Decode attention (one query token a sequence, torch's SDPA, GQA where the heads say)
    over ``buffers`` distinct bf16 KV caches of ``batch`` x ``context`` tokens, timed as a
    chain (``bench.time_chain``). Returns the Timing per call and the bytes one call moves:
    its cache, its queries and its output."""
    import torch.nn.functional as F

    from harness.bench import time_chain

    nh, nkv, hd = heads
    dev = "cuda" if kind == "cuda" else "cpu"
    q = torch.randn(batch, nh, 1, hd, device=dev, dtype=torch.bfloat16)
    kvs = [(torch.randn(batch, nkv, context, hd, device=dev, dtype=torch.bfloat16),
            torch.randn(batch, nkv, context, hd, device=dev, dtype=torch.bfloat16))
           for _ in range(buffers)]
    t = time_chain([lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v,
                                                                   enable_gqa=nh != nkv)
                    for k, v in kvs], kind=kind, budget_s=budget_s)
    return t, kv_cache_bytes(batch, context, heads) + 2 * 2 * batch * nh * hd


def fixed_costs(kind: str, bandwidth_bytes_per_s: float, budget_s: float, *,
                matmuls: tuple[tuple[int, int], ...] | None = None,
                attention: tuple[tuple[int, int], ...] | None = None) -> dict:
    """What a one-token matmul and a decode attention kernel pay beyond their bytes at
    ``bandwidth_bytes_per_s``. Each shape is timed as a chain of kernels on distinct weights
    (caches) that together hold four L2 caches, one CUDA graph (``bench.time_chain``): a
    step of many layers, each reading its own from memory. On an H100 the empty kernel
    costs 1.25 us while each projection paid 2.7-6 us over its bytes at the copy rate
    (benchmarks/results/h100-sxm-2026-11-27): the empty kernel alone left the calibrated
    prediction of Llama-3.1-8B's batch-1 step 15% short."""
    from harness.bench import buffers_beyond_l2, l2_bytes, time_chain

    dev = "cuda" if kind == "cuda" else "cpu"
    l2 = l2_bytes(kind)
    mm_points, attn_points = [], []
    for k, n in matmuls if matmuls is not None else FIXED_MATMULS[dev]:
        wbytes = 2 * k * n
        ws = [torch.randn(k, n, device=dev, dtype=torch.bfloat16)
              for _ in range(buffers_beyond_l2(wbytes, l2))]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        t = time_chain([lambda w=w, x=x: x @ w for w in ws], kind=kind, budget_s=budget_s)
        mm_points.append({"k": k, "n": n, "bytes": wbytes + 2 * (k + n), "buffers": len(ws),
                          "per_call": t.as_dict()})
        del ws
    for b, ctx in attention if attention is not None else FIXED_ATTENTION[dev]:
        buffers = buffers_beyond_l2(kv_cache_bytes(b, ctx, ATTN_HEADS), l2, at_least=2,
                                    at_most=256)
        t, nbytes = decode_attention_chain(b, ctx, ATTN_HEADS, buffers, kind=kind,
                                           budget_s=budget_s)
        attn_points.append({"batch": b, "context": ctx, "bytes": nbytes, "buffers": buffers,
                            "per_call": t.as_dict()})
    return {"matmul": mm_points, "attention": attn_points,
            "matmul_overhead_s": _excess(mm_points, bandwidth_bytes_per_s),
            "attention_overhead_s": _excess(attn_points, bandwidth_bytes_per_s)}


def launch_overhead(kind: str, budget_s: float) -> dict:
    dev = "cuda" if kind == "cuda" else "cpu"
    x = torch.zeros(1, device=dev)
    reps = 100

    def many():
        for _ in range(reps):
            x.add_(1.0)
    t = time_fn(many, kind=kind, budget_s=budget_s, use_graph=kind == "cuda")
    return {"per_kernel_s": t.median_s / reps, "method": t.method, "timing": t.as_dict()}


def noise(details: dict, *, max_spread: float = NOISY_SPREAD,
          max_drift: float = NOISY_REPEAT) -> dict:
    """How far the calibration's timings can be trusted (the check ``measure`` makes of each
    point, ``harness.measure.noise``): the worst p90 / median over every timing (copy, read,
    each matmul, the launch), and the drift of the copy's median timed again at the end,
    seconds later. ``reason`` (None when clean) says which limit was passed; a busy machine
    gave this project's CPU calibrations an 8x spread (issue 27)."""
    bw = details.get("bandwidth") or {}
    timings = [("bandwidth copy", bw.get("copy")), ("bandwidth read", bw.get("read"))]
    timings += [(f"{m.get('dtype')} matmul {m.get('m')}x{m.get('k')}x{m.get('n')}",
                 m.get("timing")) for m in details.get("matmul") or []]
    timings.append(("launch", (details.get("launch") or {}).get("timing")))
    fixed = details.get("fixed") or {}
    timings += [(f"matmul chain k={p.get('k')} n={p.get('n')}", p.get("per_call"))
                for p in fixed.get("matmul") or []]
    timings += [(f"attention chain batch {p.get('batch')} context {p.get('context')}",
                 p.get("per_call")) for p in fixed.get("attention") or []]
    worst, worst_name, reps = 1.0, None, None
    for name, t in timings:
        spread = timing_spread(t)
        if spread is not None and spread > worst:
            worst, worst_name, reps = spread, name, t.get("reps")
    first = (bw.get("copy") or {}).get("median_s")
    again = ((details.get("bandwidth_repeat") or {}).get("copy") or {}).get("median_s")
    apart = drift(first, again)
    reason = None
    if worst > max_spread:
        reason = spread_reason(worst_name, worst, reps, max_spread)
    elif apart is not None and apart > max_drift:
        reason = (f"the copy timed again at the end was {apart:.1f}x "
                  f"{'slower' if again > first else 'faster'} (limit {max_drift:g}x)")
    return {"worst_spread": worst, "worst": worst_name, "drift": apart,
            "max_spread": max_spread, "max_drift": max_drift, "noisy": reason is not None,
            "reason": reason, "load_1m": load_average()}


def calibrate(info: DeviceInfo, *, dtypes: tuple[str, ...] = ("bf16", "fp16", "fp8"),
              decode_shapes: list[tuple[int, int, int]] | None = None,
              quick: bool = False, max_spread: float = NOISY_SPREAD,
              max_drift: float = NOISY_REPEAT,
              warn: Callable[[str], None] | None = None) -> dict:
    """Run every measurement for ``dtypes``; returns a dict that validates as
    planner.core.specs.Calibration. Its ``details.noise`` records the timings' spread
    (``noise``); a noisy calibration is marked so and ``warn`` is told why, with the
    machine's load and what to do (fewer --threads, a quiet machine); ``measure`` does not
    reuse a noisy profile."""
    s = _sizes(info.kind, quick)
    bw = measure_bandwidth(info.kind, s["bw_bytes"], s["budget_s"])
    rates: dict[str, float] = {}
    shapes: list[dict] = []
    skipped: dict[str, str] = {}
    for dt in dtypes:
        if dt == "fp8" and (why := _fp8_ok(info.kind)):
            skipped[dt] = why
            continue
        try:
            best = 0.0
            for size in s["square"]:
                # the next size is 8x the work: stop before one call outgrows call_s (a slow
                # precision, fp16 on most CPUs, stays small and the calibration stays short)
                if best and 2 * size ** 3 / best > s["call_s"]:
                    break
                r = matmul_rate(info.kind, dt, size, size, size, s["budget_s"])
                shapes.append({**r, "kind": "square"})
                best = max(best, r["flops_per_s"])
            rates[dt] = best / 1e12
            for (m, k, n) in decode_shapes or []:
                r = matmul_rate(info.kind, dt, m, k, n, s["budget_s"] / 2)
                shapes.append({**r, "kind": "decode"})
        except (RuntimeError, TypeError) as err:
            skipped[dt] = f"{type(err).__name__}: {first_line(err)}"
    launch = launch_overhead(info.kind, s["budget_s"])
    # The fixed costs of a matmul and an attention kernel: on a GPU, where they are what a
    # graphed step pays; a CPU's eager kernels pay the launch cost above, which stands for them
    fixed = (fixed_costs(info.kind, bw["best_bytes_per_s"], s["budget_s"] / 2,
                         matmuls=FIXED_MATMULS["cuda"][:3] if quick else None)
             if info.kind == "cuda" else None)
    # the copy again, seconds later: a machine that got busy meanwhile shows as drift
    again = measure_bandwidth(info.kind, s["bw_bytes"], s["budget_s"])
    details = {"device": info.as_dict(), "bandwidth": bw, "matmul": shapes,
               "skipped": skipped, "launch": launch, "fixed": fixed, "quick": quick,
               "bandwidth_repeat": {"copy": again["copy"], "read": again["read"]}}
    details["noise"] = noise(details, max_spread=max_spread, max_drift=max_drift)
    if details["noise"]["noisy"] and warn is not None:
        warn(f"the calibration is noisy: {details['noise']['reason']}: the machine was busy "
             f"({busy_hint()}); its ceilings are marked noisy and not reused by a later "
             "measure")
    return {
        "device": info.hardware_db or info.name,
        "memory_bandwidth_gb_per_s": bw["best_bytes_per_s"] / 1e9,
        "matmul_tflops": rates,
        "kernel_overhead_us": launch["per_kernel_s"] * 1e6,
        **({} if fixed is None else {
            f"{name}_overhead_us": fixed[f"{name}_overhead_s"] * 1e6
            for name in ("matmul", "attention") if fixed[f"{name}_overhead_s"] is not None}),
        "created": now_iso(),
        "harness_version": HARNESS_VERSION,
        "details": details,
    }


def save(profile: dict, path: str | Path) -> Path:
    import json

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix in (".yaml", ".yml"):
        import yaml

        p.write_text(yaml.safe_dump(profile, sort_keys=False))
    else:
        p.write_text(json.dumps(profile, indent=2))
    return p
