"""The time of one serving step, from the same operator and engine model as ``estimate``.

A step of a continuous-batching server mixes decodes (one new token each) and prefill chunks.
Its operators are those of ``planner.core.ops.shape_ops`` for the step's ``StepShape``, timed by
``planner.core.roofline.op_time`` under the engine: no second performance model. A simulation runs
hundreds of thousands of steps, so the cost is split by what each operator depends on:

- every linear layer, norm, element-wise op and all-reduce depends on the step's new tokens T
  only: their sum is computed once per (T, graphed) and kept;
- the final norm and lm_head depend on the rows that sample a token: kept per (rows, graphed);
- attention (and, for an engine whose cache grows by concatenation, the KV write) depends on
  the attended pairs and the cache read: its operator is built from per-unit amounts and timed
  each step;
- the engine's fixed host cost per step, and per sequence in it.

``StepCoster.step_time(uniform shape)`` equals the estimate's step time (a test holds them
equal), so a simulated request at low load sees the TTFT and TPOT ``estimate`` predicts. A
prompt longer than the step's token budget is the exception: the simulator prefills it chunk
by chunk, each chunk attending to the ones before it and pricing the head over the rows its
engine takes logits for (every chunk's, where ``Engine.partial_prefill_logits``), where
``estimate`` prices one prefill of the whole prompt with the head once.

A fit (``planner.evidence.calibrate``) simulates one replica under hundreds of engine profiles
that differ in a few parameters. A ``CostCache`` shared by their costers keeps the operators of
each step shape, which no engine parameter changes, and the timed sums of them per engine
timing: the engine less its host costs (per step, sequence and request), which no operator
reads. A coster built on one gives the same times as a fresh one, bit for bit.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from planner.core.engine import Engine
from planner.core.estimate import Prepared
from planner.core.ops import (
    ATTENTION_OPS,
    SAMPLING_OPS,
    Op,
    StepShape,
    check_runs_on,
    host_transfer_ops,
    is_routed,
    local_attention_name,
    shape_ops,
)
from planner.core.roofline import (
    combine,
    launch_time_s,
    op_time,
    operator_device_fixed_s,
    with_host,
)
from planner.core.specs import HardwareSpec, ModelSpec, Options
from planner.layouts.pipeline import stage_ops


def host_s(e: Engine, sequences, *, prefill: bool, decodes: bool) -> float:
    """The engine's host cost of a step: a decode step's, a prefill pass's, or the larger of
    the two for a step that mixes them; and its cost per sequence."""
    if prefill and decodes:
        step = max(e.step_overhead_s, e.prefill_step_overhead_s)
    else:
        step = e.prefill_step_overhead_s if prefill else e.step_overhead_s
    return step + e.per_sequence_overhead_s * sequences


def idle_coster(coster):
    """``coster`` (a ``StepCoster``, or one wrapping it) for a step the engine runs after idle
    time: under async scheduling no step runs before it to hide its host work under (a lone
    request's prefill, as the static estimate prices it)."""
    e = coster.engine
    return coster.with_engine(replace(e, async_scheduling=False)) if e.async_scheduling \
        else coster


# the engine's host costs: what ``host_s`` and the request path read, and no operator
HOST_FIELDS = ("step_overhead_s", "per_sequence_overhead_s", "prefill_step_overhead_s",
               "request_overhead_s", "prompt_token_overhead_s", "frontend_request_s",
               "frontend_token_s", "chat_template_parse_s", "worker_step_overhead_s")
_NO_HOST = {f: 0.0 for f in HOST_FIELDS}


class CostCache:
    """What the step costers of one replica share across engine profiles: the operators of
    each step shape (they depend on the model, precision, TP, stage and attention, not on the
    engine's efficiencies, nor on the GPU) and the timed sums per engine timing (the engine
    without its host costs) and GPU ceilings. Pass one to ``StepCoster`` (``cache=``) for
    each profile tried, to the costers of a search's candidates on every GPU, or to those
    of every run ``validate`` replays."""

    __slots__ = ("_ops", "_times")

    def __init__(self) -> None:
        # replica key -> (linear ops by tokens, head ops by rows, the unit shapes' ops)
        self._ops: dict[tuple, tuple[dict, dict, dict]] = {}
        # (replica key, options, engine without host costs) -> [(ceilings, linear s, head s)]
        # for each GPU's ceilings met (compared, not hashed: they hold a dict)
        self._times: dict[tuple, list[tuple]] = {}

    @staticmethod
    def _replica(c: StepCoster) -> tuple:
        # what ``StepCoster._ops`` builds a shape's operators from: not the GPU, so costers
        # of the same model, precision and TP on other GPUs share them too
        return (c.model, c.prep.precision, c.tp, c.stage, c.options.attention,
                c.engine.lm_head_sharded, c.options.cpu_offload_bytes, c.routed_apart)

    def ops(self, c: StepCoster) -> tuple[dict, dict, dict]:
        return self._ops.setdefault(self._replica(c), ({}, {}, {}))

    def times(self, c: StepCoster) -> tuple[dict, dict]:
        key = (self._replica(c), c.options, replace(c.engine, **_NO_HOST))
        seen = self._times.setdefault(key, [])
        got = next((t for t in seen if t[0] == c.prep.ceilings), None)
        if got is None:
            got = (c.prep.ceilings, {}, {})
            seen.append(got)
        return got[1], got[2]


class StepCoster:
    """Seconds per step for a model, GPU, precision, TP degree and engine."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, prep: Prepared,
                 options: Options, *, tp: int = 1,
                 stage: tuple[int, int, bool, bool] | None = None,
                 cache: CostCache | None = None, routed_apart: bool = False):
        """``stage``: cost only a pipeline stage's operators, (first layer, end, holds the
        embedding, holds the head) as ``planner.layouts.pipeline.stage_ops`` selects them.
        ``cache``: share the operators and their times with other costers of this replica
        (``CostCache``). ``routed_apart``: leave out the routed experts and the MoE output's
        all-reduce (and any weights brought from the host), which an expert-parallel layout
        prices itself (``planner.serving.costers.ExpertCoster``): the operators
        ``planner.layouts.expert.ExpertStep.dense_s`` sums."""
        check_runs_on(model, hardware)
        self.model, self.prep, self.options, self.tp = model, prep, options, tp
        self.stage = stage
        self.routed_apart = routed_apart
        self.hardware = hardware
        self.hw_memory_bytes = hardware.memory_bytes
        self.engine: Engine = prep.engine
        if cache is None:
            self._linear_ops, self._head_ops, self._unit_ops = {}, {}, {}
            self._linear: dict[tuple[int, bool], float] = {}
            self._head: dict[tuple[int, bool], float] = {}
        else:
            self._linear_ops, self._head_ops, self._unit_ops = cache.ops(self)
            self._linear, self._head = cache.times(self)
        unit, scored_ops, fill_ops, past_ops = self._units()
        # full and sliding-window (or sparse) layers cost alike per unit of work (their
        # counts differ)
        local_name = local_attention_name(model)
        name = "attention" if "attention" in unit else local_name
        attn = replace(unit[name], count=1)
        scored = scored_ops[name]
        self._attn = attn
        self._n_full = unit["attention"].count if "attention" in unit else 0
        self._n_local = unit[local_name].count if local_name in unit else 0
        self._kv_write = unit["rope_kv_write"]
        self._concat = self.engine.kv_cache_concat
        # attention's compute and memory times are linear in the pairs, the cache read, the
        # tokens and the scores: per-unit times from op_time, combined each step by the same
        # rule op_time uses
        def unit_times(op: Op) -> tuple[float, float]:
            t = op_time(replace(op, count=1), prep.ceilings, tp=tp, options=options,
                        engine=self.engine)
            return t.compute_s, t.memory_s

        self._attn_c_per_pair = unit_times(replace(attn, kv_bytes=0.0, act_bytes=0.0))[0]
        # a prefilling sequence's pairs and cached tokens, where they cost otherwise (MLA's
        # expanded form): the extra compute per unit, 0 for other attention
        self._attn_c_per_fill_pair = unit_times(replace(
            attn, flops=fill_ops[name].flops - attn.flops, kv_bytes=0.0, act_bytes=0.0))[0]
        self._attn_c_per_fill_past = unit_times(replace(
            attn, flops=past_ops[name].flops - attn.flops, kv_bytes=0.0, act_bytes=0.0))[0]
        self._fills_apart = bool(self._attn_c_per_fill_pair or self._attn_c_per_fill_past)
        self._attn_m_per_kv = unit_times(replace(attn, flops=0.0, act_bytes=0.0))[1]
        self._attn_m_per_token = unit_times(replace(attn, flops=0.0, kv_bytes=0.0))[1]
        self._attn_m_per_score = unit_times(replace(
            attn, flops=0.0, kv_bytes=0.0, act_bytes=scored.act_bytes - attn.act_bytes))[1]
        self._attn_kernels = self.engine.kernels_for("attention", "attention")
        self._per_kernel = prep.ceilings.kernel_cost_s("attention", self.engine)
        # device time a layer's attention takes beyond its kernels' (op_time's fixed part)
        self._attn_fixed = operator_device_fixed_s(attn, self.engine)
        # sparse attention's indexer (every layer's), over the whole cache: its compute per
        # pair and memory per cached token read, per new token and per pair (its logits),
        # and its kernels, from op_time as attention's are
        idx = unit.get("dsa_indexer")
        self._idx = None if idx is None else replace(idx, count=1)
        self._n_idx = 0 if idx is None else idx.count
        if idx is not None:
            one = self._idx
            # its logits' bytes go with the pairs, its queries' with the new tokens: each
            # measured on a shape of that amount alone
            by_token, by_pair = self._indexer_units()
            self._idx_c_per_pair = unit_times(replace(one, kv_bytes=0.0, act_bytes=0.0))[0]
            self._idx_m_per_kv = unit_times(replace(one, flops=0.0, act_bytes=0.0))[1]
            self._idx_m_per_token = unit_times(replace(by_token, count=1, flops=0.0,
                                                       kv_bytes=0.0))[1]
            self._idx_m_per_pair = unit_times(replace(by_pair, count=1, flops=0.0,
                                                      kv_bytes=0.0))[1]
            self._idx_kernels = self.engine.kernels_for(one.name, one.kind)
            self._idx_fixed = operator_device_fixed_s(one, self.engine)
        self._launch_s: float | None = None
        self._graph_launch_s: float | None = None

    def with_engine(self, engine: Engine) -> StepCoster:
        """This coster under ``engine``, whose timings of the operators are this one's (it
        differs in host costs or their overlap only): the caches are shared, not rebuilt."""
        other = copy.copy(self)
        other.engine = engine
        other._launch_s = other._graph_launch_s = None
        return other

    @property
    def launch_s(self) -> float:
        """The host's time launching a step's kernels one by one, outside any CUDA graph:
        every operator's kernels at the engine's ``host_launch_s`` each, and the host time
        it spends on each MoE layer beyond them (``Engine.moe_layer_host_s``). The same for
        any number of tokens (the operators are the same); each operator's own time already
        has it as its floor (``roofline.combine``)."""
        if self._launch_s is None:
            ops = [*self._linear_ops_of(1), *self._head_ops_of(1),
                   replace(self._attn, count=self._n_full + self._n_local)]
            if self._idx is not None:
                ops.append(replace(self._idx, count=self._n_idx))
            if self._concat:  # its KV write is priced apart from the linear operators
                ops.append(self._kv_write)
            self._launch_s = launch_time_s([op_time(op, self.prep.ceilings, tp=self.tp,
                                                    options=self.options, engine=self.engine,
                                                    graphed=False) for op in ops], self.engine)
        return self._launch_s

    def _units(self) -> tuple[dict[str, Op], ...]:
        """The operators of a unit of attention work: without and with a score element, and
        with its pair, then its cached token, a prefilling sequence's."""
        got = self._unit_ops.get("unit")
        if got is None:
            got = self._unit_ops["unit"] = (
                self._ops(StepShape(tokens=1.0, attn_pairs=1.0, kv_read_tokens=1.0,
                                    kv_held_tokens=1.0, score_elems=0.0, logit_rows=1.0)),
                self._ops(StepShape(1.0, 1.0, 1.0, 1.0, 1.0, 1.0)),
                self._ops(StepShape(1.0, 1.0, 1.0, 1.0, 0.0, 1.0, None, 1.0, 0.0)),
                self._ops(StepShape(1.0, 1.0, 1.0, 1.0, 0.0, 1.0, None, 0.0, 1.0)))
        return got

    def _indexer_units(self) -> tuple[Op, Op]:
        """Sparse attention's indexer for one new token with nothing cached, and for one
        query-key pair alone (``dsa_indexer``'s bytes of each)."""
        got = self._unit_ops.get("indexer")
        if got is None:
            got = self._unit_ops["indexer"] = (
                self._ops(StepShape(1.0, 0.0, 0.0, 0.0, 0.0, 1.0))["dsa_indexer"],
                self._ops(StepShape(0.0, 1.0, 0.0, 0.0, 0.0, 0.0))["dsa_indexer"])
        return got

    def _ops(self, shape: StepShape) -> dict[str, Op]:
        ops = shape_ops(self.model, self.prep.precision, shape, tp=self.tp,
                        attention=self.options.attention,
                        lm_head_sharded=self.engine.lm_head_sharded)
        if self.routed_apart:
            return {op.name: op for op in ops if not is_routed(op)}
        ops += host_transfer_ops(self.options.cpu_offload_bytes)  # once per forward pass
        if self.stage is not None:
            ops = stage_ops(ops, self.model, *self.stage)
        return {op.name: op for op in ops}

    def _time(self, op: Op, graphed: bool) -> float:
        return op_time(op, self.prep.ceilings, tp=self.tp, options=self.options,
                       engine=self.engine, graphed=graphed).time_s

    def linear_s(self, tokens: int, graphed: bool) -> float:
        """Every operator but attention and sampling, for ``tokens`` new tokens."""
        key = (tokens, graphed)
        t = self._linear.get(key)
        if t is None:
            t = sum(self._time(op, graphed) for op in self._linear_ops_of(tokens))
            self._linear[key] = t
        return t

    def _linear_ops_of(self, tokens: int) -> list[Op]:
        ops = self._linear_ops.get((tokens, self._concat))
        if ops is None:
            skip = {*ATTENTION_OPS, *SAMPLING_OPS}
            if self._concat:
                skip.add("rope_kv_write")
            shape_ops = self._ops(StepShape(float(tokens), 0.0, 0.0, 0.0, 0.0, 0.0))
            ops = [op for name, op in shape_ops.items() if name not in skip]
            self._linear_ops[(tokens, self._concat)] = ops
        return ops

    def head_s(self, rows: int, graphed: bool, *, unsampled_weights: bool = False) -> float:
        """Final norm and lm_head for ``rows`` rows of logits (the sequences that sample a
        token, and the unfinished prompt chunks of an engine that takes logits for them:
        ``Engine.partial_prefill_logits``); at no row, nothing, or with ``unsampled_weights``
        their operators at no row (their weights read all the same, as the layouts'
        estimates price them: ``ExpertStep.dense_s``)."""
        if rows <= 0 and not unsampled_weights:
            return 0.0
        key = (rows, graphed)
        t = self._head.get(key)
        if t is None:
            t = sum(self._time(op, graphed) for op in self._head_ops_of(rows))
            self._head[key] = t
        return t

    def _one_attention_s(self, shape: StepShape, graphed: bool) -> float:
        return self._attention_layer_s(shape.attn_pairs, shape.kv_read_tokens, shape.tokens,
                                       shape.score_elems, shape.prefill_pairs,
                                       shape.prefill_past_tokens, graphed)

    def _attention_layer_s(self, pairs: float, kv_read: float, tokens: float, score: float,
                           fill_pairs: float, fill_past: float, graphed: bool) -> float:
        """One layer's attention from a step's amounts (``StepShape``'s fields)."""
        compute = self._attn_c_per_pair * pairs
        if self._fills_apart:
            compute += (self._attn_c_per_fill_pair * fill_pairs
                        + self._attn_c_per_fill_past * fill_past)
        memory = (self._attn_m_per_kv * kv_read + self._attn_m_per_token * tokens
                  + self._attn_m_per_score * score)
        return combine(compute, memory, self.engine, self.options, kernels=self._attn_kernels,
                       per_kernel_s=self._per_kernel, graphed=graphed, fixed_s=self._attn_fixed)

    def _indexer_layer_s(self, shape: StepShape, graphed: bool) -> float:
        """One layer's sparse-attention indexer over the step's whole cache (``_indexer_ops``
        in planner.core.ops): its pairs, cache read and new tokens."""
        compute = self._idx_c_per_pair * shape.attn_pairs
        memory = (self._idx_m_per_kv * shape.kv_read_tokens
                  + self._idx_m_per_token * shape.tokens
                  + self._idx_m_per_pair * shape.attn_pairs)
        return combine(compute, memory, self.engine, self.options, kernels=self._idx_kernels,
                       per_kernel_s=self._per_kernel, graphed=graphed, fixed_s=self._idx_fixed)

    def _head_ops_of(self, rows: int) -> list[Op]:
        ops = self._head_ops.get(rows)
        if ops is None:
            shape_ops = self._ops(StepShape(0.0, 0.0, 0.0, 0.0, 0.0, float(rows)))
            ops = self._head_ops[rows] = [shape_ops[n] for n in SAMPLING_OPS if n in shape_ops]
        return ops

    def attention_s(self, shape: StepShape, graphed: bool) -> float:
        """Attention of every layer (the sliding-window layers see ``shape.local``) and, for
        a concatenating cache, the KV write."""
        t = 0.0
        if self._n_full:
            t += self._n_full * self._one_attention_s(shape, graphed)
        if self._n_local:
            t += self._n_local * self._one_attention_s(shape.local or shape, graphed)
        if self._n_idx:
            t += self._n_idx * self._indexer_layer_s(shape, graphed)
        if self._concat:
            w = self._kv_write
            t += self._time(replace(w, kv_bytes=w.kv_bytes * shape.tokens,
                                    act_bytes=w.act_bytes * shape.tokens,
                                    kv_cache_bytes=w.kv_cache_bytes * self._held(shape)),
                            graphed)
        return t

    def _held(self, shape: StepShape) -> float:
        """Cached tokens per layer, averaged over the full and the sliding-window layers."""
        local = shape.local or shape
        n = self._n_full + self._n_local
        return (self._n_full * shape.kv_held_tokens + self._n_local * local.kv_held_tokens) / n

    def fixed_s(self, sequences: int, *, prefill: bool, decodes: bool) -> float:
        return host_s(self.engine, sequences, prefill=prefill, decodes=decodes)

    pads_graphs = True  # the simulator may pad its decode steps to captured graph sizes
    # under async scheduling, each step's host work runs beside the step before it
    # (``Engine.overlaps_host``; the simulator's event loop)
    overlaps_steps = True

    @property
    def prices_decodes_directly(self) -> bool:
        """``decode_step_s`` gives ``step_time``'s answer for this replica: no sliding-window
        layers and no concatenating cache, whose decode steps take the general path."""
        return not self._n_local and not self._concat

    @property
    def prices_uniform_decodes(self) -> bool:
        """``uniform_decode_pricer`` gives ``step_time``'s answer for the plain decode pool's
        steps on this replica: every attention there is (full, sliding-window, sparse and its
        indexer), but not a concatenating cache, whose KV write is priced apart."""
        return not self._concat

    def decode_step_s(self, tokens: float, attn_pairs: float, kv_read_tokens: float,
                      score_elems: float, logit_rows: float, sequences: int) -> float:
        """``step_time`` of a decode-only step of these amounts (``StepShape``'s, with
        nothing held back for prefilling sequences), to the bit, without building the
        shape or passing through ``gpu_s`` and ``attention_s``: the simulator asks it
        nearly every step. Only where ``prices_decodes_directly``."""
        graphed = self.engine.cuda_graphs
        attn = 0.0
        if self._n_full:
            attn += self._n_full * self._attention_layer_s(
                attn_pairs, kv_read_tokens, tokens, score_elems, 0.0, 0.0, graphed)
        return self._with_host_s(self._linear_head_s(tokens, logit_rows, graphed) + attn,
                                 sequences, prefill=False, decodes=True, graphed=graphed)

    def decode_attention_pricer(self, graphed: bool):
        """``attention_s`` of a decode-only step as one function of its amounts,
        ``f(tokens, attended, local)``: ``tokens`` new ones, ``attended`` the step's attended
        pairs, cache read and score elements alike (each sequence adds one token after its
        context), ``local`` the same in the sliding-window layers. The same operations in the
        same order as ``attention_s`` over such a ``StepShape`` (nothing prefills), so the
        same answer to the bit; not for a concatenating cache (``prices_uniform_decodes``).
        The uniform pricers of this coster and of ``ExpertCoster`` call it."""
        n_full, n_local, n_idx = self._n_full, self._n_local, self._n_idx
        layer_s, indexer_s = self._decode_layer_pricers(graphed)

        def attention_s(tokens: float, attended: float, local: float) -> float:
            # ``attention_s``: the full layers, the windowed ones, the indexer, in its order
            attn = n_full * layer_s(tokens, attended) if n_full else 0.0
            if n_local:
                attn += n_local * layer_s(tokens, local)
            if n_idx:
                attn += n_idx * indexer_s(tokens, attended)
            return attn

        return attention_s

    def _decode_layer_pricers(self, graphed: bool):
        """(one attention layer's time, one indexer layer's or None) of a decode-only step's
        amounts, ``f(tokens, attended)``: ``_attention_layer_s`` and ``_indexer_layer_s``
        with ``combine`` written out, the same operations in the same order."""
        e = self.engine
        c_pair, m_kv = self._attn_c_per_pair, self._attn_m_per_kv
        m_token, m_score = self._attn_m_per_token, self._attn_m_per_score
        additive = self.options.time_model == "additive"
        overlap = e.overlap_frac
        kernels_s, attn_fixed_s = self._attn_kernels * self._per_kernel, self._attn_fixed
        launch_s = self._attn_kernels * e.host_launch_s if not graphed and e.host_launch_s \
            else None
        # sparse attention's indexer, every layer's over the whole cache
        n_idx = self._n_idx
        if n_idx:
            i_pair, i_kv = self._idx_c_per_pair, self._idx_m_per_kv
            i_token, i_mpair = self._idx_m_per_token, self._idx_m_per_pair
            i_kernels_s, i_fixed_s = self._idx_kernels * self._per_kernel, self._idx_fixed
            i_launch_s = self._idx_kernels * e.host_launch_s \
                if not graphed and e.host_launch_s else None

        def layer_pricer(c_attended: float, m_read: float, m_tokens: float, m_last: float,
                         kernels: float, fixed: float, floor: float | None):
            # one layer's ``combine`` of a decode step's amounts, written out: the roofline
            # (or the additive form), the kernels' and the operator's fixed time added in its
            # order, the host's launch floor. A decode step's attended pairs, cache read and
            # score elements are one amount: its memory is the cache read's, the new tokens'
            # and the last term's (the scores, the indexer's pairs), in that order
            def layer_s(tokens: float, attended: float) -> float:
                compute = c_attended * attended
                memory = m_read * attended + m_tokens * tokens + m_last * attended
                if additive:
                    t = compute + memory
                elif overlap == 1.0:
                    t = compute if compute >= memory else memory
                else:
                    t = compute + memory - overlap * (compute if compute <= memory
                                                      else memory)
                t = t + kernels + fixed
                return floor if floor is not None and floor > t else t

            return layer_s

        # one layer's attention (``_attention_layer_s``: nothing prefills, so no fill term)
        layer_s = layer_pricer(c_pair, m_kv, m_token, m_score, kernels_s, attn_fixed_s,
                               launch_s)
        if not n_idx:
            return layer_s, None
        # one layer's indexer (``_indexer_layer_s``)
        return layer_s, layer_pricer(i_pair, i_kv, i_token, i_mpair, i_kernels_s, i_fixed_s,
                                     i_launch_s)

    def uniform_decode_pricer(self, graphed: bool | None = None):
        """``step_time`` of a decode-only step whose every sequence adds one token after its
        context (the plain decode pool's step, ``DecodePool.shape``), as one function with
        this replica's constants bound: ``f(tokens, attended, sequences)`` for ``tokens``
        padded rows (the captured graph's size), ``attended`` cached-plus-new tokens (the
        step's attended pairs, cache read and score elements alike) and ``sequences`` real
        ones; the sliding-window (or sparse) layers attend to ``min(attended, sequences x
        window)`` of them, as the pool counts them. The same operations in the same order as
        ``step_time`` through ``gpu_s`` and ``attention_s``, so the same answer to the bit
        (tested), without its dozen calls a step. Only where ``prices_uniform_decodes``.
        ``graphed=False``: the same step run without a graph (a batch above the largest
        captured size, unpadded), ``step_time``'s answer with ``graphed=False`` to the bit."""
        e, linear, head = self.engine, self._linear, self._head
        if graphed is None:
            graphed = e.cuda_graphs
        n_full, n_local, n_idx = self._n_full, self._n_local, self._n_idx
        window = self.model.attention_window
        layer_s = self._decode_layer_pricers(graphed)[0]
        decode_attention_s = self.decode_attention_pricer(graphed)

        def attention_s(tokens: int, attended: int, sequences: int) -> float:
            # the windowed layers attend to min(attended, sequences x window), as the pool
            # counts them
            local = attended if window is None or attended <= sequences * window \
                else sequences * window
            return decode_attention_s(tokens, attended, local)

        plain = not n_local and not n_idx
        step_s, per_seq_s = e.step_overhead_s, e.per_sequence_overhead_s
        hides, worker_s = e.overlaps_host(), e.worker_s(self.tp)
        launched_s = 0.0 if graphed else self.launch_s
        linear_s, head_s = self.linear_s, self.head_s

        def price(tokens: int, attended: int, sequences: int) -> float:
            if plain:  # full layers alone (the common case): one call
                attn = n_full * layer_s(tokens, attended) if n_full else 0.0
            else:
                attn = attention_s(tokens, attended, sequences)
            lin = linear.get((tokens, graphed))
            if lin is None:
                lin = linear_s(tokens, graphed)
            hd = head.get((tokens, graphed))
            if hd is None:
                hd = head_s(tokens, graphed)
            gpu = lin + hd + attn
            host = step_s + per_seq_s * sequences
            if hides:  # the host launches the step, then prepares the next (with_host)
                host += launched_s
                t = (gpu + host + abs(gpu - host)) / 2
            else:
                t = gpu + host
            return t + worker_s

        return price

    def step_time(self, shape: StepShape, *, sequences: int, prefill: bool,
                  decodes: bool = True, graphed: bool | None = None,
                  prefill_graph_tokens: int | None = None) -> float:
        """A step of ``shape`` over ``sequences`` sequences; ``prefill``: it holds a prefill
        chunk, so it is not replayed from a CUDA graph; ``decodes``: it holds decodes;
        ``graphed=False``: a decode step run without a graph (above the captured sizes).
        ``prefill_graph_tokens``: a prefill step replayed from piecewise CUDA graphs
        captured at this many tokens (``prefill_graph_s``)."""
        if prefill_graph_tokens is not None:
            return self.prefill_graph_s(shape, prefill_graph_tokens, sequences,
                                        decodes=decodes)
        if graphed is None:
            graphed = self.engine.cuda_graphs and not prefill
        return self._with_host_s(self.gpu_s(shape, prefill=prefill, graphed=graphed),
                                 sequences, prefill=prefill, decodes=decodes, graphed=graphed)

    prices_prefill_graphs = True  # the simulator may replay prefill steps from piecewise graphs

    def prefill_graph_s(self, shape: StepShape, tokens: int, sequences: int, *,
                        decodes: bool) -> float:
        """A prefill step replayed from the piecewise CUDA graphs captured at ``tokens``
        tokens (SGLang's, ``planner.core.engine.PrefillGraphs``): every operator of the
        decoder stack but attention over the captured count (the padding's rows computed
        too), graphed, so no host floor on them; each layer's attention unpadded and
        launched eagerly, as is the sampling after the stack; the host busy first with those
        launches and one replay a graph piece (``prefill_graph_launch_s``), then the step's
        own host work. The static estimate prices such a prefill alike
        (``planner.core.estimate``)."""
        e = self.engine
        rows = int(round(shape.logit_rows))
        gpu = self.linear_s(tokens, True) + self.head_s(rows, False) + \
            self.attention_s(shape, False)
        return with_host(gpu, host_s(e, sequences, prefill=True, decodes=decodes),
                         e.overlaps_host(), self.prefill_graph_launch_s) + e.worker_s(self.tp)

    @property
    def prefill_graph_launch_s(self) -> float:
        """The host's launches of a piecewise-graphed prefill step: each layer's attention
        kernels and a graph piece's replay before each, the last piece's, and the sampling's
        kernels, at the engine's ``host_launch_s`` each. The same for any number of tokens:
        worked out once, as ``launch_s``."""
        if self._graph_launch_s is None:
            layers = self._n_full + self._n_local
            head = sum(self.engine.kernels_for(op.name, op.kind)
                       for op in self._head_ops_of(1))
            idx = self._n_idx * self._idx_kernels if self._n_idx else 0.0  # launched eagerly
            self._graph_launch_s = (layers * (self._attn_kernels + 1) + idx + 1 + head) * \
                self.engine.host_launch_s
        return self._graph_launch_s

    def _with_host_s(self, gpu_s: float, sequences: int, *, prefill: bool, decodes: bool,
                     graphed: bool) -> float:
        """A step's GPU time with the engine's host cost for it, overlapped where the engine
        runs its host work beside the step before (``Engine.overlaps_host``), a step outside
        a CUDA graph holding the host for its launches first (``roofline.with_host``)."""
        e = self.engine
        return with_host(gpu_s, host_s(e, sequences, prefill=prefill, decodes=decodes),
                         e.overlaps_host(), 0.0 if graphed else self.launch_s) + \
            e.worker_s(self.tp)

    def gpu_s(self, shape: StepShape, *, prefill: bool, graphed: bool | None = None) -> float:
        """The step's operators alone, without the engine's host cost: ``linear_s`` +
        ``head_s`` + ``attention_s`` (their caches read here first: a simulation asks this
        every step)."""
        if graphed is None:
            graphed = self.engine.cuda_graphs and not prefill
        return self._linear_head_s(shape.tokens, shape.logit_rows, graphed) + \
            self.attention_s(shape, graphed)

    def _linear_head_s(self, tokens: float, logit_rows: float, graphed: bool) -> float:
        """``linear_s`` + ``head_s`` of a step's tokens and sampled rows, cached."""
        n, rows = int(round(tokens)), int(round(logit_rows))
        linear = self._linear.get((n, graphed))
        if linear is None:
            linear = self.linear_s(n, graphed)
        head = self._head.get((rows, graphed)) if rows > 0 else 0.0
        if head is None:
            head = self.head_s(rows, graphed)
        return linear + head

    def kv_capacity_tokens(self, max_num_seqs: int, step_tokens: int) -> int:
        """Tokens of KV cache the replica holds (``planner.core.memory.kv_capacity_tokens``)."""
        from planner.core.memory import kv_capacity_tokens

        return kv_capacity_tokens(self.model, self.hardware, self.prep.precision, tp=self.tp,
                                  options=self.options,
                                  lm_head_sharded=self.engine.lm_head_sharded,
                                  max_num_seqs=max_num_seqs, step_tokens=step_tokens,
                                  engine=self.engine)
