"""Fuzz the CLI: bad values, corrupted files and hostile servers, counted by outcome.

    python benchmarks/fuzz.py --cases 10000 --jobs 1 --failures-out fuzz-failures.jsonl

Each case runs one `llmplan` (or `llmplan-check`) command line with a mutated argument, input
file or metrics page: by default in a child forked from this process, which has imported the
planner once (``preload``: the CLI app, every planner module, pandas, matplotlib; never
torch), so a case costs its own work and not an interpreter's start-up (about 10x less CPU
a case); ``--mode subprocess`` runs each in a fresh interpreter for full fidelity. Either way
the case gets stdin from /dev/null, stdout and stderr to files, its own process group (killed
whole on a hang), an address-space cap (--memory-limit-mib) and a CPU cap, and the same
entry point the console script calls; tests/test_fuzz_runner.py checks that both modes give
every case the same exit code, verdict and error line.

The contract (DESIGN: bad input) is exit 0 / 1 / 2 with, on exit 2, one line on stderr (for
llmplan-check, one per budget file, each naming it); a case fails when it prints a traceback,
says "internal error" (a traceback in one line), exits with another code, writes a
multi-line error or a control character raw in its error (a terminal escape the user gave,
quoted back), prints NaN or an infinity as a figure, or runs past --timeout-s and
HANG_FACTOR times its command's clean run (a hang). A mutation that writes an out-of-range
number (NaN, inf, a negative, a bool, 1e30) into a numeric field and still exits 0 is listed
as a *suspect acceptance* for a person to look at: some fields legitimately take 0 or a
negative (an offset), so it is not counted as a failure.

Inputs: every database, HF config, budget, calibration, validation dataset, served-run,
dataset, results and price-set file, corrupted (values, bytes, truncation, nesting past any
parser's limit, 5,000-digit numbers, a FIFO or a folder for the file); bad values for every
option, with units for durations, GPU=USD for --price; the disaggregated and tensor x expert
parallel options; and `watch` against a hostile metrics server in this process (a thread on
127.0.0.1: pages that drip a byte at a time, exceed the size limit, redirect to itself or other
hosts, carry terminal escapes, lie with NaN / Inf / negative / huge values, are malformed,
garbage, the wrong content type, or reset the connection).

Set-up measures a quick CPU calibration and one tiny `measure` run so that calibration
and results files are real ones before they are corrupted (about 20 s). The case list is
a pure function of --seed, so a failure reproduces with the same seed and its index.
"""

from __future__ import annotations

import argparse
import collections
import http.server
import io
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's planner, not an installed one, in the forks
LLMPLAN = [sys.executable, "-m", "planner"]
ENTRIES = {"llmplan": LLMPLAN,  # the console scripts, as modules of this checkout
           "llmplan-check": [sys.executable, "-m", "planner.cli.budgets"]}
CHILD_ENV = {"COLUMNS": "100", "PYTHONPATH": str(ROOT)}

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
MOE = ["-m", "qwen3-30b-a3b", "-g", "h100-sxm"]
DISAGG = ["--prefill-instances", "1", "--decode-instances", "1"]
PLAN = ["--ttft", "2s", "--tpot", "50ms", "--rps", "5", "--scheduler", "static"]
PRICING = ["--prices", "--price"]
CLI_OPTIONS = {  # command line -> options that take a value ("": a positional argument)
    ("estimate", *BASE): ["--batch", "--prompt-tokens", "--output-tokens", "--tp",
                          "--group-size", "--kernel-overhead-us", "--reserve-gib",
                          "--memory-utilization", "--prefill-chunk-tokens",
                          "--price-per-hour", "--measured-tpot", "--measured-ttft",
                          "--weights", "--kv-cache", "--engine", "--calibration", "-m", "-g",
                          "--quantized-layers", "--kv-cache-memory-bytes",
                          "--kv-cache-tokens", *PRICING],
    ("sweep", *BASE): ["-b", "-p", "-o", "--tp", "--weights", "--engine", "--csv", *PRICING],
    ("simulate", *BASE, "-n", "20"): ["--request-rate", "--burstiness",
                                      "--max-concurrency", "--range-ratio", "--seed",
                                      "--max-num-seqs", "--max-num-batched-tokens",
                                      "--block-size", "--max-model-len", "--ttft-slo",
                                      "--tpot-slo", "-n", "--dataset", "--trace",
                                      "--performance-mode", "--kv-cache-memory-bytes",
                                      "--kv-cache-tokens", "--max-prefill-tokens",
                                      "--batch-wait-timeout-iters",
                                      "--batch-wait-max-tokens-ratio"],
    ("simulate", *BASE, "-n", "20", "--scheduler", "dynamic"): ["--max-wait"],
    # SGLang's random lengths (numpy seeded by --seed, from --range-ratio of -p / -o up)
    ("simulate", *BASE, "-n", "20", "--dataset-name", "sglang-random"):
        ["--range-ratio", "--seed", "-p", "-o", "--dataset-name"],
    # TensorRT-LLM's options file (planner/io/trtllm_options.py)
    ("simulate", *BASE, "-e", "trtllm", "-n", "20"): ["--extra-llm-api-options"],
    # disaggregated serving: prefill and decode instances, their GPUs and the KV link
    ("simulate", *BASE, "-n", "20", *DISAGG):
        ["--prefill-instances", "--decode-instances", "--prefill-tp", "--decode-tp",
         "--prefill-gpu", "--decode-gpu", "--kv-link", "--prefill-max-num-seqs",
         "--decode-max-num-seqs", "--prefill-max-num-batched-tokens",
         "--decode-max-num-batched-tokens", "--request-rate"],
    # tensor x expert parallel MoE, and the busiest expert GPU's load
    ("simulate", *MOE, "-n", "20", "--tp", "2", "--ep", "4"): ["--tp", "--ep",
                                                               "--expert-imbalance"],
    ("estimate", *MOE, "--tp", "2", "--ep", "4", "--json"): ["--tp", "--ep",
                                                             "--expert-imbalance"],
    ("plan", *BASE, *PLAN):
        ["--rps", "--ttft", "--tpot", "-p", "-o", "--weights", "--plot",
         "--kv-cache-memory-bytes", "--kv-cache-tokens", *PRICING],
    ("prices",): ["", "--json"],
    ("prices", "--json"): [""],
    ("gpus",): ["--prices"],
    ("check", "examples/budget.yaml"): ["--engine", "--junit", "--calibration", *PRICING,
                                        "--expert-imbalance"],
    ("validate",): ["--engine", "--source", "--csv", "--served-dataset"],
    ("compare", "tests/fixtures/servers/vllm_bench_serve.json", *BASE):
        ["--tp", "--engine", "--weights", "--plot", "-m", "-g", "--seed", "--cached-from",
         "--cached-prefix-tokens", "--lengths-from", "--dataset-name"],
    ("calibrate", "tests/fixtures/servers/vllm_bench_serve.json", *BASE, "--no-leave-one-out",
     "--out", str(Path(tempfile.gettempdir()) / "llmplan-fuzz-calibrated.yaml")):
        ["--out", "--name", "--base-engine", "--tp", "--cached-prefix-tokens"],
    ("watch", "http://127.0.0.1:9/metrics", *BASE, "--once", "--timeout", "1"):
        ["--interval", "--timeout", "--count", "--serve-metrics", "--model-name"],
}
# llmplan-check FILE... (planner/cli/budgets.py): its own parser in front of check's
CHECK_OPTIONS = {("examples/budget.yaml",): ["--engine", "--calibration", "--prices", "--price",
                                             "--expert-imbalance", "--junit-dir", ""],
                 ("examples/budget.yaml", "examples/budget-failing.yaml"): ["--price", ""]}
