"""A measured serving run against llmplan's prediction and the hardware's limits.

For each run (``planner.evidence.runs.ServedRun``):

- *simulated*: the run's traffic replayed through ``planner.serving.sim`` with the engine's
  scheduler defaults: the same number of requests, their lengths (each request's when the file
  lists them, else the run's means), and the same arrival process (gamma gaps at the request
  rate with its burstiness, all at once for an infinite rate, or a closed loop of
  ``max_concurrency`` clients, paced by the rate where the run gives both). Its figures are
  those of the measured run's keys.
- *steady state*: ``estimate`` at the concurrency the server actually held, by Little's law
  the decoding sequences = output throughput x mean TPOT: its TPOT and output throughput, the
  figures a static model gives for that load.
- *measured utilization*: the bytes a decode step must move at that concurrency (the weights
  it reads, a MoE model's routed experts only as many as its tokens pick, as ``estimate``'s
  MBU counts them, and each sequence's KV cache at its mean context, prompt + output / 2) over the
  measured mean TPOT, as a fraction of the datasheet bandwidth of the ``tp`` GPUs (MBU); and
  the FLOPs the run's tokens need (each prompt's prefill, each output token's decode at the
  mean context) over its duration, as a fraction of their dense peak (MFU).

The signed error of a figure is predicted / measured - 1: positive means llmplan predicts a
longer time (pessimistic) or a higher throughput (optimistic). Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from planner.core.errors import LlmplanError, UsageError
from planner.core.estimate import estimate
from planner.core.ops import decode_ops, prefill_ops, total_flops
from planner.core.specs import Parallelism, Workload
from planner.evidence.runs import METRIC_KEYS, ServedRun
from planner.layouts.deployment import Deployment

MAX_SIM_REQUESTS = 5000  # a longer run is simulated on its first 5,000 requests
SEED = 0  # of the simulated arrivals


@dataclass(frozen=True)
class MetricRow:
    metric: str  # a METRIC_KEYS name: mean_ttft_s, output_throughput, ...
    measured: float
    simulated: float | None
    steady: float | None = None

    @property
    def error(self) -> float | None:
        if self.simulated is None or not self.measured:
            return None
        return self.simulated / self.measured - 1

    @property
    def steady_error(self) -> float | None:
        if self.steady is None or not self.measured:
            return None
        return self.steady / self.measured - 1


@dataclass(frozen=True)
class RunComparison:
    run: ServedRun
    rows: tuple[MetricRow, ...]
    concurrency: float | None  # decoding sequences the server held (Little's law)
    achieved_bandwidth_bytes_per_s: float | None
    mbu: float | None
    achieved_flops_per_s: float | None
    mfu: float | None
    simulated: dict = field(default_factory=dict)  # the simulator's whole summary
    notes: tuple[str, ...] = ()

    @property
    def mbu_impossible(self) -> bool:
        """Above 100%: the run moved the bytes a step needs faster than the datasheet allows,
        so the deployment it is compared with (precision, TP) is not the one measured."""
        return self.mbu is not None and self.mbu > 1

    def as_dict(self) -> dict:
        r = self.run
        return {
            "source": r.source, "tool": r.tool, "label": r.label, "traffic": r.traffic,
            "request_rate": None if not math.isfinite(r.request_rate) else r.request_rate,
            "max_concurrency": r.max_concurrency, "num_prompts": r.num_prompts,
            "completed": r.completed, "mean_input_tokens": r.mean_input_tokens,
            "mean_output_tokens": r.mean_output_tokens, "model_id": r.model_id,
            "decode_concurrency": self.concurrency,
            "achieved_bandwidth_bytes_per_s": self.achieved_bandwidth_bytes_per_s,
            "mbu": self.mbu, "mbu_impossible": self.mbu_impossible,
            "achieved_flops_per_s": self.achieved_flops_per_s,
            "mfu": self.mfu,
            "metrics": {m.metric: {"measured": m.measured, "simulated": m.simulated,
                                   "steady_state": m.steady, "error": m.error,
                                   "steady_state_error": m.steady_error} for m in self.rows},
            "notes": list(r.notes + self.notes),
        }


def mean_tpot_s(run: ServedRun) -> float | None:
    """The run's seconds per output token: mean TPOT, else mean ITL, else median TPOT."""
    m = run.metrics
    return m.get("mean_tpot_s") or m.get("mean_itl_s") or m.get("median_tpot_s")


