"""llmplan's static TTFT and TPOT against NVIDIA aiconfigurator's measured-kernel figures.

    python -m venv /tmp/venv-aic && /tmp/venv-aic/bin/pip install aiconfigurator -e .
    /tmp/venv-aic/bin/python benchmarks/aiconfigurator_compare.py            # full grid
    /tmp/venv-aic/bin/python benchmarks/aiconfigurator_compare.py --quick    # a few cases
    python benchmarks/aiconfigurator_compare.py --from-csv                   # re-print the
                                                                             # recorded CSV

aiconfigurator (https://github.com/ai-dynamo/aiconfigurator, PyPI `aiconfigurator`) predicts a
static batch from GEMM, attention, MoE and all-reduce kernels timed on real GPUs, one table per
GPU, backend and backend version; the tables ship inside its wheel (the `aiconfigurator-core`
package, `systems/data/<system>/<op>/<backend>/<version>/*.parquet`). Its static mode
(`cli_estimate(..., mode="static")`, i.e. `InferenceSession.run_static`) sums the kernels of one
prefill of the whole batch (TTFT) and of every decode step (TPOT = generation time / (osl - 1));
norms, activations and embeddings come from its formulas ("empirical"), and no host-side step
cost is added in that mode. Each case here is run there with its vllm or trtllm tables and here
with `llmplan estimate --engine vllm|trtllm` (a subprocess: the CLI's --json contract), and the
ratio ours / theirs is reported. An external comparison, not a fit: nothing is tuned on it.

A case is counted in the summary only where both tools say the deployment fits in memory. The
rows go to benchmarks/results/aiconfigurator_compare.csv, each stamped with aiconfigurator's
version, the database (system, backend, version) it used and this benchmark's version.
This file is a benchmark: no test imports it, and CI has no aiconfigurator.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CSV = ROOT / "benchmarks" / "results" / "aiconfigurator_compare.csv"
BENCH_VERSION = 2  # bump when the grid, the mapping of a case or the summary changes
# 2 (2026-12-05): fp8 cases priced as a checkpoint with a static activation scale, as the
# tables' fp8 GEMMs were timed, not as --weights fp8 (quantized at load, a scale per tensor
# found at run time: one more read of each input, Engine.fp8_dynamic_tensor_reads)
BAND = (0.85, 1.15)  # issue 24: ours / theirs within this range

# llmplan model -> aiconfigurator's HF id (one of its bundled configs) and the TP sizes tried.
MODELS: dict[str, tuple[str, tuple[int, ...]]] = {
    "llama-3.1-8b": ("meta-llama/Meta-Llama-3.1-8B", (1, 2)),
    "qwen3-8b": ("Qwen/Qwen3-8B", (1,)),
    "qwen3-32b": ("Qwen/Qwen3-32B", (1, 2, 4)),
    "llama-3.1-70b": ("meta-llama/Meta-Llama-3.1-70B", (2, 4, 8)),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", (1, 2)),  # MoE: experts split by TP (moe_tp = tp)
    "gpt-oss-20b": ("openai/gpt-oss-20b", (1,)),
    "gpt-oss-120b": ("openai/gpt-oss-120b", (1, 2)),
}
MOE_MODELS = {"qwen3-30b-a3b", "gpt-oss-20b", "gpt-oss-120b"}
# the weights a model is compared in where not PRECISIONS: gpt-oss as it ships, its routed
# experts in MXFP4 and everything else in bf16 (their moe table's w4a16_mxfp4 rows)
MODEL_WEIGHTS = {"gpt-oss-20b": ("mxfp4",), "gpt-oss-120b": ("mxfp4",)}
# llmplan GPU -> aiconfigurator system
GPUS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "a100-sxm-80gb": "a100_sxm", "l40s": "l40s",
        "b200": "b200_sxm"}
# aiconfigurator backend -> llmplan engine profile
BACKENDS = {"vllm": "vllm", "trtllm": "trtllm"}
BATCHES = (1, 8, 32, 128)
LENGTHS = ((1024, 256), (1024, 1024), (4096, 256), (4096, 1024))  # (isl, osl)
# weights: the GEMMs (and MoE experts) in this type; KV cache and attention stay bf16 in both
PRECISIONS = ("bf16", "fp8")
AIC_QUANT = {"bf16": "bfloat16", "fp8": "fp8", "mxfp4": "bfloat16"}  # the GEMMs'
AIC_MOE_QUANT = {"bf16": "bfloat16", "fp8": "fp8", "mxfp4": "w4a16_mxfp4"}  # the experts'


@dataclass(frozen=True)
class Case:
    backend: str
    model: str
    gpu: str
    tp: int
    weights: str
    batch: int
    isl: int
    osl: int

    @property
    def label(self) -> str:
        return (f"{self.model} {self.gpu} tp{self.tp} {self.weights} b{self.batch} "
                f"{self.isl}/{self.osl}")


def grid(backends, gpus, models, quick: bool) -> list[Case]:
    if quick:
        return [Case(b, m, g, tp, w, bs, 1024, 256)
                for b in backends for g in gpus
                for m, tp in (("llama-3.1-8b", 1), ("llama-3.1-70b", 4)) if m in models
                for w in PRECISIONS for bs in (1, 32)]
    return [Case(b, m, g, tp, w, bs, isl, osl)
            for b in backends for g in gpus for m in models for tp in MODELS[m][1]
            for w in MODEL_WEIGHTS.get(m, PRECISIONS) for bs in BATCHES
            for isl, osl in LENGTHS]


def require_aiconfigurator():
    """aiconfigurator's static estimate, or exit 2 with one line saying how to install it."""
    try:
        from aiconfigurator.cli.api import cli_estimate
    except ImportError:
        print("aiconfigurator is not installed: python -m venv /tmp/venv-aic && "
              "/tmp/venv-aic/bin/pip install aiconfigurator -e . (then run this script with "
              "/tmp/venv-aic/bin/python)", file=sys.stderr)
        raise SystemExit(2) from None
    import logging
    logging.disable(logging.WARNING)  # its table loader logs every fallback table it opens
    return cli_estimate


