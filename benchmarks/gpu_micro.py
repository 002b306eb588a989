"""The kernels a decode step is made of, timed one family at a time at a model's own shapes:
projections (bf16 and fp8) across the token count, decode and prefill attention across batch
and context, and copies across size.

Each point is a CUDA graph of back-to-back kernels on distinct buffers, as a decode step runs
them: one projection per copy of its weight, enough copies that the working set is at least
four times the L2 cache, so each reads its weight from memory as a step's layers do. The time
per kernel is the graph's time over its kernels: the figure a step of many layers pays, with
the launch gap of the graph itself spread over many kernels. A straight line through the
batch-1 projections' times against their bytes gives the fixed cost per projection (the
intercept) and the bandwidth the projections stream at (the slope); the same line through the
copies gives what any memory-bound kernel pays.

    python benchmarks/gpu_micro.py -m llama-3.1-8b,llama-3.1-70b --out micro.jsonl
    python benchmarks/gpu_micro.py -m tiny-llama-test --device cpu      # a smoke run

On a CPU the chains run eagerly, timed with perf_counter: a smoke test of the script, not a
measurement. One JSON line per point in --out, written as it completes, so a
run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_kernels import OneLineParser, weight_dims  # noqa: E402  (beside this script)

from harness.bench import buffers_beyond_l2  # noqa: E402
from planner.core.errors import LlmplanError, UsageError, first_line  # noqa: E402
from planner.io import catalog  # noqa: E402

FAMILIES = ("copy", "gemm", "attention")


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares intercept and slope of ys against xs; None with under two distinct xs."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


class Timer:
    """Seconds per call of a chain of calls (``harness.bench.time_chain``), with the chain's
    p90 / median and its repeats."""

    def __init__(self, kind: str, budget_s: float):
        self.kind, self.budget_s = kind, budget_s

    def per_call_s(self, calls: list) -> tuple[float, float, int]:
        from harness.bench import time_chain

        return self.figures(time_chain(calls, kind=self.kind, budget_s=self.budget_s))

    @staticmethod
    def figures(t) -> tuple[float, float, int]:
        return t.median_s, t.p90_s / t.median_s, t.reps


def gemm_points(m, dtype: str, tokens: list[int], dev: str, timer: Timer, l2: int):
    import torch

    for op, (k, n) in weight_dims(m).items():
        if dtype == "fp8":
            wbytes = k * n
            count = buffers_beyond_l2(wbytes, l2)
            ws = [torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t() for _ in range(count)]
        else:
            wbytes = 2 * k * n
            count = buffers_beyond_l2(wbytes, l2)
            ws = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) for _ in range(count)]
        one = torch.ones((), device=dev)
        for t in tokens:
            if dtype == "fp8":
                x = torch.randn(t, k, device=dev).to(torch.float8_e4m3fn)
                calls = [lambda w=w, x=x, one=one: torch._scaled_mm(
                    x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16) for w in ws]
                abytes = t * k + 2 * t * n
            else:
                x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
                calls = [lambda w=w, x=x: x @ w for w in ws]
                abytes = 2 * t * k + 2 * t * n
            per_s, spread, reps = timer.per_call_s(calls)
            yield {"family": "gemm", "dtype": dtype, "model": m.name, "op": op, "tokens": t,
                   "k": k, "n": n, "weight_bytes": wbytes, "bytes": wbytes + abytes,
                   "flops": 2 * t * k * n, "copies": count, "per_call_s": per_s,
                   "spread": spread, "reps": reps}
        del ws


def attention_points(m, batches: list[int], contexts: list[int], prefill: list[int],
                     dev: str, timer: Timer, l2: int, max_bytes: float):
    import torch
    import torch.nn.functional as F

    from harness.calibrate import decode_attention_chain, kv_cache_bytes

    heads = nh, nkv, hd = m.num_attention_heads, m.num_kv_heads, m.head_dim_
    gqa = nh != nkv
    for b in batches:
        for ctx in contexts:
            kv_bytes = kv_cache_bytes(b, ctx, heads)
            count = buffers_beyond_l2(kv_bytes, l2, at_least=2, at_most=64)
            if count * kv_bytes > max_bytes:
                yield {"family": "attention", "phase": "decode", "model": m.name, "batch": b,
                       "context": ctx, "error": f"skipped: {count} caches of "
                       f"{kv_bytes / 2**30:.1f} GiB pass --max-gib"}
                continue
            try:
                t, nbytes = decode_attention_chain(b, ctx, heads, count, kind=timer.kind,
                                                   budget_s=timer.budget_s)
                per_s, spread, reps = timer.figures(t)
            except (RuntimeError, MemoryError) as err:
                yield {"family": "attention", "phase": "decode", "model": m.name, "batch": b,
                       "context": ctx, "error": first_line(err)[:160]}
                continue
            finally:
                if dev == "cuda":
                    torch.cuda.empty_cache()
            yield {"family": "attention", "phase": "decode", "model": m.name, "batch": b,
                   "context": ctx, "bytes": nbytes, "flops": 4 * b * nh * ctx * hd,
                   "copies": count, "per_call_s": per_s, "spread": spread, "reps": reps}
    for s in prefill:
        q = torch.randn(1, nh, s, hd, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, nkv, s, hd, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, nkv, s, hd, device=dev, dtype=torch.bfloat16)
        calls = [lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=gqa)] * 4
        per_s, spread, reps = timer.per_call_s(calls)
        yield {"family": "attention", "phase": "prefill", "model": m.name, "batch": 1,
               "context": s, "flops": 2 * nh * s * s * hd,  # causal: half of 4 s^2 d
               "per_call_s": per_s, "spread": spread, "reps": reps}


def copy_points(sizes: list[int], dev: str, timer: Timer, l2: int):
    import torch

    for size in sizes:
        count = buffers_beyond_l2(size, l2, at_most=2048)
        src = [torch.empty(size // 2, device=dev, dtype=torch.bfloat16) for _ in range(count)]
        dst = torch.empty(size // 2, device=dev, dtype=torch.bfloat16)
        calls = [lambda s=s, d=dst: d.copy_(s) for s in src]
        per_s, spread, reps = timer.per_call_s(calls)
        yield {"family": "copy", "bytes": 2 * size, "copies": count, "per_call_s": per_s,
               "spread": spread, "reps": reps}
        del src, dst


def summary(recs: list[dict]) -> list[str]:
    """The straight lines: per-call time against bytes for batch-1 projections (per dtype) and
    for copies; what the intercept and slope say."""
    lines = []
    for label, pick in (("copy", lambda r: r["family"] == "copy"),
                        ("bf16 projections, 1 token", lambda r: r["family"] == "gemm" and
                         r["dtype"] == "bf16" and r["tokens"] == 1),
                        ("fp8 projections, 1 token", lambda r: r["family"] == "gemm" and
                         r["dtype"] == "fp8" and r["tokens"] == 1)):
        pts = [r for r in recs if pick(r) and "per_call_s" in r]
        line = fit_line([r["bytes"] for r in pts], [r["per_call_s"] for r in pts])
        if line is None:
            continue
        a, b = line
        lines.append(f"{label}: {len(pts)} points; fixed cost {a * 1e6:.2f} us, "
                     f"{(1 / b if b > 0 else float('nan')) / 1e9:,.0f} GB/s")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--models", default="llama-3.1-8b")
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--dtypes", default="bf16,fp8")
    p.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192",
                   help="rows of the projections (decode batch, or prefill tokens)")
    p.add_argument("-b", "--batch", default="1,8,32,128", help="decode attention batches")
    p.add_argument("-c", "--context", default="512,2048,8192,32768",
                   help="decode attention contexts")
    p.add_argument("--prefill", default="512,2048,8192", help="prefill attention lengths")
    p.add_argument("--copy-sizes", default="65536,262144,1048576,4194304,16777216,67108864,"
                   "268435456,536870912", help="bytes read by each copy")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--max-gib", type=float, default=24.0,
                   help="the most memory one attention point's caches may take")
    p.add_argument("--budget-s", type=float, default=0.15, help="seconds of replays a point")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    try:
        return _run(a)
    except LlmplanError as err:
        print(f"gpu_micro: error: {first_line(err)}", file=sys.stderr)
        return getattr(err, "exit_code", 2)


def _run(a: argparse.Namespace) -> int:
    from planner.cli.options import parse_choices
    from planner.search.sweep import parse_int_list

    families = parse_choices(a.families, FAMILIES, "--families")
    dtypes = parse_choices(a.dtypes, ("bf16", "fp8"), "--dtypes")
    tokens = parse_int_list(a.tokens, "--tokens")
    batches = parse_int_list(a.batch, "--batch")
    contexts = parse_int_list(a.context, "--context")
    prefill = parse_int_list(a.prefill, "--prefill") if a.prefill else []
    sizes = parse_int_list(a.copy_sizes, "--copy-sizes")
    for flag, v in (("--budget-s", a.budget_s), ("--max-gib", a.max_gib)):
        if not v > 0 or not math.isfinite(v):
            raise UsageError(f"{flag}: {v} must be a positive number")
    models = [catalog.load_model(n.strip()) for n in a.models.split(",") if n.strip()]
    if not models:
        raise UsageError("--models: name at least one model")

    import torch

    from harness.bench import is_oom, l2_bytes
    from harness.device import detect

    info = detect(a.device)
    cuda = info.kind == "cuda"
    dev = "cuda" if cuda else "cpu"
    l2 = l2_bytes(info.kind)
    if "fp8" in dtypes:
        from harness.decoder import fp8_unsupported

        if why := fp8_unsupported(dev):
            print(f"fp8: skipped: {why}")
            dtypes = [d for d in dtypes if d != "fp8"]
    timer = Timer(info.kind, a.budget_s)
    out = a.out.open("a") if a.out else None
    recs: list[dict] = []
    print(f"{info.name}, torch {torch.__version__}, L2 {l2 / 2**20:.0f} MiB")

    def emit(gen, head: str):
        print(head)
        try:
            with torch.inference_mode():
                for r in gen:
                    r = {"device": info.name, **r}
                    recs.append(r)
                    if out:
                        out.write(json.dumps(r) + "\n")
                        out.flush()
                    if "error" in r:
                        print(f"  {r}")
                        continue
                    us = r["per_call_s"] * 1e6
                    gbs = r.get("bytes", 0) / r["per_call_s"] / 1e9
                    tf = r.get("flops", 0) / r["per_call_s"] / 1e12
                    key = " ".join(f"{k}={r[k]}" for k in ("dtype", "op", "tokens", "phase",
                                                          "batch", "context") if k in r)
                    if r["family"] == "copy":
                        key = f"{r['bytes']:,} bytes"
                    print(f"  {key:52} {us:10.2f} us {gbs:7.0f} GB/s {tf:7.1f} TFLOP/s "
                          f"(x{r['spread']:.2f})")
        except (RuntimeError, MemoryError) as err:
            if not is_oom(err) and not isinstance(err, MemoryError):
                raise
            print(f"  out of memory: {first_line(err)[:120]}; the rest of this family skipped")
            if cuda:
                torch.cuda.empty_cache()

    if "copy" in families:
        emit(copy_points(sizes, dev, timer, l2), "copies")
    for m in models:
        if "gemm" in families:
            for dt in dtypes:
                emit(gemm_points(m, dt, tokens, dev, timer, l2), f"{m.name} {dt} projections")
        if "attention" in families:
            emit(attention_points(m, batches, contexts, prefill, dev, timer, l2,
                                  a.max_gib * 2**30),
                 f"{m.name} attention")
    for line in summary(recs):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
