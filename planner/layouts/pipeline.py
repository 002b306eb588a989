"""Pipeline parallelism: the layers split into stages, each on its own TP group.

Stages get L // PP layers each and the remainder one each to the stages before the last (as
vLLM's ``get_pp_indices`` places them: the first stage also holds the embedding and the last
the final norm and lm_head). Each stage's memory is its layers' weights and KV cache (sliding
windows and dense/MoE layers where they fall) plus its share of the embedding or head, the
prefill activations of one chunk and the reserve; the deployment fits when every stage does.

Between stages each GPU sends its micro-batch's hidden state and residual (2 x tokens x hidden
x 2 bytes) to its peer in the next stage: over the intra-node link, or over the inter-node
network where the boundary crosses servers (stages fill servers in order, ``tp`` GPUs each),
plus the engine's collective latency. A decode step of the batch runs as ``m = min(batch, PP)``
micro-batches in flight (vLLM runs PP virtual engines); each token of a sequence waits for its
micro-batch to traverse every stage, and a stage serves the micro-batches in turn:

    TPOT = max(sum over stages of (t_stage + t_send) + t_host,
               m x max(max over stages of (t_stage + t_send), t_host))

with each t_stage at the micro-batch size and t_host the engine's per-step host cost, which
overlaps the other micro-batches' GPU work. TTFT is one traversal of the batch's prefill.
With PP = 1 every figure is ``estimate``'s (a test holds them equal). Pure.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from functools import lru_cache, reduce

from planner.core.arith import vmax, vmin
from planner.core.errors import UsageError
from planner.core.estimate import Prepared
from planner.core.headline import Headline
from planner.core.memory import (
    activation_bytes,
    kv_cache_bytes,
    memory_terms,
    profile_activation_bytes,
    weight_bytes_breakdown,
)
from planner.core.ops import Op, decode_ops, prefill_ops
from planner.core.roofline import op_time, with_host
from planner.core.specs import HardwareSpec, ModelSpec, Options, Precision

FIRST_ONLY = {"embed"}
LAST_ONLY = {"final_norm", "lm_head"}


def stage_layers(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """[start, end) of each stage's layers, vLLM's split."""
    if pp > num_layers:
        raise UsageError(f"pp {pp} exceeds the model's {num_layers} layers", fields=("pp",))
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    out, s = [], 0
    for n in sizes:
        out.append((s, s + n))
        s += n
    return out


@lru_cache(maxsize=4096)
def _layers_of(op_name: str, m: ModelSpec) -> tuple[int, ...] | None:
    """The layers an operator instance runs in (None: the embedding or the head). Kept per
    operator name and model: a search splits every candidate's operators this way."""
    if op_name in FIRST_ONLY or op_name in LAST_ONLY:
        return None
    sliding = m.layer_is_sliding
    if op_name == "attention":
        return tuple(i for i in range(m.num_layers) if not sliding[i])
    if op_name == "attention_local":
        return tuple(i for i in range(m.num_layers) if sliding[i])
    if op_name == "mlp_norm":  # every layer's, before its dense MLP or its experts
        return tuple(range(m.num_layers))
    if op_name.startswith("mlp_") or op_name == "allreduce_mlp":
        return tuple(i for i in range(m.num_layers) if not m.is_moe_layer(i))
    if op_name.startswith(("moe_", "experts_", "shared_")) or op_name == "allreduce_moe":
        return tuple(m.moe_layer_indices)
    return tuple(range(m.num_layers))


def stage_ops(ops: list[Op], m: ModelSpec, start: int, end: int, first: bool,
              last: bool) -> list[Op]:
    """The operators of one stage: each op's instances in its layers, the embedding on the
    first stage and the head on the last."""
    out = []
    for op in ops:
        layers = _layers_of(op.name, m)
        if layers is None:
            n = op.count if (op.name in FIRST_ONLY and first) or (
                op.name in LAST_ONLY and last) else 0
        else:  # the layers are ascending: those in [start, end)
            n = bisect.bisect_left(layers, end) - bisect.bisect_left(layers, start)
        if n:
            out.append(replace(op, count=n))
    return out