def _silicon_frac(latency_ms: dict, sources: dict) -> float | None:
    """Share of a phase's predicted time that comes from measured ("silicon") tables."""
    total = sum(latency_ms.values())
    if not total:
        return None
    return sum(v for k, v in latency_ms.items() if sources.get(k) == "silicon") / total


def theirs(cli_estimate, c: Case) -> dict:
    """aiconfigurator's static run of one case: TTFT, TPOT (s), OOM and provenance."""
    hf_id = MODELS[c.model][0]
    q = AIC_QUANT[c.weights]
    kw = dict(gemm_quant_mode=q, kvcache_quant_mode="bfloat16", fmha_quant_mode="bfloat16")
    if c.model in MOE_MODELS:
        kw.update(moe_quant_mode=AIC_MOE_QUANT[c.weights], moe_tp_size=c.tp, moe_ep_size=1)
    try:
        r = cli_estimate(hf_id, GPUS[c.gpu], mode="static", backend_name=c.backend,
                         isl=c.isl, osl=c.osl, batch_size=c.batch, tp_size=c.tp, **kw)
    except Exception as exc:  # a case it cannot run is recorded, not fatal
        return {"their_error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    s = r.summary
    return {
        "their_ttft_s": r.ttft / 1e3,  # its figures are in ms
        "their_tpot_s": r.tpot / 1e3,
        "their_fits": not s.check_oom(),
        "their_ttft_silicon_frac": _silicon_frac(s.get_context_latency_dict(),
                                                 s.get_context_source_dict()),
        "their_tpot_silicon_frac": _silicon_frac(s.get_generation_latency_dict(),
                                                 s.get_generation_source_dict()),
        "their_db": f"{GPUS[c.gpu]}/{c.backend}/{r.backend_version}",
        "their_error": "",
    }


_FP8_CHECKPOINTS = Path(tempfile.mkdtemp(prefix="llmplan-aic-"))
atexit.register(shutil.rmtree, _FP8_CHECKPOINTS, ignore_errors=True)
_FP8_LOCK = threading.Lock()  # ours() runs in a thread pool


def fp8_checkpoint(model: str) -> Path:
    """models_db's ``model`` as an fp8 checkpoint with one static activation scale per
    tensor (``quantization_config``: fp8, activation_scheme static): what aiconfigurator's
    fp8 GEMMs were timed with (its vLLM collector builds Fp8Config(activation_scheme=
    "static"); TensorRT-LLM serves ModelOpt's static FP8 checkpoints), where ``--weights
    fp8`` over the 16-bit model is vLLM's --quantization fp8, a scale found at run time."""
    path = _FP8_CHECKPOINTS / f"{model}-fp8-static.yaml"
    with _FP8_LOCK:
        if not path.exists():
            text = (ROOT / "models_db" / f"{model}.yaml").read_text()
            path.write_text(text.rstrip("\n") + "\nquantization_config:\n"
                            "  quant_method: fp8\n  activation_scheme: static\n")
    return path


def ours(c: Case) -> dict:
    """`llmplan estimate --json` for one case, with the engine profile of its backend; fp8
    weights as a checkpoint with static activation scales (``fp8_checkpoint``); a model's
    own weights (``MODEL_WEIGHTS``) as its checkpoint states them (gpt-oss: MXFP4 routed
    experts, the rest bf16; --weights mxfp4 would quantize every layer)."""
    model = ["-m", str(fp8_checkpoint(c.model))] if c.weights == "fp8" else \
        ["-m", c.model] if c.weights in MODEL_WEIGHTS.get(c.model, ()) else \
        ["-m", c.model, "--weights", c.weights]  # gpt-oss as it ships: MXFP4 experts alone
    cmd = [sys.executable, "-m", "planner", "estimate", *model, "-g", c.gpu,
           "-e", BACKENDS[c.backend], "--tp", str(c.tp),
           "--kv-cache", "bf16", "-b", str(c.batch), "-p", str(c.isl), "-o", str(c.osl),
           "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode != 0:
        return {"our_error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]}
    j = json.loads(p.stdout)
    return {"our_ttft_s": j["ttft_s"], "our_tpot_s": j["tpot_s"], "our_fits": j["fits"],
            "our_decode_overhead_s": j.get("decode_overhead_s"),
            "our_engine": j["engine"]["name"], "our_error": ""}


def _git_describe() -> str:
    """The llmplan commit the figures come from (engine profiles included), `-dirty` if edited."""
    p = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                       text=True, cwd=ROOT)
    return p.stdout.strip() or "unknown"


def _ratio(a, b):
    return a / b if a and b else None


def run(cases: list[Case], jobs: int) -> list[dict]:
    cli_estimate = require_aiconfigurator()
    import importlib.metadata as md
    stamp = {"llmplan_commit": _git_describe(),
             "aiconfigurator_version": md.version("aiconfigurator"),
             "aiconfigurator_core_version": md.version("aiconfigurator-core"),
             "bench_version": BENCH_VERSION,
             "date": dt.date.today().isoformat()}
    rows = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # ours in subprocesses, theirs here
        futures = [pool.submit(ours, c) for c in cases]
        for i, (c, fut) in enumerate(zip(cases, futures, strict=True), 1):
            row = {**asdict(c), **theirs(cli_estimate, c), **fut.result(), **stamp}
            row["ttft_ratio"] = _ratio(row.get("our_ttft_s"), row.get("their_ttft_s"))
            row["tpot_ratio"] = _ratio(row.get("our_tpot_s"), row.get("their_tpot_s"))
            rows.append(row)
            print(f"[{i}/{len(cases)}] {c.backend} {c.label}", file=sys.stderr, flush=True)
    return rows


COLUMNS = ["backend", "model", "gpu", "tp", "weights", "batch", "isl", "osl",
           "their_ttft_s", "our_ttft_s", "ttft_ratio", "their_tpot_s", "our_tpot_s",
           "tpot_ratio", "their_fits", "our_fits", "their_ttft_silicon_frac",
           "their_tpot_silicon_frac", "our_decode_overhead_s", "their_db", "our_engine",
           "their_error", "our_error", "llmplan_commit", "aiconfigurator_version",
           "aiconfigurator_core_version", "bench_version", "date"]


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(r.get(k)) for k in COLUMNS})


