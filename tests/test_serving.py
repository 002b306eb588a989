"""The serving simulator: its step cost is the estimate's, and the properties a fleet sizer
relies on hold."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.errors import UsageError
from planner.core.estimate import estimate, prepare
from planner.core.ops import StepShape, decode_ops, prefill_ops
from planner.core.roofline import step_time
from planner.core.specs import Options, Parallelism, Precision, Workload
from planner.io import catalog
from planner.serving.cost import CostCache, StepCoster, host_s, idle_coster
from planner.serving.costers import layout_coster
from planner.serving.metrics import summary, weighted_quantile
from planner.serving.sim import SchedulerConfig, simulate
from planner.serving.traffic import replay, synthetic

OPTS = Options()


@pytest.fixture(scope="module")
def setup():
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("vllm")
    prep = prepare(hw, Precision(), None, OPTS, eng)
    return m, hw, eng, prep, StepCoster(m, hw, prep, OPTS)


@pytest.mark.parametrize("engine", ["ideal", "vllm", "hf-eager", "trtllm"])
@pytest.mark.parametrize("batch,ctx", [(1, 1), (7, 300), (64, 2048)])
def test_step_cost_is_the_estimates(engine, batch, ctx):
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("a100-sxm-80gb")
    prep = prepare(hw, Precision(), None, OPTS, catalog.load_engine(engine))
    eng = prep.engine  # resolved for the A100: its scheduler defaults, its factors on Ampere
    c = StepCoster(m, hw, prep, OPTS)
    dec = step_time(decode_ops(m, prep.precision, batch=batch, context_tokens=ctx,
                               lm_head_sharded=eng.lm_head_sharded), prep.ceilings,
                    options=OPTS, engine=eng, graphed=eng.cuda_graphs,
                    fixed_s=eng.step_overhead_s + eng.per_sequence_overhead_s * batch).time_s
    got = c.step_time(StepShape.uniform(batch, 1, ctx - 1), sequences=batch, prefill=False)
    assert got == pytest.approx(dec, rel=1e-9)
    pre = step_time(prefill_ops(m, prep.precision, batch=1, prompt_tokens=ctx,
                                lm_head_sharded=eng.lm_head_sharded), prep.ceilings,
                    options=OPTS, engine=eng, graphed=False,
                    fixed_s=eng.prefill_step_overhead_s + eng.per_sequence_overhead_s).time_s
    shape = StepShape.uniform(1, ctx, 0)
    got = c.step_time(shape, sequences=1, prefill=True, decodes=False)
    if eng.overlaps_host():
        # async scheduling: a served prefill's host work runs beside the step before it, the
        # host launching this one's kernels first; an idle engine's (nothing before it) is the
        # estimate's
        host = host_s(eng, 1, prefill=True, decodes=False)
        assert c.launch_s > 0
        assert got == pytest.approx(max(c.gpu_s(shape, prefill=True), c.launch_s + host),
                                    rel=1e-9)
        assert got < pre
        c = idle_coster(c)
        got = c.step_time(shape, sequences=1, prefill=True, decodes=False)
    assert got == pytest.approx(pre, rel=1e-9)


def test_costers_sharing_a_cache_time_steps_as_fresh_ones():
    """A fit builds a coster per engine profile tried, all on one CostCache: each must give
    the times a fresh coster gives, bit for bit, whichever profile filled the cache first
    (host costs alone differing, efficiencies differing, a concatenating cache, pipeline
    stages)."""
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    vllm = catalog.load_engine_spec("vllm")
    from planner.evidence.fit import set_params

    specs = [vllm, set_params(vllm, {"step_overhead_us": 1500.0}),
             set_params(vllm, {"gemm_bandwidth_frac": 0.7, "gemm_compute_frac": 0.6}),
             catalog.load_engine_spec("hf-eager"), vllm]
    shapes = [(StepShape.uniform(b, 1, ctx - 1), b, False) for b, ctx in ((1, 9), (37, 900))]
    shapes += [(StepShape.uniform(1, 700, 0), 1, True), (StepShape.uniform(3, 100, 20), 3, True)]
    reqs = synthetic(30, prompt_tokens=600, output_tokens=40, request_rate=20.0, seed=1)
    for pp in (1, 2):
        cache = CostCache()
        for spec in specs:
            prep = prepare(hw, Precision(), None, OPTS, spec.model())
            shared = layout_coster(m, hw, prep, OPTS, pp=pp, cache=cache)
            fresh = layout_coster(m, hw, prep, OPTS, pp=pp)
            for shape, n, prefill in shapes:
                kw = dict(sequences=n, prefill=prefill)
                assert shared.step_time(shape, **kw) == fresh.step_time(shape, **kw)
            cfg = SchedulerConfig.for_engine(prep.engine)
            assert summary(simulate(reqs, shared, cfg)) == summary(simulate(reqs, fresh, cfg))


def test_costers_on_other_gpus_share_a_caches_operators_not_its_times():
    """A plan's candidates share one CostCache across GPUs: the operators of a step shape
    (the model's, precision's and TP's) are built once for all, while each GPU's times are
    its own; each coster times steps as a fresh one does, bit for bit, in any order, and a
    GPU met again after another finds its times kept (validate's runs alternate GPUs: its
    replay took 80 s where it takes 54 with them kept)."""
    m = catalog.load_model("llama-3.1-8b")
    eng = catalog.load_engine("vllm")
    shapes = [(StepShape.uniform(b, 1, ctx - 1), b, False) for b, ctx in ((1, 9), (37, 900))]
    shapes += [(StepShape.uniform(1, 700, 0), 1, True), (StepShape.uniform(3, 100, 20), 3, True)]
    cache = CostCache()
    costers = []
    for gpu in ("h100-sxm", "a100-sxm-80gb", "l40s", "h100-sxm"):
        hw = catalog.load_hardware(gpu)
        prep = prepare(hw, Precision(), None, OPTS, eng)
        shared = StepCoster(m, hw, prep, OPTS, tp=2, cache=cache)
        fresh = StepCoster(m, hw, prep, OPTS, tp=2)
        for shape, n, prefill in shapes:
            kw = dict(sequences=n, prefill=prefill)
            assert shared.step_time(shape, **kw) == fresh.step_time(shape, **kw)
        costers.append(shared)
    assert all(c._linear_ops is costers[0]._linear_ops for c in costers)  # built once
    assert costers[1]._linear is not costers[0]._linear  # another GPU's times
    assert costers[1].linear_s(700, False) != costers[0].linear_s(700, False)
    assert costers[3]._linear is costers[0]._linear  # the H100's again, after the L40S's
    assert len(cache._ops) == 1


def test_low_rate_sees_the_single_request_estimate(setup):
    m, hw, eng, prep, c = setup
    reqs = synthetic(40, prompt_tokens=1024, output_tokens=128, request_rate=0.05, seed=3)
    s = summary(simulate(reqs, c, SchedulerConfig()))
    e = estimate(m, hw, engine=eng, workload=Workload(batch=1, prompt_tokens=1024,
                                                      output_tokens=128))
    # the served TTFT adds the request path outside the engine's steps (API server, tokenizer)
    path_s = c.engine.request_path_s(1024)
    assert s["median_ttft_ms"] == pytest.approx((e.ttft_s + path_s) * 1e3, rel=1e-6)
    # TPOT: the mean decode step over the output, which estimate takes at its mean context
    assert s["median_tpot_ms"] == pytest.approx(e.tpot_s * 1e3, rel=1e-4)
    assert s["max_running_requests"] <= 2


def test_throughput_rises_then_saturates(setup):
    *_, c = setup
    thr = []
    for rate in (1.0, 4.0, 64.0, math.inf):
        reqs = synthetic(600, prompt_tokens=512, output_tokens=128, request_rate=rate, seed=1)
        thr.append(summary(simulate(reqs, c, SchedulerConfig()))["request_throughput"])
    assert thr[0] < thr[1] < thr[2]
    assert thr[0] == pytest.approx(1.0, rel=0.15) and thr[1] == pytest.approx(4.0, rel=0.15)
    assert thr[3] == pytest.approx(thr[2], rel=0.1)  # saturated


def test_requests_are_conserved_and_ordered_in_time(setup):
    *_, c = setup
    reqs = synthetic(300, prompt_tokens=700, output_tokens=90, range_ratio=0.8,
                     request_rate=30, burstiness=0.5, seed=7)
    res = simulate(reqs, c, SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=1024))
    s = summary(res)
    assert s["completed"] + s["in_flight"] == s["arrived"] == 300 and s["in_flight"] == 0
    for r in res.requests:
        assert r.arrival_s <= r.first_token_s <= r.finish_s
    assert s["max_running_requests"] <= 32
    assert s["total_output_tokens"] == sum(q.output_tokens for q in reqs)


def test_continuous_beats_static_with_varied_lengths(setup):
    *_, c = setup
    reqs = synthetic(800, prompt_tokens=512, output_tokens=256, range_ratio=0.9, seed=2)
    cont = summary(simulate(reqs, c, SchedulerConfig(max_num_seqs=64)))
    stat = summary(simulate(reqs, c, SchedulerConfig(kind="static", max_num_seqs=64)))
    assert cont["request_throughput"] > 1.2 * stat["request_throughput"]
    assert stat["completed"] == cont["completed"] == 800


def test_paged_admits_more_than_contiguous(setup):
    m, hw, eng, prep, c = setup
    reqs = synthetic(600, prompt_tokens=256, output_tokens=64, seed=4)
    cfg = dict(max_num_seqs=1024, max_num_batched_tokens=16384, max_model_len=32768)
    paged = summary(simulate(reqs, c, SchedulerConfig(**cfg)))
    contig = summary(simulate(reqs, c, SchedulerConfig(kv_layout="contiguous", **cfg)))
    cap = paged["kv_capacity_tokens"]
    assert contig["max_running_requests"] == cap // 32768  # whole reservations fit
    assert paged["max_running_requests"] >= 3 * contig["max_running_requests"]
    assert contig["kv_cache_used_frac_peak"] < 0.1 < contig["kv_cache_reserved_frac_peak"]


def test_preemption_when_the_cache_runs_out(setup):
    m, hw, eng, _, _ = setup
    tight = Options(memory_utilization_frac=0.25)
    prep = prepare(hw, Precision(), None, tight, eng)
    c = StepCoster(m, hw, prep, tight)
    reqs = synthetic(400, prompt_tokens=1024, output_tokens=1024, range_ratio=0.5, seed=5)
    res = simulate(reqs, c, SchedulerConfig())
    s = summary(res)
    assert s["preemptions"] > 0 and s["completed"] == 400
    assert s["kv_cache_reserved_frac_peak"] <= 1.0
    assert sum(r.preemptions for r in res.requests) == s["preemptions"]


def test_closed_loop_keeps_its_clients(setup):
    *_, c = setup
    reqs = synthetic(200, prompt_tokens=256, output_tokens=64, closed_loop=True, seed=6)
    s = summary(simulate(reqs, c, SchedulerConfig(max_concurrency=8)))
    assert s["max_running_requests"] == 8 and s["completed"] == 200


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 60), st.integers(1, 3000), st.integers(1, 400),
       st.floats(0.0, 0.9), st.sampled_from([0.5, 5.0, math.inf]),
       st.sampled_from(["continuous", "static", "dynamic"]),
       st.sampled_from(["paged", "contiguous"]),
       st.integers(1, 64), st.booleans())
def test_any_stream_completes(n, p, o, ratio, rate, kind, layout, seqs, chunked):
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("vllm")
    prep = prepare(hw, Precision(), None, OPTS, eng)
    c = StepCoster(m, hw, prep, OPTS)
    reqs = synthetic(n, prompt_tokens=p, output_tokens=o, range_ratio=ratio,
                     request_rate=rate, seed=n)
    cfg = SchedulerConfig(kind=kind, kv_layout=layout, max_num_seqs=seqs,
                          max_num_batched_tokens=4096, chunked_prefill=chunked,
                          max_model_len=8192, max_wait_s=0.2 if kind == "dynamic" else 0.0)
    res = simulate(reqs, c, cfg)
    s = summary(res)
    # a prompt beyond the budget with chunking off is refused, as the engine would (and
    # only then), and the run goes on with the rest
    too_long = sum(q.prompt_tokens > 4096 for q in reqs) if (
        not chunked and kind == "continuous") else 0
    assert s["failed"] == too_long
    assert s["completed"] == n - too_long and s["in_flight"] == 0
    assert s["max_running_requests"] <= seqs
    for r in res.requests:
        if r.failed:
            assert "max-num-batched-tokens (4,096)" in r.failed and math.isnan(r.finish_s)
        else:
            assert r.arrival_s <= r.first_token_s <= r.finish_s


def test_traffic_follows_vllm():
    reqs = synthetic(20000, prompt_tokens=1000, output_tokens=100, range_ratio=0.5,
                     request_rate=50.0, burstiness=1.0, seed=0)
    assert reqs[0].arrival_s == 0.0
    assert reqs[-1].arrival_s / 19999 == pytest.approx(1 / 50, rel=0.03)  # mean gap
    ps = [q.prompt_tokens for q in reqs]
    assert min(ps) == 500 and max(ps) == 1500
    assert [q.arrival_s for q in synthetic(5, prompt_tokens=1, output_tokens=1)] == [0.0] * 5
    rows = replay([(10, 5, 2.0), (20, 5, 0.0), (30, 5, 1.0)])
    assert [r.prompt_tokens for r in rows] == [20, 30, 10] and rows[0].arrival_s == 0.0


def test_a_trace_without_arrival_times_arrives_at_the_request_rate():
    """Rows without arrival_s arrive as vLLM's client would send them at --request-rate:
    the same gaps synthetic() draws, in the trace's order; every one at t = 0 only at an
    infinite rate; a trace that times some rows and not others is refused."""
    rows = [(100 + i, 10, None) for i in range(2000)]
    paced = replay(rows, request_rate=4.0, seed=7)
    ref = synthetic(2000, prompt_tokens=1, output_tokens=1, request_rate=4.0, seed=7)
    assert [r.arrival_s for r in paced] == [r.arrival_s for r in ref]
    assert [r.prompt_tokens for r in paced] == [100 + i for i in range(2000)]
    assert paced[-1].arrival_s / 1999 == pytest.approx(0.25, rel=0.06)  # mean gap 1 / rate
    assert {r.arrival_s for r in replay(rows[:5])} == {0.0}
    with pytest.raises(UsageError, match="some rows and not on others"):
        replay([(10, 5, 1.0), (20, 5, None)])


def test_weighted_quantile():
    pairs = [(1.0, 3), (2.0, 1), (10.0, 1)]  # 1, 1, 1, 2, 10
    assert weighted_quantile(pairs, 0.5) == 1.0
    assert weighted_quantile(pairs, 0.75) == 2.0
    assert weighted_quantile(pairs, 1.0) == 10.0


def test_simulate_cli(run_cli, tmp_path):
    trace = tmp_path / "t.csv"
    code, out, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "50",
                             "--request-rate", "5", "--ttft-slo", "0.5", "--tpot-slo",
                             "0.05", "--trace", str(trace), "--json")
    assert code == 0, err
    d = json.loads(out)
    for k in ("completed", "duration", "request_throughput", "output_throughput",
              "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
              "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "mean_e2el_ms", "p99_e2el_ms",
              "p90_ttft_ms", "request_goodput", "max_running_requests",
              "kv_cache_used_frac_mean", "preemptions"):
        assert k in d, k
    assert d["completed"] == 50 and d["request_rate"] == 5
    assert trace.read_text().count("\n") == 51
    code, out, _ = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "20",
                           "--json")
    assert json.loads(out)["request_rate"] == "inf"


def test_simulate_replays_a_trace(run_cli, tmp_path):
    ds = tmp_path / "d.jsonl"
    ds.write_text('{"prompt_tokens": 100, "output_tokens": 10, "arrival_s": 0.5}\n'
                  '{"prompt_tokens": 200, "output_tokens": 20, "arrival_s": 0.0}\n')
    code, out, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                             "--dataset", str(ds), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["completed"] == 2 and d["total_input_tokens"] == 300
    # without arrival times, the trace is sent at --request-rate (here 0.5 req/s: 40
    # requests take about 80 s, where all at once they would take a few seconds)
    ds.write_text("".join('{"prompt_tokens": 100, "output_tokens": 10}\n'
                          for _ in range(40)))
    code, out, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                             "--dataset", str(ds), "--request-rate", "0.5", "--json")
    assert code == 0, err
    assert json.loads(out)["duration"] > 40


@pytest.mark.parametrize("args,msg", [
    (["--request-rate", "nan"], "--request-rate"),
    (["--request-rate", "-1"], "--request-rate"),
    (["--burstiness", "inf"], "--burstiness"),
    (["--range-ratio", "1.5"], "--range-ratio"),
    (["-n", "0"], "--num-requests"),
    (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"], "max-num-batched-tokens"),
    (["--dataset", "/nonexistent.jsonl"], "cannot read"),
    (["--trace", "/nonexistent-dir/t.csv"], "does not exist"),
    (["--ttft-slo", "0"], "--ttft-slo"),
    (["-p", "500000"], "exceeds llama-3.1-8b's context of 131,072"),
    (["-p", "600000", "--allow-longer-context"], "KV tokens"),
    (["--prefix-tokens", "-5"], "--prefix-tokens"),
    (["--prefix-cache", "maybe"], "--prefix-cache: must be on or off"),
    (["--capacity-policy", "fifo"], "capacity-policy"),
    (["--prefix-tokens", "10", "--dataset-name", "sharegpt"], "only with the random"),
    (["--measure-window", "5"], "--measure-window: expected FROM,TO"),
    (["--measure-window", "10,5"], "--measure-window: expected 0 <= FROM < TO"),
    (["--measure-window", "nan,5"], "--measure-window: expected 0 <= FROM < TO"),
])
def test_simulate_bad_input(run_cli, args, msg):
    code, _, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "5",
                           *args)
    assert code == 2 and msg in err, err


def test_simulate_a_trace_with_shared_prefixes(run_cli, tmp_path):
    """Named prefixes: 3 requests share "sys" (1,600 tokens, whole blocks), one has its own;
    sent one at a time, the second and third find it cached: 2 x 1,600 of 6,800 tokens."""
    ds = tmp_path / "p.csv"
    ds.write_text("prompt_tokens,output_tokens,arrival_s,prefix_id,prefix_tokens\n"
                  "1700,5,0,sys,1600\n1700,5,10,sys,1600\n1700,5,20,sys,1600\n"
                  "1700,5,30,,\n")
    args = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--dataset", str(ds))
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["prefix_caching"] is True  # vllm's default
    assert d["prefix_cache_hit_rate"] == pytest.approx(2 * 1600 / 6800)
    code, out, err = run_cli(*args, "--prefix-cache", "off", "--json")
    assert json.loads(out)["prefix_cache_hit_rate"] is None
    code, out, err = run_cli(*args)
    assert "47.1% of prompt tokens found cached" in out
    ds.write_text("prompt_tokens,output_tokens,prefix_id,prefix_tokens\n100,5,a,200\n")
    code, _, err = run_cli(*args)
    assert code == 2 and "row 1: prefix_tokens must be in 1..prompt_tokens (100)" in err
    ds.write_text("prompt_tokens,output_tokens,prefix_tokens\n100,5,20\n")
    code, _, err = run_cli(*args)
    assert code == 2 and "prefix_tokens without a prefix_id" in err


def test_sonnet_prompts_share_their_first_200_tokens(run_json):
    """vLLM's sonnet dataset: 550-token prompts whose first 200 are the same; 192 of them are
    whole 16-token blocks, found cached by every request after the first."""
    d = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "550", "-o", "150",
                 "--dataset-name", "sonnet", "-n", "200", "--request-rate", "5")
    assert d["total_input_tokens"] == 200 * 550
    assert d["prefix_cache_hit_rate"] == pytest.approx(199 * 192 / (200 * 550))


def test_bad_trace_rows(run_cli, tmp_path):
    for text, msg in (('{"prompt_tokens": 1}\n', "missing output_tokens"),
                      ('[1, 2]\n', "not a JSON object"),
                      ('{"prompt_tokens": -1, "output_tokens": 2}\n', "must be in 1.."),
                      ('{"prompt_tokens": 1, "output_tokens": "x"}\n', "integers")):
        ds = tmp_path / "d.jsonl"
        ds.write_text(text)
        code, _, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                               "--dataset", str(ds))
        assert code == 2 and msg in err, (text, err)


def test_tp_and_moe(setup):
    m, hw = catalog.load_model("mixtral-8x7b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("vllm")
    prep = prepare(hw, Precision(), None, OPTS, eng)
    c = StepCoster(m, hw, prep, OPTS, tp=2)
    reqs = synthetic(100, prompt_tokens=512, output_tokens=64, request_rate=0.1, seed=1)
    s = summary(simulate(reqs, c, SchedulerConfig()))
    e = estimate(m, hw, engine=eng, parallelism=Parallelism(tp=2),
                 workload=Workload(batch=1, prompt_tokens=512, output_tokens=64))
    path_s = eng.request_path_s(512)
    assert s["median_ttft_ms"] == pytest.approx((e.ttft_s + path_s) * 1e3, rel=1e-6)


def test_estimate_reports_paged_and_contiguous_concurrency(run_json, model, gpu):
    from planner.core.memory import kv_cache_bytes_per_token

    d = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "16", "-p", "2048",
                 "-o", "256")
    kc = d["kv_concurrency"]
    # by hand: the cache's tokens over 2304 (a whole number of 64-token blocks), and over
    # the 131,072-token context a contiguous cache reserves
    assert kc["max_concurrency_paged"] == kc["kv_capacity_tokens"] // 2304
    assert kc["max_concurrency_contiguous"] == kc["kv_capacity_tokens"] // 131072
    assert kc["kv_used_frac_contiguous"] == pytest.approx((2048 + 128) / 131072)
    per_token = kv_cache_bytes_per_token(model("llama-3.1-8b"), Precision())
    # vLLM 0.34: all of it less a margin of at least 1 GiB, and the 1 GiB reserve
    free = 80 * 1024**3 - 1024**3 - d["weights_bytes"] - 1024**3
    assert kc["kv_capacity_tokens"] * per_token <= free
    assert kc["max_concurrency_paged"] >= 20 * kc["max_concurrency_contiguous"]


def test_simulate_plot(run_cli, tmp_path):
    png = tmp_path / "s.png"
    code, _, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "100",
                           "--request-rate", "20", "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (tmp_path / "s.csv").read_text().splitlines()
    assert rows[0] == "t_s,running,waiting,kv_reserved_tokens,kv_reserved_frac" and len(rows) > 10


def test_dynamic_batching_waits_to_fill_its_batches(setup):
    *_, c = setup
    reqs = synthetic(300, prompt_tokens=256, output_tokens=64, request_rate=40, seed=8)
    static = summary(simulate(reqs, c, SchedulerConfig(kind="static", max_num_seqs=64)))
    same = summary(simulate(reqs, c, SchedulerConfig(kind="dynamic", max_num_seqs=64)))
    assert same == static  # no wait: a static batch formed on arrival
    # a window of 1 s (some 40 arrivals at 40 req/s) fills batches that a static batch formed
    # on arrival leaves short (0.5 s is too close to the step time to show it for every profile)
    waited = simulate(reqs, c, SchedulerConfig(kind="dynamic", max_num_seqs=64,
                                               max_wait_s=1.0))
    w = summary(waited)
    assert w["completed"] == 300
    assert w["mean_running_requests"] > static["mean_running_requests"]
    # a lone request waits out the window before its prefill starts
    lone = synthetic(1, prompt_tokens=256, output_tokens=8)
    r = simulate(lone, c, SchedulerConfig(kind="dynamic", max_wait_s=0.5)).requests[0]
    idle = idle_coster(c)  # no step before it
    assert r.ttft_s == pytest.approx(0.5 + idle.step_time(StepShape.uniform(1, 256, 0),
                                                          sequences=1, prefill=True,
                                                          decodes=False)
                              + c.engine.request_path_s(256), rel=1e-9)


def test_scheduler_defaults_come_from_the_engine(run_cli):
    code, out, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "50",
                             "-p", "9000", "-o", "4", "--engine", "trtllm")
    assert code == 2 and "exceeds max-num-batched-tokens (8,192)" in err  # no chunking there
    code, out, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "50",
                             "-p", "9000", "-o", "4", "--engine", "trtllm",
                             "--chunked-prefill", "--json")
    assert code == 0, err
    code, out, _ = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "600",
                           "-p", "128", "-o", "32", "--engine", "sglang", "--json")
    assert json.loads(out)["max_running_requests"] > 256  # SGLang's 2048 (vLLM: 256 or 1024)


@pytest.mark.parametrize("model,engine,direct", [
    ("llama-3.1-8b", "vllm", True), ("deepseek-v3", "sglang", True),  # MLA: fills apart
    ("qwen3-30b-a3b", "trtllm", True), ("llama-3.1-8b", "hf-eager", False),  # concatenating
    ("gpt-oss-20b", "vllm", False)])  # sliding-window layers
@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 600), per_token=st.floats(1, 40_000), score=st.floats(0, 1e7),
       sequences=st.integers(1, 600))
def test_a_decode_step_priced_directly_is_step_time_to_the_bit(model, engine, direct, tokens,
                                                               per_token, score, sequences):
    """The simulator prices padded decode steps through ``decode_step_s``, not a StepShape:
    it must be ``step_time``'s answer exactly, and be offered only where it can be."""
    m, hw = catalog.load_model(model), catalog.load_hardware("h200")
    eng = catalog.load_engine(engine)
    prep = prepare(hw, Precision(weights="fp8") if model == "deepseek-v3" else Precision(),
                   None, OPTS, eng)
    c = StepCoster(m, hw, prep, OPTS, tp=8 if model == "deepseek-v3" else 1)
    assert c.prices_decodes_directly is direct
    if not direct:
        return
    read = tokens * per_token
    shape = StepShape(float(tokens), read - tokens / 2, read, read - tokens, score,
                      float(tokens))
    want = c.step_time(shape, sequences=sequences, prefill=False)
    assert c.decode_step_s(shape.tokens, shape.attn_pairs, shape.kv_read_tokens,
                           shape.score_elems, shape.logit_rows, sequences) == want


@pytest.mark.parametrize("model,engine,tp,time_model", [
    ("llama-3.1-8b", "vllm", 1, "roofline"), ("llama-3.1-8b", "vllm", 2, "roofline"),
    ("llama-3.1-8b", "vllm-v0", 1, "roofline"), ("llama-3.1-8b", "vllm", 1, "additive"),
    ("deepseek-v3", "sglang", 8, "roofline"), ("qwen3-30b-a3b", "trtllm", 1, "roofline")])
@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 600), per_token=st.integers(1, 40_000),
       sequences=st.integers(1, 600))