def decode_concurrency(run: ServedRun) -> float | None:
    """Sequences decoding at once: a static run's batch, else (Little's law) output tokens/s x
    seconds per output token."""
    if run.batch is not None:
        return float(run.batch)
    tpot, out = mean_tpot_s(run), run.metrics.get("output_throughput")
    if tpot and out:
        return out * tpot
    return None


def _duration_s(run: ServedRun) -> float | None:
    if run.duration_s:
        return run.duration_s
    rt = run.metrics.get("request_throughput")
    return run.completed / rt if rt else None


def _mean_cached_tokens(run: ServedRun) -> float:
    """The prompt tokens a request of the run found in the prefix cache, on average."""
    if run.cached_prefix_lens:
        return sum(run.cached_prefix_lens) / len(run.cached_prefix_lens)
    return float(run.cached_prefix_tokens)


def utilization(run: ServedRun, s: Deployment) -> tuple[float | None, ...]:
    """(concurrency, achieved bytes/s, MBU, achieved FLOP/s, MFU) of a measured run."""
    p, m, hw = s.precision, s.model, s.hardware
    n = decode_concurrency(run)
    tpot = mean_tpot_s(run)
    ctx = max(1, round(run.mean_input_tokens + run.mean_output_tokens / 2))
    bw = mbu = flops_s = mfu = None
    if n is not None and tpot:
        # what a decode step of n sequences reads, as estimate's MBU counts it: the weights
        # it touches (a MoE model's routed experts only as many as n tokens pick, the
        # embedding's n rows) and the KV cache at the mean context
        ops = decode_ops(m, p, batch=max(1, round(n)), context_tokens=ctx,
                         lm_head_sharded=s.engine.lm_head_sharded)
        step_bytes = sum((o.weight_bytes + o.kv_bytes) * o.count for o in ops)
        bw = step_bytes / tpot
        mbu = bw / (hw.memory_bandwidth_bytes_per_s * s.tp)
    dur = _duration_s(run)
    if dur and run.completed:
        prompt = max(1, round(run.mean_input_tokens))
        per_prompt = total_flops(prefill_ops(m, p, batch=1, prompt_tokens=prompt))
        cached = min(prompt - 1, round(_mean_cached_tokens(run)))
        if cached > 0:  # found in the prefix cache: computed by an earlier run, not this one
            # (causal attention: a prompt's FLOPs less its beginning's are its rest's)
            per_prompt -= total_flops(prefill_ops(m, p, batch=1, prompt_tokens=cached))
        per_token = total_flops(decode_ops(m, p, batch=1, context_tokens=ctx))
        if run.batch is not None:  # a static batch: one decode step of the whole batch
            flops_s = run.batch * per_token / tpot if tpot else None
        else:
            flops_s = run.completed * (per_prompt + run.mean_output_tokens * per_token) / dur
        if flops_s is not None:
            peak = hw.peak_flops_per_s(p.compute_dtype)
            mfu = flops_s / (peak * s.tp)
    return n, bw, mbu, flops_s, mfu