DURATIONS = {"--measured-tpot", "--measured-ttft", "--max-wait", "--ttft-slo", "--tpot-slo",
             "--ttft", "--tpot", "--interval", "--timeout"}
DURATION_VALUES = ["1e999s", "-5ms", "nanms", "infs", "5parsec", "0s", "1e-320s", "2min",
                   "1e308h", "ms", "5ms5", "9" * 400 + "ms", "1_000ms", "5\u00b5s", "5 us",
                   "0.5", "3d", "-0s", "1e-9ns", "50ms,60ms", "PT5S"]
DURATION_OUT_OF_RANGE = {"1e999s", "-5ms", "nanms", "infs", "1e308h", "9" * 400 + "ms"}
PRICE_VALUES = ["h100-sxm=nan", "h100-sxm=-1", "h100-sxm=inf", "=3", "h100-sxm=", "nosuch=3",
                "h100-sxm=1e308", "h100-sxm=1e-320", "h100-sxm", "h100-sxm=3=4", "H100-SXM=2",
                "h100-sxm=0", "h100-sxm=\x1b[31m2", "h100-sxm=2$", "h100-sxm=" + "9" * 400]
PRICE_OUT_OF_RANGE = {"h100-sxm=nan", "h100-sxm=-1", "h100-sxm=inf", "h100-sxm=1e308",
                      "h100-sxm=" + "9" * 400}
PRICES_VALUES = ["nosuch", "", "/dev/null", "/dev/zero", ".", "owned", "committed-3y", "OWNED",
                 "x" * 5000, "../prices/owned", "owned.yaml", "/etc/passwd", "\x1b[2Jowned",
                 "nosuch.yaml", "specialty-on-demand", "-"]
GPU_VALUES = ["nosuch", "", "h100-sxm", "a10", "mi300x", "b200", "H100-SXM", "\x1b[2J",
              "h100-sxm.yaml", "/dev/null"]
OPTION_VALUES = {"--price": PRICE_VALUES, "--prices": PRICES_VALUES, "": PRICES_VALUES,
                 "--prefill-gpu": GPU_VALUES, "--decode-gpu": GPU_VALUES,
                 "--kv-link": ["auto", "intra-node", "inter-node", "nvlink", "", "AUTO"],
                 **{d: DURATION_VALUES for d in DURATIONS}}
PATH_OPTIONS = {"--csv", "--trace", "--junit", "--plot", "--dataset", "--calibration",
                "--served-dataset", "--junit-dir", "--prices", "",
                "--engine", "-m", "-g", "--source", "--out", "--base-engine",
                "--prefill-gpu", "--decode-gpu", "--kv-link", "--extra-llm-api-options",
                "--lengths-from",
                "--name", "--model-name"}  # names: calibrate's profile, watch's label filter
SERVED_READ = re.compile(r"^((mean|median|p90|p99)_(ttft|tpot|itl|e2el|e2e_latency)_ms|completed|"
                         r"total_(input|output)_tokens|request_rate|max_concurrency|"
                         r"request_throughput|output_throughput|total_token_throughput)$")
PRICES_READ = {"usd_per_gpu_hour", "purchase_usd", "power_w", "value"}
CALIBRATION_READ = {"memory_bandwidth_gb_per_s", "bf16", "fp16", "fp8", "int8",
                    "kernel_overhead_us"}
# the keys of a TensorRT-LLM options file llmplan reads (planner/io/trtllm_options.py)
LLM_API_READ = {"tensor_parallel_size", "pipeline_parallel_size", "moe_expert_parallel_size",
                "max_batch_size", "max_num_tokens", "max_seq_len", "enable_chunked_prefill",
                "kv_cache_config", "free_gpu_memory_fraction", "enable_block_reuse", "dtype",
                "tokens_per_block", "scheduler_config", "capacity_scheduler_policy",
                "cuda_graph_config", "batch_sizes", "enable_padding"}


# a figure no output may hold (the output gate's promise): NaN or an infinity, in JSON or text;
# a request rate of "inf" (every request at once, vLLM's spelling; a served run's label
# "rate=inf") is a setting, not a figure;
# AMD's Infinity Fabric is a link's name
IMPOSSIBLE = re.compile(r"(?<![\w.\"-])(?<!rate=)[-+]?(?:nan|inf|infinity)"
                        r"(?![\w-]|\s+req/s|\s+fabric)", re.IGNORECASE)


