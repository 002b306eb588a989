"""A measured serving run, whatever tool wrote it, in SI units.

Every reader in ``planner.evidence.formats`` turns its tool's result into ``ServedRun``s: the
traffic the run sent (request rate and burstiness, or a closed loop of clients; the lengths of
its prompts and outputs) and what it measured (TTFT, TPOT, ITL and end-to-end latency
statistics, throughputs), so that one prediction and one comparison serve them all. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Measured figures a run may carry, in SI units: latency statistics in seconds (mean, median,
# p90, p99 of each of ttft, tpot, itl and e2el) and throughputs per second.
LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "p90", "p99")
THROUGHPUTS = ("request_throughput", "output_throughput", "total_token_throughput")
METRIC_KEYS = tuple(f"{s}_{m}_s" for m in LATENCIES for s in STATS) + THROUGHPUTS


@dataclass(frozen=True)
class RandomLengths:
    """A benchmark client's random dataset as its file states it: each request's prompt and
    output lengths drawn uniformly from [ratio x nominal, nominal] (SGLang's
    --random-input-len, --random-output-len, --random-range-ratio)."""

    input_len: int
    output_len: int
    range_ratio: float


@dataclass(frozen=True)
class ServedRun:
    """One benchmark run against one server configuration."""

    source: str  # file (and the run's place in it)
    tool: str  # vllm-bench-serve, sglang-bench-serving, guidellm, genai-perf, llmplan-measure
    label: str
    # traffic: an open loop at ``request_rate`` (inf: every request at once) with gamma gaps of
    # shape ``burstiness``, or a closed loop of ``max_concurrency`` clients (rate nan)
    request_rate: float
    max_concurrency: int | None
    num_prompts: int
    completed: int
    mean_input_tokens: float
    mean_output_tokens: float
    metrics: dict[str, float] = field(default_factory=dict)
    burstiness: float = 1.0
    duration_s: float | None = None
    input_lens: tuple[int, ...] | None = None  # per request, when the file lists them
    output_lens: tuple[int, ...] | None = None
    # the dataset the client drew its prompts from, where the file names it (SGLang's
    # dataset_name: "random", "sharegpt", ...), and a random dataset's nominal lengths
    dataset: str | None = None
    random_lengths: RandomLengths | None = None
    # vLLM's random dataset's range ratio, where the client's command states one and the file
    # lists no lengths: each request's were drawn uniformly within that share of the nominal
    # ones, so the replay draws them within it of the run's means, adding up to its totals
    # (their spread, not the values, which only the client's seed and tokenizer would give);
    # 0: every request at the means
    length_spread_frac: float = 0.0
    model_id: str | None = None  # the served model as the tool names it
    # a static batch measured by `llmplan measure`: its batch and context, no traffic
    batch: int | None = None
    notes: tuple[str, ...] = ()
    # the first this many tokens of every prompt were in the server's prefix cache when the
    # run began (an earlier run on the same server sent the same beginnings)
    cached_prefix_tokens: int = 0
    # per request, where the runs before it cached beginnings of different lengths (prompt i
    # of each began prompt i of this one); overrides ``cached_prefix_tokens``
    cached_prefix_lens: tuple[int, ...] | None = None
    # sent to a chat-completions endpoint: the server wraps each prompt in the model's chat
    # template, tokens the client's counts leave out
    chat: bool = False
    # the client sent ignore_eos (vLLM's and SGLang's benchmark clients' --ignore-eos): SGLang
    # admits such requests by its own path where its prefix cache is off
    # (``SchedulerConfig.ignore_eos``)
    ignore_eos: bool = False
    # the deployment the file states, where it states one, as the tool wrote it (SGLang's
    # server_info, vLLM's --metadata keys, llmplan measure's config): TP, the server's
    # --quantization, llmplan's weights name, the KV-cache and 16-bit types; ``stated_by``
    # names the field they came from
    server_tp: int | None = None
    server_quantization: str | None = None
    server_weights: str | None = None
    server_kv_cache: str | None = None
    server_dtype: str | None = None
    stated_by: str | None = None

    def __post_init__(self):
        for k, v in self.metrics.items():
            if k not in METRIC_KEYS:
                raise ValueError(f"unknown metric {k}")
            if not (isinstance(v, float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{k} must be a finite number >= 0, got {v!r}")

    @property
    def lists_lengths(self) -> bool:
        """Whether the file lists each request's prompt and output lengths (one pair each)."""
        return bool(self.input_lens and self.output_lens
                    and len(self.input_lens) == len(self.output_lens))

    @property
    def closed_loop(self) -> bool:
        return self.max_concurrency is not None and not math.isfinite(self.request_rate)

    @property
    def traffic(self) -> str:
        if self.batch is not None:
            return f"static batch of {self.batch}"
        if self.closed_loop:
            n = self.max_concurrency
            return f"a closed loop of {n} client{'s' if n != 1 else ''}"
        rate = "all at once" if math.isinf(self.request_rate) else \
            f"{self.request_rate:g} req/s"
        cap = f", at most {self.max_concurrency} in flight" if self.max_concurrency else ""
        return rate + cap