def simulate_run(run: ServedRun, s: Deployment, *, step_coster=None,
                 itl: bool = True) -> tuple[dict, tuple[str, ...]]:
    """The simulator's summary for the run's traffic (keys as vLLM's result file).
    ``step_coster``: ``planner.serving.run.coster(s)``, built once for many runs; ``itl``:
    False leaves the ITL statistics out of the summary."""
    from planner.serving import run as serving
    from planner.serving.metrics import summary
    from planner.serving.traffic import Request, synthetic, with_chat_template, with_totals

    notes: list[str] = []
    n = min(run.num_prompts or run.completed, MAX_SIM_REQUESTS)
    if n < (run.num_prompts or run.completed):
        notes.append(f"simulated the first {n:,} of {run.num_prompts:,} requests")
    closed = run.closed_loop
    if run.max_concurrency is not None and not closed:
        notes.append(f"at most {run.max_concurrency} requests in flight beside the rate: each "
                     "goes out at its arrival time or when one in flight finishes, whichever "
                     "is later (the benchmark client's semaphore)")
    listed = run.lists_lengths
    spread = run.length_spread_frac  # set only where the file lists no lengths (Traffic.apply)
    mean_in, mean_out = max(1, round(run.mean_input_tokens)), max(1, round(run.mean_output_tokens))
    reqs = synthetic(max(n, 1), prompt_tokens=mean_in, output_tokens=mean_out,
                     range_ratio=spread,
                     request_rate=run.request_rate if not closed else math.inf,
                     burstiness=run.burstiness, closed_loop=closed, seed=SEED)
    if spread:
        reqs = with_totals(reqs, round(run.mean_input_tokens * len(reqs)),
                           round(run.mean_output_tokens * len(reqs)), mean_in, mean_out,
                           spread)
        notes.append(f"each request's lengths drawn uniformly within {spread:.0%} of the "
                     "means, adding up to the run's totals (the client's random dataset; its "
                     "own draw is not in the file)")
    if listed:
        lens = list(zip(run.input_lens, run.output_lens, strict=True))[:n]
        reqs = [Request(r.id, r.arrival_s, max(1, p), max(1, o))
                for r, (p, o) in zip(reqs, lens, strict=False)]  # lens may be fewer
    template = chat_template_tokens(run, s.model)
    if template:
        reqs = with_chat_template(reqs, s.model.chat_template)
        notes.append(f"each prompt {template} tokens longer than the client counted "
                     f"({s.model.name}'s chat template; the first "
                     f"{s.model.chat_template.prefix_tokens} the same in every request)")
    elif run.chat and s.model.chat_template is None:
        notes.append(f"chat API: {s.model.name}'s chat-template tokens are not recorded; "
                     "prompts replayed as the client counted them")
    warm = None
    cached = run.cached_prefix_lens or (run.cached_prefix_tokens,) * len(reqs)
    if any(cached):  # each prompt's own beginning, cached by an earlier run
        reqs = [replace(r, prefix_id=i, prefix_tokens=min(c, r.prompt_tokens - 1)) if c else r
                for i, (r, c) in enumerate(zip(reqs, cached, strict=False))]
        warm = {r.prefix_id: r.prefix_tokens for r in reqs if r.prefix_tokens}
        if run.cached_prefix_lens:
            share = sum(r.prefix_tokens for r in reqs) / max(1, sum(r.prompt_tokens
                                                                    for r in reqs))
            notes.append(f"{share:.0%} of the prompt tokens were in the prefix cache when the "
                         "run began (each prompt's beginning, sent by the runs before it)")
        else:
            notes.append(f"the first {run.cached_prefix_tokens:,} tokens of each prompt were "
                         "in the prefix cache when the run began")
    cfg = serving.scheduler(s, max_model_len=s.engine.max_model_len or
                            s.model.max_position_embeddings,
                            max_concurrency=run.max_concurrency, ignore_eos=run.ignore_eos,
                            chat_template_parse_s=serving.chat_parse_s(s, run.chat))
    if cfg.chat_template_parse_s:
        notes.append(f"the API server parses {s.model.name}'s chat template anew for each "
                     f"request, {cfg.chat_template_parse_s * 1e3:,.1f} ms beside its other "
                     f"work ({s.engine.display_name} release {s.engine.release or 'named'})")
    sim = summary(serving.run(s, reqs, cfg, step_coster=step_coster, warm_prefixes=warm),
                  itl=itl)
    if sim["failed"]:
        notes.append(f"{sim['failed']:,} simulated requests refused: {sim['failed_reason']}")
    return sim, tuple(notes)


