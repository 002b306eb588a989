"""Published serving runs against the simulator: the served half of ``llmplan validate``.

A served dataset (``planner/data/served/<source>.yaml``) names real benchmark result files that
someone measured on real servers and published (a vLLM ``bench serve`` result, SGLang's
``bench_serving`` lines, ...), with the repository, path and commit they were copied from and
the published file's SHA-256, and, for each, the deployment the run was measured on: model,
GPU, tensor-parallel size, precision, engine. A file lies beside the manifest ``verbatim``, or
as an ``extract``: the published JSON less the per-request lists the comparison does not read
(``ttfts``, ``itls``, ``generated_texts``, ``errors``: megabytes of them), written by
``benchmarks/extract_served.py``; every other key, ``input_lens`` and ``output_lens`` included,
keeps its published value. Each run's traffic is replayed through the simulator
(``planner.evidence.compare``: the same request count, lengths and arrival process) with the
engine's profile, and once more with the ideal engine, and the measured TTFT, TPOT and output
throughput are compared with both.

A run is in-sample when an engine parameter names it in ``fitted_on`` (the host costs of a
profile fitted by ``benchmarks/fit_served.py`` on whole sources); every other run is held out.
Pure: no I/O (the CLI reads the files).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planner.core.arith import no_bool_numbers
from planner.core.specs import DType
from planner.evidence.bands import served_regime
from planner.evidence.compare import compare_run
from planner.evidence.runs import RandomLengths, ServedRun
from planner.evidence.validate import Errors, Summary, summarize
from planner.layouts.deployment import Deployment

# The figures compared, the first the run reports of each group: a run that gives only the
# median TTFT is compared on it.
METRIC_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("served TTFT", ("mean_ttft_s", "median_ttft_s")),
    ("served TPOT", ("mean_tpot_s", "median_tpot_s", "mean_itl_s", "median_itl_s")),
    # a run whose file gives only requests a second (a published table's row) is compared on
    # them: with the fixed output lengths such a run states, the error is the same
    ("served throughput", ("output_throughput", "request_throughput")),
    ("served E2E", ("mean_e2el_s", "median_e2el_s")),  # where the file has it (issue 24's
    # per-run E2E target); not among the figures the served fits use
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    _no_bools = field_validator("*", mode="before")(no_bool_numbers)


class ServedSource(_Strict):
    id: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    url: str = Field(min_length=1)  # the folder or file, at the commit copied
    # a repository's committed result files, or pages (issue comments, posts) whose printed
    # result blocks were copied: a page has no commit, each run names its URL in ``path``
    kind: Literal["repository", "page"] = "repository"
    repo: str = Field(min_length=3)  # owner/name (for pages, the tracker's repository or site)
    commit: str | None = Field(None, pattern=r"^[0-9a-f]{40}$")
    date: str = Field(min_length=1)
    engine: str = Field(min_length=1)  # engines_db name that predicts its runs
    engine_version: str = Field(min_length=1)
    hardware_note: str = Field(min_length=1)  # the evidence for the GPU, in the source's words
    workload_note: str | None = None
    notes: str | None = None


class Traffic(_Strict):
    """What the client sent, from its command, for a result that does not record it (a
    printed block of an older release prints no request rate)."""

    dataset: str | None = None
    num_prompts: int | None = Field(None, gt=0, le=10_000_000)
    request_rate: float | None = Field(None, gt=0, allow_inf_nan=True)  # .inf: all at once
    burstiness: float | None = Field(None, gt=0, le=1e6)
    max_concurrency: int | None = Field(None, gt=0, le=10_000_000)
    input_len: int | None = Field(None, gt=0, le=10_000_000)
    output_len: int | None = Field(None, gt=0, le=10_000_000)
    range_ratio: float | None = Field(None, ge=0, le=1)
    # how the client reads range_ratio for its random dataset: "plus-minus", each length
    # uniform within +-range_ratio of the nominal one (vLLM's bench serve, the default); or
    # "from-ratio", uniform from range_ratio x the nominal length up to it (the copy of
    # vLLM's benchmark_serving.py in SemiAnalysis' InferenceX, utils/bench_serving,
    # sample_random_requests: randint(int(L x ratio), L + 1)), whose mean is L (1 + ratio) / 2
    # and half-width (1 - ratio) / (1 + ratio) of it
    range_style: Literal["plus-minus", "from-ratio"] | None = None
    ignore_eos: bool | None = None
    # the first this many tokens of every prompt were cached by the server before the run (the
    # run before it on the same server, with the same seed, sent the same beginnings)
    cached_prefix_tokens: int | None = Field(None, gt=0, le=10_000_000)
    # the runs of this manifest before this one on the same server with the same seed, whose
    # prompt of each index began this run's prompt of that index (SGLang's random dataset
    # repeats one ShareGPT prompt per index to each run's length): request i's first
    # min(its length, the longest of theirs at i) tokens were cached; their files list the
    # lengths of every request
    cached_prefix_runs: list[str] | None = Field(None, min_length=1)
    # the client's random seed (SGLang's bench_serving --seed, default 1), where its command
    # or defaults state it: a run of its random dataset whose file lists no per-request
    # lengths is replayed with the lengths drawn again from it (planner.evidence.redraw)
    seed: int | None = Field(None, ge=0, lt=2**32)
    # the run of this manifest that sent the same requests (the same client, dataset, seed
    # and prompt count) and whose file lists each request's lengths, where this run's file
    # gives only totals: replayed with those lengths, checked against the totals
    # (planner.evidence.redraw.copied_lengths)
    lengths_from: str | None = Field(None, min_length=1)
    # the API the client called; None: read from the client command (vLLM bench serve's
    # --backend openai-chat or --endpoint /v1/chat/completions is the chat API)
    endpoint: Literal["completions", "chat"] | None = None
    client_command: str | None = None
    server_command: str | None = None

    @property
    def chat(self) -> bool:
        """Whether the client sent chat messages, which the server wraps in the model's chat
        template before the engine sees them."""
        if self.endpoint is not None:
            return self.endpoint == "chat"
        cmd = self.client_command or ""
        return "openai-chat" in cmd or "/chat/completions" in cmd

    @model_validator(mode="after")
    def _style_has_a_ratio(self) -> Traffic:
        if self.range_style is not None and (self.range_ratio is None or
                                             self.dataset != "random"):
            raise ValueError("range_style: says how a random dataset's range_ratio is read; "
                             "give dataset random and range_ratio with it")
        return self

    @field_validator("request_rate")
    @classmethod
    def _not_nan(cls, v):
        if v is not None and math.isnan(v):
            raise ValueError("request_rate: not a number")
        return v

    def apply(self, run: ServedRun) -> ServedRun:
        """The run with the traffic its command states put over what the file says."""
        upd: dict = {}
        if self.request_rate is not None:
            upd["request_rate"] = self.request_rate
        if self.max_concurrency is not None:
            upd["max_concurrency"] = self.max_concurrency
        if self.burstiness is not None:
            upd["burstiness"] = self.burstiness
        if self.num_prompts is not None:
            upd["num_prompts"] = self.num_prompts
        if self.cached_prefix_tokens is not None:
            upd["cached_prefix_tokens"] = self.cached_prefix_tokens
        if self.ignore_eos is not None:
            upd["ignore_eos"] = self.ignore_eos
        if (run.tool.startswith("sglang-bench-serving") and run.random_lengths is None
                and self.dataset == "random" and None not in (
                    self.range_ratio, self.input_len, self.output_len)):
            # a printed SGLang block does not say how its random lengths were drawn; the
            # command does (vLLM's random dataset reads its ratio otherwise: RandomLengths is
            # SGLang's)
            upd["random_lengths"] = RandomLengths(self.input_len, self.output_len,
                                                  self.range_ratio)
        if (run.tool == "vllm-bench-serve" and self.dataset == "random"
                and 0 < (self.range_ratio or 0) < 1 and not run.lists_lengths):
            # vLLM's random dataset: lengths uniform on [L (1 - r), L (1 + r)]; requests at
            # one length finish together and the next ones go out together, where spread
            # lengths let them go out one at a time. From the ratio up ([r L, L]): the same
            # uniform spread about its mean, (1 - r) / (1 + r) of it
            r = self.range_ratio
            upd["length_spread_frac"] = ((1 - r) / (1 + r) if self.range_style == "from-ratio"
                                         else r)
        if self.chat:
            upd["chat"] = True
        return replace(run, **upd) if upd else run


class Checkpoint(_Strict):
    """The checkpoint a run's server loaded, where it stores its weights otherwise than the
    model file's does (a quantized release of a 16-bit model: Qwen/Qwen3-8B-FP8): its name as
    the server command or the result file gives it, where its quantization is stated and in
    that source's words, and its config.json's ``quantization_config``, read as a config.json's
    is (``planner/io/quant_config.py``). Without one, a run's quantized ``weights`` are
    replayed as the engine quantizing the 16-bit checkpoint at load (vLLM's --quantization)."""

    repo: str = Field(min_length=3, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+$")
    source: str = Field(pattern=r"^https://\S+$")  # the page read: card, config, paper
    quote: str = Field(min_length=1)  # what the source says of the quantization
    quantization_config: dict


class ServedEntry(_Strict):
    id: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    file: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # beside the manifest
    path: str = Field(min_length=1)  # where it lies in the source repository
    commit: str | None = Field(None, pattern=r"^[0-9a-f]{40}$")  # when not the source's
    # of the file as published (an excerpt's or a table row's: of the kept file)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    # excerpt: a printed block; table: a row of a published table (a report's, where the result
    # files were not published), its figures as printed under the result file's keys
    kept: Literal["verbatim", "extract", "excerpt", "table"] = "verbatim"
    model: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    tp: int = Field(1, gt=0, le=1024)
    weights: DType = DType.bf16
    kv_cache: DType | None = None
    engine: str | None = None  # this run's, when not the source's
    engine_version: str | None = None  # this run's, when not the source's
    checkpoint: Checkpoint | None = None  # the quantized release the server loaded
    traffic: Traffic | None = None
    # figures not compared, each for a reason the note gives (a measurement the simulator
    # cannot reproduce by construction, such as prompts served from a warm prefix cache)
    skip: list[Literal["TTFT", "TPOT", "throughput", "E2E"]] = Field(default_factory=list)
    note: str | None = None

    @model_validator(mode="after")
    def _skip_has_reason(self) -> ServedEntry:
        if self.skip and not self.note:
            raise ValueError(f"run {self.id}: skip needs a note saying why")
        return self

    @model_validator(mode="after")
    def _checkpoint_is_served(self) -> ServedEntry:
        cmd = self.traffic.server_command if self.traffic else None
        if self.checkpoint is not None and cmd and self.checkpoint.repo not in cmd:
            raise ValueError(f"run {self.id}: checkpoint.repo {self.checkpoint.repo} is not "
                             "in the server command")
        return self


class ServedDataset(_Strict):
    source: ServedSource
    runs: list[ServedEntry] = Field(min_length=1)
    # runs of the source deliberately left out, each with its reason (they are not predicted)
    left_out: list[str] = Field(default_factory=list)

    def url_of(self, e: ServedEntry) -> str:
        if self.source.kind == "page":
            return e.path
        return f"https://github.com/{self.source.repo}/blob/{e.commit or self.source.commit}/" \
               f"{e.path}"

    @model_validator(mode="after")
    def _commit(self) -> ServedDataset:
        if self.source.kind == "repository" and self.source.commit is None:
            raise ValueError("source.commit: a repository source names the commit copied")
        if self.source.kind == "page":
            for r in self.runs:
                if not r.path.startswith("https://"):
                    raise ValueError(f"run {r.id}: path must be the page's https:// URL")
        return self

    @model_validator(mode="after")
    def _unique(self) -> ServedDataset:
        ids = [r.id for r in self.runs]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"run id {', '.join(dup)} appears twice")
        for r in self.runs:
            twin = r.traffic.lengths_from if r.traffic else None
            if twin is not None and (twin == r.id or twin not in ids):
                raise ValueError(f"run {r.id}: traffic.lengths_from: {twin!r} is not another "
                                 "run of this manifest")
            if twin is not None and r.traffic.seed is not None:
                raise ValueError(f"run {r.id}: traffic: seed and lengths_from both given; "
                                 "give one")
            before = r.traffic.cached_prefix_runs if r.traffic else None
            if not before:
                continue
            if r.traffic.cached_prefix_tokens is not None:
                raise ValueError(f"run {r.id}: traffic: cached_prefix_tokens and "
                                 "cached_prefix_runs both given; give one")
            for b in before:
                if b == r.id or b not in ids:
                    raise ValueError(f"run {r.id}: traffic.cached_prefix_runs: {b!r} is not "
                                     "another run of this manifest")
        return self

    def entry(self, run_id: str) -> ServedEntry:
        return next(r for r in self.runs if r.id == run_id)


@dataclass(frozen=True)
class ServedComparison(Errors):
    source: str
    run: str  # the manifest entry and the run's label within its file
    engine: str
    metric: str  # a ServedRun metric key: mean_ttft_s, output_throughput, ...
    phase: str  # served TTFT, served TPOT, served throughput
    model: str
    gpu: str
    tp: int
    traffic: str
    mean_input_tokens: float
    mean_output_tokens: float
    measured: float
    predicted: float
    ideal: float
    in_sample: bool = False  # set for the runs of a source an engine's host costs were fitted on
    regime: str = "unsaturated"  # or "saturated" (planner.evidence.bands.served_regime)


def _pick(run: ServedRun, keys: tuple[str, ...]) -> str | None:
    for k in keys:
        if run.metrics.get(k):
            return k
    return None


def compared_figures(entry: ServedEntry, run: ServedRun,
                     predicted) -> list[tuple[str, str, float]]:
    """(phase, metric, predicted) of each figure a run is compared on: per phase, the first
    metric of its group the run reports, unless the entry skips the phase; ``predicted(metric)``
    gives the simulated value, and a figure without a finite one is left out."""
    out = []
    for phase, keys in METRIC_GROUPS:
        if phase.split()[-1] in entry.skip:
            continue
        k = _pick(run, keys)
        if k is None:
            continue
        p = predicted(k)
        if p is not None and math.isfinite(p):
            out.append((phase, k, p))
    return out


def compare_entry(source: ServedSource, entry: ServedEntry, runs: list[ServedRun],
                  setup: Deployment, ideal: Deployment,
                  fitted_rows: frozenset[str] | set[str] = frozenset(), cache=None
                  ) -> list[ServedComparison]:
    """Every run of one result file, simulated with the engine's profile and the ideal
    engine's, against what was measured. ``fitted_rows``: the engine's ``fitted_on`` entries
    (``source:run``): a run named there is in-sample. ``cache``: a
    ``planner.serving.cost.CostCache`` shared by the files' replicas (``compare_run``)."""
    out: list[ServedComparison] = []
    fitted = f"{source.id}:{entry.id}" in fitted_rows
    for run in runs:
        cmp = compare_run(run, setup, cache)
        real = {m.metric: m for m in cmp.rows}
        # a closed loop offers what the server takes: no rate to fall behind (NaN), as
        # simulate classifies its own; saturated only where its batch fills
        regime = served_regime(math.nan if run.closed_loop else run.request_rate,
                               cmp.simulated.get("request_throughput"),
                               cmp.simulated.get("max_running_requests"),
                               setup.engine.max_num_seqs)
        bound = {m.metric: m for m in compare_run(run, ideal, cache).rows}
        label = entry.id if len(runs) == 1 else f"{entry.id} {run.label}"
        for phase, k, p in compared_figures(entry, run, lambda k, real=real: real[k].simulated):
            b = bound[k].simulated
            if b is None or not math.isfinite(b):
                continue
            out.append(ServedComparison(
                source.id, label, setup.engine.name, k, phase, entry.model, entry.gpu, entry.tp,
                run.traffic, run.mean_input_tokens, run.mean_output_tokens, run.metrics[k], p,
                b, fitted, regime))
    return out


def summarize_served(rows: list[ServedComparison], *, by_source: bool = True) -> list[Summary]:
    """Median and 90th-percentile absolute error per (source, engine, phase); with
    ``by_source`` False, over all sources together."""
    return summarize(rows, by_source=by_source, phase_of=lambda c: c.phase)