def read_recorded(path: Path, read) -> list[dict]:
    """``read(path)``, or exit 2 with one line where the recorded CSV cannot be read."""
    try:
        return read(path)
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as err:
        print(f"{Path(sys.argv[0]).stem}: {path}: cannot read the recorded rows: {err}",
              file=sys.stderr)
        raise SystemExit(2) from None


def read_typed_csv(path: Path, columns: list[str], ints=frozenset(),
                   bools=frozenset()) -> list[dict]:
    """A recorded CSV's rows, each of ``columns`` required: ``ints`` as int, ``bools`` as
    bool, the times, ratios and fractions (``_s``, ``_ratio``, ``_frac``) as float, an empty
    cell as None (``csv.Error`` where a column is missing)."""
    floats = {k for k in columns if k.endswith(("_s", "_ratio", "_frac"))}

    def parse(k: str, v: str):
        if v == "":
            return None
        if k in ints:
            return int(v)
        if k in bools:
            return v == "True"
        return float(v) if k in floats else v
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [k for k in columns if k not in (reader.fieldnames or ())]
        if missing:
            raise csv.Error(f"no column {', '.join(missing)}")
        return [{k: parse(k, v) for k, v in r.items()} for r in reader]


def read_csv(path: Path) -> list[dict]:
    """Rows as `run` returns them: counts as int, times and ratios as float, flags as bool."""
    return read_typed_csv(path, COLUMNS, ints={"tp", "batch", "isl", "osl", "bench_version"},
                          bools={"their_fits", "our_fits"})