@dataclass(frozen=True)
class Stage:
    index: int
    layers: tuple[int, int]
    weights_bytes: float
    kv_cache_bytes: float
    activation_bytes: float
    total_bytes: float
    fits: bool
    decode_s: float  # one micro-batch's decode step through this stage
    prefill_s: float  # the batch's prefill through this stage
    send_s: float  # hidden state to the next stage (0 for the last)
    crosses_node: bool
    usable_bytes: float = 0.0  # what the engine's memory fraction lets this GPU fill


@dataclass(frozen=True)
class Pipeline:
    pp: int
    tp: int
    micro_batches: int
    micro_batch: int
    stages: tuple[Stage, ...]
    tpot_s: float
    ttft_s: float
    fixed_s: float

    @property
    def fits(self):
        """Every stage fits (a bool, or an array of them in a sweep)."""
        return reduce(lambda a, s: a & s.fits, self.stages, True)

    @property
    def gpus(self) -> int:
        return self.pp * self.tp

    @property
    def max_memory_per_gpu_bytes(self):
        return reduce(vmax, (s.total_bytes for s in self.stages))

    def headline(self, batch, output_tokens, price_usd_per_gpu_hour: float | None = None
                 ) -> Headline:
        """Every GPU of every stage counts in the cost."""
        return Headline(self.ttft_s, self.tpot_s, batch, output_tokens, self.gpus,
                        price_usd_per_gpu_hour)

    def throughput_tokens_per_s(self, batch: int) -> float:
        return self.headline(batch, 1).throughput_tokens_per_s

    def latency_s(self, output_tokens: int) -> float:
        return self.headline(1, output_tokens).latency_s

    def cost_usd_per_million_output_tokens(self, price_usd_per_gpu_hour: float | None,
                                           batch: int, output_tokens: int) -> float | None:
        return self.headline(batch, output_tokens,
                             price_usd_per_gpu_hour).cost_usd_per_million_output_tokens

    def as_dict(self, batch: int, output_tokens: int,
                price_usd_per_gpu_hour: float | None = None) -> dict:
        return {"pp": self.pp, "tp": self.tp, "gpus": self.gpus,
                "latency_s": self.latency_s(output_tokens),
                "cost_usd_per_million_output_tokens": self.cost_usd_per_million_output_tokens(
                    price_usd_per_gpu_hour, batch, output_tokens),
                "micro_batches": self.micro_batches, "micro_batch": self.micro_batch,
                "tpot_s": self.tpot_s, "ttft_s": self.ttft_s, "fits": self.fits,
                "throughput_tokens_per_s": self.throughput_tokens_per_s(batch),
                "max_memory_per_gpu_bytes": self.max_memory_per_gpu_bytes,
                "stages": [s.__dict__ | {"layers": list(s.layers)} for s in self.stages]}


def weights_of_stage(m: ModelSpec, p: Precision, tp: int, start: int, end: int, first: bool,
                     last: bool, *, lm_head_sharded: bool = True) -> float:
    """A stage's weights per GPU: each per-layer tensor's share of its layers in the stage."""
    bd = weight_bytes_breakdown(m, p, tp=tp, lm_head_sharded=lm_head_sharded)
    n = end - start
    moe = sum(1 for i in range(start, end) if m.is_moe_layer(i))
    dense = n - moe
    total = 0.0
    for key, b in bd.items():
        if key.startswith("embed/"):
            # a tied lm_head is the embedding: the last stage holds it too
            total += b * (first + (last and m.tie_word_embeddings))
        elif key.startswith("vision/"):
            # vLLM builds the vision encoder on every pipeline rank (qwen3_vl.py at 0.19.1
            # has no rank check), though only the first runs it
            total += b
        elif key in ("lm_head", "norms/final"):
            total += b * last
        elif key.startswith("mlp/"):
            total += b * dense / max(m.num_dense_layers, 1)
        elif key.startswith("moe/"):
            total += b * moe / max(m.num_moe_layers, 1)
        else:  # attention/*, norms/layers: every layer
            total += b * n / m.num_layers
    return total