@dataclass
class Case:
    index: int
    kind: str
    args: list[str]
    files: dict[str, bytes] = field(default_factory=dict)  # name -> content, in a temp dir
    out_of_range: bool = False
    what: str = ""
    entry: str = "llmplan"  # or "llmplan-check"


@dataclass
class Outcome:
    case: Case
    code: int | None
    stderr: str
    seconds: float
    stdout: str = ""
    cpu_s: float = 0.0  # the case's own CPU time (user + system): wall time on a busy machine

    def _error_lines(self) -> int:
        """Lines a refusal may take: one, or for llmplan-check one per budget file at most
        (each naming its file, as a compiler reports each file)."""
        lines = self.stderr.strip().splitlines()
        if self.case.entry != "llmplan-check":
            return 1
        files = [a for a in self.case.args if a.endswith((".yaml", ".yml", ".json"))]
        per_file = all(any(f"{Path(f).name}" in ln for f in files) for ln in lines)
        return len(lines) if per_file and 1 <= len(lines) <= len(files) else 1

    @property
    def verdict(self) -> str:
        if self.code is None:
            return "hang"
        if "Traceback" in self.stderr:
            return "traceback"
        if self.code not in (0, 1, 2):
            return f"exit {self.code}"
        if self.code == 2 and len(self.stderr.strip().splitlines()) != self._error_lines():
            return "multi-line error"
        if self.code == 2 and any(not c.isprintable()
                                  for c in self.stderr.strip().replace("\n", "")):
            return "terminal escape"  # an error line quoting a control character raw
        if self.code == 1 and "internal error" in self.stderr:
            return "internal error"  # a traceback said in one line: still a bug
        if self.code in (0, 1) and IMPOSSIBLE.search(self.stdout):
            return "impossible figure"
        if self.code == 0 and self.case.out_of_range:
            return "suspect acceptance"
        return "ok"


# ---------------------------------------------------------------- mutations
NUMERIC_YAML = re.compile(
    r"^(\s*(?:- )?[A-Za-z_][\w.-]*:\s*)(-?[\d.]+(?:e[+-]?\d+)?)(\s*(?:#.*)?)$")
NUMERIC_JSON = re.compile(r'("[\w.-]+"\s*:\s*)(-?[\d.]+(?:e[+-]?\d+)?)')


def json_parent(text: str, pos: int) -> str:
    """The keys of the objects that enclose ``pos`` in JSON ``text``, outermost first, joined
    by dots ("" at the top level; a list adds nothing): where a mutated number sits, so a key
    read at the top level and repeated in a section nothing reads (a multimodal config's
    ``vision_config.hidden_size``) is told apart."""
    stack: list[str | None] = []  # per open container: its key in the parent object
    key, last, i = None, None, 0
    while i < pos:
        c = text[i]
        if c == '"':  # a string: skip it whole, escapes included
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            last = json.loads(text[i:j + 1])  # the key as the document means it
            i = j + 1
            continue
        if c == ":":
            key = last
        elif c in "{[":
            stack.append(key)
            key = None
        elif c in "}]" and stack:
            stack.pop()
            key = None
        elif c == ",":
            key = None
        i += 1
    return ".".join(k for k in stack[1:] if k is not None)


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
                parent = json_parent(text, m.start())
                where = f"{parent}." if parent else ""
                return new.encode(), bad in OUT_OF_RANGE, f"{where}{m.group(1).strip()} {bad}"
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


# ---------------------------------------------------------------- a hostile metrics server
SERVER = "{SERVER}"  # in a case's URL: the hostile server's base URL once it listens
HOSTILE_CLASSES = ("drip-body", "drip-headers", "oversize", "oversize-announced", "redirect",
                   "escapes", "values", "malformed", "garbage", "content-type", "reset",
                   "status", "length-lie", "chunked", "empty", "slow-start")
ESCAPES = ["\x1b[2J", "\x1b]0;pwned\x07", "\x1b[31m", "\x9b31m", "\x00", "\x08", "\r",
           "\x1b]8;;http://x\x1b\\", "\u202e", "\x7f", "\x1bP+q\x1b\\", "\x1b[6n"]
HEADER_ESCAPES = [e for e in ESCAPES if e.isascii() or ord(max(e)) < 256]  # latin-1 lines
METRIC_VALUES = ["NaN", "+Inf", "-Inf", "-1", "-0", "0", "1e308", "1e-320", "9" * 400,
                 "-1e308", "1e19", "0x10", "1_000", "", "abc", "3.5", "1e999", "nan", "inf"]
VLLM_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
               "vllm:kv_cache_usage_perc")
VLLM_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                 "vllm:request_success_total")
VLLM_HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
                   "vllm:e2e_request_latency_seconds")


def exposition(rng: random.Random, n: int, value=None) -> str:
    """A vLLM-shaped metrics page at scrape ``n``; ``value()`` (when given) replaces some
    of its numbers with hostile ones."""
    def v(honest: float) -> str:
        return value() if value is not None and rng.random() < 0.4 else repr(honest)

    lines = []
    for name, honest in zip(VLLM_GAUGES, (16, 2, 0.25), strict=True):
        lines += [f"# TYPE {name} gauge", f'{name}{{model_name="m"}} {v(honest)}']
    for name, step in zip(VLLM_COUNTERS, (200, 2000, 2), strict=True):
        lines += [f"# TYPE {name} counter", f'{name}{{model_name="m"}} {v(n * step)}']
    for name in VLLM_HISTOGRAMS:
        lines.append(f"# TYPE {name} histogram")
        cum = 0
        for le in (0.01, 0.05, 0.1, 1.0):
            cum += n * 10
            lines.append(f'{name}_bucket{{le="{le}",model_name="m"}} {v(cum)}')
        lines += [f'{name}_bucket{{le="+Inf",model_name="m"}} {v(cum + n)}',
                  f'{name}_sum{{model_name="m"}} {v(n * 3.5)}',
                  f'{name}_count{{model_name="m"}} {v(cum + n)}']
    return "\n".join(lines) + "\n"


