"""A sweep of 1,000,000 configurations to a CSV: wall time and peak memory (max RSS).

Target (issue 3): at most 3 s and 1.5 GB. Runs the CLI as a user would, in a subprocess:
    python benchmarks/bench_sweep.py [--out /tmp/sweep.csv]
The grid: 1 model x 4 GPUs x 250 batches x 125 prompt lengths x 8 output lengths.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/llmplan-sweep-1m.csv")
    args = ap.parse_args()
    exe = shutil.which("llmplan")
    base = [exe] if exe else [sys.executable, "-m", "planner"]
    cmd = base + ["sweep", "-m", "llama-3.1-8b", "-g", "h100-sxm,h200,a100-sxm-80gb,mi300x",
                  "-b", "1..250+1", "-p", "128..8064+64",
                  "-o", "64,256,1024,2048,4096,8192,16384,32768", "--csv", args.out]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode:
        sys.exit(r.stderr)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    with open(args.out, "rb") as f:
        rows = sum(1 for _ in f) - 1
    size = os.path.getsize(args.out)
    print(f"sweep to CSV: {rows:,} rows in {wall:.2f} s wall (process start to exit), "
          f"peak RSS {rss / 1e9:.2f} GB, file {size / 1e6:,.0f} MB, {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