def test_the_uniform_decode_pricer_is_decode_step_s_to_the_bit(model, engine, tp, time_model,
                                                               tokens, per_token, sequences):
    """``uniform_decode_pricer``: the plain pool's decode step in one call, with the
    replica's constants bound, must give ``decode_step_s``'s answer exactly (async
    scheduling or not, a worker hand-off above one GPU or not, either time model)."""
    m, hw = catalog.load_model(model), catalog.load_hardware("h200")
    eng = catalog.load_engine(engine)
    opts = Options(time_model=time_model)
    prep = prepare(hw, Precision(weights="fp8") if model == "deepseek-v3" else Precision(),
                   None, opts, eng)
    c = StepCoster(m, hw, prep, opts, tp=tp)
    price = c.uniform_decode_pricer()
    attended = tokens * per_token  # each decoder's cache plus its new token, summed
    assert price(tokens, attended, sequences) == c.decode_step_s(
        float(tokens), float(attended), float(attended), float(attended), float(tokens),
        sequences)
    # the same step above the largest captured size: no graph, so the host's launches
    # floor each kernel and come before the step's host work
    eager = c.uniform_decode_pricer(False)
    shape = StepShape(float(tokens), float(attended), float(attended),
                      float(attended - tokens), float(attended), float(tokens))
    assert eager(tokens, attended, sequences) == c.step_time(
        shape, sequences=sequences, prefill=False, graphed=False)
    if c.engine.cuda_graphs and c.launch_s > 0:
        assert eager(tokens, attended, sequences) > price(tokens, attended, sequences)