def _malformed(rng: random.Random, n: int) -> str:
    lines = exposition(rng, n).splitlines()
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(lines))
        ln = lines[i]
        lines[i] = rng.choice([
            ln.split(" ")[0],  # no value
            ln.replace("{", "{{", 1), ln.replace("}", "", 1), ln.replace('"', "", 1),
            ln + " 123 456 789",  # value, timestamp and more
            ln.replace('le="', 'le="abc', 1), ln.replace('le="0.01"', 'le="-1"'),
            ln.replace("model_name", "model_name=\"a\",model_name", 1),
            "# TYPE " + ln.split("{")[0] + " " + rng.choice(["gauge", "summary", "bogus"]),
            ln.split("{")[0] + "{" + ",".join(f'l{k}="v"' for k in range(2000)) + "} 1",
            ln.split("{")[0] + '{model_name="' + "x" * 100_000 + '"} 1',
            "\t" + ln, ln + "\r", "", "#", "# HELP", ln * 50,
        ])
    if rng.random() < 0.3:  # cumulative buckets that go down, or no +Inf bucket
        lines = [ln for ln in lines if 'le="+Inf"' not in ln] if rng.random() < 0.5 else \
            [ln.replace(" 10", " 999999") if "_bucket" in ln and 'le="0.01"' in ln else ln
             for ln in lines]
    return "\n".join(lines) + rng.choice(["\n", "", "\n\n\n"])


class _Hostile(http.server.BaseHTTPRequestHandler):
    """GET /<nonce>/<class>/<seed>/...: a page of that hostile class, drawn from the seed and the
    number of times that path has been fetched (watch scrapes twice for a window)."""

    protocol_version = "HTTP/1.1"
    seen: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def log_message(self, *a):  # nothing from this thread reaches the fuzzer's output
        pass

    def do_GET(self):  # noqa: N802 (http.server's name)
        with self.lock:
            self.seen[self.path] += 1
            n = self.seen[self.path]
        parts = [p for p in self.path.split("/") if p]
        if parts and parts[0].isdigit():  # the run's nonce: each run starts at scrape 1
            parts = parts[1:]
        kind = parts[0] if parts else ""
        seed = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        rng = random.Random(f"{seed}/{n}")
        try:
            getattr(self, "_" + kind.replace("-", "_"), self._values)(rng, n)
        except OSError:  # the client hung up: what a hostile server shrugs off
            pass

    def _send(self, body: bytes, status: int = 200, reason: str | None = None,
              ctype: str = "text/plain; version=0.0.4", headers=()) -> None:
        self.send_response(status, reason)
        self.send_header("Content-Type", ctype)
        for k, v in headers:
            self.send_header(k, v)
        if not any(k.lower() in ("content-length", "transfer-encoding") for k, _ in headers):
            self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _drip(self, byte: bytes, seconds: float, pause_s: float = 0.1) -> None:
        for _ in range(int(seconds / pause_s)):
            self.wfile.write(byte)
            self.wfile.flush()
            time.sleep(pause_s)
        self.close_connection = True

    def _drip_body(self, rng, n):
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        self._drip(rng.choice([b"#", b"v", b"\n", b"\x1b"]), 30)

    def _drip_headers(self, rng, n):
        self._drip(rng.choice([b"H", b"X", b"\r"]), 30)

    def _slow_start(self, rng, n):  # silent, then a good page: a connect that never answers
        time.sleep(rng.choice([0.5, 3.0, 30.0]))
        self._send(exposition(rng, n).encode())

    def _oversize(self, rng, n):
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        line = exposition(rng, n).encode() if rng.random() < 0.5 else b"# " + b"x" * 4094 + b"\n"
        for _ in range(rng.choice([5_000, 10_000])):  # 20-40 MiB, unannounced
            self.wfile.write(line)
        self.close_connection = True

    def _oversize_announced(self, rng, n):
        self.send_response(200)
        self.send_header("Content-Length", str(rng.choice([17 * 2**20, 10**15, 2**64, -5])))
        self.end_headers()
        self.wfile.write(exposition(rng, n).encode())
        self.close_connection = True

    def _redirect(self, rng, n):
        port = self.server.server_address[1]
        target = rng.choice([
            self.path, "/" + self.path.lstrip("/").replace("redirect", "values", 1),
            f"http://localhost:{port}/values/1/metrics",
            f"http://127.0.0.2:{port}/values/1/metrics",
            "http://169.254.169.254/latest/meta-data/", "http://[::1]:9/metrics",
            "file:///etc/passwd", "ftp://127.0.0.1/metrics", "gopher://x/",
            f"http://127.0.0.1:{port}" + "/redirect/1/" + "a" * 9000,
            "/m" + "".join(rng.sample(HEADER_ESCAPES, 3)), "", "http://:99999/",
            "//evil.example/x",
            "http://user:pw@127.0.0.1:1/", "javascript:alert(1)", "\x00",
        ])
        self.send_response(rng.choice([301, 302, 303, 307, 308, 300, 399]))
        if rng.random() < 0.9:
            self.send_header("Location", target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _escapes(self, rng, n):
        esc = "".join(rng.choice(ESCAPES) for _ in range(5))
        page = rng.choice([
            exposition(rng, n).replace('model_name="m"', f'model_name="{esc}"'),
            f"vllm:num_requests_running{{x=\"{esc}\" 3\n",
            f"# HELP vllm:num_requests_running {esc}\n" + exposition(rng, n),
            esc + "\n",
        ])
        status = rng.choice([200, 200, 404, 500])
        reason = "Gone" + "".join(rng.choice(HEADER_ESCAPES) for _ in range(5))
        self._send(page.encode(), status, reason=rng.choice([None, reason]))

    def _values(self, rng, n):
        self._send(exposition(rng, n, value=lambda: rng.choice(METRIC_VALUES)).encode())

    def _malformed(self, rng, n):
        self._send(_malformed(rng, n).encode())

    def _garbage(self, rng, n):
        self._send(bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 100, 5000]))),
                   ctype=rng.choice(["text/plain", "application/octet-stream"]))

    def _content_type(self, rng, n):
        body, ctype = rng.choice([
            (exposition(rng, n), "text/html"), ('{"running": 3}', "application/json"),
            ("<html><body>login</body></html>", "text/html"),
            (exposition(rng, n), "application/openmetrics-text; version=1.0.0"),
            (exposition(rng, n), "text/plain; charset=utf-16"),
        ])
        self._send(body.encode(), ctype=ctype)

    def _reset(self, rng, n):
        import socket
        import struct

        if rng.random() < 0.5:  # half the headers first
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Le")
            self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                   struct.pack("ii", 1, 0))  # close with a RST
        self.connection.close()
        self.close_connection = True

    def _status(self, rng, n):
        raw = rng.choice([b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\nno",
                          b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 999 Odd\r\n\r\n",
                          b"HTTP/1.1 abc\r\n\r\n", b"NOT-HTTP\r\n\r\n", b"HTTP/2 200\r\n\r\n",
                          b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200 + b"\r\nvllm:x 1\n",
                          b"HTTP/1.1 200 OK\r\nX: " + b"a" * 100_000 + b"\r\n\r\n",
                          b"HTTP/1.1 404 " + "".join(ESCAPES).encode() + b"\r\n\r\n"])
        self.wfile.write(raw)
        self.close_connection = True

    def _length_lie(self, rng, n):
        body = exposition(rng, n).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) + rng.choice([-100, 1, 10_000])))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _chunked(self, rng, n):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        head = exposition(rng, n).encode()[:16]
        self.wfile.write(rng.choice([b"zz\r\nabc\r\n0\r\n\r\n", b"ffffffffffffffff\r\nab",
                                     b"5\r\nvllm:\r\n", b"-1\r\n\r\n",
                                     b"10\r\n" + head + b"\r\n0\r\n\r\n"]))
        self.close_connection = True

    def _empty(self, rng, n):
        self._send(b"", status=rng.choice([200, 200, 503]))


