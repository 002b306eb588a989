"""Speed of `llmplan calibrate` on four result files, leave-one-out fits included (issue:
under 10 s; 108 s once on a quiet two-core machine), process start to exit.

The four files (--files published, the default) are R1-Benchmark's published runs of
Llama-3.1-8B FP8 on one H200 (planner/data/served/r1-benchmark.yaml): vLLM 0.8.2 at 1000 / 2000,
5000 / 1000 and 10000 / 500 tokens and SGLang 0.4.4 at 1000 / 2000, 50 requests at 10 req/s
each. --files fixtures takes the four tools' fixture files instead (tests/fixtures/servers:
vLLM, SGLang, guidellm, genai-perf; six runs of up to 200 requests, illustrative numbers).

    python benchmarks/bench_calibrate.py [--files published|fixtures] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVED = "planner/data/served/r1bench-llama31-8b-fp8-h200x1-"
FIX = "tests/fixtures/servers/"
FILES = {
    "published": ([f"{SERVED}vllm082-1000in-2000out.json", f"{SERVED}vllm082-5000in-1000out.json",
                   f"{SERVED}vllm082-10000in-500out.json",
                   f"{SERVED}sglang0443-1000in-2000out.json"],
                  ["-m", "llama-3.1-8b", "-g", "h200", "--weights", "fp8",
                   "--base-engine", "vllm@0.8.2"]),
    "fixtures": ([f"{FIX}vllm_bench_serve.json", f"{FIX}sglang_bench_serving.jsonl",
                  f"{FIX}guidellm_report.json", f"{FIX}genai_perf_profile_export.json"],
                 ["-m", "llama-3.1-8b", "-g", "h100-sxm"]),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", choices=sorted(FILES), default="published")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    files, setup = FILES[args.files]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, not an installed copy
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "planner", "calibrate", *files, *setup,
               "--out", str(Path(tmp) / "fitted.yaml"), "--json"]
        times, cpu, out = [], [], None
        for _ in range(args.runs):
            t, c = time.perf_counter(), _children_cpu_s()
            r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            times.append(time.perf_counter() - t)
            cpu.append(_children_cpu_s() - c)
            if r.returncode not in (0, 1):  # 1: a fit refused at a range's edge
                sys.exit(r.stderr)
            out = json.loads(r.stdout)
    print("llmplan calibrate " + " ".join(files[:1]) + f" ... ({len(files)} files, "
          f"{len(out['runs'])} runs) {' '.join(setup)}")
    print(f"  fitted {out['values']}" + (" (refused)" if out["refused"] else ""))
    print(f"  median {statistics.median(times):.2f} s, min {min(times):.2f} s over "
          f"{args.runs} run(s) on {os.cpu_count()} cores (target < 10 s); CPU (user + sys) "
          f"median {statistics.median(cpu):.2f} s, which other load on the machine moves less")


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


if __name__ == "__main__":
    main()