V32 = str(Path(__file__).parent / "fixtures" / "hf" / "deepseek-v3.2.json")


@pytest.mark.parametrize("model,engine,tp,weights,time_model", [
    ("gpt-oss-20b", "vllm", 1, None, "roofline"),  # 12 full, 12 windowed layers of 128
    ("gemma-3-27b", "vllm", 2, None, "additive"),  # 5 windowed of 1,024 to each full one
    ("gemma-2-9b", "sglang", 1, None, "roofline"),
    ("gpt-oss-120b", "trtllm", 4, None, "roofline"),
    pytest.param(V32, "sglang", 8, "fp8", "roofline",  # sparse layers and their indexer
                 id="deepseek-v3.2-sglang-8-fp8-roofline")])
@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 600), per_token=st.integers(1, 40_000),
       sequences=st.integers(1, 600))
def test_the_uniform_decode_pricer_prices_windowed_and_sparse_layers_as_step_time(
        model, engine, tp, weights, time_model, tokens, per_token, sequences):
    """Sliding-window and sparse layers: the bound pricer's step is ``step_time``'s of the
    shape the plain pool gives (``DecodePool.shape``: the windowed layers see
    ``min(attended, sequences x window)``), padded to ``tokens`` or run eagerly, to the
    bit."""
    sequences = min(sequences, tokens)  # a padded step holds at most its size
    m, hw = catalog.load_model(model), catalog.load_hardware("h200")
    eng = catalog.load_engine(engine)
    opts = Options(time_model=time_model)
    prec = Precision(weights=weights) if weights else Precision()
    c = StepCoster(m, hw, prepare(hw, prec, None, opts, eng), opts, tp=tp)
    assert c.prices_uniform_decodes and not c.prices_decodes_directly
    window = m.attention_window
    assert window is not None
    n = sequences
    attended = n * per_token  # each decoder's cache plus its new token, summed
    past, w = attended - n, min(attended, n * window)

    def shape(size: int) -> StepShape:
        local = StepShape(float(size), float(w), float(w), float(min(past, n * window)),
                          float(w), float(size))
        return StepShape(float(size), float(attended), float(attended), float(past),
                         float(attended), float(size), local)

    want = c.step_time(shape(tokens), sequences=n, prefill=False)
    assert c.uniform_decode_pricer()(tokens, attended, n) == want
    eager = c.step_time(shape(n), sequences=n, prefill=False, graphed=False)
    assert c.uniform_decode_pricer(False)(n, attended, n) == eager
    # the windowed layers are priced at their window, not the whole cache: on the GPU (the
    # host may hide the difference) a cache far past it costs less than if all were full
    if per_token > 2 * window:
        full = StepShape(float(tokens), float(attended), float(attended), float(past),
                         float(attended), float(tokens), None)
        assert c.gpu_s(shape(tokens), prefill=False) < c.gpu_s(full, prefill=False)