_NONCE = itertools.count(1)


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client gone mid-page: expected
        pass


class HostileServer:
    """The hostile metrics server, on a free port of 127.0.0.1, in a daemon thread."""

    _srv: http.server.ThreadingHTTPServer | None = None

    @classmethod
    def start(cls) -> None:
        if cls._srv is None:
            srv = _QuietServer(("127.0.0.1", 0), _Hostile)
            srv.daemon_threads = True
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            cls._srv = srv

    @classmethod
    def base(cls) -> str:
        cls.start()
        return f"http://127.0.0.1:{cls._srv.server_address[1]}"


def watch_case(rng: random.Random) -> tuple[list[str], str]:
    """``llmplan watch`` of a hostile page: (arguments, what)."""
    kind = rng.choice(HOSTILE_CLASSES)
    url = f"{SERVER}/{kind}/{rng.randrange(10**6)}/metrics"
    args = ["watch", url, *BASE, "--once", "--interval", rng.choice(["0.05", "0.2"]),
            "--timeout", rng.choice(["1", "2"])]
    for flag, p in (("--json", 0.5), ("--follow-redirects", 0.4 if kind == "redirect" else 0.1)):
        if rng.random() < p:
            args.append(flag)
    if rng.random() < 0.3:
        args += ["--model-name", rng.choice(["m", "other", "\x1b[2Jm"])]
    return args, f"{kind} {url.split('/', 3)[-1]}"


# ---------------------------------------------------------------- cases
def file_targets(setup: Path) -> list[tuple]:
    """(kind, source file, command with FILE as placeholder, json?[, entry point])."""
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
                ["estimate", "-m", "gpt2", "-g", "h100-sxm", "-p", "512", "--calibration", "FILE",
                 "--json"],
                False))
    for p in sorted((ROOT / "tests" / "fixtures" / "servers").glob("*_bench_serv*.json*")):
        out.append(("served", p, ["compare", "FILE", *BASE, "--json"], True))
    out.append(("llm-api-options", setup / "llm_api_options.yaml",
                ["simulate", *BASE, "-e", "trtllm", "-n", "20", "--extra-llm-api-options",
                 "FILE", "--json"], False))
    out.append(("dataset", setup / "dataset.jsonl",
                ["simulate", *BASE, "--dataset", "FILE", "-n", "8", "--json"], True))
    for p in sorted((ROOT / "planner" / "data" / "prices").glob("*.yaml")):
        out.append(("prices", p, ["prices", "FILE", "--json"], False))
        out.append(("prices", p, ["estimate", *BASE, "--prices", "FILE", "--json"], False))
        out.append(("prices", p, ["gpus", "--prices", "FILE"], False))
    for p in sorted((ROOT / "examples").glob("budget*.yaml")):
        out.append(("budget-check", p, ["FILE", "examples/budget.yaml"], False, "llmplan-check"))
    return out


# the config.json sections whose keys the planner reads: the top level, a multimodal Gemma-3's
# text_config (its language model) and the checkpoint's quantization_config; vision_config and
# the like are passed over
HF_SECTIONS_READ = ("", "text_config", "quantization_config")


def hf_fields_read() -> set[str]:
    """The config.json keys the planner reads: a mutation of any other key is ignored by
    design (``initializer_range: NaN`` changes no estimate), so it is no suspect."""
    text = (ROOT / "planner" / "io" / "catalog.py").read_text()
    return set(re.findall(r'(?:_req\(cfg, |cfg\.get\(|cfg\[)"(\w+)"', text))


def cli_case(i: int, rng: random.Random, cli: list, entry: str = "llmplan") -> Case:
    """A bad value for one option (or positional argument) of a working command line."""
    cmd, opt = rng.choice(cli)
    special = OPTION_VALUES.get(opt)
    value = rng.choice(special if special and rng.random() < 0.6 else BAD_CLI_VALUES)
    numeric = opt not in PATH_OPTIONS  # "nan" is a fine file name
    # a rate that parses to inf (also 1e999 and 400 nines) sends all at t = 0
    legit = opt == "--request-rate" and value in ("inf", "1e999", "9" * 400)
    oor = numeric and not legit and (
        value in {"nan", "inf", "-inf", "-1", "1e999", "1e30", "9" * 400}
        or value in DURATION_OUT_OF_RANGE or value in PRICE_OUT_OF_RANGE)
    args = [*cmd, value] if opt == "" else [*cmd, opt, value]
    kind = "cli" if entry == "llmplan" else "check-cli"
    return Case(i, kind, args, out_of_range=oor, entry=entry,
                what=f"{entry} {cmd[0]} {opt or 'ARG'} {value!r}")