def pipeline(m: ModelSpec, hw: HardwareSpec, prep: Prepared, o: Options, *, tp: int, pp: int,
             batch: int, prompt_tokens: int, output_tokens: int) -> Pipeline:
    e, p, c = prep.engine, prep.precision, prep.ceilings
    ranges = stage_layers(m.num_layers, pp)
    mb_count = vmin(batch, pp)
    mb = -(-batch // mb_count)
    ctx = prompt_tokens + output_tokens / 2
    sharded = e.lm_head_sharded
    dec = decode_ops(m, p, batch=mb, context_tokens=ctx, tp=tp, attention=o.attention,
                     lm_head_sharded=sharded)
    pre = prefill_ops(m, p, batch=batch, prompt_tokens=prompt_tokens, tp=tp,
                      attention=o.attention, lm_head_sharded=sharded)
    act = activation_bytes(m, p, batch=batch, prompt_tokens=prompt_tokens, tp=tp,
                           attention=o.attention, chunk_tokens=o.prefill_chunk_tokens)
    profile_act = profile_activation_bytes(m, p, tp=tp, engine=e, options=o)
    per_node = c.gpus_per_node
    stages: list[Stage] = []
    links: list[tuple[float, float]] = []
    for i, (s, t) in enumerate(ranges):
        first, last = i == 0, i == pp - 1
        w = weights_of_stage(m, p, tp, s, t, first, last, lm_head_sharded=sharded)
        kv = kv_cache_bytes(m, p, batch=batch, seq_len=prompt_tokens + output_tokens, tp=tp,
                            layers=range(s, t))
        total = w + kv + act + o.reserve_bytes
        # each stage's own terms: its weights and its layers' KV bytes a token
        terms = memory_terms(o, e, capacity_bytes=hw.memory_bytes, weights_bytes=w,
                             profile_act_bytes=profile_act,
                             per_token_bytes=kv_cache_bytes(m, p, batch=1, seq_len=1, tp=tp,
                                                            layers=range(s, t)))
        usable = terms.usable_bytes(hw.memory_bytes, weights_bytes=w, activation_bytes=act,
                                    reserve_bytes=o.reserve_bytes)

        def timed(ops: list[Op], graphed: bool, s=s, t=t, first=first, last=last) -> float:
            return sum(op_time(op, c, tp=tp, options=o, engine=e, graphed=graphed).time_s
                       for op in stage_ops(ops, m, s, t, first, last))

        crosses = bool(per_node) and not last and ((i + 1) * tp) % per_node == 0
        link, extra = c.link(crosses)
        lat = e.allreduce_latency_s + extra
        links.append((link, lat))
        send = 0.0 if last else 2 * mb * m.hidden_size * p.activation_bytes / link + lat
        stages.append(Stage(i, (s, t), w, kv, act, total, total <= usable,
                            timed(dec, e.cuda_graphs), timed(pre, False), send, crosses,
                            usable))
    fixed = e.step_overhead_s + e.per_sequence_overhead_s * mb
    # the hand-off to the stages' worker processes, on every step's path (``Engine.worker_s``)
    handoff = e.worker_s(tp * pp)
    traverse = with_host(sum(st.decode_s + st.send_s for st in stages), fixed,
                         e.hides_host(e.cuda_graphs, pp)) + handoff
    # the host prepares one micro-batch while the GPUs run the others: a cycle is bound by
    # the slowest stage or by the host, whichever is longer
    cycle = mb_count * vmax(reduce(vmax, (st.decode_s + st.send_s for st in stages)),
                            fixed) + handoff
    chunks = 1 if o.prefill_chunk_tokens is None else \
        -(-(batch * prompt_tokens) // o.prefill_chunk_tokens)
    # the prefill sends every prompt token's states across each boundary
    pre_bytes = 2 * batch * prompt_tokens * m.hidden_size * p.activation_bytes
    prefill_send = sum(pre_bytes / link + lat for link, lat in links[:-1])
    ttft = sum(st.prefill_s for st in stages) + prefill_send + \
        e.prefill_step_overhead_s * chunks + e.per_sequence_overhead_s * batch + \
        handoff * chunks
    return Pipeline(pp, tp, mb_count, mb, tuple(stages), vmax(traverse, cycle), ttft, fixed)