def test_a_concatenating_cache_keeps_the_general_path():
    """HF eager's concatenated cache writes its whole KV each step, which the bound pricer
    does not price: such a replica is not offered it."""
    m, hw = catalog.load_model("gpt-oss-20b"), catalog.load_hardware("h200")
    eng = catalog.load_engine("hf-eager")
    c = StepCoster(m, hw, prepare(hw, Precision(), None, OPTS, eng), OPTS)
    assert not c.prices_uniform_decodes


@pytest.mark.parametrize("model,engine,largest", [
    ("llama-3.1-8b", "vllm", None), ("llama-3.1-8b", "sglang", None),
    ("llama-3.1-8b", "vllm", 16), ("llama-3.1-8b", "sglang", 16),
    ("llama-3.1-8b", "trtllm", None),  # pads to no captured size
    ("gpt-oss-20b", "vllm", None), ("gemma-3-27b", "vllm", 16)])  # windowed layers
def test_a_simulation_is_the_same_with_the_uniform_decode_pricer_or_without(model, engine,
                                                                            largest,
                                                                            monkeypatch):
    """The event loop prices the plain pool's padded decode steps with the bound pricer, and
    those above the largest captured size (``largest``: graphs captured up to 16 requests)
    with its eager twin, the inner loop stepping runs of both where the engine mixes
    batches; where the engine pads to none (TensorRT-LLM's PyTorch backend) a batch of
    exactly a captured size replays its graph and any other runs eagerly. With the pricers
    taken away (every step through ``step_time``'s shapes) the run is the same to the bit:
    every request's first token and finish, and the summary."""
    from planner.serving import sim

    m, hw = catalog.load_model(model), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine(engine)
    prep = prepare(hw, Precision(), None, OPTS, eng)
    kw = {} if largest is None else {"graph_sizes": (1, 2, 4, 8, largest)}
    cfg = SchedulerConfig.for_engine(eng, memory_bytes=hw.memory_bytes, max_num_seqs=64,
                                     max_num_batched_tokens=2048, **kw)  # SGLang's apart
    assert cfg.graph_sizes
    sched_mixes = cfg.mixed_batches
    reqs = synthetic(300, prompt_tokens=700, output_tokens=90, request_rate=30.0, seed=5,
                     range_ratio=0.5)
    calls = {True: [], False: []}
    bound = StepCoster.uniform_decode_pricer

    def counted(self, graphed=None):
        price = bound(self, graphed)
        seen = calls[graphed is None]
        return lambda *a: seen.append(a) or price(*a)

    stepped = []  # the batch of each run of decode-only steps the inner loop took
    run = sim._decode_run

    def counted_run(sched, *a, **k):
        n = sched.batch.n
        out = run(sched, *a, **k)
        if out[2]:
            stepped.append(n)
        return out

    monkeypatch.setattr(StepCoster, "uniform_decode_pricer", counted)
    monkeypatch.setattr(sim, "_decode_run", counted_run)
    fast = simulate(reqs, StepCoster(m, hw, prep, OPTS), cfg)
    assert calls[True]  # the bound pricer took the decode steps
    if not cfg.graph_padding:  # graphed at exactly a captured size, eager at any other
        captured = set(cfg.graph_sizes)
        assert all(a[2] in captured and a[0] == a[2] for a in calls[True])
        assert calls[False] and all(a[2] not in captured for a in calls[False])
    elif largest is not None:  # and its eager twin those of more than ``largest`` requests,
        # the inner loop's runs among them
        assert calls[False] and all(a[2] > largest for a in calls[False])
        if sched_mixes:
            assert any(n > largest for n in stepped)
        assert all(a[2] <= largest for a in calls[True])
    monkeypatch.setattr(StepCoster, "prices_decodes_directly", False)
    monkeypatch.setattr(StepCoster, "prices_uniform_decodes", False)
    calls[True].clear()
    slow = simulate(reqs, StepCoster(m, hw, prep, OPTS), cfg)
    assert not calls[True]  # every step through the shapes
    assert [(r.first_token_s, r.finish_s) for r in fast.requests] == \
        [(r.first_token_s, r.finish_s) for r in slow.requests]
    assert summary(fast) == summary(slow)


