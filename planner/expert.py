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

from planner.errors import UsageError
from planner.estimate import Prepared
from planner.memory import activation_bytes, kv_cache_bytes, weight_bytes_breakdown
from planner.ops import StepShape, decode_ops, shape_ops
from planner.roofline import op_time
from planner.specs import HardwareSpec, ModelSpec, Options


def max_load(pairs: float, gpus: int) -> float:
    """Expected token-expert pairs on the most loaded of ``gpus`` GPUs under uniform routing."""
    if gpus == 1:
        return pairs
    p = 1 / gpus
    approx = pairs * p + math.sqrt(2 * math.log(gpus) * pairs * p * (1 - p))
    # some GPU holds at least the mean rounded up (1 pair over 64 GPUs: one holds it)
    return min(pairs, max(math.ceil(pairs * p), approx))


@dataclass(frozen=True)
class ExpertParallel:
    ep: int
    batch_per_gpu: int
    pairs_mean: float  # token-expert pairs per GPU on average
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

    @property
    def imbalance(self) -> float:
        return self.pairs_max / self.pairs_mean if self.pairs_mean else 1.0

    @property
    def tpot_s(self) -> float:
        return self.dense_s + self.experts_s + self.all_to_all_s + self.fixed_s

    def as_dict(self, batch: int) -> dict:
        return {"ep": self.ep, "batch_per_gpu": self.batch_per_gpu,
                "pairs_per_gpu_mean": self.pairs_mean, "pairs_per_gpu_max": self.pairs_max,
                "imbalance": self.imbalance, "weights_bytes": self.weights_bytes,
                "kv_cache_bytes": self.kv_cache_bytes, "total_bytes": self.total_bytes,
                "fits": self.fits, "tpot_s": self.tpot_s,
                "throughput_tokens_per_s": batch / self.tpot_s, "dense_s": self.dense_s,
                "experts_s": self.experts_s, "all_to_all_s": self.all_to_all_s,
                "fixed_s": self.fixed_s, "crosses_node": self.crosses_node}


def expert_parallel(m: ModelSpec, hw: HardwareSpec, prep: Prepared, o: Options, *, ep: int,
                    batch: int, prompt_tokens: int, output_tokens: int) -> ExpertParallel:
    if m.moe is None:
        raise UsageError(f"--ep: {m.name} has no experts (not a mixture-of-experts model)")
    e_n = m.moe.num_experts
    if e_n % ep:
        raise UsageError(f"--ep {ep} does not divide {m.name}'s {e_n} experts")
    e, p, c = prep.engine, prep.precision, prep.ceilings
    k = m.moe.experts_per_token
    b = -(-batch // ep)
    ctx = prompt_tokens + output_tokens / 2
    sharded = e.lm_head_sharded
    ops = decode_ops(m, p, batch=b, context_tokens=ctx, attention=o.attention,
                     lm_head_sharded=sharded)
    graphed = e.cuda_graphs

    def t(op) -> float:
        return op_time(op, c, options=o, engine=e, graphed=graphed).time_s

    dense = sum(t(op) for op in ops if not op.name.startswith("experts_"))
    pairs = batch * k
    mean, top = pairs / ep, max_load(pairs, ep)
    # the routed experts of one GPU: E / N local experts, reached by its most loaded share
    local = m.model_copy(update={"moe": m.moe.model_copy(update={"num_experts": e_n // ep})})
    shape = StepShape.uniform(top / k, 1, ctx - 1)
    experts = sum(t(op) for op in shape_ops(local, p, shape, attention=o.attention,
                                             lm_head_sharded=sharded)
                  if op.name.startswith("experts_"))
    crosses = bool(c.gpus_per_node) and ep > c.gpus_per_node
    link, extra = c.link(crosses)
    lat = e.allreduce_latency_s + extra
    moved = b * k * m.hidden_size * p.activation_bytes * (ep - 1) / ep
    a2a = 2 * m.num_moe_layers * (moved / link + lat) if ep > 1 else 0.0
    bd = weight_bytes_breakdown(m, p, lm_head_sharded=sharded)
    w = sum(v / (ep if key == "moe/routed_experts" else 1) for key, v in bd.items())
    kv = kv_cache_bytes(m, p, batch=b, seq_len=prompt_tokens + output_tokens)
    act = activation_bytes(m, p, batch=b, prompt_tokens=prompt_tokens, attention=o.attention,
                           chunk_tokens=o.prefill_chunk_tokens)
    total = w + kv + act + o.reserve_bytes
    fixed = e.step_overhead_s + e.per_sequence_overhead_s * b
    return ExpertParallel(ep, b, mean, top, w, kv, total,
                          total <= hw.memory_bytes * o.memory_utilization_frac, dense, experts,
                          a2a, fixed, crosses)