def make_cases(n: int, seed: int, setup: Path) -> list[Case]:
    rng = random.Random(seed)
    targets = file_targets(setup)
    results = setup / "results.jsonl"
    cli = [(cmd, opt) for cmd, opts in CLI_OPTIONS.items() for opt in opts]
    check_cli = [(cmd, opt) for cmd, opts in CHECK_OPTIONS.items() for opt in opts]
    hf_read = hf_fields_read()
    cases = []
    for i in range(n):
        r = rng.random()
        if r < 0.30:  # a bad value on the command line
            cases.append(cli_case(i, rng, cli))
        elif r < 0.33:  # llmplan-check FILE... with a bad option
            cases.append(cli_case(i, rng, check_cli, "llmplan-check"))
        elif r < 0.40:  # watch against a hostile metrics server
            args, what = watch_case(rng)
            cases.append(Case(i, "watch", args, what=what))
        elif r < 0.98:
            target = rng.choice(targets)
            kind, src, cmd, is_json = target[:4]
            entry = target[4] if len(target) > 4 else "llmplan"
            content, oor, what = mutate_text(rng, src.read_bytes(), is_json)
            if kind == "hf-config" and what.split('"')[1:2] and (
                    what.split('"')[1] not in hf_read
                    or what.split('"')[0].rstrip(".") not in HF_SECTIONS_READ):
                oor = False  # a key nothing reads, or one in a section nothing reads
            if kind == "served" and not SERVED_READ.match(what.split('"')[1] if '"' in what
                                                          else ""):
                oor = False  # a key compare does not read (std_ttft_ms, date, ...)
            if kind == "calibration" and what.split(":")[0].strip("- ") not in CALIBRATION_READ:
                oor = False  # the raw timings under details: are a record, not an input
            if kind == "llm-api-options" and \
                    what.split(":")[0].strip("- ") not in LLM_API_READ:
                oor = False  # moe_config and the like: passed over, as trtllm-serve's flags
            if kind == "prices" and what.split(":")[0].strip("- ") not in PRICES_READ:
                oor = False  # a date, an offer's instance count: records, not prices
            name = "input" + src.suffix
            args = [name if a == "FILE" else a for a in cmd]
            cases.append(Case(i, kind, args, {name: content}, oor, f"{src.name}: {what}",
                              entry=entry))
        else:  # a corrupted results file resumed by measure
            content, oor, what = mutate_jsonl(rng, results.read_bytes())
            args = ["measure", "-m", "tiny-llama-test", "--device", "cpu", "-b", "1", "-c",
                    "32", "--calibration", str(setup / "calibration.yaml"), "--out",
                    "results.jsonl", "--resume", "--budget-s", "0.01", "--threads", "1"]
            cases.append(Case(i, "results", args, {"results.jsonl": content}, False,
                              f"results.jsonl {what}"))
    return cases


def _materialize(case: Case, d: Path) -> list[str]:
    """Write the case's files into the folder ``d``; its arguments, made absolute where they
    name a file of the repository."""
    for name, content in case.files.items():
        if content == FIFO and hasattr(os, "mkfifo"):
            os.mkfifo(d / name)  # a read that opens it would hang: a failure
        elif content == DIRECTORY:
            (d / name).mkdir()
        else:
            (d / name).write_bytes(content)
    out = []
    for a in case.args:
        if a.startswith(("examples/", "tests/fixtures/")):
            a = str(ROOT / a)
        if SERVER in a:
            a = a.replace(SERVER, f"{HostileServer.base()}/{next(_NONCE)}")
        out.append(a)
    return out


