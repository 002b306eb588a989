"""Request streams: synthetic (vLLM's random dataset and arrival process) or replayed.

Arrivals follow ``vllm bench serve``: at ``request_rate`` requests/s the gaps between requests
are gamma-distributed with shape ``burstiness`` and mean 1 / rate (burstiness 1 is a Poisson
process; below 1 burstier, above 1 more regular); an infinite rate sends every request at
t = 0; the first request arrives at t = 0. Lengths follow vLLM's random dataset: each prompt and
output length is drawn uniformly from [L (1 - range_ratio), L (1 + range_ratio)], integers,
at least 1. ``prefix_tokens`` (vLLM's ``--random-prefix-len``) puts the same first tokens in
front of every prompt: its length is that prefix plus the drawn one. A request's prefix
(``prefix_id``, ``prefix_tokens``) is what a prefix cache can share with others of the same
id. Pure: the caller reads any trace file.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from planner.core.errors import UsageError
from planner.serving.gcpause import no_cycle_collection


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    arrival_s: float  # nan in a closed loop: a request is sent when a client is free
    prompt_tokens: int
    output_tokens: int
    # the first prefix_tokens of the prompt are those of every request with this prefix_id
    # (-1: none shared), which a prefix cache computes once
    prefix_id: int = -1
    prefix_tokens: int = 0
    # prompt tokens whose KV arrives with the request, computed elsewhere (a disaggregated
    # decode instance receives them from a prefill instance: ``planner.serving.disagg``)
    loaded_tokens: int = 0


def length_range(mean: int, range_ratio: float) -> tuple[int, int]:
    """The lengths vLLM's random dataset draws from, uniformly: [lo, hi], at least 1."""
    lo = max(int(mean * (1 - range_ratio)), 1)
    return lo, max(int(mean * (1 + range_ratio)), lo)


def _shifted(values: list[int], total: int, lo: int, hi: int) -> list[int]:
    """``values`` moved by whole numbers, as evenly as the range lets them, to add up to
    ``total``, each kept within [lo, hi]: what the range cuts off one value goes to the
    others; short of ``total`` only where every value is at the bound."""
    out = list(values)
    for _ in range(len(out) + 1):  # each pass ends at the total or puts a value at a bound
        diff = total - sum(out)
        movable = [i for i, v in enumerate(out) if (v < hi if diff > 0 else v > lo)]
        if not diff or not movable:
            break
        step, extra = divmod(abs(diff), len(movable))
        sign = 1 if diff > 0 else -1
        for k, i in enumerate(movable):
            out[i] = min(max(out[i] + sign * (step + (k < extra)), lo), hi)
    return out


def with_totals(reqs: list[Request], prompt_total: int, output_total: int, prompt_mean: int,
                output_mean: int, range_ratio: float) -> list[Request]:
    """Requests drawn within ``range_ratio`` of the means (``synthetic``), their lengths
    shifted to add up to the totals a benchmark's file states: a draw of a few hundred
    requests averages a point or two off its means, which a run's totals pin down."""
    if not reqs:
        return reqs
    prompts = _shifted([r.prompt_tokens for r in reqs], prompt_total,
                       *length_range(prompt_mean, range_ratio))
    outputs = _shifted([r.output_tokens for r in reqs], output_total,
                       *length_range(output_mean, range_ratio))
    return [replace(r, prompt_tokens=p, output_tokens=o)
            for r, p, o in zip(reqs, prompts, outputs, strict=True)]


def lengths(rng: random.Random, mean: int, range_ratio: float) -> int:
    return rng.randint(*length_range(mean, range_ratio))


