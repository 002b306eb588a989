"""Speculative decoding in the serving simulator: what it costs a step, and the KV it takes.

With speculation each decoding request takes 1 + k tokens of the step's budget (vLLM V1
schedules the k proposed tokens as tokens of the step); the target verifies k + 1 tokens per
request in that step (every position's logits) and each request keeps, on average,
E = (1 - a^(k+1)) / (1 - a) of them (``planner.layouts.speculation.expected_tokens``). The
drafter (a draft model, or one decoder layer for MTP and EAGLE heads) runs k passes a step:
the first over every token the step schedules (the 1 + k each decoding request verified, and
the prompt chunks, so that it holds their KV too), then k - 1 of one token a request
(``planner.serving.decoding.SpecDecodePool.draft_s``); n-gram prompt lookup runs on the host
and costs the GPU nothing. The drafter's weights and its KV cache (one token of it per token
of the target's) come out of the same memory as the target's block pool, as in vLLM, whose
draft and target share one KV pool.

The simulator advances every decoding request by E tokens per step: after n steps a request
has generated floor(n E) tokens (capped at its output), so the steps it needs are
ceil(remaining / E). The acceptance of each step is its mean, not a draw: mean TTFT, TPOT and
throughput follow the expected tokens; the spread of TPOT across requests is understated.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.estimate import Prepared
from planner.core.memory import kv_cache_bytes_per_token
from planner.core.specs import HardwareSpec, ModelSpec, Options
from planner.layouts.speculation import (
    SpeculationConfig,
    check_draft,
    drafter,
    expected_tokens,
    extra_weight_bytes,
)
from planner.serving.cost import StepCoster


@dataclass(frozen=True)
class SpecServing:
    config: SpeculationConfig
    tokens_per_step: float  # E, per decoding request and step
    draft: StepCoster | None  # the drafter's operators; None: n-gram lookup on the host
    draft_weight_bytes: float  # per GPU
    draft_kv_bytes_per_token: float  # per GPU, one token of the drafter's cache
    target_kv_bytes_per_token: float  # per GPU

    @property
    def k(self) -> int:
        return self.config.k

    def kv_capacity_tokens(self, target_tokens: int) -> int:
        """Tokens the shared pool holds once the drafter's weights are loaded and each token
        also caches the drafter's KV: (target tokens x target bytes - draft weights) /
        (target + draft bytes per token)."""
        free = target_tokens * self.target_kv_bytes_per_token - self.draft_weight_bytes
        per = self.target_kv_bytes_per_token + self.draft_kv_bytes_per_token
        return max(0, int(free // per))


def spec_serving(m: ModelSpec, hw: HardwareSpec, prep: Prepared, o: Options, *, tp: int,
                 cfg: SpeculationConfig) -> SpecServing:
    """Speculative decoding of ``cfg`` for a replica of ``tp`` GPUs."""
    check_draft(m, cfg, tp)
    p = prep.precision
    draft = None
    draft_kv = 0.0
    d = drafter(m, cfg)
    if d is not None:
        draft = StepCoster(d, hw, prep, o, tp=tp)
        draft_kv = kv_cache_bytes_per_token(d, p, tp=tp)
    return SpecServing(cfg, expected_tokens(cfg.acceptance, cfg.k), draft,
                       extra_weight_bytes(m, prep, tp, cfg), draft_kv,
                       kv_cache_bytes_per_token(m, p, tp=tp))
