"""`llmplan plan`'s disaggregated layouts: P prefill instances and D decode instances (xPyD),
each side with its own TP and weight precision, the cheapest that meet the targets.

Each side is sized on its own first, by simulating it alone (``planner.serving.sim``):
- a decode instance takes its share of the rate, each request arriving with its prompt's KV
  (all but the last token computed: ``Request.loaded_tokens``); the fewest D whose
  percentile TPOT meets the target, and the decode side's share of TTFT (from arrival to the
  first token) at that D;
- a prefill instance takes its share of the rate, each request with one output token; the
  fewest P whose percentile time to the prompt's end meets the TTFT target less the decode
  side's share and the KV transfer (bytes / the link's rate).
Both sides are searched as ``planner.search.plan.replicas_needed`` searches replicas:
from the analytic bound (no fewer instances can serve the rate), doubling then bisecting.
Then the pair is simulated whole (``planner.serving.disagg``, the instances in turn, the KV
over the link between them) and grown, prefill or decode by the target it misses, until it
meets both: the figures a row shows are the whole simulation's.

Pairs are tried in order of a lower bound on their cost (each side's analytic bound), and the
search stops once the next bound is above the ``top``-th cost found. Both pools are of one GPU
type and one KV precision (the KV crosses as it is). Imports pandas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.core.errors import UsageError
from planner.core.specs import DType, Options, Precision
from planner.layouts.deployment import Deployment, Layout
from planner.search.sweep import grid_precision


@dataclass(frozen=True)
class Side:
    """One side's candidate instance: its deployment, its scheduler, and the most requests a
    second one instance can serve (an analytic bound)."""

    dep: Deployment
    cfg: object  # planner.serving.config.SchedulerConfig
    rate_bound: float
    gpus: int
    price: float


class _Sizer:
    """The fewest instances of one side that meet a test: its runs at each count cached
    (``planner.search.plan.CountRuns``: the run's first requests, then its steady state), so
    one side's runs serve every threshold asked of it."""

    def __init__(self, side: Side, make, settings, rate: float, max_factor: int = 64,
                 cache=None):
        from planner.search.plan import CountRuns, sizing_coster
        from planner.serving import run

        self.side, self.max_factor = side, max_factor
        # as predicted; ``cache``: the search's shared operators (``CostCache``)
        self.nominal = run.coster(side.dep, cache)
        self.coster = sizing_coster(self.nominal, settings)  # as sized
        self.runs = CountRuns(lambda n, p99_ms: make(rate / n, p99_ms), self._simulated,
                              settings.num_requests, rate=rate, rate_bound=side.rate_bound,
                              max_num_seqs=side.cfg.max_num_seqs)
        self.floor = max(1, math.ceil(rate / side.rate_bound))  # fewer cannot serve it

    def _simulated(self, reqs: list, window) -> dict:
        from planner.serving.metrics import summary
        from planner.serving.sim import simulate

        return summary(simulate(reqs, self.coster, self.side.cfg), itl=False, window=window)

    def summary(self, n: int) -> dict:
        """The steady state at ``n`` instances, over the targets' window (``settled``)."""
        return self.runs.settled(n)

    def fewest(self, ok) -> int:
        """The fewest instances whose runs pass ``ok(summary)`` (0: none within
        ``max_factor`` times the analytic bound)."""
        return self.runs.fewest(ok, self.floor, self.max_factor)


def _served(s: dict) -> bool:
    """Every request served, and, over a steady-state window, finished as fast as they
    arrived (``keeps_up``, as ``plan`` holds a replica to): a side or pair whose queue grows
    through the window does not pass, however long the window (``steady_lifetime_s``)."""
    from planner.serving.metrics import keeps_up

    return s["completed"] > 0 and not s.get("failed") and keeps_up(s) is not False


def search_disaggregated(model, gpus, *, prompt_tokens: int, output_tokens: int, targets,
                         tps=(1, 2, 4, 8), weights=(DType.bf16, DType.fp8),
                         kv_cache=(None, DType.fp8), options: Options | None = None,
                         calibration=None, price_usd_per_gpu_hour: float | None = None,
                         engine=None, settings=None, top: int = 10,
                         compute: DType | None = None, quantized_layers: str = "all",
                         max_adjust: int = 6, screened=None, advance=None, prefetch=None,
                         auto_dtype: bool = False, released: bool = False):
    """Rows in the shape ``search_continuous`` returns (``disaggregated`` True, the layout's
    ``prefill_*`` / ``decode_*`` and ``kv_transfer_*`` fields), the cheapest first.
    ``screened``: ``planner.search.plan.screen``'s rows, when the caller has them.
    ``prefetch``: pairs sized beforehand, side by side, with the same rows
    (``planner.search.plan.cut_in_order``; each forked worker keeps its own cache of each
    side's runs)."""
    import pandas as pd

    from planner.search.plan import (
        SimSettings,
        cut_in_order,
        filled,
        light,
        percentile_name,
        percentile_s,
        request_lifetime_s,
        screen,
        sized_at_fields,
        sizing_requests,
        steady_fields,
        steady_lifetime_s,
    )
    from planner.serving import run
    from planner.serving.cost import CostCache
    from planner.serving.disagg import transfer_figures
    from planner.serving.metrics import summary
    from planner.serving.traffic import Request, synthetic

    o = options or Options()
    st = settings or SimSettings()
    p_ = st.percentile
    df = screened if screened is not None else screen(
        model, gpus, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
        targets=targets, tps=tps, weights=weights, kv_cache=kv_cache, options=o,
        calibration=calibration, price_usd_per_gpu_hour=price_usd_per_gpu_hour,
        engine=engine, compute=compute, quantized_layers=quantized_layers,
        auto_dtype=auto_dtype, released=released)
    df = df[df["supported"].astype(bool) & df["priced"] & (df["pp"] == 1) & (df["ep"] == 1)]
    keys = ["gpu", "tp", "weights", "kv_cache"]
    groups: dict[tuple, list[dict]] = {}
    for r in df[keys + ["batch", "fits", "ttft_s", "tpot_s", "num_gpus",
                        "price_usd_per_gpu_hour"]].to_dict("records"):
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    by_name = {h.name: h for h in gpus}

    def deployment(gpu, tp, w, kv, chunk: int | None = None) -> Deployment:
        prec_kv = None if kv == Precision.of(w, compute=compute).kv_cache.value else DType(kv)
        # the pools hand KV over a connector: vLLM 0.34 sizes the cache as before it there
        eng = engine if engine is None else engine.without_measured_kv()
        return Deployment.build(model, by_name[gpu], engine=eng, precision=grid_precision(
            model, w, prec_kv, compute=compute, quantized_layers=quantized_layers,
            auto=auto_dtype, released=released),
            layout=Layout(tp), options=o.model_copy(update={"prefill_chunk_tokens": chunk})
            if chunk else o, calibration=calibration)

    prefill: dict[tuple, list[Side]] = {}  # (gpu, kv) -> sides
    decode: dict[tuple, list[Side]] = {}
    for (gpu, tp, w, kv), g in groups.items():
        one = next((r for r in g if r["batch"] == 1), None)
        if one is None or not bool(one["fits"]):
            continue
        try:
            dep = deployment(gpu, tp, w, kv)
        except UsageError:
            continue
        cfg = run.scheduler(dep, mode=st.performance_mode,
                            max_model_len=model.max_position_embeddings)
        dep = dep.with_options(prefill_chunk_tokens=cfg.max_num_batched_tokens)
        # the screen sized the layout as one replica's engine does; a pool's KV cache may be
        # smaller (sized without the measured basis: ``deployment``), down to none
        if run.coster(dep).kv_capacity_tokens(cfg.max_num_seqs,
                                              cfg.max_num_batched_tokens) < cfg.block_size:
            continue
        price, n = float(one["price_usd_per_gpu_hour"]), int(one["num_gpus"])
        fit = [r for r in g if bool(r["fits"]) and r["ttft_s"] == r["ttft_s"]]
        # prefill: a prompt costs at least its share of the best batched prefill
        if float(one["ttft_s"]) <= targets.ttft_s:
            per = min(float(r["ttft_s"]) / r["batch"] for r in fit)
            prefill.setdefault((gpu, kv), []).append(Side(dep, cfg, 1 / per, n, price))
        # decode: a request costs at least its share of a batched step within the target
        ok = [float(r["tpot_s"]) / r["batch"] for r in fit
              if float(r["tpot_s"]) <= targets.tpot_s]
        if float(one["tpot_s"]) <= targets.tpot_s and ok:
            decode.setdefault((gpu, kv), []).append(
                Side(dep, cfg, 1 / (min(ok) * output_tokens), n, price))
    rate = targets.requests_per_s

    def stream(r: float, out: int, loaded: bool,
               p99_ms: float | None = None) -> tuple[list, tuple[float, float] | None]:
        """The requests one side (or the pair) is simulated with at ``r`` a second, and the
        arrival window of its steady state whose requests are measured (``sizing_requests``:
        a prefill instance's requests live one TTFT at the target; ``p99_ms``: the p99
        end-to-end latency of the run's first requests simulated alone, whose lifetime bounds
        it where shorter, ``steady_lifetime_s``)."""
        life = steady_lifetime_s(targets.ttft_s if out == 1 else
                                 request_lifetime_s(targets, out), p99_ms)
        count, window = sizing_requests(r, life, st)
        reqs = synthetic(count, prompt_tokens=prompt_tokens, output_tokens=out,
                         range_ratio=st.range_ratio, request_rate=r, seed=st.seed)
        if not loaded:
            return reqs, window
        return [Request(q.id, q.arrival_s, q.prompt_tokens, q.output_tokens,
                        loaded_tokens=q.prompt_tokens - 1) for q in reqs], window

    sizers: dict[int, _Sizer] = {}
    shared = CostCache()  # the sides' step operators, built once for each shape

    def sizer(side: Side, pre: bool) -> _Sizer:
        key = id(side)
        if key not in sizers:
            sizers[key] = _Sizer(side, (lambda r, e: stream(r, 1, False, e)) if pre else
                                 (lambda r, e: stream(r, output_tokens, True, e)), st, rate,
                                 cache=shared)
        return sizers[key]

    pairs = []
    for key, pres in prefill.items():
        for d in decode.get(key, ()):
            for p in pres:
                lb = (math.ceil(rate / p.rate_bound) * p.gpus * p.price
                      + math.ceil(rate / d.rate_bound) * d.gpus * d.price)
                pairs.append((lb, p, d))
    pairs.sort(key=lambda x: x[0])

    def size(i: int) -> dict | None:
        """Pair i sized: its plan row, or None where no counts meet the targets."""
        lb, p, d = pairs[i]
        ds = sizer(d, False)
        n_d = ds.fewest(lambda s: _served(s) and (percentile_s(s, "tpot", p_) or 0)
                        * st.tpot_factor <= targets.tpot_s)
        if not n_d:
            return None
        d_ttft = percentile_s(ds.summary(n_d), "ttft", p_) or 0.0
        try:
            link = run.kv_link(p.dep, d.dep, prefill_instances=max(1, math.ceil(
                rate / p.rate_bound)), decode_instances=n_d)
        except UsageError:
            return None  # no link stated between them
        wire = link.transfer_s(prompt_tokens * _kv_bytes(d.dep))
        budget = targets.ttft_s / st.ttft_factor - d_ttft - wire
        if budget <= 0:
            return None
        ps = sizer(p, True)
        n_p = ps.fewest(lambda s, b=budget: _served(s) and
                        (percentile_s(s, "ttft", p_) or math.inf) <= b)
        if not n_p:
            return None
        # the pair simulated whole, grown by the side whose target it misses; a request lives
        # through both sides, so where both are loaded lightly and neither side's run filled,
        # its lifetime is bounded by the sum of what each side's first requests showed; and
        # where an instance of the pair filled nonetheless, it is simulated again over the
        # targets' window (``planner.search.plan.CountRuns``: a shorter window is noisier
        # near capacity)
        o_p, o_d = ps.runs.observed_p99_ms(n_p), ds.runs.observed_p99_ms(n_d)
        both = o_p + o_d if o_p and o_d and light(rate / n_p, p.rate_bound) \
            and light(rate / n_d, d.rate_bound) \
            and not filled(ps.summary(n_p), p.cfg.max_num_seqs) \
            and not filled(ds.summary(n_d), d.cfg.max_num_seqs) else None
        streams = [stream(rate, output_tokens, False, both)]

        def pair(n_p: int, n_d: int, pre, dec, reqs, window, p=p, d=d):
            """The pair at these counts on these costers: (result, link, summary, the
            percentile's TTFT and TPOT)."""
            link = run.kv_link(p.dep, d.dep, prefill_instances=n_p, decode_instances=n_d)
            res = run.run_disaggregated(p.dep, d.dep, reqs, prefill_instances=n_p,
                                        decode_instances=n_d, prefill_cfg=p.cfg,
                                        decode_cfg=d.cfg, link=link,
                                        prefill_coster=pre, decode_coster=dec)
            s = summary(res.combined(), itl=False, window=window)
            return res, link, s, percentile_s(s, "ttft", p_), \
                percentile_s(s, "tpot", p_) or 0.0

        adjust = max_adjust - 1  # pair runs that grow a side, after each stream's first
        for reqs, window in streams:
            while True:
                res, link, s, ttft, tpot = pair(n_p, n_d, ps.coster, ds.coster, reqs, window)
                ttft_ok = _served(s) and ttft is not None and ttft * st.ttft_factor <= \
                    targets.ttft_s
                tpot_ok = _served(s) and tpot * st.tpot_factor <= targets.tpot_s
                if ttft_ok and tpot_ok:
                    break
                if adjust <= 0:
                    return None
                adjust -= 1
                if not tpot_ok:
                    n_d += 1
                if not ttft_ok:
                    n_p += 1
            if len(streams) == 1 and _pair_filled(res, p.cfg, d.cfg):
                full = stream(rate, output_tokens, False, None)
                if (len(full[0]), full[1]) != (len(reqs), window):
                    streams.append(full)
        high = s
        if not st.sizes_at_prediction:  # the figures shown are the predicted server's
            res, link, s, ttft, tpot = pair(n_p, n_d, ps.nominal, ds.nominal, reqs, window)
        usd = n_p * p.gpus * p.price + n_d * d.gpus * d.price
        x = transfer_figures(res)
        name = percentile_name(p_)
        pd_, dd = p.dep, d.dep
        return {
            "gpu": pd_.hardware.name, "tp": dd.tp, "pp": 1, "ep": 1,
            "num_gpus": p.gpus + d.gpus, "weights": _w(pd_, dd),
            "quantized_layers": quantized_layers, "kv_cache": dd.precision.kv_cache.value,
            "engine": dd.engine.name, "engine_release": dd.engine.release,
            "kv_cache_memory_bytes": o.kv_cache_memory_bytes,
            "kv_cache_max_tokens": o.kv_cache_max_tokens,
            "scheduler": "continuous", "disaggregated": True,
            "prefill_instances": n_p, "prefill_tp": pd_.tp,
            "prefill_weights": pd_.precision.weights.value,
            "decode_instances": n_d, "decode_tp": dd.tp,
            "decode_weights": dd.precision.weights.value,
            "kv_link": x["link"], "kv_transfer_mean_s": x["mean_transfer_s"],
            "kv_bandwidth_used_bytes_per_s": x["bandwidth_used_bytes_per_s"],
            "rate_per_replica": rate / n_d, "percentile": p_,
            f"{name}_ttft_s": ttft, f"{name}_tpot_s": tpot,
            **sized_at_fields({**s, "sized_at": high}, st, name),
            "latency_s": s[f"{name}_e2el_ms"] / 1e3, **steady_fields(s),
            "mean_running_requests": s["mean_running_requests"],
            "max_running_requests": s["max_running_requests"],
            "batch": d.cfg.max_num_seqs, "meets_targets": True,
            "replicas": n_p + n_d, "total_gpus": n_p * p.gpus + n_d * d.gpus,
            "price_usd_per_gpu_hour": d.price, "usd_per_hour": usd,
            "cost_usd_per_million_output_tokens_at_traffic":
                usd / (rate * output_tokens * 3600) * 1e6,
            "lower_bound_usd_per_hour": lb}

    def started(i: int) -> None:
        if advance is not None:  # progress: one pair more being sized
            _, p, d = pairs[i]
            advance(f"{p.dep.hardware.name} P TP{p.dep.tp} / D TP{d.dep.tp}")

    rows = cut_in_order([x[0] for x in pairs], size, top, started=started, prefetch=prefetch)
    out = pd.DataFrame(rows)
    if len(out):
        out = out.sort_values(["usd_per_hour", "total_gpus"]).reset_index(drop=True)
    return out


def _pair_filled(res, prefill_cfg, decode_cfg) -> bool:
    """Whether any instance of a disaggregated run filled, each on its own
    (``planner.search.plan.filled_at``: the pair's summary sums its decode instances and
    leaves its prefill instances' batches out)."""
    from planner.search.plan import filled_at

    return any(filled_at(r.preemptions, r.peak_kv_reserved_tokens / r.kv_capacity_tokens
                         if r.kv_capacity_tokens else math.inf, r.max_running,
                         cfg.max_num_seqs)
               for rs, cfg in ((res.prefill, prefill_cfg), (res.decode, decode_cfg))
               for r in rs)


def _kv_bytes(dep: Deployment) -> float:
    from planner.core.memory import kv_cache_bytes_per_token

    return kv_cache_bytes_per_token(dep.model, dep.precision)


def _w(p: Deployment, d: Deployment) -> str:
    a, b = p.precision.weights.value, d.precision.weights.value
    return a if a == b else f"{a}/{b}"


def pd_label(r) -> str:
    """"6P1D TP1/2": a disaggregated row's layout in the xPyD notation (6 prefill and 1 decode
    instances), then the prefill and decode instances' TP (a row of
    ``search_disaggregated``)."""
    return f"{int(r['prefill_instances'])}P{int(r['decode_instances'])}D " \
        f"TP{int(r['prefill_tp'])}/{int(r['decode_tp'])}"
