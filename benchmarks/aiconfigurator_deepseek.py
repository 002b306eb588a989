"""DeepSeek-V3's decode step as llmplan prices it, beside NVIDIA aiconfigurator's static estimate.

    /tmp/venv-aic/bin/python benchmarks/aiconfigurator_deepseek.py          # run both, write CSV
    python benchmarks/aiconfigurator_deepseek.py --from-csv                  # re-print the CSV

benchmarks/aiconfigurator_compare.py compares dense and Qwen MoE models; this one covers the
model whose served runs miss most, DeepSeek-V3 (MLA attention, 256 routed experts in
block-scaled fp8), at TP 8 on the H100, the H200 and the B200, with each backend whose tables
aiconfigurator ships for it: SGLang (0.5.14), TensorRT-LLM (1.3.0rc20) and vLLM (0.24.0).
aiconfigurator's static mode sums, for every decode step of a batch, its MLA block (for
TensorRT-LLM and vLLM the whole block timed as one module; for SGLang composed of the
block's kernels timed one by one: the fp8 GEMMs, the MLA attention kernel, the absorbed
batched GEMMs), its MoE block (the fused experts, the shared expert and the router) and the
norms and logits; no host-side cost is added in that mode. Ours is ``llmplan estimate -m
deepseek-v3`` (the checkpoint's block-scaled fp8 weights) with the engine profile of the same
backend, its KV cache and attention in bf16 as theirs. Besides TPOT, each row splits one decode
step into the MLA block, the MoE block (the three dense layers' MLPs with it) and the
all-reduces, ours and, where aiconfigurator reports the same split, theirs.

An external comparison, not a fit: nothing is tuned on it. No test imports this file, and CI
has no aiconfigurator.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.aiconfigurator_compare import (  # noqa: E402
    _git_describe,
    _ratio,
    read_recorded,
    read_typed_csv,
    require_aiconfigurator,
)
from benchmarks.gpu_kernels import OneLineParser  # noqa: E402

DEFAULT_CSV = ROOT / "benchmarks" / "results" / "aiconfigurator_deepseek.csv"
HF_ID = "deepseek-ai/DeepSeek-V3"
GPUS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm"}
BACKENDS = {"sglang": "sglang", "trtllm": "trtllm", "vllm": "vllm"}  # theirs -> our profile
BATCHES = (1, 4, 8, 16, 32, 64)
ISL, OSL, TP = 1024, 1024, 8
# our decode operators by block (llmplan estimate --json: operators.decode[].name)
MLA_OPS = {"attn_norm", "mla_down_proj", "mla_q_up_proj", "mla_kv_up_proj", "rope_kv_write",
           "attention", "o_proj"}
COMM_OPS = {"allreduce_attn", "allreduce_mlp", "allreduce_moe"}
# their generation ops by block (InferenceSession's summary: get_generation_latency_dict)
THEIR_MLA = ("generation_mla_block", "generation_add_norm_1")
THEIR_MOE = ("generation_moe_overlap", "generation_moe", "generation_add_norm_2")
COLUMNS = ["backend", "gpu", "batch", "their_tpot_s", "our_tpot_s", "tpot_ratio",
           "their_mla_s", "our_mla_s", "their_moe_s", "our_moe_s", "our_comm_s",
           "our_other_s", "their_db", "their_error", "our_error", "llmplan_commit",
           "aiconfigurator_version", "date"]


def theirs(cli_estimate, backend: str, gpu: str, batch: int) -> dict:
    """aiconfigurator's static run: TPOT and one decode step's MLA and MoE blocks (s)."""
    try:
        r = cli_estimate(HF_ID, GPUS[gpu], mode="static", backend_name=backend, isl=ISL,
                         osl=OSL, batch_size=batch, tp_size=TP, gemm_quant_mode="fp8_block",
                         moe_quant_mode="fp8_block", kvcache_quant_mode="bfloat16",
                         fmha_quant_mode="bfloat16", moe_tp_size=TP, moe_ep_size=1)
    except Exception as exc:  # a case it cannot run is recorded, not fatal
        return {"their_error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    per_step = {k: v / 1e3 / (OSL - 1) for k, v in
                r.summary.get_generation_latency_dict().items()}  # ms over the steps
    return {"their_tpot_s": r.tpot / 1e3,
            "their_mla_s": sum(per_step.get(k, 0.0) for k in THEIR_MLA),
            "their_moe_s": sum(per_step.get(k, 0.0) for k in THEIR_MOE),
            "their_db": f"{GPUS[gpu]}/{backend}/{r.backend_version}", "their_error": ""}


def split_ours(decode_ops: list[dict]) -> dict:
    """Our decode step's operators summed by block: MLA, all-reduces, the rest of the layer
    (experts, router, shared expert, dense MLPs, their norm) as MoE, and embed / final norm /
    logits as other."""
    out = {"our_mla_s": 0.0, "our_moe_s": 0.0, "our_comm_s": 0.0, "our_other_s": 0.0}
    for op in decode_ops:
        name = op["name"]
        key = ("our_mla_s" if name in MLA_OPS else "our_comm_s" if name in COMM_OPS else
               "our_other_s" if name in ("embed", "final_norm", "lm_head") else "our_moe_s")
        out[key] += op["time_s"]
    return out


def ours(backend: str, gpu: str, batch: int) -> dict:
    cmd = [sys.executable, "-m", "planner", "estimate", "-m", "deepseek-v3", "-g", gpu,
           "-e", BACKENDS[backend], "--tp", str(TP), "--kv-cache", "bf16", "-b", str(batch),
           "-p", str(ISL), "-o", str(OSL), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    if p.returncode != 0:
        return {"our_error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]}
    j = json.loads(p.stdout)
    return {"our_tpot_s": j["tpot_s"], **split_ours(j["operators"]["decode"]), "our_error": ""}


def run(backends, gpus, jobs: int) -> list[dict]:
    import importlib.metadata as md
    cli_estimate = require_aiconfigurator()
    cases = [(b, g, n) for b in backends for g in gpus for n in BATCHES]
    stamp = {"llmplan_commit": _git_describe(),
             "aiconfigurator_version": md.version("aiconfigurator"),
             "date": dt.date.today().isoformat()}
    rows = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(ours, *c) for c in cases]
        for (b, g, n), fut in zip(cases, futures, strict=True):
            row = {"backend": b, "gpu": g, "batch": n, **theirs(cli_estimate, b, g, n),
                   **fut.result(), **stamp}
            row["tpot_ratio"] = _ratio(row.get("our_tpot_s"), row.get("their_tpot_s"))
            rows.append(row)
            print(f"{b} {g} b{n}", file=sys.stderr, flush=True)
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else "" if v is None else v)
                        for k, v in ((k, r.get(k)) for k in COLUMNS)})


def read_csv(path: Path) -> list[dict]:
    """Rows as `run` returns them: the batch as int, times and ratios as float."""
    return read_typed_csv(path, COLUMNS, ints={"batch"})


def _ms(x) -> str:
    return f"{x * 1e3:7.2f}" if isinstance(x, float) else f"{'-':>7}"


def print_rows(rows: list[dict]) -> None:
    print(f"{'backend':7} {'gpu':8} {'batch':>5} {'TPOT':>7} {'ours':>7} {'ratio':>6}  "
          f"{'MLA':>7} {'ours':>7}  {'MoE':>7} {'ours':>7}  {'AR ours':>7}  (ms a step)")
    for r in rows:
        ratio = f"{r['tpot_ratio']:6.2f}" if r.get("tpot_ratio") else f"{'-':>6}"
        print(f"{r['backend']:7} {r['gpu']:8} {r['batch']:5d} {_ms(r.get('their_tpot_s'))} "
              f"{_ms(r.get('our_tpot_s'))} {ratio}  {_ms(r.get('their_mla_s'))} "
              f"{_ms(r.get('our_mla_s'))}  {_ms(r.get('their_moe_s'))} "
              f"{_ms(r.get('our_moe_s'))}  {_ms(r.get('our_comm_s'))}  "
              f"{r.get('their_error') or r.get('our_error') or ''}")
    for b in sorted({r["backend"] for r in rows}):
        rs = [r["tpot_ratio"] for r in rows if r["backend"] == b and r.get("tpot_ratio")]
        if rs:
            print(f"{b}: TPOT ours / theirs median {statistics.median(rs):.2f} "
                  f"({min(rs):.2f}-{max(rs):.2f}, {len(rs)} cases)")


def main() -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", action="append", choices=sorted(BACKENDS))
    ap.add_argument("--gpu", action="append", choices=sorted(GPUS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--from-csv", action="store_true", help="re-print --csv; runs nothing")
    a = ap.parse_args()
    if a.jobs < 1:
        ap.error(f"--jobs {a.jobs}: must be 1 or more")
    if a.from_csv:
        rows = read_recorded(a.csv, read_csv)
    else:
        rows = run(a.backend or list(BACKENDS), a.gpu or list(GPUS), a.jobs)
        write_csv(rows, a.csv)
    print_rows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
