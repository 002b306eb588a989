"""Expert parallelism: a MoE model's routed experts split over N GPUs, attention TP or DP.

The layout of DeepSeek-V3-style serving. The replica's N = ``ep`` GPUs each hold E / N of each
layer's routed experts; every other weight (attention, dense layers, shared experts, router,
embeddings, lm_head) is tensor-parallel over ``tp`` = t GPUs, in d = N / t data-parallel
attention groups, each serving B / d of the batch with those sequences' KV cache (sharded by
heads over its t GPUs, or, for MLA's latent, whole on each of them, as ``planner.core.ops``
shards it). t = 1 is SGLang's and vLLM's data-parallel attention (``--dp N
--enable-dp-attention``, ``--data-parallel-size N --enable-expert-parallel``); t = N is one TP
group with its experts spread (vLLM's ``--tensor-parallel-size N --enable-expert-parallel``,
SGLang's ``--tp N --ep N``).

How each MoE layer moves its tokens, as vLLM runs it
(vllm-project/vllm@002d6073aa034d4f5545d45021b0e56d1f3c3593,
vllm/model_executor/layers/fused_moe/config.py ``FusedMoEParallelConfig``: the MoE's EP size
is the flattened tp x dp, and ``use_all2all_kernels`` holds only with dp > 1; its MoE models'
``forward`` with ``use_sequence_parallel_moe``: ``sequence_parallel_chunk`` before the experts,
``tensor_model_parallel_all_gather`` after):

* d = 1: the hidden states are already on every GPU of the TP group, so nothing is
  dispatched; each GPU applies its local experts to the token-expert pairs that reach them and
  the outputs (with the shared experts') are summed by the TP group's all-reduce over the N GPUs,
  T x hidden x 2 bytes, timed as every TP all-reduce (``planner.core.roofline``). SGLang's
  ``--tp N --ep N`` does the same (sgl-project/sglang@3e4a39ee73308590c5c753108bdcb8d333f7f1c6,
  python/sglang/srt/models/deepseek_v2.py ``DeepseekV2MoE.forward_normal``: the experts, plus
  the shared experts, then ``tensor_model_parallel_all_reduce`` when tp > 1).
* d > 1: each GPU of a group dispatches its 1/t share of the group's tokens to the GPUs holding
  their top-k experts and combines the results back (an all-to-all of (b / t) x k x hidden x 2
  bytes each way per GPU, (N - 1) / N of it off the GPU, over NVLink or, past one server, the
  inter-node network, plus the engine's collective latency each way), and the TP group then
  all-gathers the group's tokens, (t - 1) / t x b x hidden x 2 bytes through each GPU (half an
  all-reduce's traffic, at the all-reduce's link and latency). With t = 1 there is no gather.

Routing. The n = B x k token-expert pairs of a step fall on the N GPUs; the most loaded GPU
sets the step. Under uniform routing its expected load is the mean plus sqrt(2 ln N) standard
deviations (the Gaussian approximation of the expected maximum of N bins; Gumbel 1958),
n / N + sqrt(2 ln N x n (1 / N) (1 - 1 / N)), no less than ceil(n / N) and no more than n.
Real routers are less even: the busiest GPU carries ``expert_imbalance`` x n / N
(``Options.expert_imbalance``; default ``EXPERT_IMBALANCE``, from a published measurement),
with the uniform expectation as the floor and n as the ceiling. The step is the non-expert
operators at the group's batch, the routed experts at the most loaded GPU's pairs, and the
MoE's communication. Pure.
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
    memory_terms_of,
    weight_bytes_breakdown,
)
from planner.core.ops import Op, StepShape, is_routed, shape_ops
from planner.core.roofline import op_time, with_host
from planner.core.specs import HardwareSpec, ModelSpec, Options

# The default expert imbalance: the busiest GPU's routed load over the mean. SGLang served
# DeepSeek-V3's prefill on 4 x 8 H100 (EP 32) at 50,302 tokens/s per node with its default
# expert placement and at 59,337 with routing simulated perfectly balanced (LMSYS, "Deploying
# DeepSeek with PD Disaggregation and Large-scale Expert Parallelism on 96 H100 GPUs",
# https://lmsys.org/blog/2025-05-05-large-scale-ep/, 2025-05-05, "Overall Throughput" table;
# read 2026-11-27): 1.18 x. Only the MoE part of a step stretches with the load, so the
# busiest GPU's max / mean load was at least that; taken as the factor: estimated.
EXPERT_IMBALANCE = 59_337 / 50_302
EXPERT_IMBALANCE_SOURCE = {
    "url": "https://lmsys.org/blog/2025-05-05-large-scale-ep/",
    "date": "2025-05-05",
    "what": "SGLang DeepSeek-V3 prefill, EP32 on 32 H100: 59,337 / 50,302 tokens/s per node "
            "(perfectly balanced routing / default placement)",
    "estimated": True,
}


def expert_imbalance(o: Options) -> tuple[float, dict]:
    """(factor, its source) for ``o``: the user's ``expert_imbalance`` or the default."""
    if o.expert_imbalance is not None:
        return o.expert_imbalance, {"from": "--expert-imbalance", "estimated": False}
    return EXPERT_IMBALANCE, {"from": "default", **EXPERT_IMBALANCE_SOURCE}