def synthetic(num_requests: int, *, prompt_tokens: int, output_tokens: int,
              range_ratio: float = 0.0, request_rate: float = math.inf,
              burstiness: float = 1.0, closed_loop: bool = False,
              seed: int = 0, prefix_tokens: int = 0) -> list[Request]:
    """``num_requests`` requests of random lengths arriving at ``request_rate``, each prompt
    after ``prefix_tokens`` shared ones."""
    if num_requests <= 0:
        raise UsageError("the number of requests must be positive")
    if not 0 <= range_ratio < 1:
        raise UsageError(f"range ratio must be in [0, 1), got {range_ratio:g}")
    if not request_rate > 0:
        raise UsageError(f"request rate must be positive, got {request_rate:g}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise UsageError(f"burstiness must be positive and finite, got {burstiness:g}")
    if prefix_tokens < 0:
        raise UsageError(f"prefix tokens must be >= 0, got {prefix_tokens}")
    shared = (0, prefix_tokens) if prefix_tokens else (-1, 0)
    rng = random.Random(seed)
    # the loop draws a prompt length, an output length and (when timed) the gap to the next
    # arrival, in that order, from the one generator: a seed gives the same stream
    draw, gap = rng.randrange, rng.gammavariate  # randint(lo, hi) is randrange(lo, hi + 1)
    p_lo, p_hi = length_range(prompt_tokens, range_ratio)
    o_lo, o_hi = length_range(output_tokens, range_ratio)
    p_hi, o_hi = p_hi + 1, o_hi + 1
    timed = not closed_loop and not math.isinf(request_rate)
    untimed_s = math.nan if closed_loop else 0.0  # a closed loop's, or all at t = 0
    mean_gap_s = 1.0 / (request_rate * burstiness)
    out: list[Request] = []
    t = 0.0
    if not timed and p_hi - p_lo == 1 and o_hi - o_lo == 1:
        # fixed lengths and no gaps: the draws could only give p_lo and o_lo, and nothing
        # is drawn after them, so skipping them gives the same stream (a third of the time
        # of 100,000 requests)
        with no_cycle_collection():
            return [Request(i, untimed_s, prefix_tokens + p_lo, o_lo, *shared)
                    for i in range(num_requests)]
    with no_cycle_collection():  # a Request each, none in a cycle
        for i in range(num_requests):
            p = draw(p_lo, p_hi)
            o = draw(o_lo, o_hi)
            out.append(Request(i, t if timed else untimed_s, prefix_tokens + p, o, *shared))
            if timed:
                t += gap(burstiness, mean_gap_s)
    return out


def replay(rows: list[tuple], *, request_rate: float = math.inf,
           burstiness: float = 1.0, closed_loop: bool = False, seed: int = 0) -> list[Request]:
    """Requests from a trace: (prompt_tokens, output_tokens, arrival_s or None), and
    optionally (prefix_id, prefix_tokens) after them. Rows with an
    arrival time keep it; rows without one arrive as ``synthetic`` sends them: at
    ``request_rate`` with gamma gaps of shape ``burstiness`` (every one at t = 0 at an infinite
    rate), or when a client of a closed loop is free. The stream is ordered by arrival."""
    rows = [tuple(r) + (-1, 0)[len(r) - 3:] if len(r) < 5 else tuple(r) for r in rows]
    timed = [r[2] is not None for r in rows]
    if any(timed) and not all(timed):
        raise UsageError("a trace gives arrival_s on some rows and not on others: give it on "
                         "every row, or on none (then --request-rate sets the arrivals)")
    if rows and not any(timed):
        paced = synthetic(len(rows), prompt_tokens=1, output_tokens=1,
                          request_rate=request_rate, burstiness=burstiness,
                          closed_loop=closed_loop, seed=seed)
        return [Request(i, q.arrival_s, int(p), int(o), int(g), int(n))
                for i, (q, (p, o, _, g, n)) in enumerate(zip(paced, rows, strict=True))]
    reqs = [Request(i, float(a), int(p), int(o), int(g), int(n))
            for i, (p, o, a, g, n) in enumerate(rows)]
    reqs.sort(key=lambda r: (r.arrival_s, r.id))
    return [replace(r, id=i) for i, r in enumerate(reqs)]


def shaped_lengths(pairs: list[tuple[int, int]], n: int, *, mean_prompt: float | None,
                   mean_output: float | None, seed: int = 0) -> list[tuple[int, int]]:
    """``n`` (prompt, output) lengths drawn from a published distribution of ``pairs`` (such
    as ShareGPT's, ``planner/data/lengths``), each scaled so that the distribution's means are
    ``mean_prompt`` and ``mean_output``: the shape kept, the scale the run's (another model's
    tokenizer counts the same text differently); a mean of None keeps the distribution's
    own, as vLLM's bench serve draws the dataset when no length is given. Drawn without
    replacement in a seeded order, then again, so ``n`` up to ``len(pairs)`` takes each pair
    at most once. Integers, at least 1."""
    if not pairs:
        raise UsageError("a length distribution needs at least one (prompt, output) pair")
    mp = sum(p for p, _ in pairs) / len(pairs)
    mo = sum(o for _, o in pairs) / len(pairs)
    mean_prompt = mp if mean_prompt is None else mean_prompt
    mean_output = mo if mean_output is None else mean_output
    if not (mean_prompt > 0 and mean_output > 0):
        raise UsageError("the mean prompt and output lengths must be positive")
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    out = []
    for k in range(n):
        p, o = pairs[order[k % len(order)]]
        out.append((max(1, round(p * mean_prompt / mp)), max(1, round(o * mean_output / mo))))
    return out


def with_chat_template(reqs: list[Request], template) -> list[Request]:
    """``reqs`` as the engine sees chat messages: each prompt longer by the template's tokens
    (a ``ChatTemplate``), whose opening (a default system message) is the same in every
    request and so one prefix a prefix cache computes once. A request's own shared prefix
    follows that opening: its group shares both; a request without one joins a group of its
    own that shares the opening alone."""
    if not template.tokens:
        return reqs
    lone = 1 + max((r.prefix_id for r in reqs), default=-1)  # an id no request has
    out = []
    for r in reqs:
        pid = lone if r.prefix_id < 0 and template.prefix_tokens else r.prefix_id
        out.append(replace(r, prompt_tokens=r.prompt_tokens + template.tokens, prefix_id=pid,
                           prefix_tokens=template.prefix_tokens + r.prefix_tokens
                           if pid >= 0 else 0))
    return out
