"""Where a decode step's time goes: each projection, attention and everything else, timed
kernel by kernel on the device, beside the planner's time for the same operator.

`llmplan measure` compares whole steps. When a step is 15% slower than predicted, this says
which operator the 15% is in: the harness's decoder (compiled on CUDA, as `measure` runs it)
is run under torch.profiler, its matmuls matched to the planner's operators by their weight
shapes, and the planner's per-operator time (``planner.core.roofline.op_time`` against the
calibrated ceilings, as `measure` predicts) printed beside each. Prefill slices are profiled
too: their kernel time against their wall time shows what the host adds.

    python benchmarks/gpu_kernels.py -m llama-3.1-8b --weights bf16,fp8 -b 1,64 -c 512 \\
        --calibration results/calibration-h100-sxm.yaml --out results/kernels.jsonl
    python benchmarks/gpu_kernels.py -m tiny-llama-test --device cpu   # a smoke run

On a CPU the "device" times are the operators' CPU times (no kernels): a smoke test of the
script, not a measurement. One JSON line per point in --out, written as it completes.
Measured on an H100 on 2026-11-27: docs/measure.md, benchmarks/results/h100-sxm-2026-11-27.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.core.errors import LlmplanError, UsageError, first_line  # noqa: E402
from planner.core.ops import decode_ops  # noqa: E402
from planner.core.roofline import ceilings, op_time  # noqa: E402
from planner.core.specs import DType, Precision  # noqa: E402
from planner.io import catalog  # noqa: E402

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::_scaled_mm", "aten::_weight_int8pack_mm",
              "aten::_weight_int4pack_mm", "aten::_weight_int4pack_mm_for_cpu")
PLANNER_GEMMS = ("qkv_proj", "o_proj", "mlp_gate_up_proj", "mlp_down_proj", "lm_head")


def weight_dims(m) -> dict[str, tuple[int, int]]:
    """(k, n) of each projection, as the harness's decoder holds them."""
    h, hd, i = m.hidden_size, m.head_dim_, m.intermediate_size
    nh, nkv = m.num_attention_heads, m.num_kv_heads
    return {"qkv_proj": (h, (nh + 2 * nkv) * hd), "o_proj": (nh * hd, h),
            "mlp_gate_up_proj": (h, 2 * i), "mlp_down_proj": (i, h), "lm_head": (h, m.vocab_size)}


def match_gemm(shapes: list, dims: dict[str, tuple[int, int]]) -> str | None:
    """The projection whose weight a matmul's inputs hold: [k, n] (16-bit, fp8), [n, k]
    (int8), or int4's scales-and-zeros [k / group, n, 2] beside a [rows, k] input."""
    for name, (k, n) in dims.items():
        for s in shapes:
            s = list(s)
            if s in ([k, n], [n, k]):
                return name
            if len(s) == 3 and s[1] == n and s[2] == 2 and shapes and list(shapes[0])[-1:] == [k]:
                return name
    return None


def _device_us(e, cuda: bool) -> float:
    if cuda:
        return float(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0))
    return float(e.cpu_time_total)


