"""Expert parallelism: a MoE model's routed experts split over N GPUs, attention data-parallel.

The layout of DeepSeek-V3-style serving (SGLang's and vLLM's expert parallelism with
data-parallel attention): each of the N GPUs holds every non-expert weight (attention, dense
layers, shared experts, router, embeddings) and E / N of each layer's routed experts, and
serves its own B / N of the batch, with those sequences' KV cache. In each MoE layer every GPU
sends each of its tokens' hidden states to the GPUs holding its top-k experts (dispatch) and
receives the results back (combine): an all-to-all of b x k x hidden x 2 bytes each way per
GPU, of which (N - 1) / N leaves the GPU, over NVLink or, past one server, the inter-node
network, plus the engine's collective latency per all-to-all.

Routing is uniform at random, so the n = B x k token-expert pairs of a step fall on the N GPUs
as a multinomial, and the most loaded GPU sets the step. Its expected load is taken as the
mean plus sqrt(2 ln N) standard deviations (the Gaussian approximation of the expected
maximum of N bins; Gumbel 1958), n / N + sqrt(2 ln N x n (1 / N) (1 - 1 / N)), no less than
ceil(n / N) and no more than n; real
routers are less even, so this is a lower bound on imbalance. The step is the non-expert
operators at the GPU's own batch, the routed experts at the most loaded GPU's tokens, and the
all-to-alls. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.core.arith import vmax, vmin
from planner.core.errors import UsageError
from planner.core.estimate import Prepared
from planner.core.headline import Headline
from planner.core.memory import (
    ROUTED,
    activation_bytes,
    kv_cache_bytes,
    memory_share,
    usable_bytes,
    weight_bytes_breakdown,
)
from planner.core.ops import StepShape, shape_ops
from planner.core.roofline import op_time, with_host
from planner.core.specs import HardwareSpec, ModelSpec, Options


def max_load(pairs, gpus: int):
    """Expected token-expert pairs on the most loaded of ``gpus`` GPUs under uniform routing
    (``pairs``: a number or an array)."""
    if gpus == 1:
        return pairs
    p = 1 / gpus
    approx = pairs * p + (2 * math.log(gpus) * pairs * p * (1 - p)) ** 0.5
    # some GPU holds at least the mean rounded up (1 pair over 64 GPUs: one holds it)
    return vmin(pairs, vmax(-(-(pairs * p) // 1), approx))


@dataclass(frozen=True)
class ExpertParallel:
    ep: int
    batch_per_gpu: int
    pairs_mean: float  # token-expert pairs per GPU on average, per decode step
    pairs_max: float  # on the most loaded GPU
    weights_bytes: float  # per GPU
    kv_cache_bytes: float
    total_bytes: float
    fits: bool
    dense_s: float  # attention, dense layers, shared experts, router, head: the GPU's batch
    experts_s: float  # the routed experts at the most loaded GPU's load
    all_to_all_s: float  # dispatch and combine, every MoE layer
    fixed_s: float
    crosses_node: bool
    ttft_s: float  # each GPU prefills its own sequences' prompts, the experts at the top load
    usable_bytes: float = 0.0  # what the engine's memory fraction lets each GPU fill
    overlapped: bool = False  # async scheduling: the host's work beside the GPU's

    @property
    def imbalance(self):
        return self.pairs_max / self.pairs_mean

    @property
    def tpot_s(self):
        return with_host(self.dense_s + self.experts_s + self.all_to_all_s, self.fixed_s,
                         self.overlapped)

    @property
    def gpus(self) -> int:
        return self.ep

    def headline(self, batch, output_tokens, price_usd_per_gpu_hour: float | None = None
                 ) -> Headline:
        return Headline(self.ttft_s, self.tpot_s, batch, output_tokens, self.gpus,
                        price_usd_per_gpu_hour)

    def latency_s(self, output_tokens):
        return self.headline(1, output_tokens).latency_s

    def as_dict(self, batch: int) -> dict:
        return {"ep": self.ep, "batch_per_gpu": self.batch_per_gpu,
                "pairs_per_gpu_mean": self.pairs_mean, "pairs_per_gpu_max": self.pairs_max,
                "imbalance": self.imbalance, "weights_bytes": self.weights_bytes,
                "kv_cache_bytes": self.kv_cache_bytes, "total_bytes": self.total_bytes,
                "fits": self.fits, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "throughput_tokens_per_s": self.headline(batch, 1).throughput_tokens_per_s,
                "dense_s": self.dense_s, "experts_s": self.experts_s,
                "all_to_all_s": self.all_to_all_s, "fixed_s": self.fixed_s,
                "crosses_node": self.crosses_node}


def check_ep(m: ModelSpec, ep: int) -> None:
    if m.moe is None:
        raise UsageError(f"ep: {m.name} has no experts (not a mixture-of-experts model)",
                         fields=("ep",))
    if m.moe.num_experts % ep:
        raise UsageError(f"ep {ep} does not divide {m.name}'s {m.moe.num_experts} experts",
                         fields=("ep",))


class ExpertStep:
    """The GPU work of one expert-parallel step, split as the layout runs it: the non-expert
    operators over one GPU's share of the step, the routed experts at the most loaded GPU's
    token-expert pairs, and the dispatch / combine all-to-alls of that share. Numbers or
    arrays (a sweep)."""

    def __init__(self, m: ModelSpec, prep: Prepared, o: Options, ep: int):
        check_ep(m, ep)
        self.m, self.prep, self.o, self.ep = m, prep, o, ep
        e, c = prep.engine, prep.ceilings
        self.k = m.moe.experts_per_token
        # the routed experts of one GPU: E / N local experts, reached by its most loaded share
        self.local = m.model_copy(update={"moe": m.moe.model_copy(
            update={"num_experts": m.moe.num_experts // ep})})
        self.crosses_node = bool(c.gpus_per_node) and ep > c.gpus_per_node
        link, extra = c.link(self.crosses_node)
        self._link, self._lat = link, e.allreduce_latency_s + extra

    def _t(self, op, graphed: bool):
        return op_time(op, self.prep.ceilings, options=self.o, engine=self.prep.engine,
                       graphed=graphed).time_s

    def dense_s(self, own: StepShape, graphed: bool):
        """Every operator but the routed experts, for one GPU's own shape."""
        ops = shape_ops(self.m, self.prep.precision, own, attention=self.o.attention,
                        lm_head_sharded=self.prep.engine.lm_head_sharded)
        return sum(self._t(op, graphed) for op in ops if not op.name.startswith("experts_"))

    def experts_s(self, tokens, graphed: bool):
        """The routed experts of the most loaded GPU, when the step holds ``tokens`` tokens
        over all ``ep`` GPUs; and that GPU's token-expert pairs."""
        top = max_load(tokens * self.k, self.ep)
        shape = StepShape(top / self.k, 0.0, 0.0, 0.0, 0.0, 0.0)
        ops = shape_ops(self.local, self.prep.precision, shape, attention=self.o.attention,
                        lm_head_sharded=self.prep.engine.lm_head_sharded)
        return sum(self._t(op, graphed) for op in ops if op.name.startswith("experts_")), top

    def all_to_all_s(self, own_tokens):
        """Dispatch and combine in every MoE layer for one GPU's ``own_tokens``."""
        if self.ep == 1:
            return 0.0 * own_tokens
        moved = own_tokens * self.k * self.m.hidden_size * self.prep.precision.activation_bytes \
            * (self.ep - 1) / self.ep
        return 2 * self.m.num_moe_layers * (moved / self._link + self._lat)


