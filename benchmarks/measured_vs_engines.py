"""Measured decode and prefill steps (`llmplan measure` JSON Lines) against every engine
profile's prediction for the same model, GPU, precision, batch and context.

    python benchmarks/measured_vs_engines.py results/gpu/*.jsonl [--csv out.csv]

The harness runs one model the way a tuned engine would (CUDA graphs on GPU, one step at a
time): no profile is fitted to it, so every figure here is held out. TPOT is compared at the
measured context (prompt = context, one output token); TTFT is the whole batch's prefill.
Points measured on a CPU are predicted on a hardware spec built from the file's recorded
calibration (no datasheet exists for a processor).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def predictions(rec: dict, engines: dict, gpu: str | None) -> dict[str, tuple[float, float]]:
    """engine name -> (predicted TPOT s, predicted TTFT s) for one measured point."""
    from harness.device import DeviceInfo
    from harness.measure import cpu_hardware
    from planner.core.estimate import estimate
    from planner.core.specs import Calibration, DType, Precision, Workload
    from planner.io import catalog

    c, env = rec["config"], rec["env"]
    m = catalog.load_model(c["model"])
    if c["layers"] != m.num_layers:
        m = m.model_copy(update={"num_layers": c["layers"]})
    dev = env["device"]
    name = gpu or dev.get("hardware_db")
    if name:
        hw = catalog.load_hardware(name)
    else:  # a CPU: its recorded calibration is its datasheet
        cal = Calibration(device=dev["name"], **env["calibration"])
        info = DeviceInfo(kind=dev["kind"], name=dev["name"], memory_bytes=dev["memory_bytes"],
                          torch_version=dev.get("torch_version", ""))
        hw = cpu_hardware(info, cal)
    prec = Precision(weights=DType(c["weights"]), kv_cache=DType(c["kv_cache"]))
    out = {}
    for ename, eng in engines.items():
        e = estimate(m, hw, precision=prec, engine=eng,
                     workload=Workload(batch=c["batch"], prompt_tokens=c["context"],
                                       output_tokens=1))
        out[ename] = (e.tpot_s, e.ttft_s)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--gpu", help="hardware_db entry (default: the one the harness matched)")
    ap.add_argument("--csv", type=Path, help="every comparison to this CSV")
    args = ap.parse_args()
    from harness.measure import load_done
    from planner.io import catalog

    engines = {n: catalog.load_engine(n) for n in catalog.engine_names()}
    rows = []
    for path in args.results:
        for rec in load_done(path).values():
            if rec.get("status") != "ok":
                continue
            tpot = rec["measured"]["tpot_s"]["median_s"]
            ttft = rec["measured"]["ttft_s"]
            c = rec["config"]
            for ename, (pt, pf) in predictions(rec, engines, args.gpu).items():
                rows.append({"file": path.name, "model": c["model"], "layers": c["layers"],
                             "model_layers": c.get("model_layers", c["layers"]),
                             "weights": c["weights"], "batch": c["batch"],
                             "context": c["context"], "engine": ename,
                             "measured_tpot_s": tpot, "predicted_tpot_s": pt,
                             "tpot_error": pt / tpot - 1, "measured_ttft_s": ttft,
                             "predicted_ttft_s": pf, "ttft_error": pf / ttft - 1})
    if not rows:
        print("no measured points (status ok) in the files given")
        return 1
    names = list(engines)
    print(f"{'model':<20}{'w':>5}{'B':>5}{'ctx':>6}{'TPOT ms':>9}  "
          + "".join(f"{n[:9]:>10}" for n in names) + "   (TPOT error per engine)")
    seen = []
    for r in rows:
        key = (r["file"], r["model"], r["layers"], r["weights"], r["batch"], r["context"])
        if key in seen:
            continue
        seen.append(key)
        errs = {x["engine"]: x["tpot_error"] for x in rows
                if (x["file"], x["model"], x["layers"], x["weights"], x["batch"],
                    x["context"]) == key}
        label = r["model"] + (f"/{r['layers']}L" if r["layers"] != r["model_layers"] else "")
        print(f"{label[:20]:<20}{r['weights']:>5}{r['batch']:>5}{r['context']:>6}"
              f"{r['measured_tpot_s'] * 1e3:>9.3f}  "
              + "".join(f"{errs[n]:>+10.1%}" for n in names))
    print("\nmedian |error| per engine, all points held out (no profile was fitted to them):")
    print(f"{'engine':<10}{'TPOT':>9}{'TTFT':>9}{'points':>8}")
    for n in names:
        sub = [x for x in rows if x["engine"] == n]
        print(f"{n:<10}{statistics.median(abs(x['tpot_error']) for x in sub):>9.1%}"
              f"{statistics.median(abs(x['ttft_error']) for x in sub):>9.1%}{len(sub):>8}")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
