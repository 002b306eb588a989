"""Step costs of a replica spread over pipeline stages or expert-parallel GPUs.

Each coster answers the simulator's two questions, ``step_time(shape, ...)`` and
``kv_capacity_tokens(...)``, for a layout other than one tensor-parallel group
(``planner.serving.cost.StepCoster``), with the same formulas as ``planner.layouts.pipeline`` and
``planner.layouts.expert``, so that a replica at low load sees the TPOT and TTFT ``estimate --pp`` /
``--ep`` predict (tests hold them equal).

Pipeline (``PipelineCoster``): a step's sequences run as m = min(sequences, PP) micro-batches,
the largest holding ceil(sequences / m) of them and that share of the step's work (vLLM
schedules one batch per virtual engine; an even split is the balanced case). Each token
waits for its micro-batch to pass every stage, and each stage serves the m micro-batches in
turn, so the step takes

    max(sum over stages of (stage + send) + host,
        m x max(max over stages of (stage + send), host))

the host cost being the engine's per step and per sequence of one micro-batch. A prefill chunk
of one sequence is in one micro-batch whole: in a step that mixes chunks and decodes the
largest micro-batch holds its share of the decodes and of the chunks (as a data-parallel group
does below). The KV pool is that of the tightest stage: each stage
holds its own layers' cache of every token.

Expert parallel (``ExpertCoster``): the replica's ``ep`` GPUs hold the routed experts, 1/ep
each, and run everything else tensor-parallel in ``dp`` = ep / tp attention groups
(``planner.layouts.expert``). The sequences are spread evenly over the groups, each with its
own scheduler limits (``max_num_seqs`` and a step budget per group, as vLLM's data-parallel
engines each have; modelled as one scheduler of ``ranks = dp`` over the pooled cache: the
balanced case; one TP group is one scheduler). A step costs the busiest group's share of the
non-expert work (ceil(sequences / dp) of the decodes; a prefill chunk runs whole in one group,
the chunks spread over min(chunks, dp) of them), the routed experts at the most loaded GPU's
token-expert pairs, and the MoE's communication of that share (all-to-alls and the TP group's
gather, or one TP group's all-reduce). The KV pool is ``dp`` times one group's.

Pure: no I/O.
"""

from __future__ import annotations

from planner.core.engine import Engine
from planner.core.estimate import Prepared
from planner.core.memory import (
    kv_cache_bytes_per_token,
    serving_kv_tokens,
    step_activation_bytes,
)
from planner.core.ops import StepShape, check_tp, kv_bytes_per_token_per_layer
from planner.core.roofline import with_host
from planner.core.specs import HardwareSpec, ModelSpec, Options
from planner.layouts.expert import ExpertStep
from planner.layouts.pipeline import stage_layers, weights_of_stage
from planner.serving.cost import CostCache, StepCoster, host_s


class _Layout:
    model: ModelSpec
    hardware: HardwareSpec
    prep: Prepared
    options: Options
    engine: Engine
    tp: int

    def fixed_s(self, sequences, *, prefill: bool, decodes: bool) -> float:
        return host_s(self.engine, sequences, prefill=prefill, decodes=decodes)

    def _activation_bytes(self, max_num_seqs: int, step_tokens: int, tp: int) -> float:
        return step_activation_bytes(self.model, self.prep.precision,
                                     max_num_seqs=max_num_seqs, step_tokens=step_tokens, tp=tp,
                                     attention=self.options.attention)


