"""Request streams: synthetic (vLLM's random dataset and arrival process) or replayed.

Arrivals follow ``vllm bench serve``: at ``request_rate`` requests/s the gaps between requests
are gamma-distributed with shape ``burstiness`` and mean 1 / rate (burstiness 1 is a Poisson
process; below 1 burstier, above 1 more regular); an infinite rate sends every request at
t = 0; the first request arrives at t = 0. Lengths follow vLLM's random dataset: each prompt and
output length is drawn uniformly from [L (1 - range_ratio), L (1 + range_ratio)], integers,
at least 1. Pure: the caller reads any trace file.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from planner.core.errors import UsageError


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    arrival_s: float  # nan in a closed loop: a request is sent when a client is free
    prompt_tokens: int
    output_tokens: int


def lengths(rng: random.Random, mean: int, range_ratio: float) -> int:
    lo = max(int(mean * (1 - range_ratio)), 1)
    hi = max(int(mean * (1 + range_ratio)), lo)
    return rng.randint(lo, hi)


def synthetic(num_requests: int, *, prompt_tokens: int, output_tokens: int,
              range_ratio: float = 0.0, request_rate: float = math.inf,
              burstiness: float = 1.0, closed_loop: bool = False,
              seed: int = 0) -> list[Request]:
    """``num_requests`` requests of random lengths arriving at ``request_rate``."""
    if num_requests <= 0:
        raise UsageError("the number of requests must be positive")
    if not 0 <= range_ratio < 1:
        raise UsageError(f"range ratio must be in [0, 1), got {range_ratio:g}")
    if not request_rate > 0:
        raise UsageError(f"request rate must be positive, got {request_rate:g}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise UsageError(f"burstiness must be positive and finite, got {burstiness:g}")
    rng = random.Random(seed)
    out: list[Request] = []
    t = 0.0
    for i in range(num_requests):
        p = lengths(rng, prompt_tokens, range_ratio)
        o = lengths(rng, output_tokens, range_ratio)
        arrival = math.nan if closed_loop else (0.0 if math.isinf(request_rate) else t)
        out.append(Request(i, arrival, p, o))
        if not closed_loop and not math.isinf(request_rate):
            t += rng.gammavariate(burstiness, 1.0 / (request_rate * burstiness))
    return out


def replay(rows: list[tuple[int, int, float | None]], *, request_rate: float = math.inf,
           burstiness: float = 1.0, closed_loop: bool = False, seed: int = 0) -> list[Request]:
    """Requests from a trace: (prompt_tokens, output_tokens, arrival_s or None). Rows with an
    arrival time keep it; rows without one arrive as ``synthetic`` sends them: at
    ``request_rate`` with gamma gaps of shape ``burstiness`` (every one at t = 0 at an infinite
    rate), or when a client of a closed loop is free. The stream is ordered by arrival."""
    timed = [a is not None for _, _, a in rows]
    if any(timed) and not all(timed):
        raise UsageError("a trace gives arrival_s on some rows and not on others: give it on "
                         "every row, or on none (then --request-rate sets the arrivals)")
    if rows and not any(timed):
        paced = synthetic(len(rows), prompt_tokens=1, output_tokens=1,
                          request_rate=request_rate, burstiness=burstiness,
                          closed_loop=closed_loop, seed=seed)
        return [Request(i, q.arrival_s, int(p), int(o))
                for i, (q, (p, o, _)) in enumerate(zip(paced, rows, strict=True))]
    reqs = [Request(i, float(a), int(p), int(o)) for i, (p, o, a) in enumerate(rows)]
    reqs.sort(key=lambda r: (r.arrival_s, r.id))
    return [Request(i, r.arrival_s, r.prompt_tokens, r.output_tokens)
            for i, r in enumerate(reqs)]


def shaped_lengths(pairs: list[tuple[int, int]], n: int, *, mean_prompt: float,
                   mean_output: float, seed: int = 0) -> list[tuple[int, int]]:
    """``n`` (prompt, output) lengths drawn from a published distribution of ``pairs`` (such
    as ShareGPT's, ``planner/data/lengths``), each scaled so that the distribution's means are
    ``mean_prompt`` and ``mean_output``: the shape kept, the scale the run's (another model's
    tokenizer counts the same text differently). Drawn without replacement in a seeded order,
    then again, so ``n`` up to ``len(pairs)`` takes each pair at most once. Integers, at
    least 1."""
    if not pairs:
        raise UsageError("a length distribution needs at least one (prompt, output) pair")
    if not (mean_prompt > 0 and mean_output > 0):
        raise UsageError("the mean prompt and output lengths must be positive")
    mp = sum(p for p, _ in pairs) / len(pairs)
    mo = sum(o for _, o in pairs) / len(pairs)
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    out = []
    for k in range(n):
        p, o = pairs[order[k % len(order)]]
        out.append((max(1, round(p * mean_prompt / mp)), max(1, round(o * mean_output / mo))))
    return out