def test_a_slowed_replica_takes_each_step_that_many_times_longer(setup):
    """``SlowedCoster``: one request alone meets no queue, so its time between tokens is the
    factor times the predicted one and its first token the factor times the prefill (the
    request path outside the steps stays); near saturation the same factor pushes the queue
    past capacity, and TTFT grows far more than the factor (what ``plan --size-at high``
    sizes against)."""
    from planner.serving.steps import SlowedCoster

    m, hw, eng, prep, c = setup
    cfg = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192)
    one = [synthetic(1, prompt_tokens=1000, output_tokens=50, request_rate=1.0, seed=0)[0]]
    base, slow = simulate(one, c, cfg).requests[0], \
        simulate(one, SlowedCoster(c, 1.5), cfg).requests[0]
    assert slow.tpot_s == pytest.approx(1.5 * base.tpot_s, rel=1e-12)
    path = eng.request_path_s(1000)  # the API server and the rest, outside the steps
    assert path > 0
    assert slow.ttft_s - path == pytest.approx(1.5 * (base.ttft_s - path), rel=1e-12)
    # twice slowed is the product
    twice = simulate(one, SlowedCoster(SlowedCoster(c, 1.5), 2.0), cfg).requests[0]
    assert twice.tpot_s == pytest.approx(3.0 * base.tpot_s, rel=1e-12)
    # the rate at which the predicted replica keeps up with room to spare
    sat = summary(simulate(synthetic(400, prompt_tokens=1000, output_tokens=200,
                                     request_rate=1e4, seed=3), c, cfg))
    capacity = sat["request_throughput"]
    reqs = synthetic(400, prompt_tokens=1000, output_tokens=200,
                     request_rate=0.8 * capacity, seed=3)
    fast, slowed = summary(simulate(reqs, c, cfg)), summary(simulate(reqs, SlowedCoster(c, 1.5),
                                                                     cfg))
    assert slowed["mean_ttft_ms"] > 5 * fast["mean_ttft_ms"]
    import copy
    import pickle

    for twin in (copy.copy(SlowedCoster(c, 1.5)), copy.deepcopy(SlowedCoster(c, 1.5)),
                 pickle.loads(pickle.dumps(SlowedCoster(c, 1.5)))):
        assert twin.time_scale == 1.5 and twin.engine.name == c.engine.name
    with pytest.raises(ValueError):
        SlowedCoster(c, 0.0)
    with pytest.raises(ValueError):
        SlowedCoster(c, math.nan)