def warmed_by(run: ServedRun, earlier: list[tuple[str, list[ServedRun]]],
              where: str) -> ServedRun:
    """``run`` as replayed after ``earlier`` ((file name, its runs) in the order sent) on the
    same server, whose prompt of each index began this run's prompt of that index (a sweep of
    lengths with one seed: SGLang's random dataset repeats one ShareGPT conversation per
    index to each run's length): request i's first min(its length, the longest earlier prompt
    i) tokens are in the prefix cache. Each file must list its requests' lengths; one of
    fewer requests warms only the indices it sent (SGLang's seeded draw is sequential: the
    first n requests of a longer run are those of a run of n)."""
    if not run.input_lens:
        raise LlmplanError(f"{where} lists no per-request input_lens (SGLang's bench_serving "
                         "--output-details, vLLM's bench serve --save-detailed)")
    longest = [0] * len(run.input_lens)
    for name, runs in earlier:
        if len(runs) != 1:
            raise LlmplanError(f"{where}: {name} holds {len(runs)} runs; name a file of one "
                               "run, the one sent before")
        lens = runs[0].input_lens
        if not lens:
            raise LlmplanError(f"{where}: {name} does not list one input length for each of "
                             f"the {len(longest)} requests")
        # an earlier run of fewer requests leaves the rest cold; of more, its first ones count
        longest = [max(a, b) for a, b in zip(longest, lens, strict=False)] + longest[len(lens):]
    return replace(run, cached_prefix_lens=tuple(
        min(p, c) for p, c in zip(run.input_lens, longest, strict=True)))


def chat_template_tokens(run: ServedRun, model) -> int:
    """The tokens the server added to each of the run's prompts: its model's chat template,
    where the client called the chat API (vLLM's bench serve counts the message only)."""
    if not run.chat or model.chat_template is None:
        return 0
    return model.chat_template.tokens


def _sim_value(sim: dict, metric: str) -> float | None:
    if metric.endswith("_s"):
        v = sim.get(metric[:-2] + "_ms")
        return None if v is None or not math.isfinite(v) else v / 1e3
    v = sim.get(metric)
    return None if v is None or not math.isfinite(v) else float(v)


def _static_prediction(run: ServedRun, s: Deployment) -> dict:
    """A static batch (``llmplan measure``): the estimate's decode step at the run's context
    and the prefill of the batch."""
    e = estimate(s.model, s.hardware, precision=s.precision, options=s.options,
                 workload=Workload(batch=run.batch, prompt_tokens=max(1, round(
                     run.mean_input_tokens)), output_tokens=1),
                 parallelism=Parallelism(tp=s.tp), engine=s.engine)
    return {"median_tpot_ms": e.tpot_s * 1e3, "mean_tpot_ms": e.tpot_s * 1e3,
            "median_ttft_ms": e.ttft_s * 1e3, "mean_ttft_ms": e.ttft_s * 1e3}


def compare_run(run: ServedRun, s: Deployment, cache=None) -> RunComparison:
    """Measured against simulated and steady-state figures, and the measured MBU / MFU.
    ``cache``: a ``planner.serving.cost.CostCache`` the simulated replica's step coster
    shares with other runs' (the same figures, sooner)."""
    if s.model.max_position_embeddings < run.mean_input_tokens + run.mean_output_tokens:
        raise UsageError(f"{run.source}: {run.label}: prompts of {run.mean_input_tokens:,.0f} "
                         f"+ {run.mean_output_tokens:,.0f} tokens exceed {s.model.name}'s "
                         f"context of {s.model.max_position_embeddings:,}")
    notes: tuple[str, ...] = ()
    if run.batch is not None:
        sim = _static_prediction(run, s)
    else:
        from planner.serving.run import coster

        sim, notes = simulate_run(run, s, step_coster=None if cache is None
                                  else coster(s, cache))
    n, bw, mbu, flops_s, mfu = utilization(run, s)
    steady: dict[str, float] = {}
    if n is not None and run.batch is None and n >= 0.5:
        b = max(1, round(n))
        e = estimate(s.model, s.hardware, precision=s.precision, options=s.options,
                     workload=Workload(batch=b, prompt_tokens=max(1, round(
                         run.mean_input_tokens)), output_tokens=max(1, round(
                             run.mean_output_tokens))),
                     parallelism=Parallelism(tp=s.tp), engine=s.engine)
        steady = {"mean_tpot_s": e.tpot_s, "median_tpot_s": e.tpot_s,
                  "output_throughput": b / e.tpot_s}
    rows = tuple(MetricRow(k, run.metrics[k], _sim_value(sim, k), steady.get(k))
                 for k in METRIC_KEYS if k in run.metrics)
    return RunComparison(run, rows, n, bw, mbu, flops_s, mfu, sim, notes)