def profile(fn, *, cuda: bool, steps: int):
    """Per call of ``fn`` (``steps`` calls profiled): the matmul leaves with their input
    shapes and device times, the outermost attention calls' device time, and the number of
    kernels launched. Kernel durations are not summed: on an H100 (torch 2.11) the sum of the
    profiler's kernel events came to 1.7-2.9x the graphed step, while the operators' device
    times fit it; what is neither matmul nor attention is the step's time less those two."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with tprofile(activities=acts, record_shapes=True) as prof:
        for _ in range(steps):
            fn()
        if cuda:
            torch.cuda.synchronize()
    gemms: list[tuple[list, float]] = []
    attn_us = 0.0
    kernels = 0
    for e in prof.events():
        if getattr(getattr(e, "device_type", None), "name", "CPU") == "CUDA":
            kernels += 1
            continue
        parent = getattr(e, "cpu_parent", None)
        pname = parent.name if parent is not None else ""
        if e.name in MATMUL_OPS:
            if pname not in MATMUL_OPS:
                gemms.append((list(e.input_shapes or []), _device_us(e, cuda) / steps))
        elif "scaled_dot_product" in e.name or "flash_attention" in e.name:
            if "scaled_dot_product" not in pname and "flash_attention" not in pname:
                attn_us += _device_us(e, cuda)
    return gemms, attn_us / steps, kernels / steps


class OneLineParser(argparse.ArgumentParser):
    """argparse whose refusals (an unknown flag, a value of the wrong type) are one line and
    exit 2, as the script's own checks and llmplan's are, not a usage block."""

    def error(self, message: str):
        print(f"{Path(self.prog).stem}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default="llama-3.1-8b")
    p.add_argument("--weights", default="bf16")
    p.add_argument("-b", "--batch", default="1,64")
    p.add_argument("-c", "--context", default="512")
    p.add_argument("--layers", type=int)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--calibration", help="ceilings for the planner's times (default: the "
                   "GPU's hardware_db figures)")
    p.add_argument("--gpu", help="hardware_db entry (default: matched by name)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prefill", default="512,2048",
                   help="prompt lengths of batch-1 prefill slices to profile ('' for none)")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    try:
        return _run(a)
    except LlmplanError as err:  # a bad name, file or number: one line, as llmplan says it
        print(f"gpu_kernels: error: {first_line(err)}", file=sys.stderr)
        return getattr(err, "exit_code", 2)  # no CUDA device: 3, as measure says it
    except (MemoryError, RuntimeError) as err:
        from harness.bench import is_oom

        if not isinstance(err, MemoryError) and not is_oom(err):
            raise
        print(f"gpu_kernels: error: out of memory ({first_line(err)[:120]}); ask for "
              "fewer sequences, a shorter context or --layers", file=sys.stderr)
        return 2


def _run(a: argparse.Namespace) -> int:
    from harness.cli import WEIGHT_CHOICES
    from planner.cli.options import parse_choices
    from planner.search.sweep import parse_int_list

    weight_list = parse_choices(a.weights, WEIGHT_CHOICES, "--weights")
    batches = parse_int_list(a.batch, "--batch")
    contexts = parse_int_list(a.context, "--context")
    prompts = parse_int_list(a.prefill, "--prefill") if a.prefill else []
    if a.steps < 1:
        raise UsageError(f"--steps: {a.steps} must be 1 or more")
    if a.layers is not None and a.layers < 1:
        raise UsageError(f"--layers: {a.layers} must be 1 or more")

    import torch

    from harness.bench import time_fn
    from harness.decoder import Decoder, UnsupportedConfig
    from harness.device import detect

    info = detect(a.device)
    cuda = info.kind == "cuda"
    m = catalog.load_model(a.model)
    cal = catalog.load_calibration(a.calibration) if a.calibration else None
    if cuda or cal is None:
        gpu = a.gpu or info.hardware_db or "h100-sxm"
        hw = catalog.load_hardware(gpu)
    else:  # a CPU's own calibrated ceilings, as `measure` predicts on one
        from harness.measure import cpu_hardware

        gpu, hw = "cpu", cpu_hardware(info, cal)
    c = ceilings(hw, cal)
    layers = a.layers or m.num_layers
    # the model as built (``--layers``), as `measure` predicts it: the layers scale, the
    # embedding and the head do not
    built = m if layers == m.num_layers else m.model_copy(update={"num_layers": layers})
    dims = weight_dims(m)
    out = a.out.open("a") if a.out else None
    print(f"{info.name}, torch {torch.__version__}; planner ceilings: "
          f"{'calibration ' + a.calibration if cal else gpu + ' datasheet'}")
    for weights in weight_list:
        try:
            dec = Decoder(m, layers=a.layers, batch=1, max_tokens=1, weights=weights,
                          device=info.kind, compile=cuda)
        except UnsupportedConfig as err:
            print(f"{weights}: skipped: {err}")
            continue
        prec = Precision(weights=DType(weights), kv_cache=DType.bf16,
                         group_size=128 if weights == "int4" else m.hidden_size,
                         zero_point_bytes=2 if weights == "int4" else 0)
        with torch.inference_mode():
            for batch in batches:
                for ctx in contexts:
                    dec.alloc_cache(batch, ctx)
                    tok = torch.randint(0, m.vocab_size, (batch, 1), device=info.kind)

                    def step(tok=tok, ctx=ctx, dec=dec):
                        return dec.decode_step(tok, ctx - 1)

                    graph = time_fn(step, kind=info.kind, budget_s=0.3)
                    gemms, attn_us, kernels = profile(step, cuda=cuda, steps=a.steps)
                    ops = {o.name: o for o in decode_ops(built, prec, batch=batch,
                                                         context_tokens=ctx)}
                    rows = {}
                    for shapes, us in gemms:
                        name = match_gemm(shapes, dims) or "other matmul"
                        r = rows.setdefault(name, [0.0, 0])
                        r[0] += us
                        r[1] += 1
                    table = []
                    for name in PLANNER_GEMMS + ("attention",):
                        op = ops[name]
                        pred = op_time(op, c)
                        per_call_pred_us = pred.time_s / op.count * 1e6
                        if name == "attention":
                            meas_us, calls = attn_us / max(layers, 1), layers
                        else:
                            total_us, n = rows.get(name, [0.0, 0])
                            calls = round(n / a.steps, 3)  # per step
                            meas_us = total_us / calls if calls else float("nan")
                        gbs = op.bytes / (meas_us * 1e-6) / 1e9 if meas_us == meas_us and \
                            meas_us > 0 else float("nan")
                        table.append({"op": name, "calls": calls, "measured_us": meas_us,
                                      "predicted_us": per_call_pred_us, "bytes": op.bytes,
                                      "achieved_gb_per_s": gbs})
                    pred_step = sum(op_time(o, c).time_s for o in ops.values())
                    mm_us = sum(v[0] for v in rows.values())
                    step_ms = graph.median_s * 1e3
                    rec = {"device": info.name, "torch": str(torch.__version__),
                           "model": m.name, "layers": layers, "weights": weights,
                           "batch": batch, "context": ctx, "mode": dec.mode,
                           "step_graph_ms": step_ms, "kernels_per_step": kernels,
                           "matmul_ms": mm_us / 1e3, "attention_ms": attn_us / 1e3,
                           "other_ms": step_ms - (mm_us + attn_us) / 1e3,
                           "predicted_step_ms": pred_step * 1e3, "ops": table}
                    print(f"\n{weights} batch {batch} context {ctx} ({dec.mode}): step "
                          f"{step_ms:.3f} ms {'graphed' if cuda else 'timed'} "
                          f"({kernels:.0f} kernels): matmul "
                          f"{rec['matmul_ms']:.3f}, attention {rec['attention_ms']:.3f}, "
                          f"the rest {rec['other_ms']:.3f}; planner "
                          f"{rec['predicted_step_ms']:.3f}")
                    print(f"  {'op':18} {'calls':>6} {'meas us':>9} {'pred us':>9} "
                          f"{'meas/pred':>9} {'GB/s':>8}")
                    for t in table:
                        ratio = t["measured_us"] / t["predicted_us"] if t["predicted_us"] \
                            else float("nan")
                        print(f"  {t['op']:18} {t['calls']:6.0f} {t['measured_us']:9.2f} "
                              f"{t['predicted_us']:9.2f} {ratio:9.3f} "
                              f"{t['achieved_gb_per_s']:8.0f}")
                    if out:
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
            for prompt in prompts:
                dec.alloc_cache(1, prompt)
                toks = torch.randint(0, m.vocab_size, (1, prompt), device=info.kind)

                def pre(toks=toks, dec=dec):
                    return dec.prefill(toks)

                t = time_fn(pre, kind=info.kind, budget_s=0.3, use_graph=False)
                gemms, attn_us, kernels = profile(pre, cuda=cuda, steps=3)
                mm_us = sum(us for _, us in gemms)
                rec = {"device": info.name, "model": m.name, "weights": weights,
                       "prefill_tokens": prompt, "mode": dec.mode,
                       "wall_ms": t.median_s * 1e3, "kernels": kernels,
                       "matmul_ms": mm_us / 1e3, "attention_ms": attn_us / 1e3,
                       "other_ms": t.median_s * 1e3 - (mm_us + attn_us) / 1e3}
                print(f"{weights} prefill {prompt}: {rec['wall_ms']:.2f} ms ({kernels:.0f} "
                      f"kernels): matmul {rec['matmul_ms']:.2f}, attention "
                      f"{rec['attention_ms']:.2f}, the rest {rec['other_ms']:.2f} (host "
                      "launches included: not graphed)")
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
        del dec
        if cuda:
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
