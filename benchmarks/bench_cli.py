"""Cold start of `llmplan estimate` (process start to exit), median of N runs.

Target (issue 3): at most 0.4 s median on a 2-core machine.
    python benchmarks/bench_cli.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

CMD = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "16",
       "--prompt-tokens", "2048", "--output-tokens", "256"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    exe = shutil.which("llmplan")
    cmd = [exe, *CMD] if exe else [sys.executable, "-m", "planner", *CMD]
    for variant, extra in (("table", []), ("--json", ["--json"])):
        subprocess.run(cmd + extra, check=True, capture_output=True)  # warm the page cache
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            subprocess.run(cmd + extra, check=True, capture_output=True)
            times.append(time.perf_counter() - t)
        print(f"llmplan estimate ({variant}): median {statistics.median(times):.3f} s, "
              f"min {min(times):.3f} s, max {max(times):.3f} s over {args.runs} runs "
              f"on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