def _ms(x) -> str:
    return f"{x * 1e3:9.2f}" if isinstance(x, (int, float)) else f"{'-':>9}"


def _x(x) -> str:
    return f"{x:6.2f}" if isinstance(x, (int, float)) else f"{'-':>6}"


def print_rows(rows: list[dict]) -> None:
    print(f"{'backend':7} {'case':44} {'TTFT ms':>9} {'ours':>9} {'ratio':>6} "
          f"{'TPOT ms':>9} {'ours':>9} {'ratio':>6}  note")
    for r in rows:
        c = Case(**{k: r[k] for k in Case.__dataclass_fields__})
        note = "" if compared(r) else ("error" if r.get("their_error") or r.get("our_error")
                                       else "OOM")
        print(f"{r['backend']:7} {c.label:44} {_ms(r.get('their_ttft_s'))} "
              f"{_ms(r.get('our_ttft_s'))} {_x(r.get('ttft_ratio'))} "
              f"{_ms(r.get('their_tpot_s'))} {_ms(r.get('our_tpot_s'))} "
              f"{_x(r.get('tpot_ratio'))}  {note}")


def compared(r: dict) -> bool:
    """A case enters the summary when both ran it and both say it fits in memory."""
    return bool(r.get("ttft_ratio") and r.get("tpot_ratio") and r.get("their_fits")
                and r.get("our_fits"))


def quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stats(ratios: list[float]) -> str:
    inside = sum(BAND[0] <= x <= BAND[1] for x in ratios) / len(ratios)
    return (f"median {statistics.median(ratios):5.2f}  p10-p90 {quantile(ratios, 0.1):4.2f}-"
            f"{quantile(ratios, 0.9):4.2f}  within {BAND[0]}-{BAND[1]}: {inside:4.0%}")


