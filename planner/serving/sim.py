"""A discrete-event simulation of one replica serving a request stream, step by step.

Continuous batching follows vLLM's v1 scheduler (vllm/v1/core/sched/scheduler.py): each step
spends a token budget (``max_num_batched_tokens``) on the running requests first (a decode
takes one token, an unfinished prefill its next chunk), then admits waiting requests in arrival
order while the budget, ``max_num_seqs`` and the KV cache allow, a long prompt getting a chunk
(with chunked prefill; without it a prompt must fit the budget whole). The KV cache is a pool of
blocks of ``block_size`` tokens (``kv_layout="paged"``, PagedAttention) allocated as a request's
tokens reach a new block; when a step needs a block and none is free, the newest running request
is preempted: its blocks are freed and it goes back to the front of the queue, to recompute its
prompt and the tokens it had generated (vLLM's recompute preemption). ``kv_layout="contiguous"``
reserves ``max_model_len`` tokens for each admitted request up front, as servers did before
PagedAttention. Static batching forms a batch of up to ``max_num_seqs`` waiting requests, runs
their prefill, then decodes the whole batch until its longest request is done (finished
sequences are padding), then forms the next. Dynamic batching does the same, but an idle server
waits up to ``max_wait_s`` after the oldest waiting request's arrival for the batch to fill.
(``schedulers``: one class per policy; ``kv``: the pool, paged or contiguous.)

Each step takes ``StepCoster.step_time`` of its shape: the estimate's operator and engine
model (``steps``, over ``cost`` and ``layouts``). Decoding requests are kept in aggregate (their
count, the sum of their contexts, a heap of the steps at which they finish and a count per
block offset of those about to need a new block: ``decoding.DecodePool``), so a step costs O(1)
work whatever the batch: 100,000 requests simulate in seconds. Speculative decoding
(``planner.serving.speculation``) advances each request by a fraction of a token per step on
average, so it tracks each decoding request: O(running requests) a step
(``decoding.SpecDecodePool``).

Sliding-window layers (Gemma-2/3, gpt-oss, Mistral-7B v0.1): a prefill chunk's windowed
attention is costed exactly; the decoders, held in aggregate, are costed as reading
min(sum of their contexts, count x window) keys in those layers, which is exact when every
context is below the window or every one above it, and an upper bound otherwise. Where the
engine has vLLM's hybrid KV cache manager (``SchedulerConfig.hybrid_kv_cache``) and the model
one group of full-attention layers (``planner.core.memory.kv_cache_groups``), the pool is
``kv.HybridPagedKV``: its sliding layers hold only their window's blocks. Otherwise the pool is
sized and filled as if every layer cached the whole context (vLLM before that manager, SGLang,
TensorRT-LLM here).

The parts, each in its module of ``planner.serving``: the requests and their states
(``requests``), the scheduler's settings (``config``), the KV pool (``kv``), the decode pool
(``decoding``), the batching policies (``schedulers``), the arrivals (``arrivals``: an open
stream or a closed loop of clients), the step's shape and time (``steps``) and what the replica
held over time (``occupancy``), and the API server in front of the engine (``frontend``: a
queue for requests, a pace for streamed tokens). ``simulate`` builds them and runs the event
loop that ties them together.

A request the engine would refuse is not served and does not end the run: one longer than the
whole KV cache (vLLM refuses it at admission), one whose prompt and output exceed
``max_model_len`` (vLLM's OpenAI server answers 400), or, with chunked prefill off, one whose prompt
exceeds a step's token budget (TensorRT-LLM rejects it: "should not exceed max_num_tokens").
Its ``RequestResult.failed`` says why; the figures are over the requests served, as `bench
serve` counts only the successful ones. Pure: no I/O, no printing.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.core.errors import UsageError
from planner.core.memory import kv_cache_bytes_per_token, kv_cache_groups
from planner.serving.arrivals import Arrivals, arrivals
from planner.serving.config import SchedulerConfig
from planner.serving.cost import StepCoster, idle_coster
from planner.serving.decoding import DecodePool, check_spec, decode_pool
from planner.serving.frontend import Frontend
from planner.serving.gcpause import no_cycle_collection
from planner.serving.kv import KVPool, PrefixCache, kv_pool
from planner.serving.occupancy import Occupancy
from planner.serving.records import RequestRecords
from planner.serving.requests import RequestResult, SimRequest
from planner.serving.schedulers import ContinuousScheduler, Scheduler, make_scheduler
from planner.serving.speculation import SpecServing
from planner.serving.steps import StepPricer
from planner.serving.traffic import Request

__all__ = ["RequestResult", "SchedulerConfig", "SimResult", "hybrid_kv_groups",
           "kv_capacity_tokens", "simulate"]


@dataclass
class SimResult:
    requests: RequestRecords | list[RequestResult]  # by position in the stream given
    duration_s: float
    steps: int
    kv_capacity_tokens: int
    itl: list[tuple[float, int]]  # (inter-token latency, how many tokens waited it)
    samples: list[tuple[float, int, int, int]]  # (t, running, waiting, KV tokens reserved)
    busy_s: float = 0.0
    running_integral: float = 0.0  # integral of running requests over time
    kv_held_integral: float = 0.0  # of KV tokens holding data
    kv_reserved_integral: float = 0.0  # of KV tokens reserved (blocks or reservations)
    max_running: int = 0
    peak_kv_held_tokens: int = 0
    peak_kv_reserved_tokens: int = 0
    preemptions: int = 0
    arrived: int = 0
    in_flight: int = 0
    failed: int = 0  # requests refused (``RequestResult.failed`` says why)
    # prefix caching: prompt tokens admissions found cached, of those they needed (None: off)
    prefix_hit_tokens: int | None = None
    prefix_query_tokens: int | None = None
    # the API server (``planner.serving.frontend``): seconds requests waited for it before the
    # engine saw them (summed over the requests served), and seconds its token streaming
    # added to steps over the engine's own time
    api_server_wait_s: float = 0.0
    api_server_stream_s: float = 0.0


def kv_capacity_tokens(coster: StepCoster, cfg: SchedulerConfig) -> int:
    """Tokens of KV cache the replica holds at this scheduler's step size (the coster's
    layout decides: one TP group, pipeline stages, expert-parallel GPUs)."""
    return coster.kv_capacity_tokens(cfg.max_num_seqs, cfg.max_num_batched_tokens)


def simulate(requests: list[Request], coster: StepCoster, cfg: SchedulerConfig, *,
             sample_every_s: float | None = None, max_steps: int = 50_000_000,
             spec: SpecServing | None = None,
             on_record: Callable[[RequestResult], None] | None = None,
             warm_prefixes: dict[int, int] | None = None) -> SimResult:
    """Serve ``requests`` on one replica; every request runs to completion. ``spec``:
    speculative decoding (``planner.serving.speculation``; continuous batching only).
    ``on_record``: called with each request's result as it is done or refused, its figures
    final (a caller's sink: a trace written as the run goes). A request's objects are made
    when it is next to arrive and let go when it is done: the run holds those in flight and
    a row of figures per request (``planner.serving.records``). ``warm_prefixes``: prefix id
    -> tokens already in the prefix cache when the run begins (an earlier run on the same
    server computed them; ``KVPool.warm``)."""
    if cfg.ranks == 1 and getattr(coster, "dp_ranks", 1) > 1:
        cfg = replace(cfg, ranks=coster.dp_ranks)
    cfg.check()
    check_spec(cfg, spec)
    kv = _kv_pool(coster, cfg, spec)
    if warm_prefixes:
        kv.warm(warm_prefixes)
    if any(q.loaded_tokens for q in requests) and cfg.kind != "continuous":
        raise UsageError("requests that arrive with their KV (a disaggregated decode "
                         "instance) are simulated with continuous batching only")
    batch = decode_pool(cfg, kv, spec)
    records = RequestRecords(len(requests))
    wait_s = array("d", [math.nan]) * len(requests)  # API-server wait, served requests
    path = coster.engine if (coster.engine.request_overhead_s or
                             coster.engine.prompt_token_overhead_s) else None
    refused = set()
    for i, q in enumerate(requests):
        reason = _refusal(q.prompt_tokens, q.output_tokens, kv, batch.k1, cfg)
        if reason:
            refused.add(i)
            _record(records, i, RequestResult(q.id, q.arrival_s, q.prompt_tokens,
                                              q.output_tokens, failed=reason), path, on_record)

    def stream():  # each request's objects, made as it is next to arrive
        for i, q in enumerate(requests):
            if i not in refused:
                r = RequestResult(q.id, q.arrival_s, q.prompt_tokens, q.output_tokens)
                s = SimRequest.of(r, q.prefix_id, q.prefix_tokens, q.loaded_tokens)
                s.index = i
                yield s

    def done(q: SimRequest) -> None:
        r = q.r
        if not r.failed:
            wait_s[q.index] = q.visible_s - r.arrival_s
        _record(records, q.index, r, path, on_record)
        if release is not None:  # the client has it whole at its finish, the path included
            release(r.finish_s)

    sched = make_scheduler(cfg, kv, batch)
    sched.on_done = done
    e = coster.engine
    front = Frontend(e.frontend_request_s + cfg.chat_template_parse_s, e.frontend_token_s,
                     cfg.api_servers)
    arr = arrivals(stream(), cfg.max_concurrency, front if front.active else None)
    release = getattr(arr, "release", None)
    occ = Occupancy(sample_every_s)
    # speculative decoding runs the target's prefill eagerly (SGLang 0.5.10 turns the prefill
    # graphs off under it; 0.5.12 and later replay none for an EAGLE / MTP target, whose
    # hidden-state capture the graphs do not hold)
    prefill_graphs = cfg.prefill_graphs if spec is None else None
    pricer = StepPricer(coster, batch, cfg.graph_sizes, cfg.graph_padding, prefill_graphs)
    inner = _inner_pricer(coster, batch, cfg, spec) if cfg.scheduler_steps > 1 else None
    # async scheduling, where the coster prices it (one TP group): a step's host work runs
    # beside the step before it, and a step after idle time has none to run beside
    cold = None
    if getattr(coster, "overlaps_steps", False) and e.overlaps_host():
        cold = StepPricer(idle_coster(coster), batch, cfg.graph_sizes, cfg.graph_padding,
                          prefill_graphs)
    with no_cycle_collection():  # the loop makes no cycles: refcounts free all
        t, stream_s = _serve(sched, arr, pricer, occ, n=len(requests) - len(refused),
                             max_steps=max_steps, front=front if front.token_s else None,
                             inner=inner, cold=cold)
    if path is not None:  # when the last request is done, its request path included
        for f in records.column("finish_s"):
            t = max(t, f)
    return SimResult(records, t, occ.steps, kv.capacity_tokens, occ.itl, occ.samples,
                     busy_s=occ.busy_s, running_integral=occ.running_integral,
                     kv_held_integral=occ.kv_held_integral,
                     kv_reserved_integral=occ.kv_reserved_integral,
                     max_running=occ.max_running, peak_kv_held_tokens=occ.peak_kv_held_tokens,
                     peak_kv_reserved_tokens=occ.peak_kv_reserved_tokens,
                     preemptions=sched.preemptions, arrived=arr.arrived,
                     in_flight=arr.arrived - sched.finished,
                     failed=len(refused) + sched.refused,
                     prefix_hit_tokens=None if kv.prefixes is None else kv.prefixes.hit_tokens,
                     prefix_query_tokens=None if kv.prefixes is None else
                     kv.prefixes.query_tokens,
                     api_server_wait_s=sum(w for w in wait_s if not math.isnan(w)),
                     api_server_stream_s=stream_s)


def _record(records: RequestRecords, i: int, r: RequestResult, path,
            on_record: Callable[[RequestResult], None] | None) -> None:
    """Request ``i``'s final figures into its row (and to ``on_record``). Where ``path`` (the
    engine) has a request path outside its steps (the API server's handling, tokenization,
    hand-off, the first token's detokenization and streaming: ``Engine.request_path_s``), it
    delays the request's first token and so its last; its time between tokens is unchanged.
    Shifting each request after its steps are simulated is exact for an open stream (the
    engine sees the same stream, later); a closed loop's client sends its next request at the
    shifted finish (``ClosedLoop.release``), so the engine sees it that much later."""
    if path is not None:
        d = path.request_path_s(r.prompt_tokens, admitted=True)
        r.first_token_s += d
        r.finish_s += d
    records.put(i, r)
    if on_record is not None:
        on_record(r)


def _refusal(prompt_tokens: int, output_tokens: int, kv: KVPool, k1: int,
             cfg: SchedulerConfig) -> str:
    """Why the engine refuses a request of these lengths on arrival ("" when it does not)."""
    need = kv.tokens_for(prompt_tokens + output_tokens + k1 - 1)  # and the k lookahead
    if need > kv.capacity_tokens:
        return (f"{prompt_tokens:,} + {output_tokens:,} tokens need {need:,} KV "
                f"tokens; the replica holds {kv.capacity_tokens:,}")
    if prompt_tokens + output_tokens > cfg.max_model_len:
        return (f"{prompt_tokens:,} + {output_tokens:,} tokens exceed max-model-len "
                f"({cfg.max_model_len:,})")
    if (cfg.kind == "continuous" and not cfg.chunks_prompts
            and not cfg.takes_whole_prompts and prompt_tokens > cfg.max_num_batched_tokens):
        return (f"its prompt ({prompt_tokens:,} tokens) exceeds max-num-batched-tokens "
                f"({cfg.max_num_batched_tokens:,}) and {cfg.unchunked_why}")
    return ""


def _inner_pricer(coster: StepCoster, batch, cfg: SchedulerConfig,
                  spec: SpecServing | None) -> StepPricer:
    """The pricer of a multi-step block's later steps (``MultiStepScheduler``): the engine's
    host work for them (output processing, the graph's launch) runs beside the GPU's, as
    under async scheduling, since scheduling and input preparation ran once for the block; a
    step run without a CUDA graph still keeps the host busy launching its kernels
    first (``StepCoster.launch_s``). On a TP replica without speculation, as vLLM V0 ran it."""
    if spec is not None:
        raise UsageError("--num-scheduler-steps: multi-step scheduling and speculative "
                         "decoding are not simulated together (vLLM V0 refused the pair)")
    try:
        hidden = coster.with_engine(replace(coster.engine, async_scheduling=True))
    except AttributeError:  # a pipeline or expert-parallel layout's coster
        raise UsageError("--num-scheduler-steps: multi-step scheduling is simulated on a TP "
                         "replica only (pp 1, ep 1)") from None
    return StepPricer(hidden, batch, cfg.graph_sizes, cfg.graph_padding, cfg.prefill_graphs)


def hybrid_kv_groups(model, cfg: SchedulerConfig) -> tuple[int, int] | None:
    """(layers per group, sliding-window groups) where the replica's pool is vLLM's hybrid
    one (``kv.HybridPagedKV``): the scheduler has the manager, the KV cache is paged, and
    the model's layers form one full-attention group and sliding ones
    (``planner.core.memory.kv_cache_groups``); None otherwise (a model whose full layers
    make several groups keeps the pool that counts every layer at full context)."""
    groups = kv_cache_groups(model) if cfg.hybrid_kv_cache else None
    if groups is None or groups[1] != 1 or cfg.kv_layout != "paged":
        return None
    return groups[0], groups[2]


def _kv_pool(coster: StepCoster, cfg: SchedulerConfig, spec: SpecServing | None) -> KVPool:
    """The replica's KV pool, which a drafter's weights and cache share."""
    capacity = kv_capacity_tokens(coster, cfg)
    if spec is not None:
        capacity = spec.kv_capacity_tokens(capacity)
    sliding = None
    groups = hybrid_kv_groups(coster.model, cfg)
    if groups is not None:
        # the pool counts one group's tokens (``HybridPagedKV``): the memory of ``capacity``
        # tokens in every layer holds layers / per_group times as many blocks of one group
        per_group, sliding_groups = groups
        capacity = capacity * coster.model.num_layers // per_group
        # static batches reserve each request's whole length at once: no chunk's peak
        sliding = (sliding_groups, coster.model.sliding_window,
                   cfg.max_num_batched_tokens if cfg.kind == "continuous" else None)
    o = getattr(coster, "options", None)  # a pool or cap the options give (a test's coster: none)
    cap = getattr(o, "kv_cache_max_tokens", None)
    if cap is not None:  # the tokens the pool counts, a hybrid pool's too, at most the cap
        capacity = min(capacity, cap)
    kv = kv_pool(cfg.kv_layout, capacity, block_size=cfg.block_size,
                 max_model_len=cfg.max_model_len,
                 on_demand=cfg.capacity_policy != "guaranteed-no-evict", sliding=sliding)
    if cfg.prefix_caching and cfg.kind == "continuous" and cfg.kv_layout == "paged":
        kv.prefixes = PrefixCache(cfg.block_size)
    given = getattr(o, "kv_cache_memory_bytes", None)
    if kv.capacity_tokens < cfg.block_size and (given is not None or cap is not None):
        block_bytes = cfg.block_size * kv_cache_bytes_per_token(
            coster.model, coster.prep.precision, tp=getattr(coster, "tp", 1))
        capped = cap is not None and cap < cfg.block_size
        if given is not None and given >= block_bytes and not capped:
            # room for a block, but not beside the weights, activations and reserve
            raise UsageError(f"the KV cache given (--kv-cache-memory-bytes, "
                             f"{given / 1024**3:.2f} GiB) does not fit beside the weights, "
                             "activations and reserve on this GPU")
        said = "--kv-cache-tokens" if capped or given is None else "--kv-cache-memory-bytes"
        raise UsageError(f"the KV cache given ({said}) holds {kv.capacity_tokens} tokens, "
                         f"under one block of {cfg.block_size}")
    if kv.capacity_tokens < cfg.block_size:
        drafter = " and the drafter's" if spec is not None and spec.draft_weight_bytes else ""
        raise UsageError(f"the weights{drafter} leave no room for a KV cache on this GPU "
                         f"({kv.capacity_tokens} tokens); use more GPUs (--tp) or a smaller "
                         "precision")
    return kv


def _too_many_steps(max_steps: int) -> UsageError:
    return UsageError(f"the simulation did not finish within {max_steps:,} steps")


# The event loop's inner loop over runs of decode-only steps (``_serve``); tests turn it off
# to hold its steps to the loop's own, to the bit.
QUICK_DECODE_RUNS = True


def _decode_run(sched: ContinuousScheduler, arr: Arrivals, pricer: StepPricer, occ: Occupancy,
                front: Frontend | None, t: float, stream_s: float, ahead: bool,
                max_steps: int) -> tuple[float, float, bool]:
    """``_serve``'s inner loop: the decode-only steps from ``t`` while nothing prefills and
    nothing waiting can be admitted, up to the step a request is due to finish, a request
    arrives that could be admitted, or a block cannot be had without the scheduler. What the
    event loop's calls do for such a step, with their work written out (the step's price,
    the occupancy record, the pool's step, the arrival check), in the same operations and
    order, so the same figures to the bit. Returns (t, stream_s, whether any step ran)."""
    batch, kv, running, waiting = sched.batch, sched.kv, sched.running, sched.waiting
    n_dec = batch.n
    # a queue that cannot be admitted (every seat taken, or no token of the step's budget
    # left beside the decodes) leaves a decode-only step decode-only; so does a head that
    # the scheduler found no room for, where nothing was released since and the free tokens
    # have only fallen (each step's blocks take more): its admission fails again as it did,
    # and leaves the pool and the prefix cache as they are (the first failure evicted what
    # it could). Not under TensorRT-LLM's batch waiting, which counts the steps it holds.
    full = len(running) >= sched.max_seqs or sched.token_budget - n_dec <= 0
    blocked = None
    if waiting and not full:
        blocked = sched.blocked
        if blocked is None or blocked is not waiting[0] or sched.wait_iters or \
                kv.free_tokens > sched.blocked_free:
            return t, stream_s, False
    # constant over the run: the pool's members, the captured size it pads to, the floor
    # an API server that streams slowly sets
    size, price = pricer.decode_pricer(n_dec)
    scale = pricer.scale
    base = batch.sum_c0_minus_G0
    floor = front.step_floor_s(n_dec) if front is not None else 0.0
    prefixes = kv.prefixes
    held_of = None if type(kv).held_of is KVPool.held_of else kv.held_of
    running_n, capacity = len(running), kv.capacity_tokens
    bucket, bs, unit, heap = batch.bucket, batch.bs, kv.block_growth_tokens, batch.heap
    # the open stream's arrival check written out; a closed loop's clients are asked
    pending = arr.pending if type(arr) is Arrivals else None
    arrive, add_itl = arr.arrive, occ.itl.append
    G, stepped = batch.G, False
    # ``Occupancy.record``'s figures, added to here and stored when the run ends (nothing
    # called in between reads them); the running requests are the same every step
    steps, busy_s = occ.steps, occ.busy_s
    running_int, held_int, reserved_int = (occ.running_integral, occ.kv_held_integral,
                                           occ.kv_reserved_integral)
    peak_held, peak_reserved = occ.peak_kv_held_tokens, occ.peak_kv_reserved_tokens
    next_sample_s = occ.next_sample_s
    while True:
        if steps >= max_steps:
            raise _too_many_steps(max_steps)
        grow = bucket[(-G) % bs] * unit  # the pool's ``growth_tokens``
        if grow > kv.free_tokens:  # room must be made: the scheduler's step
            break
        kv.free_tokens -= grow
        # ``StepPricer.time_s`` of a padded decode-only step
        past = base + n_dec * G
        dt = price(size, past + n_dec, n_dec)
        if scale != 1.0:
            dt = dt * scale
        if floor > dt:
            stream_s += floor - dt
            dt = floor
        held = past - prefixes.double_counted if prefixes is not None else past
        if held_of is not None:
            held = held_of(held)
        reserved = capacity - kv.free_tokens
        running_int += running_n * dt
        held_int += held * dt
        reserved_int += reserved * dt
        if held > peak_held:
            peak_held = held
        if reserved > peak_reserved:
            peak_reserved = reserved
        busy_s += dt
        steps += 1
        add_itl((dt, n_dec))
        t += dt
        G += 1
        batch.G = G  # ``DecodePool.step``
        stepped = True
        due = bool(heap) and heap[0] <= G
        if due:  # a request may be done: the scheduler's end of step
            sched.on_step_end([], t)
        now = t - dt if ahead else t
        if pending is None or (pending and pending[0].visible_s <= now):
            arrive(now, waiting)
        if t >= next_sample_s:
            occ.sample(t, len(running), len(waiting), capacity - kv.free_tokens)
            next_sample_s = occ.next_sample_s
        if due or (waiting and not full and waiting[0] is not blocked):
            break
    if stepped:
        occ.steps, occ.busy_s = steps, busy_s
        occ.running_integral, occ.kv_held_integral, occ.kv_reserved_integral = (
            running_int, held_int, reserved_int)
        occ.peak_kv_held_tokens, occ.peak_kv_reserved_tokens = peak_held, peak_reserved
        if running_n > occ.max_running:
            occ.max_running = running_n
    return t, stream_s, stepped


def _serve(sched: Scheduler, arr: Arrivals, pricer: StepPricer, occ: Occupancy, *, n: int,
           max_steps: int, front: Frontend | None = None,
           inner: StepPricer | None = None,
           cold: StepPricer | None = None) -> tuple[float, float]:
    """The event loop: arrivals, then a step the scheduler fills and the pricer times, until
    every request is done. Returns the time the last step ended, and the seconds ``front`` (an
    API server that costs time per token streamed) added to steps: a step is seen to take no
    less than its tokens need (``Frontend.step_floor_s``).

    A step that runs no decodes (``Scheduler.decodes``, SGLang's prefill batches) makes the
    decoding requests wait: their next token's gap is that step and the decode step after it
    (``stall_s`` counted for the requests that sat out the last such step). ``inner``: the
    pricer of a multi-step block's later steps (``Scheduler.inner``).

    ``cold``: given where the engine schedules each step while the GPU runs the one before
    (async scheduling, ``Engine.overlaps_host``), the pricer of a step with nothing before it
    to hide its host work under (the engine was idle: the same steps, host time added). The
    step after a busy one holds only the requests the engine had seen when that one began, so
    one arriving during a step waits for the step after next; an idle engine schedules an
    arrival at once."""
    ahead = cold is not None
    cold_s = None if cold is None else cold.timer
    fresh = True  # the engine is idle before the next step
    kv, batch = sched.kv, sched.batch
    running, waiting, prefilling = sched.running, sched.waiting, sched.prefilling
    arrive, schedule, end_step = arr.arrive, sched.schedule, sched.on_step_end
    wait_until, record = sched.wait_until, occ.record
    time_s = pricer.timer
    inner_s = None if inner is None else inner.timer
    t = stall_s = stream_s = 0.0
    stalled = 0
    # multi-step bursts (``MultiStepScheduler.bursts``): a block's seconds so far and the
    # requests it decodes, each seeing one gap when the block's tokens reach it
    bursts = sched.bursts
    burst_s, burst_n = 0.0, 0
    # A run of decode-only steps (nothing prefills, nothing waits that could be admitted, no
    # request is due) is stepped by the inner loop below: what the loop's calls do for such
    # a step, and nothing else (mixed batches under the plain decode pool, each step priced in
    # one call: padded to its captured size, run without a graph above the largest or where
    # the engine pads to none, or a layout's that captures none; ``StepPricer.decode_pricer``).
    # Where it applies, the same steps to the bit, in the same order.
    quick = (QUICK_DECODE_RUNS and type(sched) is ContinuousScheduler and sched.mixed
             and sched.reserve is None and not bursts and inner is None
             and type(batch) is DecodePool and batch.padding == 0 and pricer.uniform is not None)
    arrive(0.0, waiting)
    while sched.finished < n:
        if occ.steps >= max_steps:
            raise _too_many_steps(max_steps)
        if quick and not fresh and not prefilling and not stall_s and batch.n:
            t, stream_s, stepped = _decode_run(sched, arr, pricer, occ, front, t, stream_s,
                                               ahead, max_steps)
            if stepped:
                continue
        if not running and not waiting:
            if not arr.more:
                break
            t = max(t, arr.next_s())  # idle until the next arrival
            arrive(t, waiting)
            fresh = True
            continue
        wake = wait_until(t, arr)
        if wake is not None:
            t = wake
            arrive(t, waiting)
            fresh = True
            continue
        chunks = schedule()
        decodes = sched.decodes
        n_dec = batch.n if decodes else 0
        if not chunks and not n_dec:
            if arr.more and not waiting:
                t = max(t, arr.next_s())
                arrive(t, waiting)
                fresh = True
                continue
            raise sched.stuck()
        price = inner_s if inner_s is not None and sched.inner else \
            cold_s if fresh and ahead else time_s
        fresh = False
        dt, past = price(chunks, decodes)
        out = n_dec - batch.padding
        if front is not None:
            floor = front.step_floor_s(out)
            if floor > dt:
                stream_s += floor - dt
                dt = floor
        if bursts and n_dec:  # held to the block's end (a gap over the stall before it)
            if not burst_s:
                burst_n = out
            burst_s += dt
            out = 0
        elif n_dec and stall_s:  # tokens that also waited the prefill steps before this one
            late = min(stalled, out)
            if late:
                occ.itl.append((dt + stall_s, late))
            out -= late
            stall_s = 0.0
        elif not decodes and batch.n:
            stall_s += dt
            stalled = batch.n
        held = past + sum(q.computed for q in prefilling.values()) if prefilling else past
        if kv.prefixes is not None:
            held -= kv.prefixes.double_counted
        held = kv.held_of(held)
        record(dt, len(running), held, kv.capacity_tokens - kv.free_tokens, out)
        t += dt
        if n_dec:
            batch.step()
        end_step(chunks, t)
        if burst_s and not sched.left:
            # the requests decoding before the prefill steps ahead of the block waited those
            # too; any prefilled in them saw their first token then
            late = min(stalled, burst_n) if stall_s else 0
            if late:
                occ.itl.append((burst_s + stall_s, late))
            if burst_n > late:
                occ.itl.append((burst_s, burst_n - late))
            burst_s = stall_s = 0.0
        arrive(t - dt if ahead else t, waiting)
        if t >= occ.next_sample_s:
            occ.sample(t, len(running), len(waiting), kv.capacity_tokens - kv.free_tokens)
    return t, stream_s