class PipelineCoster(_Layout):
    """Seconds per step of a replica of ``pp`` stages, each on ``tp`` GPUs."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, prep: Prepared,
                 options: Options, *, tp: int = 1, pp: int = 2, cache: CostCache | None = None):
        check_tp(model, tp)
        self.model, self.hardware, self.prep, self.options = model, hardware, prep, options
        self.engine, self.tp, self.pp = prep.engine, tp, pp
        self.ranges = stage_layers(model.num_layers, pp)
        self.stages = [StepCoster(model, hardware, prep, options, tp=tp,
                                  stage=(s, t, i == 0, i == pp - 1), cache=cache)
                       for i, (s, t) in enumerate(self.ranges)]
        c = prep.ceilings
        per_node = c.gpus_per_node
        self._links = []
        for i in range(pp - 1):
            crosses = bool(per_node) and ((i + 1) * tp) % per_node == 0
            link, extra = c.link(crosses)
            self._links.append((link, self.engine.allreduce_latency_s + extra))
        self._hidden_bytes = 2 * model.hidden_size * prep.precision.activation_bytes

    splits_parts = True  # the simulator passes a mixed step's decodes apart (``parts``)

    def step_time(self, shape: StepShape, *, sequences: int, prefill: bool,
                  decodes: bool = True, parts: tuple[StepShape, int] | None = None) -> float:
        """``parts``: (the decodes' shape, the number of prefill chunks) of a step that mixes
        them: a chunk is one sequence's, so it runs whole in one micro-batch, and the largest
        micro-batch holds its share of the decodes and of the chunks (1 / min(chunks, m)),
        not a share of every token (which would split one prompt's prefill over the
        stages' micro-batches as soon as anything else decodes beside it)."""
        m = max(1, min(sequences, self.pp))
        per = -(-sequences // m)  # the largest micro-batch's sequences
        part = shape if m == 1 else _busiest(shape, sequences, m, parts)
        sends = [self._hidden_bytes * part.tokens / link + lat for link, lat in self._links]
        per_stage = [st.gpu_s(part, prefill=prefill) + (sends[i] if i < len(sends) else 0.0)
                     for i, st in enumerate(self.stages)]
        host = self.fixed_s(per, prefill=prefill, decodes=decodes)
        overlapped = self.engine.hides_host(self.engine.cuda_graphs and not prefill, self.pp)
        return max(with_host(sum(per_stage), host, overlapped),
                   m * max(max(per_stage), host)) + self.engine.worker_s(self.tp * self.pp)

    @property
    def prices_uniform_decodes(self) -> bool:
        """``uniform_decode_pricer`` gives ``step_time``'s answer for the plain decode pool's
        decode-only steps: every stage's attention priced so
        (``StepCoster.prices_uniform_decodes``)."""
        return all(st.prices_uniform_decodes for st in self.stages)

    def uniform_decode_pricer(self):
        """``step_time`` of the plain decode pool's decode-only step (``DecodePool.shape``)
        as one function, ``f(tokens, attended, sequences)``, ``tokens`` the step's rows
        (``sequences``: this layout captures no graph sizes to pad to), ``attended`` its
        cached-plus-new tokens: the largest micro-batch's share through every stage and the
        sends between them, with the host's cost. The same operations in the same order as
        ``step_time`` through ``_busiest`` and each stage's ``gpu_s``, so the same answer to
        the bit (tested), without building a stage's shapes a step. Only where
        ``prices_uniform_decodes``."""
        e, pp = self.engine, self.pp
        graphed = e.cuda_graphs
        window = self.model.attention_window
        # each stage's operators: its linear and head sums (``gpu_s``'s cached pair) and its
        # attention, with the send to the next stage after it (the last sends nothing)
        stages = [(st._linear_head_s, st.decode_attention_pricer(graphed))
                  for st in self.stages]
        links, hidden = self._links, self._hidden_bytes
        step_s, per_seq_s = e.step_overhead_s, e.per_sequence_overhead_s
        overlapped = e.hides_host(graphed, pp)
        worker_s = e.worker_s(self.tp * pp)

        def price(tokens: int, attended: int, sequences: int) -> float:
            m = max(1, min(sequences, pp))
            per = -(-sequences // m)  # the largest micro-batch's sequences
            rows, read = float(sequences), float(attended)
            local = read if window is None else float(min(attended, sequences * window))
            if m != 1:  # its share of every amount (``_busiest``, ``StepShape.scaled``)
                n = max(sequences, 1)
                f = -(-n // m) / n
                rows, read, local = rows * f, read * f, local * f
            sends = [hidden * rows / link + lat for link, lat in links]
            per_stage = [lin_head(rows, rows, graphed) + attention_s(rows, read, local)
                         + (sends[i] if i < len(sends) else 0.0)
                         for i, (lin_head, attention_s) in enumerate(stages)]
            host = step_s + per_seq_s * per
            return max(with_host(sum(per_stage), host, overlapped),
                       m * max(max(per_stage), host)) + worker_s

        return price

    def kv_capacity_tokens(self, max_num_seqs: int, step_tokens: int) -> int:
        """The tightest stage's: its free memory over its layers' KV bytes per token (every
        layer caching the whole context; a hybrid pool, ``planner.serving.kv.HybridPagedKV``,
        counts it again in one group's tokens)."""
        m, p, o = self.model, self.prep.precision, self.options
        act = self._activation_bytes(max_num_seqs, step_tokens, self.tp)
        per_layer = kv_bytes_per_token_per_layer(m, p.kv_bytes, self.tp)
        return min(serving_kv_tokens(
            self.hardware.memory_bytes, o, self.engine,
            weights_bytes=weights_of_stage(m, p, self.tp, s, t, i == 0, i == self.pp - 1,
                                           lm_head_sharded=self.engine.lm_head_sharded),
            step_act_bytes=act, per_token_bytes=(t - s) * per_layer)
            for i, (s, t) in enumerate(self.ranges))


class ExpertCoster(_Layout):
    """Seconds per step of an expert-parallel replica of ``ep`` GPUs, attention
    tensor-parallel over ``tp`` of them in ep / tp data-parallel groups."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, prep: Prepared,
                 options: Options, *, ep: int, tp: int = 1, cache: CostCache | None = None):
        self.model, self.hardware, self.prep, self.options = model, hardware, prep, options
        self.engine, self.ep, self.tp = prep.engine, ep, tp
        self.x = ExpertStep(model, prep, options, ep, tp)
        self.dp_ranks = self.x.dp  # each group schedules its own sequences (SchedulerConfig.ranks)
        # one attention group's operators but the routed experts, priced as a TP replica's
        # step is (their sums kept by tokens and rows, attention from its per-unit times):
        # ``ExpertStep.dense_s``'s sum to 1e-12, without building every operator each step
        self._dense = StepCoster(model, hardware, prep, options, tp=tp, routed_apart=True,
                                 cache=cache)
        # the routed experts by the step's tokens, the MoE's communication by the group's
        self._experts: dict[tuple[float, bool], float] = {}
        self._comm: dict[tuple[float, bool], float] = {}

    splits_parts = True  # the simulator passes a mixed step's decodes apart (``parts``)

    def step_time(self, shape: StepShape, *, sequences: int, prefill: bool,
                  decodes: bool = True, parts: tuple[StepShape, int] | None = None) -> float:
        """``parts``: (the decodes' shape, the number of prefill chunks) of a step that mixes
        them: a chunk runs whole in one group, so the busiest group holds its share of the
        decodes and of the chunks (1 / min(chunks, dp)), not a share of every token."""
        graphed = self.engine.cuda_graphs and not prefill
        dp = self.dp_ranks
        per = -(-max(sequences, 1) // dp)  # the busiest group's sequences
        # one group holds all of a step's sequences (its share is the step: x 1.0 exactly)
        own = shape if dp == 1 and parts is None else _busiest(shape, sequences, dp, parts)
        key = (shape.tokens, graphed)
        experts = self._experts.get(key)
        if experts is None:
            experts = self._experts[key] = self.x.experts_s(shape.tokens, graphed)[0]
        key = (own.tokens, graphed)
        comm = self._comm.get(key)
        if comm is None:
            comm = self._comm[key] = self.x.all_to_all_s(own.tokens) + \
                self.x.moe_reduce_s(own.tokens, graphed)
        return with_host(self.dense_s(own, graphed) + experts + comm,
                         self.fixed_s(per, prefill=prefill, decodes=decodes),
                         self.engine.hides_host(graphed)) + self.engine.worker_s(self.x.ep)

    @property
    def prices_uniform_decodes(self) -> bool:
        """``uniform_decode_pricer`` gives ``step_time``'s answer for the plain decode pool's
        decode-only steps: every attention its group's ``StepCoster`` prices so
        (``StepCoster.prices_uniform_decodes``)."""
        return self._dense.prices_uniform_decodes

    def uniform_decode_pricer(self):
        """``step_time`` of the plain decode pool's decode-only step (``DecodePool.shape``:
        each sequence adds one token after its context) as one function,
        ``f(tokens, attended, sequences)``, ``tokens`` the step's rows (``sequences``: this
        layout captures no graph sizes to pad to), ``attended`` its cached-plus-new tokens:
        the busiest group's share of the attention group's operators, the routed experts at
        the step's tokens and the MoE's communication of the share, with the host's cost.
        The same operations in the same order as ``step_time`` through ``_busiest`` and
        ``dense_s``, so the same answer to the bit (tested), without building three shapes a
        step. Only where ``prices_uniform_decodes``."""
        e, d, x = self.engine, self._dense, self.x
        graphed = e.cuda_graphs
        attention_s = d.decode_attention_pricer(graphed)
        dp, window = self.dp_ranks, self.model.attention_window
        linear, head, experts, comm = d._linear, d._head, self._experts, self._comm
        linear_s, head_s = d.linear_s, d.head_s
        hides, worker_s = e.hides_host(graphed), e.worker_s(x.ep)
        step_s, per_seq_s = e.step_overhead_s, e.per_sequence_overhead_s

        def price(tokens: int, attended: int, sequences: int) -> float:
            n = max(sequences, 1)
            per = -(-n // dp)  # the busiest group's sequences
            rows, read = float(sequences), float(attended)
            local = read if window is None else float(min(attended, sequences * window))
            key = (rows, graphed)
            ex = experts.get(key)
            if ex is None:
                ex = experts[key] = x.experts_s(rows, graphed)[0]
            if dp != 1:  # the busiest group's share of every amount (``StepShape.scaled``)
                f = per / n
                rows, read, local = rows * f, read * f, local * f
            key = (rows, graphed)
            cm = comm.get(key)
            if cm is None:
                cm = comm[key] = x.all_to_all_s(rows) + x.moe_reduce_s(rows, graphed)
            lin = linear.get(key)
            if lin is None:
                lin = linear_s(rows, graphed)
            hd = head.get(key)
            if hd is None:
                hd = head_s(rows, graphed, unsampled_weights=True)
            gpu = lin + hd + attention_s(rows, read, local) + ex + cm
            host = step_s + per_seq_s * per
            if hides:  # ``with_host``: the longer of the two
                host = host + 0.0
                t = (gpu + host + abs(gpu - host)) / 2
            else:
                t = gpu + host
            return t + worker_s

        return price

    def dense_s(self, own: StepShape, graphed: bool) -> float:
        """``ExpertStep.dense_s`` of one group's share: its linear operators by its tokens,
        the sampling by its rows and attention by its amounts, each kept or combined as
        ``StepCoster`` does (tokens and rows as they are, not rounded: a share of a step
        can hold a fraction of a prompt)."""
        d = self._dense
        # a step that samples no row (a chunk that does not finish its prompt, on an engine
        # that takes no logits for it: ``Engine.partial_prefill_logits`` off, vLLM V0): the
        # layout's estimate still reads the final norm's and the lm_head's weights
        return d.linear_s(own.tokens, graphed) + \
            d.head_s(own.logit_rows, graphed, unsampled_weights=True) + \
            d.attention_s(own, graphed)

    def kv_capacity_tokens(self, max_num_seqs: int, step_tokens: int) -> int:
        """``dp`` groups' caches: each GPU's memory less its weights (1/ep of the routed
        experts, every other weight as ``tp`` shards it) and the activations of a full step
        of its group (``max_num_seqs`` and ``step_tokens`` are one rank's), over the KV bytes
        per token each GPU of a group holds."""
        return self.dp_ranks * serving_kv_tokens(
            self.hardware.memory_bytes, self.options, self.engine,
            weights_bytes=self.x.weights_bytes(),
            step_act_bytes=self._activation_bytes(max_num_seqs, step_tokens, self.tp),
            per_token_bytes=kv_cache_bytes_per_token(self.model, self.prep.precision,
                                                     tp=self.tp))


def _busiest(shape: StepShape, sequences: int, groups: int,
             parts: tuple[StepShape, int] | None) -> StepShape:
    """The share of a step's work the busiest of ``groups`` (micro-batches, data-parallel
    groups) holds: ceil(sequences / groups) of them; or, for a step that mixes decodes and
    prefill chunks (``parts``: the decodes' shape and the number of chunks), its share of
    the decodes and of the chunks, 1 / min(chunks, groups), a chunk being one sequence's and
    run whole in one group."""
    if parts is None:
        return shape.scaled(-(-max(sequences, 1) // groups) / max(sequences, 1))
    dec, n_chunks = parts
    n_dec = max(dec.tokens, 1.0)
    return _add(dec.scaled(-(-n_dec // groups) / n_dec),
                _add(shape, dec.scaled(-1.0)).scaled(1 / min(n_chunks, groups)))


def _add(a: StepShape, b: StepShape) -> StepShape:
    """Field by field (the sliding-window view too, where both have one)."""
    local = None if a.local is None or b.local is None else _add(a.local, b.local)
    return StepShape(a.tokens + b.tokens, a.attn_pairs + b.attn_pairs,
                     a.kv_read_tokens + b.kv_read_tokens, a.kv_held_tokens + b.kv_held_tokens,
                     a.score_elems + b.score_elems, a.logit_rows + b.logit_rows, local,
                     a.prefill_pairs + b.prefill_pairs,
                     a.prefill_past_tokens + b.prefill_past_tokens)


def layout_coster(model: ModelSpec, hardware: HardwareSpec, prep: Prepared, options: Options,
                  *, tp: int = 1, pp: int = 1, ep: int = 1, cache: CostCache | None = None):
    """The step coster of a replica of tp x pp GPUs, or of ep expert-parallel GPUs with
    attention TP over ``tp`` of them. ``cache``: shared with the costers of this replica under
    other engine profiles and on other GPUs (an expert-parallel coster shares its attention
    group's operators and their times; it keeps the routed experts' own)."""
    if ep > 1:
        from planner.layouts.deployment import Layout

        Layout(tp, pp, ep).check(model)
        return ExpertCoster(model, hardware, prep, options, ep=ep, tp=tp, cache=cache)
    if pp > 1:
        return PipelineCoster(model, hardware, prep, options, tp=tp, pp=pp, cache=cache)
    return StepCoster(model, hardware, prep, options, tp=tp, cache=cache)
