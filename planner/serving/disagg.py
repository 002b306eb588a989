"""Disaggregated serving: a pool of prefill instances and a pool of decode instances, the KV
cache of each prompt sent from the one to the other.

As vLLM's disaggregated prefill runs it (its proxy, examples/online_serving/
disaggregated_serving/disagg_proxy_demo.py and the NixlConnector, vllm/distributed/
kv_transfer/kv_connector/v1/nixl_connector.py), and as SGLang's and Dynamo's do in outline: a
request goes to a prefill instance, which computes its prompt's KV (it runs the request with
one output token); the KV of the prompt then crosses to a decode instance, which holds the
prompt's tokens but the last as computed, computes that last one in its next step (the first
token the client sees comes from the decode instance) and decodes the rest. Each instance is a
replica as ``planner.serving.sim`` simulates one, with its own GPUs, layout, engine and
scheduler limits; both pools take requests in turn (round robin, as the proxy does: the
prefill pool in arrival order, the decode pool in the order prompts finish).

The transfer: the prompt's KV (every layer's, ``kv_bytes_per_token`` x prompt tokens) over
the link between the pools, each of the ``min(prefill TP, decode TP)`` GPU pairs carrying its
share (``KVLink``: the per-GPU bandwidth of NVLink within a server, or of the inter-node
network between servers, from hardware_db, and the network's latency). A prefill instance's
link and a decode instance's link each carry one transfer at a time, in the order prompts
finish: a transfer starts when its prompt is done and both links are free.

The pools are simulated one after the other, which is exact for an open stream of requests
routed in turn: nothing a decode instance does changes when a prefill instance finishes a
prompt. Two simplifications, both in the prefill instance's favour: a prompt's KV is freed on
the prefill instance when its prompt is done, not when the decode instance has pulled it; and
the transfer starts at once, where NIXL's decode side pulls the KV once it has admitted the
request (a busy decode instance would hold the KV longer on the prefill side). A closed loop
of clients (``max_concurrency``) couples the pools (a client's next request waits for its
last to decode) and is refused. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from planner.core.errors import UsageError
from planner.serving.config import SchedulerConfig
from planner.serving.requests import RequestResult
from planner.serving.sim import SimResult, simulate
from planner.serving.traffic import Request


@dataclass(frozen=True)
class Pool:
    """``instances`` replicas, each costed by ``coster`` (a ``planner.serving.cost``
    step coster) and scheduled by ``cfg``."""

    coster: object
    cfg: SchedulerConfig
    instances: int


@dataclass(frozen=True)
class KVLink:
    """The path a prompt's KV takes between the pools: the bandwidth one transfer gets (the
    GPU pairs that carry it together, each at its link's one-way rate) and a fixed latency
    per transfer."""

    bytes_per_s: float
    latency_s: float
    kind: str  # "nvlink", or the inter-node network's kind from hardware_db ("infiniband")
    gpu_pairs: int = 1

    def transfer_s(self, nbytes: float) -> float:
        return nbytes / self.bytes_per_s + self.latency_s


@dataclass
class DisaggResult:
    """The run as the client sees it (``requests``, each over both pools) and each pool's own
    runs, with the transfers between them."""

    requests: list[RequestResult]
    duration_s: float
    prefill: list[SimResult]
    decode: list[SimResult]
    link: KVLink
    transfer_bytes: list[float] = field(default_factory=list)  # per request transferred
    transfer_s: list[float] = field(default_factory=list)  # on the wire
    link_wait_s: list[float] = field(default_factory=list)  # waiting for a free link
    prefill_done_s: list[float] = field(default_factory=list)  # prompt done - arrival
    link_busy_s: float = 0.0  # the busiest link's seconds carrying KV

    def combined(self) -> SimResult:
        """The run as one ``SimResult``, for ``planner.serving.metrics.summary``: the
        client's requests; the decode pool's running requests, KV cache and token gaps
        (where the tokens stream from); steps and preemptions of both pools."""
        dec, pre = self.decode, self.prefill
        both = pre + dec
        hit = [r.prefix_hit_tokens for r in pre if r.prefix_hit_tokens is not None]
        query = [r.prefix_query_tokens for r in pre if r.prefix_query_tokens is not None]
        return SimResult(
            self.requests, self.duration_s, sum(r.steps for r in both),
            sum(r.kv_capacity_tokens for r in dec), [g for r in dec for g in r.itl], [],
            busy_s=sum(r.busy_s for r in dec),
            running_integral=sum(r.running_integral for r in dec),
            kv_held_integral=sum(r.kv_held_integral for r in dec),
            kv_reserved_integral=sum(r.kv_reserved_integral for r in dec),
            max_running=sum(r.max_running for r in dec),
            peak_kv_held_tokens=sum(r.peak_kv_held_tokens for r in dec),
            peak_kv_reserved_tokens=sum(r.peak_kv_reserved_tokens for r in dec),
            preemptions=sum(r.preemptions for r in both),
            arrived=sum(r.arrived for r in pre), in_flight=0,
            failed=sum(1 for r in self.requests if r.failed),
            prefix_hit_tokens=sum(hit) if hit else None,
            prefix_query_tokens=sum(query) if query else None,
            api_server_wait_s=sum(r.api_server_wait_s for r in both),
            api_server_stream_s=sum(r.api_server_stream_s for r in dec))


def simulate_disaggregated(requests: list[Request], prefill: Pool, decode: Pool, link: KVLink,
                           kv_bytes_per_token: float) -> DisaggResult:
    """Serve ``requests`` (an open stream) on ``prefill.instances`` prefill and
    ``decode.instances`` decode instances joined by ``link``."""
    if prefill.instances < 1 or decode.instances < 1:
        raise UsageError("disaggregated serving needs at least one prefill and one decode "
                         "instance", fields=("prefill_instances", "decode_instances"))
    for name, pool in (("prefill", prefill), ("decode", decode)):
        if pool.cfg.max_concurrency is not None:
            raise UsageError("disaggregated serving is simulated for an open stream of "
                             "requests (a request rate), not a closed loop of clients: "
                             "drop --max-concurrency", fields=("max_concurrency",))
        if pool.cfg.kind != "continuous":
            raise UsageError(f"disaggregated serving: the {name} pool is simulated with "
                             "continuous batching only", fields=("scheduler",))
    if not (link.bytes_per_s > 0 and link.latency_s >= 0):
        raise UsageError("the KV link needs a positive bandwidth and a latency >= 0",
                         fields=("kv_link",))
    reqs = sorted(requests, key=lambda q: (q.arrival_s, q.id))
    if any(math.isnan(q.arrival_s) for q in reqs):
        raise UsageError("disaggregated serving needs arrival times (an open stream)",
                         fields=("max_concurrency",))
    P, D = prefill.instances, decode.instances
    # a disaggregated server replays no prefill graphs (SGLang's _handle_piecewise_cuda_graph
    # turns them off under PD disaggregation)
    prefill = replace(prefill, cfg=replace(prefill.cfg, prefill_graphs=None))
    decode = replace(decode, cfg=replace(decode.cfg, prefill_graphs=None))
    # the prefill pool: each prompt with one output token, the instances in turn
    pre_runs, pre_of = [], {}
    for i in range(P):
        mine = [replace(q, output_tokens=1) for q in reqs[i::P]]
        res = simulate(mine, prefill.coster, prefill.cfg) if mine else None
        pre_runs.append(res)
        for r in (res.requests if res else ()):
            pre_of[r.id] = r
    # the transfers, in the order prompts finish; the decode instances in turn
    done = sorted((r for r in pre_of.values() if not r.failed),
                  key=lambda r: (r.first_token_s, r.id))
    by_id = {q.id: q for q in reqs}
    p_free, d_free = [0.0] * P, [0.0] * D
    p_busy, d_busy = [0.0] * P, [0.0] * D
    p_index = {q.id: i % P for i, q in enumerate(reqs)}
    dec_reqs: list[list[Request]] = [[] for _ in range(D)]
    moved = {}
    for n, r in enumerate(done):
        q, pi, di = by_id[r.id], p_index[r.id], n % D
        nbytes = q.prompt_tokens * kv_bytes_per_token
        wire = link.transfer_s(nbytes)
        start = max(r.first_token_s, p_free[pi], d_free[di])
        end = start + wire
        p_free[pi] = d_free[di] = end
        p_busy[pi] += wire
        d_busy[di] += wire
        moved[r.id] = (nbytes, wire, start - r.first_token_s)
        # it reaches the decode instance with its prompt but the last token computed; the
        # prefix it shared was the prefill instance's to reuse
        dec_reqs[di].append(Request(q.id, end, q.prompt_tokens, q.output_tokens,
                                    loaded_tokens=q.prompt_tokens - 1))
    dec_runs, dec_of = [], {}
    for mine in dec_reqs:
        res = simulate(mine, decode.coster, decode.cfg) if mine else None
        dec_runs.append(res)
        for r in (res.requests if res else ()):
            dec_of[r.id] = r
    out: list[RequestResult] = []
    for q in reqs:
        p = pre_of[q.id]
        r = RequestResult(q.id, q.arrival_s, q.prompt_tokens, q.output_tokens,
                          preemptions=p.preemptions, cached_tokens=p.cached_tokens)
        d = dec_of.get(q.id)
        if p.failed:
            r.failed = f"prefill instance: {p.failed}"
        elif d.failed:
            r.failed = f"decode instance: {d.failed}"
            r.preemptions += d.preemptions
        else:
            r.first_token_s, r.finish_s = d.first_token_s, d.finish_s
            r.preemptions += d.preemptions
        out.append(r)
    served = [r for r in out if not r.failed]
    end = max((r.finish_s for r in served), default=0.0)
    ids = [r.id for r in served]
    return DisaggResult(
        out, end, [x for x in pre_runs if x is not None], [x for x in dec_runs if x is not None],
        link, transfer_bytes=[moved[i][0] for i in ids], transfer_s=[moved[i][1] for i in ids],
        link_wait_s=[moved[i][2] for i in ids],
        prefill_done_s=[pre_of[i].first_token_s - pre_of[i].arrival_s for i in ids],
        link_busy_s=max(p_busy + d_busy))


def pool_figures(runs: list[SimResult], duration_s: float) -> dict:
    """A pool's use over the run: the share of the run its instances spent in steps (mean
    and busiest), their running requests and KV cache, their preemptions."""
    if not runs or not duration_s > 0:
        return {}
    busy = [r.busy_s / duration_s for r in runs]
    cap = sum(r.kv_capacity_tokens for r in runs)
    return {"busy_frac_mean": sum(busy) / len(busy), "busy_frac_max": max(busy),
            "mean_running_requests": sum(r.running_integral for r in runs) / duration_s,
            "kv_capacity_tokens": cap,
            "kv_cache_used_frac_mean": sum(r.kv_held_integral for r in runs) / duration_s / cap,
            "kv_cache_used_frac_peak": max(r.peak_kv_held_tokens / r.kv_capacity_tokens
                                           for r in runs),
            # blocks reserved: a prefill instance's prompts hold theirs for one step each
            "kv_cache_reserved_frac_peak": max(r.peak_kv_reserved_tokens / r.kv_capacity_tokens
                                               for r in runs),
            "preemptions": sum(r.preemptions for r in runs), "steps": sum(r.steps for r in runs)}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def transfer_figures(res: DisaggResult) -> dict:
    """The KV transfers: bytes, the link, the bandwidth the run used and how busy the
    busiest link was."""
    from planner.core.arith import quantile

    dur = res.duration_s
    total = sum(res.transfer_bytes)
    ts = res.transfer_s
    return {"link": res.link.kind, "link_bytes_per_s": res.link.bytes_per_s,
            "link_latency_s": res.link.latency_s, "gpu_pairs": res.link.gpu_pairs,
            "bytes_per_request_mean": _mean(res.transfer_bytes),
            "total_bytes": total,
            "bandwidth_used_bytes_per_s": total / dur if dur > 0 else None,
            "link_busy_frac_max": res.link_busy_s / dur if dur > 0 else None,
            "mean_transfer_s": _mean(ts), "p90_transfer_s": quantile(ts, 0.9) if ts else None,
            "mean_link_wait_s": _mean(res.link_wait_s)}
