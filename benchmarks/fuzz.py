"""Fuzz the CLI as subprocesses: bad values and corrupted files, counted by outcome.

    python benchmarks/fuzz.py --cases 10000 --jobs 8 --failures-out fuzz-failures.jsonl

Each case runs one `llmplan` command in a fresh process with a mutated argument or input
file. The contract (DESIGN: bad input) is exit 0 / 1 / 2 with, on exit 2, one line on
stderr; a case fails when it prints a traceback, exits with another code, writes a
multi-line error, or runs past --timeout-s and HANG_FACTOR times its command's clean run
(a hang). A mutation that writes an
out-of-range number (NaN, inf, a negative, a bool, 1e30) into a numeric field and still
exits 0 is listed as a *suspect acceptance* for a person to look at: some fields
legitimately take 0 or a negative (an offset), so it is not counted as a failure.

Set-up measures a quick CPU calibration and one tiny `measure` run so that calibration
and results files are real ones before they are corrupted (about 20 s). The case list is
a pure function of --seed, so a failure reproduces with the same seed and its index.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLMPLAN = [sys.executable, "-m", "planner"]

BAD_YAML_VALUES = [".nan", ".inf", "-.inf", "-1", "0", "true", "false", "1e30",
                   "100000000000000000000000", "-0.5", "'abc'", "[]", "{}", "null", "",
                   "0x1F", "1_000", "2.5", "9" * 400]
BAD_JSON_VALUES = ["NaN", "Infinity", "-Infinity", "-1", "0", "true", "1e999", "1e30",
                   '"x"', "null", "[]", "{}", "-0.5", "9" * 400]
OUT_OF_RANGE = {".nan", ".inf", "-.inf", "-1", "true", "false", "1e30", "-0.5",
                "100000000000000000000000", "9" * 400, "NaN", "Infinity", "-Infinity",
                "1e999"}
BAD_CLI_VALUES = ["nan", "inf", "-inf", "-1", "0", "1e999", "1e30", "0x10", "", "true",
                  "abc", "1,2", "-0", "1e-320", "9" * 400, "\u00e9", "1..3", "[1]"]

BASE = ["-m", "llama-3.1-8b", "-g", "h100-sxm"]
CLI_OPTIONS = {  # command line -> options that take a value
    ("estimate", *BASE): ["--batch", "--prompt-tokens", "--output-tokens", "--tp",
                          "--group-size", "--kernel-overhead-us", "--reserve-gib",
                          "--memory-utilization", "--prefill-chunk-tokens",
                          "--price-per-hour", "--measured-tpot", "--measured-ttft",
                          "--weights", "--kv-cache", "--engine", "--calibration", "-m", "-g",
                          "--quantized-layers"],
    ("sweep", *BASE): ["-b", "-p", "-o", "--tp", "--weights", "--engine", "--csv"],
    ("simulate", *BASE, "-n", "20"): ["--request-rate", "--burstiness",
                                      "--max-concurrency", "--range-ratio", "--seed",
                                      "--max-num-seqs", "--max-num-batched-tokens",
                                      "--block-size", "--max-model-len", "--ttft-slo",
                                      "--tpot-slo", "-n", "--dataset", "--trace"],
    ("simulate", *BASE, "-n", "20", "--scheduler", "dynamic"): ["--max-wait"],
    ("plan", *BASE, "--ttft", "2s", "--tpot", "50ms", "--scheduler", "static"):
        ["--rps", "--ttft", "--tpot", "-p", "-o", "--weights", "--plot"],
    ("check", "examples/budget.yaml"): ["--engine", "--junit", "--calibration"],
    ("validate",): ["--engine", "--source", "--csv", "--served-dataset"],
    ("compare", "tests/fixtures/servers/vllm_bench_serve.json", *BASE):
        ["--tp", "--engine", "--weights", "--plot", "-m", "-g"],
    ("calibrate", "tests/fixtures/servers/vllm_bench_serve.json", *BASE, "--no-leave-one-out"):
        ["--out", "--name", "--base-engine", "--tp"],
    ("watch", "http://127.0.0.1:9/metrics", *BASE, "--once", "--timeout", "1"):
        ["--interval", "--timeout", "--count", "--serve-metrics", "--model-name"],
}
PATH_OPTIONS = {"--csv", "--trace", "--junit", "--plot", "--dataset", "--calibration",
                "--served-dataset",
                "--engine", "-m", "-g", "--source", "--out", "--base-engine"}
SERVED_READ = re.compile(r"^((mean|median|p90|p99)_(ttft|tpot|itl|e2el|e2e_latency)_ms|completed|"
                         r"total_(input|output)_tokens|request_rate|max_concurrency|"
                         r"request_throughput|output_throughput|total_token_throughput)$")
CALIBRATION_READ = {"memory_bandwidth_gb_per_s", "bf16", "fp16", "fp8", "int8",
                    "kernel_overhead_us"}


@dataclass
class Case:
    index: int
    kind: str
    args: list[str]
    files: dict[str, bytes] = field(default_factory=dict)  # name -> content, in a temp dir
    out_of_range: bool = False
    what: str = ""


@dataclass
class Outcome:
    case: Case
    code: int | None
    stderr: str
    seconds: float

    @property
    def verdict(self) -> str:
        if self.code is None:
            return "hang"
        if "Traceback" in self.stderr:
            return "traceback"
        if self.code not in (0, 1, 2):
            return f"exit {self.code}"
        if self.code == 2 and len(self.stderr.strip().splitlines()) != 1:
            return "multi-line error"
        if self.code == 0 and self.case.out_of_range:
            return "suspect acceptance"
        return "ok"


# ---------------------------------------------------------------- mutations
NUMERIC_YAML = re.compile(
    r"^(\s*(?:- )?[A-Za-z_][\w.-]*:\s*)(-?[\d.]+(?:e[+-]?\d+)?)(\s*(?:#.*)?)$")
NUMERIC_JSON = re.compile(r'("[\w.-]+"\s*:\s*)(-?[\d.]+(?:e[+-]?\d+)?)')


def mutate_text(rng: random.Random, data: bytes, is_json: bool) -> tuple[bytes, bool, str]:
    """One corruption of a YAML / JSON / JSONL file: (content, out of range?, description)."""
    text = data.decode()
    lines = text.splitlines(keepends=True)
    choice = rng.random()
    if choice < 0.55:  # a numeric value replaced
        if is_json:
            spots = list(NUMERIC_JSON.finditer(text))
            if spots:
                m = rng.choice(spots)
                bad = rng.choice(BAD_JSON_VALUES)
                new = text[:m.start(2)] + bad + text[m.end(2):]
                return new.encode(), bad in OUT_OF_RANGE, f"{m.group(1).strip()} {bad}"
        else:
            spots = [i for i, ln in enumerate(lines) if NUMERIC_YAML.match(ln.rstrip("\n"))]
            if spots:
                i = rng.choice(spots)
                m = NUMERIC_YAML.match(lines[i].rstrip("\n"))
                bad = rng.choice(BAD_YAML_VALUES)
                lines[i] = f"{m.group(1)}{bad}{m.group(3)}\n"
                return "".join(lines).encode(), bad in OUT_OF_RANGE, f"{m.group(1).strip()} {bad}"
    if choice < 0.65:  # a byte that is not UTF-8
        pos = rng.randrange(len(data) + 1)
        return data[:pos] + bytes([rng.choice([0xff, 0xfe, 0xc3, 0x80, 0x00])]) + data[pos:], \
            False, f"byte at {pos}"
    if choice < 0.75:  # truncated
        pos = rng.randrange(len(data) + 1)
        return data[:pos], False, f"truncated at {pos}"
    if choice < 0.85 and lines:  # a line deleted
        i = rng.randrange(len(lines))
        return "".join(lines[:i] + lines[i + 1:]).encode(), False, f"line {i + 1} deleted"
    if choice < 0.92 and lines:  # a line duplicated or its indentation broken
        i = rng.randrange(len(lines))
        lines.insert(i, " " * rng.randrange(5) + lines[i].lstrip())
        return "".join(lines).encode(), False, f"line {i + 1} repeated"
    special = rng.choice([
        b"", b"\n", b"[]", b"null", b"42", b'"text"',
        b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
            f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n".encode()
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
        b"[" * 5000 + b"]" * 5000, b"x: " + b"9" * 5000 + b"\n",
        # the input boundary's classes (issue 27): nesting past libyaml's composer and past
        # Python's recursion limit, block and flow; a float literal beyond a float; not a file
        b"- " * 50_000 + b"x\n", b"{a: " * 50_000 + b"1" + b"}" * 50_000,
        b"deployments: " + b"[" * 999 + b"]" * 999 + b"\n",
        b"".join(b"  " * i + b"- a:\n" for i in range(1000)), b"x: 1.0e+999\n",
        b'{"x": ' + b"9" * 5000 + b"}", FIFO, DIRECTORY,
    ])
    return special, False, f"replaced by {special[:20]!r}"


FIFO, DIRECTORY = b"\0fifo\0", b"\0directory\0"  # written as a named pipe / a folder


def mutate_jsonl(rng: random.Random, data: bytes) -> tuple[bytes, bool, str]:
    """One line of a JSON Lines file corrupted, the others kept."""
    lines = data.splitlines(keepends=True)
    i = rng.randrange(len(lines))
    new, oor, what = mutate_text(rng, lines[i], is_json=True)
    return b"".join(lines[:i]) + new + b"".join(lines[i + 1:]), oor, f"line {i + 1}: {what}"


# ---------------------------------------------------------------- cases
def file_targets(setup: Path) -> list[tuple[str, Path, list[str], bool]]:
    """(kind, source file, command with FILE as placeholder, json?)."""
    out = []
    for p in sorted((ROOT / "models_db").glob("*.yaml")):
        out.append(("model", p, ["estimate", "-m", "FILE", "-g", "h100-sxm", "--json"], False))
    for p in sorted((ROOT / "tests" / "fixtures" / "hf").glob("*.json")):
        out.append(("hf-config", p, ["estimate", "-m", "FILE", "-g", "h100-sxm", "--json"], True))
    for p in sorted((ROOT / "hardware_db").glob("*.yaml")):
        out.append(("gpu", p, ["estimate", "-m", "llama-3.1-8b", "-g", "FILE", "--json"], False))
    for p in sorted((ROOT / "engines_db").glob("*.yaml")):
        out.append(("engine", p, ["estimate", *BASE, "--engine", "FILE", "--json"], False))
    for p in sorted((ROOT / "examples").glob("budget*.yaml")):
        out.append(("budget", p, ["check", "FILE"], False))
    for p in sorted((ROOT / "planner" / "data" / "validation").glob("*.yaml")):
        out.append(("validation", p, ["validate", "--dataset", "FILE", "--no-rows"], False))
    out.append(("calibration", setup / "calibration.yaml",
                ["estimate", "-m", "gpt2", "-g", "h100-sxm", "--calibration", "FILE", "--json"],
                False))
    for p in sorted((ROOT / "tests" / "fixtures" / "servers").glob("*_bench_serv*.json*")):
        out.append(("served", p, ["compare", "FILE", *BASE, "--json"], True))
    out.append(("dataset", setup / "dataset.jsonl",
                ["simulate", *BASE, "--dataset", "FILE", "-n", "20", "--json"], True))
    return out


def hf_fields_read() -> set[str]:
    """The config.json keys the planner reads: a mutation of any other key is ignored by
    design (``initializer_range: NaN`` changes no estimate), so it is no suspect."""
    text = (ROOT / "planner" / "io" / "catalog.py").read_text()
    return set(re.findall(r'(?:_req\(cfg, |cfg\.get\(|cfg\[)"(\w+)"', text))


def make_cases(n: int, seed: int, setup: Path) -> list[Case]:
    rng = random.Random(seed)
    targets = file_targets(setup)
    results = setup / "results.jsonl"
    cli = [(cmd, opt) for cmd, opts in CLI_OPTIONS.items() for opt in opts]
    hf_read = hf_fields_read()
    cases = []
    for i in range(n):
        r = rng.random()
        if r < 0.30:  # a bad value on the command line
            cmd, opt = rng.choice(cli)
            value = rng.choice(BAD_CLI_VALUES)
            numeric = opt not in PATH_OPTIONS  # "nan" is a fine file name
            # a rate that parses to inf (also 1e999 and 400 nines) sends all at t = 0
            legit = opt == "--request-rate" and value in ("inf", "1e999", "9" * 400)
            cases.append(Case(i, "cli", [*cmd, opt, value], out_of_range=numeric and value in
                              {"nan", "inf", "-inf", "-1", "1e999", "1e30", "9" * 400}
                              and not legit,
                              what=f"{cmd[0]} {opt} {value!r}"))
        elif r < 0.95:
            kind, src, cmd, is_json = rng.choice(targets)
            content, oor, what = mutate_text(rng, src.read_bytes(), is_json)
            if kind == "hf-config" and what.split('"')[1:2] and \
                    what.split('"')[1] not in hf_read:
                oor = False
            if kind == "served" and not SERVED_READ.match(what.split('"')[1] if '"' in what
                                                          else ""):
                oor = False  # a key compare does not read (std_ttft_ms, date, ...)
            if kind == "calibration" and what.split(":")[0].strip("- ") not in CALIBRATION_READ:
                oor = False  # the raw timings under details: are a record, not an input
            name = "input" + src.suffix
            args = [name if a == "FILE" else a for a in cmd]
            cases.append(Case(i, kind, args, {name: content}, oor, f"{src.name}: {what}"))
        else:  # a corrupted results file resumed by measure
            content, oor, what = mutate_jsonl(rng, results.read_bytes())
            args = ["measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1", "-c",
                    "32", "--calibration", str(setup / "calibration.yaml"), "--out",
                    "results.jsonl", "--resume", "--budget-s", "0.01", "--threads", "1"]
            cases.append(Case(i, "results", args, {"results.jsonl": content}, False,
                              f"results.jsonl {what}"))
    return cases


def run_case(case: Case, timeout_s: float) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="llmplan-fuzz-") as d:
        for name, content in case.files.items():
            if content == FIFO and hasattr(os, "mkfifo"):
                os.mkfifo(Path(d) / name)  # a read that opens it would hang: a failure
            elif content == DIRECTORY:
                (Path(d) / name).mkdir()
            else:
                (Path(d) / name).write_bytes(content)
        if case.args and case.args[0] == "check" and "examples/budget.yaml" in case.args:
            case_args = [str(ROOT / a) if a.startswith("examples/") else a for a in case.args]
        else:
            case_args = case.args
        t0 = time.perf_counter()
        env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT)}
        try:
            p = subprocess.run([*LLMPLAN, *case_args], cwd=d, capture_output=True, text=True,
                               timeout=timeout_s, env=env, errors="replace")
            return Outcome(case, p.returncode, p.stderr, time.perf_counter() - t0)
        except subprocess.TimeoutExpired:
            return Outcome(case, None, "", time.perf_counter() - t0)


# A case is a hang when it runs past --timeout-s and past this many times the clean run of its
# command: `validate` replays every published serving run through the simulator (36 s with a
# fuzz beside it on 2 cores), so a fixed 60 s called two of its cases hangs that were not.
HANG_FACTOR = 3.0


def clean_seconds(jobs: int, timeout_s: float) -> dict[str, float]:
    """Seconds each command takes on its unmutated base line (the first of CLI_OPTIONS)."""
    bases: dict[str, tuple] = {}
    for base in CLI_OPTIONS:
        bases.setdefault(base[0], base)
    cases = [Case(-1, "clean", list(b)) for b in bases.values()]
    with ThreadPoolExecutor(jobs) as pool:
        runs = list(pool.map(lambda c: run_case(c, 10 * timeout_s), cases))
    return {c.args[0]: o.seconds for c, o in zip(cases, runs, strict=True)}


def prepare(setup: Path) -> None:
    """A real calibration, results file and dataset to corrupt."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cal = setup / "calibration.yaml"
    subprocess.run([*LLMPLAN, "measure", "--device", "cpu", "--calibrate", "--quick-calibration",
                    "--threads", "1", "--calibration-out", str(cal)],
                   check=True, capture_output=True, env=env)
    subprocess.run([*LLMPLAN, "measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1,2",
                    "-c", "32", "--calibration", str(cal), "--out", str(setup / "results.jsonl"),
                    "--budget-s", "0.02", "--threads", "1",
                    # a busy machine's points are noisy; what is fuzzed is their file
                    "--max-spread", "1e6", "--max-drift", "1e6"],
                   check=True, capture_output=True, env=env)
    (setup / "dataset.jsonl").write_text("".join(
        json.dumps({"prompt_tokens": 100 * k + 7, "output_tokens": 20 + k}) + "\n"
        for k in range(1, 9)))