def expert_parallel(m: ModelSpec, hw: HardwareSpec, prep: Prepared, o: Options, *, ep: int,
                    batch, prompt_tokens, output_tokens) -> ExpertParallel:
    """The deployment at ``batch`` sequences in all (numbers, or arrays in a sweep)."""
    x = ExpertStep(m, prep, o, ep)
    e, p = prep.engine, prep.precision
    k = x.k
    b = -(-batch // ep)
    ctx = prompt_tokens + output_tokens / 2
    graphed = e.cuda_graphs
    dense = x.dense_s(StepShape.uniform(b, 1, ctx - 1, m.sliding_window), graphed)
    experts, top = x.experts_s(batch, graphed)
    a2a = x.all_to_all_s(b)
    # prefill: each GPU its own sequences' prompts, in one pass per chunk
    pre_dense = x.dense_s(StepShape.uniform(b, prompt_tokens, 0, m.sliding_window), False)
    pre_experts, _ = x.experts_s(batch * prompt_tokens, False)
    chunks = 1 if o.prefill_chunk_tokens is None else \
        -(-(b * prompt_tokens) // o.prefill_chunk_tokens)
    ttft = pre_dense + pre_experts + x.all_to_all_s(b * prompt_tokens) + \
        e.prefill_step_overhead_s * chunks + e.per_sequence_overhead_s * b
    sharded = e.lm_head_sharded
    bd = weight_bytes_breakdown(m, p, lm_head_sharded=sharded)
    w = sum(v / (ep if key in ROUTED else 1) for key, v in bd.items())
    kv = kv_cache_bytes(m, p, batch=b, seq_len=prompt_tokens + output_tokens)
    act = activation_bytes(m, p, batch=b, prompt_tokens=prompt_tokens, attention=o.attention,
                           chunk_tokens=o.prefill_chunk_tokens)
    total = w + kv + act + o.reserve_bytes
    frac, basis = memory_share(o, e, hw.memory_bytes)
    usable = usable_bytes(hw.memory_bytes, weights_bytes=w, activation_bytes=act,
                          reserve_bytes=o.reserve_bytes, frac=frac, basis=basis)
    fixed = e.step_overhead_s + e.per_sequence_overhead_s * b
    return ExpertParallel(ep, b, batch * k / ep, top, w, kv, total, total <= usable, dense, experts,
                          a2a, fixed, x.crosses_node, ttft, usable,
                          e.hides_host(graphed))