def print_summary(rows: list[dict]) -> None:
    used = [r for r in rows if compared(r)]
    print(f"\nours / aiconfigurator, cases both run and both fit: {len(used)} of {len(rows)}")
    groups: dict[tuple, list[dict]] = {}
    for r in used:
        groups.setdefault((r["backend"],), []).append(r)
        groups.setdefault((r["backend"], r["gpu"]), []).append(r)
        groups.setdefault((r["backend"], r["model"]), []).append(r)
        groups.setdefault((r["backend"], f"batch {r['batch']}"), []).append(r)
        groups.setdefault((r["backend"], r["weights"]), []).append(r)
    for key in sorted(groups, key=lambda k: (k[0], len(k), str(k[1:]))):
        g = groups[key]
        name = " ".join(str(k) for k in key)
        print(f"{name:28} n={len(g):3}  TPOT {stats([r['tpot_ratio'] for r in g])}")
        print(f"{'':28} {'':5}  TTFT {stats([r['ttft_ratio'] for r in g])}")
    dbs = sorted({r["their_db"] for r in rows if r.get("their_db")})
    vers = sorted({str(r.get("aiconfigurator_version")) for r in rows})
    print(f"aiconfigurator {', '.join(vers)}; databases: {', '.join(dbs)}")


def rerun_ours(rows: list[dict], jobs: int, backends) -> list[dict]:
    """The recorded rows with our side computed again at this commit and theirs kept as
    recorded (aiconfigurator need not be installed): for a change of llmplan's profiles."""
    keep = [r for r in rows if not backends or r["backend"] in backends]
    cases = [Case(*(r[k] for k in ("backend", "model", "gpu", "tp", "weights", "batch", "isl",
                                   "osl"))) for r in keep]
    stamp = {"llmplan_commit": _git_describe(), "bench_version": BENCH_VERSION,
             "date": dt.date.today().isoformat()}
    out = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for r, new in zip(keep, pool.map(ours, cases), strict=True):
            row = {**r, **new, **stamp}
            row["ttft_ratio"] = _ratio(row.get("our_ttft_s"), row.get("their_ttft_s"))
            row["tpot_ratio"] = _ratio(row.get("our_tpot_s"), row.get("their_tpot_s"))
            out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", action="append", choices=sorted(BACKENDS),
                    help="aiconfigurator backend (repeatable; default: all)")
    ap.add_argument("--gpu", action="append", choices=sorted(GPUS),
                    help="GPU (repeatable; default: all)")
    ap.add_argument("--model", action="append", choices=sorted(MODELS),
                    help="model (repeatable; default: all)")
    ap.add_argument("--quick", action="store_true", help="a few cases, to check the set-up")
    ap.add_argument("--jobs", type=int, default=2, help="llmplan subprocesses at once")
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="rows to this CSV")
    ap.add_argument("--from-csv", action="store_true",
                    help="re-print the table and summary from --csv; runs nothing")
    ap.add_argument("--ours-from-csv", action="store_true",
                    help="read --csv, compute our side again (their recorded figures kept; "
                    "aiconfigurator not needed) and write it back")
    ap.add_argument("--no-rows", action="store_true", help="the summary only")
    a = ap.parse_args()
    if a.from_csv:
        rows = read_recorded(a.csv, read_csv)
    elif a.ours_from_csv:
        rows = rerun_ours(read_recorded(a.csv, read_csv), a.jobs, a.backend)
        if not a.backend:
            write_csv(rows, a.csv)
            print(f"{len(rows)} rows -> {a.csv}", file=sys.stderr)
    else:
        cases = grid(a.backend or list(BACKENDS), a.gpu or list(GPUS), a.model or list(MODELS),
                     a.quick)
        rows = run(cases, a.jobs)
        write_csv(rows, a.csv)
        print(f"{len(rows)} rows -> {a.csv}", file=sys.stderr)
    if not a.no_rows:
        print_rows(rows)
    print_summary(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