def _failure_line(o: Outcome) -> str:
    return json.dumps({"index": o.case.index, "verdict": o.verdict, "code": o.code,
                       "kind": o.case.kind, "what": o.case.what, "args": o.case.args,
                       "stderr": o.stderr[-4000:]}) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--failures-out", type=Path, help="JSONL of every failing case")
    ap.add_argument("--only", help="Run only the case with this index (reproduce a failure)")
    a = ap.parse_args()
    setup = Path(tempfile.mkdtemp(prefix="llmplan-fuzz-setup-"))
    t0 = time.perf_counter()
    prepare(setup)
    cases = make_cases(a.cases, a.seed, setup)
    if a.only is not None:
        cases = [cases[int(a.only)]]
    clean = clean_seconds(a.jobs, a.timeout_s)
    slow = {k: round(v, 1) for k, v in clean.items() if HANG_FACTOR * v > a.timeout_s}
    print(f"set-up {time.perf_counter() - t0:.1f} s; {len(cases)} cases, {a.jobs} jobs, "
          f"seed {a.seed}; longer limits for commands slow when clean (s): {slow}", flush=True)

    def limit_s(case: Case) -> float:
        return max(a.timeout_s, HANG_FACTOR * clean.get(case.args[0] if case.args else "", 0))

    t0 = time.perf_counter()
    outcomes: list[Outcome] = []
    # each failing case is written as it completes: a run stopped early keeps what it found
    fails_file = a.failures_out.open("w") if a.failures_out else None
    with ThreadPoolExecutor(a.jobs) as pool:
        for k, o in enumerate(pool.map(lambda c: run_case(c, limit_s(c)), cases), 1):
            outcomes.append(o)
            if fails_file is not None and o.verdict != "ok":
                fails_file.write(_failure_line(o))
                fails_file.flush()
            if k % 500 == 0:
                counts = collections.Counter(x.verdict for x in outcomes)
                print(f"  {k} cases, {time.perf_counter() - t0:.0f} s; "
                      + ", ".join(f"{v}: {n}" for v, n in sorted(counts.items())), flush=True)
    wall = time.perf_counter() - t0
    if fails_file is not None:
        fails_file.close()

    by_code = collections.Counter("hang" if o.code is None else o.code for o in outcomes)
    by_verdict = collections.Counter(o.verdict for o in outcomes)
    by_kind = collections.defaultdict(collections.Counter)
    for o in outcomes:
        by_kind[o.case.kind][o.verdict] += 1
    print(f"\n{len(outcomes)} cases in {wall:.0f} s ({len(outcomes) / wall:.1f} per s)")
    print("by exit code: " + ", ".join(f"{k}: {v}" for k, v in sorted(by_code.items(), key=str)))
    print("by verdict:   " + ", ".join(f"{k}: {v}" for k, v in sorted(by_verdict.items())))
    print(f"{'input':<12} " + " ".join(f"{v:>10}" for v in ("ok", "suspect", "failures")))
    for kind, c in sorted(by_kind.items()):
        fails = sum(v for k, v in c.items() if k not in ("ok", "suspect acceptance"))
        print(f"{kind:<12} {c['ok']:>10} {c['suspect acceptance']:>10} {fails:>10}")
    bad = [o for o in outcomes if o.verdict != "ok"]
    for o in bad[:40]:
        last = o.stderr.strip().splitlines()[-1:] or [""]
        print(f"[{o.verdict}] #{o.case.index} {o.case.kind}: {o.case.what[:70]} -> "
              f"{last[0][:110]}")
    shutil.rmtree(setup, ignore_errors=True)
    failures = sum(1 for o in bad if o.verdict != "suspect acceptance")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