def max_load(pairs, gpus: int):
    """Expected token-expert pairs on the most loaded of ``gpus`` GPUs under uniform routing
    (``pairs``: a number or an array)."""
    if gpus == 1:
        return pairs
    p = 1 / gpus
    approx = pairs * p + (2 * math.log(gpus) * pairs * p * (1 - p)) ** 0.5
    # some GPU holds at least the mean rounded up (1 pair over 64 GPUs: one holds it)
    return vmin(pairs, vmax(-(-(pairs * p) // 1), approx))


def busiest_load(pairs, gpus: int, imbalance: float):
    """Pairs on the busiest GPU: ``imbalance`` x the mean, never below uniform routing's
    expected maximum (``max_load``) nor above every pair."""
    return vmin(pairs, vmax(max_load(pairs, gpus), imbalance * pairs / gpus))


@dataclass(frozen=True)
class ExpertParallel:
    ep: int
    batch_per_gpu: int  # sequences of one data-parallel attention group (each of its GPUs)
    pairs_mean: float  # token-expert pairs per GPU on average, per decode step
    pairs_max: float  # on the most loaded GPU
    weights_bytes: float  # per GPU
    kv_cache_bytes: float
    total_bytes: float
    fits: bool
    dense_s: float  # attention, dense layers, shared experts, router, head: the group's batch
    experts_s: float  # the routed experts at the most loaded GPU's load
    all_to_all_s: float  # dispatch and combine, every MoE layer (none with one TP group)
    fixed_s: float
    crosses_node: bool
    ttft_s: float  # each group prefills its own sequences' prompts, experts at the top load
    usable_bytes: float = 0.0  # what the engine's memory fraction lets each GPU fill
    overlapped: bool = False  # async scheduling: the host's work beside the GPU's
    tp: int = 1  # attention's tensor-parallel GPUs per group
    moe_reduce_s: float = 0.0  # the experts' all-reduce (one TP group) or the TP gather
    imbalance_factor: float = 1.0  # the max / mean load asked for (uniform routing the floor)
    imbalance_source: dict | None = None
    handoff_s: float = 0.0  # a step's hand-off to the worker processes (``Engine.worker_s``)
    moe_layers: int = 1  # the MoE layers each step's all-to-alls and collectives run in

    @property
    def dp(self) -> int:
        return self.ep // self.tp

    @property
    def dispatch(self) -> str:
        """"all_reduce" (one TP group: tokens already everywhere) or "all_to_all"."""
        return "all_reduce" if self.dp == 1 else "all_to_all"

    @property
    def imbalance(self):
        return self.pairs_max / self.pairs_mean

    @property
    def comm_s(self):
        return self.all_to_all_s + self.moe_reduce_s

    @property
    def tpot_s(self):
        return with_host(self.dense_s + self.experts_s + self.comm_s, self.fixed_s,
                         self.overlapped) + self.handoff_s

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
        return {"ep": self.ep, "tp": self.tp, "dp": self.dp, "gpus": self.gpus,
                "dispatch": self.dispatch, "batch_per_gpu": self.batch_per_gpu,
                "pairs_per_gpu_mean": self.pairs_mean, "pairs_per_gpu_max": self.pairs_max,
                "imbalance": self.imbalance, "expert_imbalance": self.imbalance_factor,
                "expert_imbalance_source": self.imbalance_source,
                "weights_bytes": self.weights_bytes,
                "kv_cache_bytes": self.kv_cache_bytes, "total_bytes": self.total_bytes,
                "fits": self.fits, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
                "throughput_tokens_per_s": self.headline(batch, 1).throughput_tokens_per_s,
                "dense_s": self.dense_s, "experts_s": self.experts_s,
                "all_to_all_s": self.all_to_all_s, "moe_reduce_s": self.moe_reduce_s,
                "fixed_s": self.fixed_s, "crosses_node": self.crosses_node}


def check_ep(m: ModelSpec, ep: int) -> None:
    if m.moe is None:
        raise UsageError(f"ep: {m.name} has no experts (not a mixture-of-experts model)",
                         fields=("ep",))
    if m.moe.num_experts % ep:
        raise UsageError(f"ep {ep} does not divide {m.name}'s {m.moe.num_experts} experts",
                         fields=("ep",))


class ExpertStep:
    """The GPU work of one expert-parallel step, split as the layout runs it: the non-expert
    operators over one attention group's share of the step (TP over ``tp`` GPUs), the routed
    experts at the most loaded GPU's token-expert pairs, and the MoE's communication for that
    share. Numbers or arrays (a sweep)."""

    def __init__(self, m: ModelSpec, prep: Prepared, o: Options, ep: int, tp: int = 1):
        check_ep(m, ep)
        if ep % tp:
            raise UsageError(f"ep {ep} is not a multiple of tp {tp}", fields=("ep", "tp"))
        self.m, self.prep, self.o, self.ep, self.tp = m, prep, o, ep, tp
        self.dp = ep // tp
        e, c = prep.engine, prep.ceilings
        self.k = m.moe.experts_per_token
        self.imbalance, self.imbalance_source = expert_imbalance(o)
        # the routed experts of one GPU: E / N local experts, reached by its most loaded share
        # (a token reaches at most all of them: k capped at E / N where N exceeds E / k)
        local_e = m.moe.num_experts // ep
        self.k_local = min(self.k, local_e)
        self.local = m.model_copy(update={"moe": m.moe.model_copy(
            update={"num_experts": local_e, "experts_per_token": self.k_local})})
        self.crosses_node = bool(c.gpus_per_node) and ep > c.gpus_per_node
        link, extra = c.link(self.crosses_node)
        self._link, self._lat = link, e.allreduce_latency_s + extra

    def _t(self, op, graphed: bool, tp: int = 1):
        return op_time(op, self.prep.ceilings, tp=tp, options=self.o, engine=self.prep.engine,
                       graphed=graphed).time_s

    def dense_s(self, own: StepShape, graphed: bool):
        """Every operator but the routed experts and the MoE's reduction, for one attention
        group's shape, tensor-parallel over its ``tp`` GPUs (with their all-reduces)."""
        ops = shape_ops(self.m, self.prep.precision, own, tp=self.tp,
                        attention=self.o.attention,
                        lm_head_sharded=self.prep.engine.lm_head_sharded)
        return sum(self._t(op, graphed, self.tp) for op in ops if not is_routed(op))

    def experts_s(self, tokens, graphed: bool):
        """The routed experts of the most loaded GPU, when the step holds ``tokens`` tokens
        over all ``ep`` GPUs; and that GPU's token-expert pairs."""
        top = busiest_load(tokens * self.k, self.ep, self.imbalance)
        shape = StepShape(top / self.k_local, 0.0, 0.0, 0.0, 0.0, 0.0)
        ops = shape_ops(self.local, self.prep.precision, shape, attention=self.o.attention,
                        lm_head_sharded=self.prep.engine.lm_head_sharded)
        return sum(self._t(op, graphed) for op in ops if op.name.startswith("experts_")), top

    def all_to_all_s(self, own_tokens):
        """Dispatch and combine in every MoE layer for one group's ``own_tokens``, each of its
        GPUs sending its 1/tp share; none within one TP group (the tokens are everywhere)."""
        if self.ep == 1 or self.dp == 1:
            return 0.0 * own_tokens
        moved = own_tokens / self.tp * self.k * self.m.hidden_size \
            * self.prep.precision.activation_bytes * (self.ep - 1) / self.ep
        return 2 * self.m.num_moe_layers * (moved / self._link + self._lat)

    def moe_reduce_s(self, own_tokens, graphed: bool):
        """The MoE output's collective in every MoE layer, over one group's ``own_tokens``:
        one TP group (dp 1) all-reduces it over its ``tp`` = ``ep`` GPUs; several groups
        all-gather each group's tokens over its ``tp`` GPUs after the combine ((tp - 1) / tp
        of them through each GPU: half an all-reduce's bytes); nothing on one GPU a group."""
        if self.tp == 1:
            return 0.0 * own_tokens
        h, p = self.m.hidden_size, self.prep.precision
        payload = own_tokens * h * p.activation_bytes
        name = "allreduce_moe" if self.dp == 1 else "allgather_moe"
        op = Op(name, "allreduce", self.m.num_moe_layers, flops=0.0,
                comm_bytes=payload if self.dp == 1 else payload / 2, dtype=p.half_dtype)
        return self._t(op, graphed, self.tp)

    def weights_bytes(self) -> float:
        """One GPU's weights: 1/ep of the routed experts, every other tensor as ``tp`` shards
        it."""
        sharded = self.prep.engine.lm_head_sharded
        p = self.prep.precision
        whole = weight_bytes_breakdown(self.m, p, lm_head_sharded=sharded)
        split = whole if self.tp == 1 else weight_bytes_breakdown(
            self.m, p, tp=self.tp, lm_head_sharded=sharded)
        return sum(whole[key] / self.ep if key in ROUTED else v for key, v in split.items())


def expert_parallel(m: ModelSpec, hw: HardwareSpec, prep: Prepared, o: Options, *, ep: int,
                    tp: int = 1, batch, prompt_tokens, output_tokens) -> ExpertParallel:
    """The deployment at ``batch`` sequences in all (numbers, or arrays in a sweep)."""
    x = ExpertStep(m, prep, o, ep, tp)
    e, p = prep.engine, prep.precision
    k = x.k
    b = -(-batch // x.dp)  # one attention group's sequences
    ctx = prompt_tokens + output_tokens / 2
    graphed = e.cuda_graphs
    dense = x.dense_s(StepShape.uniform(b, 1, ctx - 1, m.attention_window), graphed)
    experts, top = x.experts_s(batch, graphed)
    a2a = x.all_to_all_s(b)
    reduce = x.moe_reduce_s(b, graphed)
    # prefill: each group its own sequences' prompts, in one pass per chunk
    pre_dense = x.dense_s(StepShape.uniform(b, prompt_tokens, 0, m.attention_window), False)
    pre_experts, _ = x.experts_s(batch * prompt_tokens, False)
    chunks = 1 if o.prefill_chunk_tokens is None else \
        -(-(b * prompt_tokens) // o.prefill_chunk_tokens)
    ttft = pre_dense + pre_experts + x.all_to_all_s(b * prompt_tokens) + \
        x.moe_reduce_s(b * prompt_tokens, False) + \
        e.prefill_step_overhead_s * chunks + e.per_sequence_overhead_s * b + \
        e.worker_s(ep) * chunks
    w = x.weights_bytes()
    kv = kv_cache_bytes(m, p, batch=b, seq_len=prompt_tokens + output_tokens, tp=tp)
    act = activation_bytes(m, p, batch=b, prompt_tokens=prompt_tokens, tp=tp,
                           attention=o.attention, chunk_tokens=o.prefill_chunk_tokens)
    total = w + kv + act + o.reserve_bytes
    usable = memory_terms_of(m, p, o, e, capacity_bytes=hw.memory_bytes, weights_bytes=w,
                             tp=tp).usable_bytes(hw.memory_bytes, weights_bytes=w,
                                                 activation_bytes=act,
                                                 reserve_bytes=o.reserve_bytes)
    fixed = e.step_overhead_s + e.per_sequence_overhead_s * b
    return ExpertParallel(ep, b, batch * k / ep, top, w, kv, total, total <= usable, dense,
                          experts, a2a, fixed, x.crosses_node, ttft, usable,
                          e.hides_host(graphed), tp, reduce, x.imbalance, x.imbalance_source,
                          e.worker_s(ep), m.num_moe_layers)