def _limit_resources(memory_mib: int, cpu_s: float) -> None:
    """In the case's process before it runs: its own process group (the parent kills the
    whole group on a hang), an address-space cap (an input that asks for more memory than
    the cap must be refused in one line, not kill the machine) and a CPU-time cap."""
    import resource

    os.setpgid(0, 0)
    if memory_mib > 0:
        cap = memory_mib * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    cpu = int(cpu_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read(f, limit: int = 1 << 20) -> str:
    f.seek(0)
    return f.read(limit).decode(errors="replace")


# ---------------------------------------------------------------- the fork server
def preload() -> list[str]:
    """Import in this process what the commands import (the CLI app, every planner module,
    pandas, matplotlib), so that each forked case starts with it loaded; never torch, whose
    threads and CUDA state do not survive a fork (the harness imports it itself, per case).
    Returns the modules that failed to import."""
    import importlib
    import pkgutil

    os.environ.update(CHILD_ENV)  # rich reads COLUMNS when its consoles are made
    torch_before = "torch" in sys.modules  # a test process may hold it from another test
    failed = []
    saved = sys.stdout, sys.stderr
    # consoles made at import decide colour from isatty(): as in a subprocess, not a terminal
    sys.stdout, sys.stderr = _NotATerminal(saved[0]), _NotATerminal(saved[1])
    try:
        import planner
        import planner.cli.app  # noqa: F401

        for m in pkgutil.walk_packages(planner.__path__, "planner."):
            if m.name.endswith("__main__"):  # runs the CLI when imported
                continue
            try:
                importlib.import_module(m.name)
            except Exception:
                failed.append(m.name)
        for name in ("harness.cli", "pandas", "matplotlib.pyplot", "yaml", "pydantic",
                     "prometheus_client", "planner.cli.budgets"):
            try:
                importlib.import_module(name)
            except Exception:
                failed.append(name)
    finally:
        sys.stdout, sys.stderr = saved
    assert torch_before or "torch" not in sys.modules, "a preloaded module imported torch"
    _memoize_typer_signatures()
    return failed


def _memoize_typer_signatures() -> None:
    """typer reads every command function's signature (``get_type_hints``, an ``eval`` per
    annotation) each time the app runs: most of a usage error's time. The answer is a pure
    function of the function, so this process reads each built-in command's once and every
    fork reuses it (each fork has its own copy of the memory: a case cannot alter another's;
    tests/test_fuzz_runner.py checks both modes classify alike)."""
    import functools

    import typer.main

    typer.main.get_params_from_function = functools.lru_cache(maxsize=None)(
        typer.main.get_params_from_function)
    from planner.cli.app import app

    typer.main.get_command(app)  # every built-in command's signature, read here once


class _NotATerminal:
    def __init__(self, stream):
        self._stream = stream

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _child(case: Case, args: list[str], d: Path, timeout_s: float, memory_mib: int) -> None:
    """In the forked process: become what ``python -m planner ARGS`` would be, run the same
    entry point, and leave with its exit code (never returns)."""
    code = 1
    try:
        os.chdir(d)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(d / ".stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(d / ".stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        # the streams a fresh interpreter makes for a file or a pipe
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for s in (signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL if s != signal.SIGPIPE else signal.SIG_IGN)
        _limit_resources(memory_mib, 2 * timeout_s)
        sys.argv = [case.entry, *args]
        try:
            ENTRY_POINTS[case.entry]()
            code = 0
        except SystemExit as e:
            code = _exit_code(e.code)
        except BaseException:  # what the interpreter does with an uncaught exception
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code)


def _exit_code(value) -> int:
    """The status ``sys.exit(value)`` leaves with (a string is printed and gives 1)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        print(value, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _run_entry_llmplan() -> None:
    from planner.cli.entry import run

    run()


def _run_entry_check() -> None:
    from planner.cli.budgets import main

    sys.exit(main())


ENTRY_POINTS = {"llmplan": _run_entry_llmplan, "llmplan-check": _run_entry_check}


class Running:
    """One case started, in a subprocess or a forked child, with its folder and deadline."""

    def __init__(self, case: Case, limit_s: float, mode: str, memory_mib: int):
        self.case, self.limit_s = case, limit_s
        self.tmp = tempfile.TemporaryDirectory(prefix="llmplan-fuzz-")
        d = Path(self.tmp.name)
        args = _materialize(case, d)
        for name in (".stdout", ".stderr"):
            (d / name).touch()
        self.t0 = time.perf_counter()
        self.cpu_s = 0.0
        self.popen: subprocess.Popen | None = None
        if mode == "subprocess":  # a fresh interpreter: full fidelity, ~1 s start-up
            with open(d / ".stdout", "wb") as out, open(d / ".stderr", "wb") as err:
                self.popen = subprocess.Popen(
                    [*ENTRIES[case.entry], *args], cwd=d, env={**os.environ, **CHILD_ENV},
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    preexec_fn=lambda: _limit_resources(memory_mib, 2 * limit_s))
            self.pid = self.popen.pid
        else:  # forked from this process, the planner already imported (preload)
            sys.stdout.flush()
            sys.stderr.flush()
            self.pid = os.fork()
            if self.pid == 0:
                _child(case, args, d, limit_s, memory_mib)
            try:
                os.setpgid(self.pid, self.pid)  # the child does it too: whichever is first
            except (ProcessLookupError, PermissionError):
                pass

    def _reap(self, block: bool) -> int | None:
        """The exit code (minus the signal for a death by signal), or None if running; the
        CPU seconds it used go to ``cpu_s``."""
        done, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
        if not done:
            return None
        code = os.waitstatus_to_exitcode(status)
        self.cpu_s = usage.ru_utime + usage.ru_stime
        if self.popen is not None:
            self.popen.returncode = code  # reaped here, not by Popen
        return code

    def poll(self) -> Outcome | None:
        """The outcome once the case is over (killed, with code None, past its limit)."""
        code = self._reap(block=False)
        hung = code is None and time.perf_counter() - self.t0 > self.limit_s
        if code is None and not hung:
            return None
        if hung:
            _kill_group(self.pid)
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._reap(block=True)
        seconds = time.perf_counter() - self.t0
        _kill_group(self.pid)  # what the case left running in its group
        d = Path(self.tmp.name)
        with open(d / ".stdout", "rb") as out, open(d / ".stderr", "rb") as err:
            o = Outcome(self.case, None if hung else code, _read(err), seconds, _read(out),
                        self.cpu_s)
        self.tmp.cleanup()
        return o


def run_cases(cases, limit_s, *, mode: str = "fork", jobs: int = 1, memory_mib: int = 0):
    """Outcomes of ``cases`` in the order they finish, at most ``jobs`` at a time; one
    thread starts and polls every case, so a fork never happens beside another thread's
    work (the hostile HTTP server's thread does only socket I/O)."""
    pending = list(cases)[::-1]
    running: list[Running] = []
    delay = 0.001
    while pending or running:
        while pending and len(running) < jobs:
            c = pending.pop()
            running.append(Running(c, limit_s(c), mode, memory_mib))
            delay = 0.001
        finished = False
        for r in list(running):
            o = r.poll()
            if o is not None:
                running.remove(r)
                finished = True
                yield o
        if not finished:
            time.sleep(delay)
            delay = min(2 * delay, 0.02)


def run_case(case: Case, timeout_s: float, mode: str = "fork", memory_mib: int = 0) -> Outcome:
    return next(run_cases([case], lambda c: timeout_s, mode=mode, memory_mib=memory_mib))


# A case is a hang when it runs past --timeout-s and past this many times the clean run of its
# command: `validate` replays every published serving run through the simulator (36 s with a
# fuzz beside it on 2 cores), so a fixed 60 s called two of its cases hangs that were not.
HANG_FACTOR = 3.0


def clean_seconds(jobs: int, timeout_s: float, mode: str = "fork") -> dict[str, float]:
    """Seconds each command takes on its unmutated base line (the first of CLI_OPTIONS).
    Every base line must run (exit 0, or 1 for a budget or plan that is only not met): a
    refused base makes each of its cases test that refusal, not the value mutated."""
    bases: dict[str, tuple] = {}
    for base in CLI_OPTIONS:
        bases.setdefault(base[0], base)
    cases = [Case(-1, "clean", list(b)) for b in bases.values()]
    out = {}
    for o in run_cases(cases, lambda c: 10 * timeout_s, mode=mode, jobs=jobs):
        if o.code not in (0, 1) and o.case.args[0] != "watch":  # watch: no server there
            raise SystemExit(f"fuzz: the base line of {o.case.args[0]} exits {o.code}: "
                             f"{o.stderr.strip()[:300]}")
        out[o.case.args[0]] = o.seconds
    return out


def check_file_bases(setup: Path, jobs: int, timeout_s: float, mode: str = "fork") -> None:
    """Each kind of corrupted file's command must run on its file as it is (the first file of
    the kind; a validation dataset is left out, its clean run replays every served run): the
    calibration cases' base had been refused (gpt2's 1,024-token context under the default
    1,024 + 256 tokens), so each of them tested that refusal and not the file."""
    seen, cases = set(), []
    for t in file_targets(setup):
        kind, path, args = t[0], t[1], t[2]
        if kind in seen or kind == "validation":
            continue
        seen.add(kind)
        entry = t[4] if len(t) > 4 else "llmplan"
        cases.append(Case(-1, f"clean {kind}", [str(path) if a == "FILE" else a for a in args],
                          entry=entry))
    for o in run_cases(cases, lambda c: 10 * timeout_s, mode=mode, jobs=jobs):
        if o.code not in (0, 1):
            raise SystemExit(f"fuzz: the {o.case.kind} base line exits {o.code} on its file as "
                             f"it is: {o.stderr.strip()[:300]}")


def write_inputs(setup: Path) -> None:
    """The inputs to corrupt that need no measuring: a dataset and a TensorRT-LLM options
    file."""
    (setup / "llm_api_options.yaml").write_text(
        "max_batch_size: 64\nmax_num_tokens: 4096\nenable_chunked_prefill: true\n"
        "kv_cache_config:\n  free_gpu_memory_fraction: 0.85\n  enable_block_reuse: false\n"
        "  dtype: auto\nscheduler_config:\n  capacity_scheduler_policy: MAX_UTILIZATION\n"
        "cuda_graph_config:\n  enable_padding: true\n  max_batch_size: 64\n"
        "moe_config:\n  backend: CUTLASS\n")
    (setup / "dataset.jsonl").write_text("".join(
        json.dumps({"prompt_tokens": 100 * k + 7, "output_tokens": 20 + k}) + "\n"
        for k in range(1, 9)))


def prepare(setup: Path) -> None:
    """A real calibration and results file to corrupt, and the other inputs
    (``write_inputs``)."""
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
    write_inputs(setup)


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
    ap.add_argument("--verdicts-out", type=Path,
                    help="JSONL of every case's index, exit code and verdict (to compare runs)")
    ap.add_argument("--only", help="Run only the case with this index (reproduce a failure)")
    ap.add_argument("--mode", choices=("fork", "subprocess"), default="fork",
                    help="fork (default): each case a child forked from this process with the "
                    "planner imported once; subprocess: a fresh interpreter per case (full "
                    "fidelity, about 5x slower)")
    ap.add_argument("--memory-limit-mib", type=int, default=8192,
                    help="address-space cap of each case (0: none)")
    a = ap.parse_args()
    setup = Path(tempfile.mkdtemp(prefix="llmplan-fuzz-setup-"))
    t0 = time.perf_counter()
    if a.mode == "fork":
        failed = preload()
        if failed:
            print(f"could not preload {failed}", flush=True)
    HostileServer.start()
    prepare(setup)
    cases = make_cases(a.cases, a.seed, setup)
    if a.only is not None:
        cases = [cases[int(a.only)]]
    clean = clean_seconds(a.jobs, a.timeout_s, a.mode)
    check_file_bases(setup, a.jobs, a.timeout_s, a.mode)
    slow = {k: round(v, 1) for k, v in clean.items() if HANG_FACTOR * v > a.timeout_s}
    print(f"set-up {time.perf_counter() - t0:.1f} s; {len(cases)} cases, {a.jobs} jobs, "
          f"{a.mode} mode, seed {a.seed}; longer limits for commands slow when clean (s): "
          f"{slow}", flush=True)

    def limit_s(case: Case) -> float:
        return max(a.timeout_s, HANG_FACTOR * clean.get(case.args[0] if case.args else "", 0))

    t0 = time.perf_counter()
    outcomes: list[Outcome] = []
    # each failing case is written as it completes: a run stopped early keeps what it found
    fails_file = a.failures_out.open("w") if a.failures_out else None
    verdicts_file = a.verdicts_out.open("w") if a.verdicts_out else None
    for k, o in enumerate(run_cases(cases, limit_s, mode=a.mode, jobs=a.jobs,
                                    memory_mib=a.memory_limit_mib), 1):
        outcomes.append(o)
        if fails_file is not None and o.verdict != "ok":
            fails_file.write(_failure_line(o))
            fails_file.flush()
        if verdicts_file is not None:
            verdicts_file.write(json.dumps({"index": o.case.index, "code": o.code,
                                            "verdict": o.verdict,
                                            "seconds": round(o.seconds, 3),
                                            "cpu_s": round(o.cpu_s, 3)}) + "\n")
        if k % 500 == 0:
            counts = collections.Counter(x.verdict for x in outcomes)
            print(f"  {k} cases, {time.perf_counter() - t0:.0f} s; "
                  + ", ".join(f"{v}: {n}" for v, n in sorted(counts.items())), flush=True)
    wall = time.perf_counter() - t0
    for f in (fails_file, verdicts_file):
        if f is not None:
            f.close()

    by_code = collections.Counter("hang" if o.code is None else o.code for o in outcomes)
    by_verdict = collections.Counter(o.verdict for o in outcomes)
    by_kind = collections.defaultdict(collections.Counter)
    for o in outcomes:
        by_kind[o.case.kind][o.verdict] += 1
    cpu = sum(o.cpu_s for o in outcomes)
    print(f"\n{len(outcomes)} cases in {wall:.0f} s ({len(outcomes) / wall:.1f} per s); the "
          f"cases' own CPU {cpu:.0f} s ({1e3 * cpu / max(len(outcomes), 1):.0f} ms a case)")
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