def test_a_trace_takes_its_first_n_rows_and_vllms_prefix_cache_names(run_json, run_cli,
                                                                       tmp_path):
    """-n over a --dataset takes its first N rows (vLLM bench's --num-prompts); more than it
    holds, or a --dataset-name beside it, is refused in one line. --enable-prefix-caching /
    --no-enable-prefix-caching are vLLM's names for --prefix-cache on / off."""
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps({"prompt_tokens": 500 + i, "output_tokens": 50}) + "\n"
                         for i in range(100)))
    base = ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--dataset", str(f),
            "--request-rate", "5"]
    assert run_json(*base)["completed"] == 100
    d = run_json(*base, "-n", "20")
    assert d["completed"] == 20 and d["total_input_tokens"] == sum(500 + i for i in range(20))
    code, _, err = run_cli(*base, "-n", "200")
    assert code == 2 and "holds 100 rows, fewer than 200" in err
    code, _, err = run_cli(*base, "--dataset-name", "sharegpt")
    assert code == 2 and "--dataset-name sharegpt and --dataset" in err
    shared = ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "200",
              "--prefix-tokens", "512", "--request-rate", "5"]
    assert run_json(*shared)["prefix_cache_hit_rate"] > 0.3
    assert run_json(*shared, "--enable-prefix-caching")["prefix_cache_hit_rate"] > 0.3
    assert run_json(*shared, "--no-enable-prefix-caching")["prefix_cache_hit_rate"] is None
    code, _, err = run_cli(*shared, "--prefix-cache", "on", "--no-enable-prefix-caching")
    assert code == 2 and "disagree" in err

