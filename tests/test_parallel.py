"""Parallelism across servers: TP beyond a node pays the inter-node network."""

from __future__ import annotations

import json
import math

import pytest

from planner.core.errors import UsageError, flagged
from planner.core.estimate import estimate
from planner.core.specs import DType, Parallelism, Precision, Workload
from planner.io import catalog


def _allreduce_s(est) -> float:
    return sum(t.comm_s for t in est.decode.ops if t.op.kind == "allreduce")


def test_tp_across_nodes_pays_the_inter_node_link():
    # H100 SXM in hardware_db: 8 per AWS p5.48xlarge, NVLink 900 GB/s both ways (450 one way),
    # EFA 3,200 Gb/s per node = 50 GB/s per GPU one way
    m, hw = catalog.load_model("llama-3.1-405b"), catalog.load_hardware("h100-sxm")
    assert hw.node.gpus_per_node == 8 and hw.node.inter_node.bandwidth_gb_per_s == 50
    kw = dict(precision=Precision(weights=DType.fp8, kv_cache=DType.fp8),
              workload=Workload(batch=32, prompt_tokens=1024, output_tokens=128))
    e8 = estimate(m, hw, parallelism=Parallelism(tp=8), **kw)
    e16 = estimate(m, hw, parallelism=Parallelism(tp=16), **kw)
    # ideal engine: 2 (N-1)/N x S / link, S = 32 tokens x 16,384 x 2 bytes, 2 per layer
    s = 32 * 16384 * 2
    per8 = 2 * 7 / 8 * s / 450e9 + 2e-6
    per16 = 2 * 15 / 16 * s / 50e9 + 2e-6
    assert _allreduce_s(e8) == pytest.approx(2 * 126 * per8)
    assert _allreduce_s(e16) == pytest.approx(2 * 126 * per16)
    # a GPU file without a node block keeps its intra-node link at any TP
    bare = hw.model_copy(update={"node": None})
    e16b = estimate(m, bare, parallelism=Parallelism(tp=16), **kw)
    assert _allreduce_s(e16b) == pytest.approx(2 * 126 * (2 * 15 / 16 * s / 450e9 + 2e-6))


def test_estimate_names_the_link_its_all_reduces_cross(run_cli):
    out = run_cli("estimate", "-m", "llama-3.1-405b", "-g", "h100-sxm", "--tp", "16")[1]
    assert "across 2 servers of 8: over efa, 50 GB/s per GPU" in " ".join(out.split())
    out = run_cli("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "4")[1]
    assert "per decode step, over nvlink4" in " ".join(out.split())


from planner.core.estimate import prepare  # noqa: E402
from planner.core.specs import Options  # noqa: E402
from planner.layouts.pipeline import pipeline, stage_layers  # noqa: E402


@pytest.mark.parametrize("layers,pp,sizes", [
    (80, 2, [40, 40]), (80, 3, [27, 27, 26]),  # vLLM: the remainder before the last stage
    (61, 4, [15, 15, 16, 15]), (126, 8, [15, 16, 16, 16, 16, 16, 16, 15]), (4, 4, [1] * 4),
])
def test_stage_split_is_vllms(layers, pp, sizes):
    r = stage_layers(layers, pp)
    assert [t - s for s, t in r] == sizes and r[0][0] == 0 and r[-1][1] == layers


def _pipe(model, tp, pp, batch=16, p=1024, o=256, engine="vllm", gpu="h100-sxm"):
    m, hw, eng = catalog.load_model(model), catalog.load_hardware(gpu), catalog.load_engine(
        engine)
    opts = Options()
    prep = prepare(hw, Precision(), None, opts, eng)
    return m, hw, eng, pipeline(m, hw, prep, opts, tp=tp, pp=pp, batch=batch,
                                prompt_tokens=p, output_tokens=o)


def test_one_stage_is_the_estimate():
    m, hw, eng, r = _pipe("llama-3.1-70b", 8, 1)
    e = estimate(m, hw, engine=eng, parallelism=Parallelism(tp=8),
                 workload=Workload(batch=16, prompt_tokens=1024, output_tokens=256))
    assert r.tpot_s == pytest.approx(e.tpot_s, rel=1e-9)
    assert r.ttft_s == pytest.approx(e.ttft_s, rel=1e-9)
    assert r.max_memory_per_gpu_bytes == pytest.approx(e.memory.total_bytes, rel=1e-9)


def test_llama_70b_memory_per_stage_by_hand():
    # Llama-3.1-70B, bf16, PP 2 x TP 1: per layer 2 x 8192^2 (q, o) + 2 x 8192 x 1024 (k, v)
    # + 3 x 8192 x 28672 (MLP) + 2 x 8192 (norms) = 855,654,400 parameters; 40 layers each.
    # Stage 0 adds the embedding (128,256 x 8,192 = 1,050,673,152), stage 1 the lm_head and
    # the final norm (8,192). Bytes = 2 x parameters.
    *_, r = _pipe("llama-3.1-70b", 1, 2, batch=1, p=512, o=128)
    layer = 855_654_400
    assert r.stages[0].weights_bytes == 2 * (40 * layer + 1_050_673_152)
    assert r.stages[1].weights_bytes == 2 * (40 * layer + 1_050_673_152 + 8192)
    # KV: 40 layers x 2 x 8 x 128 x 2 bytes x 640 tokens each
    assert r.stages[0].kv_cache_bytes == 40 * 2 * 8 * 128 * 2 * 640


def test_stage_weights_add_up_and_micro_batches_pipeline():
    m, hw, eng, r = _pipe("deepseek-v3", 8, 4, batch=64, gpu="h200")
    from planner.core.memory import weight_bytes

    total = sum(s.weights_bytes for s in r.stages)
    assert total == pytest.approx(weight_bytes(m, Precision(), tp=8), rel=1e-9)
    assert r.micro_batches == 4 and r.micro_batch == 16
    slowest = max(s.decode_s + s.send_s for s in r.stages)
    assert r.tpot_s >= 4 * slowest  # each stage serves 4 micro-batches per token
    # stages of 8 GPUs fill 8-GPU servers: every boundary crosses the network
    assert all(s.crosses_node for s in r.stages[:-1]) and not r.stages[-1].crosses_node


def test_pp_cli(run_json, run_cli):
    d = run_json("estimate", "-m", "llama-3.1-405b", "-g", "h100-sxm", "--tp", "8", "--pp", "2",
                 "--weights", "fp8", "--batch", "32")
    p = d["pipeline"]
    assert p["gpus"] == 16 and p["fits"] and len(p["stages"]) == 2
    assert p["cost_usd_per_million_output_tokens"] > 0
    code, _, err = run_cli("estimate", "-m", "tiny-llama-test", "-g", "h100-sxm", "--pp", "8")
    assert code == 2 and "exceeds the model's 4 layers" in err


from planner.layouts.expert import expert_parallel, max_load  # noqa: E402


def test_max_load_is_the_gaussian_extreme():
    # 1,000 token-expert pairs over 8 GPUs: 125 + sqrt(2 ln 8 x 1000 x 1/8 x 7/8) = 146.33
    assert max_load(1000, 8) == pytest.approx(125 + math.sqrt(2 * math.log(8) * 109.375))
    assert max_load(1000, 8) == pytest.approx(146.33, abs=0.01)
    assert max_load(5, 1) == 5 and max_load(1, 64) == 1  # never above every pair


def _ep(ep, batch=256, model="deepseek-v3", gpu="h200"):
    m, hw, eng = catalog.load_model(model), catalog.load_hardware(gpu), catalog.load_engine(
        "vllm")
    prec, opts = Precision(weights=DType.fp8), Options()
    prep = prepare(hw, prec, None, opts, eng)
    return m, hw, eng, prec, opts, expert_parallel(m, hw, prep, opts, ep=ep, batch=batch,
                                                   prompt_tokens=2000, output_tokens=500)


def test_one_gpu_is_the_estimate():
    m, hw, eng, prec, opts, x = _ep(1, batch=8, model="mixtral-8x7b", gpu="h100-sxm")
    e = estimate(m, hw, precision=prec, options=opts, engine=eng,
                 workload=Workload(batch=8, prompt_tokens=2000, output_tokens=500))
    assert x.tpot_s == pytest.approx(e.tpot_s, rel=1e-9) and x.all_to_all_s == 0


def test_ep16_memory_and_all_to_all_by_hand():
    from planner.core.memory import weight_bytes_breakdown

    m, hw, eng, prec, opts, x = _ep(16)
    bd = weight_bytes_breakdown(m, prec)
    assert x.weights_bytes == pytest.approx(sum(bd.values()) - bd["moe/routed_experts"] * 15 / 16)
    # 16 sequences per GPU x 8 experts x 7,168 x 2 bytes, 15/16 of it off the GPU, each way,
    # in each of the 58 MoE layers, over H200's p5en network share (16 GPUs > 8 per node)
    link = hw.node.inter_node.bandwidth_gb_per_s * 1e9
    moved = 16 * 8 * 7168 * 2 * 15 / 16
    assert x.crosses_node
    assert x.all_to_all_s == pytest.approx(2 * 58 * (moved / link + 10e-6))  # vLLM's latency
    assert x.pairs_mean == 256 * 8 / 16 and x.imbalance > 1


@pytest.mark.parametrize("args,msg", [
    (["-m", "llama-3.1-8b", "--ep", "4"], "no experts"),
    (["-m", "mixtral-8x7b", "--ep", "3"], "does not divide"),
    (["-m", "mixtral-8x7b", "--ep", "2", "--tp", "4"], "--ep 2 is not a multiple of --tp 4"),
    (["-m", "mixtral-8x7b", "--ep", "2", "--pp", "2"], "give --pp 1"),
])
def test_bad_ep_is_one_line(run_cli, args, msg):
    code, _, err = run_cli("estimate", *args, "-g", "h100-sxm")
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ the layouts, everywhere

import numpy as np  # noqa: E402

from planner.core.ops import StepShape  # noqa: E402
from planner.serving.costers import ExpertCoster, PipelineCoster, layout_coster  # noqa: E402


def test_ep_prefill_on_one_gpu_is_the_estimate():
    m, hw, eng, prec, opts, x = _ep(1, batch=4, model="mixtral-8x7b", gpu="h100-sxm")
    e = estimate(m, hw, precision=prec, options=opts, engine=eng,
                 workload=Workload(batch=4, prompt_tokens=2000, output_tokens=500))
    assert x.ttft_s == pytest.approx(e.ttft_s, rel=1e-9)
    assert x.latency_s(500) == pytest.approx(e.latency_s, rel=1e-9)


@pytest.mark.parametrize("layout", ["pp", "ep"])
def test_layouts_take_arrays_as_the_sweep_passes_them(layout):
    """The sweep passes batch, prompt and output as broadcastable arrays: every element must
    equal the scalar call."""
    B = np.array([1.0, 3, 64]).reshape(-1, 1, 1)
    P = np.array([100.0, 3000]).reshape(1, -1, 1)
    O = np.array([10.0, 500]).reshape(1, 1, -1)  # noqa: E741
    if layout == "pp":
        m, hw, eng = catalog.load_model("llama-3.1-70b"), catalog.load_hardware("h100-sxm"), \
            catalog.load_engine("vllm")
        prep = prepare(hw, Precision(), None, Options(), eng)

        def run(b, p, o):
            return pipeline(m, hw, prep, Options(), tp=4, pp=3, batch=b, prompt_tokens=p,
                            output_tokens=o)
        fields = lambda r: (r.tpot_s, r.ttft_s, r.max_memory_per_gpu_bytes, r.fits)  # noqa: E731
    else:
        m, hw, eng = catalog.load_model("qwen3-30b-a3b"), catalog.load_hardware("h100-sxm"), \
            catalog.load_engine("sglang")
        prep = prepare(hw, Precision(), None, Options(), eng)

        def run(b, p, o):
            return expert_parallel(m, hw, prep, Options(), ep=8, batch=b, prompt_tokens=p,
                                   output_tokens=o)
        fields = lambda r: (r.tpot_s, r.ttft_s, r.total_bytes, r.fits)  # noqa: E731
    arr = [np.broadcast_to(v, (3, 2, 2)) for v in fields(run(B, P, O))]
    for i, j, k in np.ndindex(3, 2, 2):
        one = fields(run(int(B[i, 0, 0]), int(P[0, j, 0]), int(O[0, 0, k])))
        for a, v in zip(arr, one, strict=True):
            assert a[i, j, k] == pytest.approx(v, rel=1e-12)


def _costers(layout):
    eng = catalog.load_engine("vllm")
    opts = Options(prefill_chunk_tokens=None)
    if layout == "pp":
        m, hw = catalog.load_model("llama-3.1-70b"), catalog.load_hardware("h100-sxm")
        prep = prepare(hw, Precision(), None, opts, eng)
        return m, hw, prep, opts, PipelineCoster(m, hw, prep, opts, tp=2, pp=4)
    m, hw = catalog.load_model("qwen3-30b-a3b"), catalog.load_hardware("h100-sxm")
    prep = prepare(hw, Precision(), None, opts, eng)
    return m, hw, prep, opts, ExpertCoster(m, hw, prep, opts, ep=8)


@pytest.mark.parametrize("layout", ["pp", "ep"])
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_simulated_step_is_the_layouts_estimate(layout, batch):
    """A uniform decode step and a lone prefill cost what ``estimate --pp / --ep`` says."""
    m, hw, prep, opts, c = _costers(layout)
    p, o = 1500, 300
    ctx = p + o / 2
    if layout == "pp":
        r = pipeline(m, hw, prep, opts, tp=2, pp=4, batch=batch, prompt_tokens=p,
                     output_tokens=o)
        one = pipeline(m, hw, prep, opts, tp=2, pp=4, batch=1, prompt_tokens=p,
                       output_tokens=o)
    else:
        r = expert_parallel(m, hw, prep, opts, ep=8, batch=batch, prompt_tokens=p,
                            output_tokens=o)
        one = expert_parallel(m, hw, prep, opts, ep=8, batch=1, prompt_tokens=p,
                              output_tokens=o)
    shape = StepShape.uniform(batch, 1, ctx - 1, m.sliding_window)
    assert c.step_time(shape, sequences=batch, prefill=False) == pytest.approx(r.tpot_s,
                                                                                   rel=1e-9)
    pre = c.step_time(StepShape.uniform(1, p, 0, m.sliding_window), sequences=1,
                      prefill=True, decodes=False)
    assert pre == pytest.approx(one.ttft_s, rel=1e-9)


@pytest.mark.parametrize("pp", [2, 4])
def test_a_prompt_beside_a_decode_is_prefilled_whole_in_one_micro_batch(pp):
    """A 6,000-token prompt of Llama-3.1-8B arriving while another request decodes: its
    chunk is one sequence's, so it runs whole in one micro-batch through every stage, and
    its first token comes no sooner than on an idle replica (it had come 40% sooner: the
    step's tokens were split over the micro-batches), and not much later: one decode
    beside it adds a few percent."""
    from planner.serving.metrics import summary
    from planner.serving.sim import SchedulerConfig, simulate
    from planner.serving.traffic import replay

    m, hw, eng = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm"), \
        catalog.load_engine("vllm")
    opts = Options()
    prep = prepare(hw, Precision(), None, opts, eng)
    c = PipelineCoster(m, hw, prep, opts, tp=1, pp=pp)
    cfg = SchedulerConfig.for_engine(eng)
    alone = simulate(replay([(6000, 10, 1.0)]), c, cfg)
    beside = simulate(replay([(16, 2000, 0.0), (6000, 10, 1.0)]), c, cfg)
    ttft_alone = alone.requests[0].ttft_s
    ttft = next(r for r in beside.requests if r.prompt_tokens == 6000).ttft_s
    assert ttft >= ttft_alone
    assert ttft <= 1.15 * ttft_alone
    assert summary(beside)["completed"] == 2


def test_pipeline_kv_pool_is_the_tightest_stage_by_hand():
    # Llama-3.1-70B bf16 over PP 2 x TP 1 H200s: the last stage holds 40 layers, the lm_head
    # and the final norm (test_llama_70b_memory_per_stage_by_hand), 40 x 4,096 B per token
    from planner.core.memory import activation_bytes

    m, hw, eng = catalog.load_model("llama-3.1-70b"), catalog.load_hardware("h200"), \
        catalog.load_engine("vllm")
    opts = Options()
    prep = prepare(hw, Precision(), None, opts, eng)
    c = PipelineCoster(m, hw, prep, opts, tp=1, pp=2)
    w = 2 * (40 * 855_654_400 + 1_050_673_152 + 8192)
    act = activation_bytes(m, prep.precision, batch=256, prompt_tokens=32, tp=1,
                           attention=opts.attention, chunk_tokens=8192)
    # vLLM 0.34's measured sizing: all of it less max(1 GiB, 0.75 A); A is 1.68 GiB here, so
    # 0.75 A binds
    assert act == 1_809_055_744 and 0.75 * act > 2**30
    free = hw.memory_bytes - 0.75 * act - w - act - 2**30
    assert c.kv_capacity_tokens(256, 8192) == int(free // (40 * 2 * 8 * 128 * 2))


def test_ep_kv_pool_is_every_gpus():
    m, hw, prep, opts, c = _costers("ep")
    one = layout_coster(m, hw, prep, opts, ep=1)  # a plain StepCoster
    assert c.kv_capacity_tokens(256, 8192) > 7 * one.kv_capacity_tokens(256, 8192)
    with pytest.raises(UsageError, match="not a multiple of tp") as err:
        layout_coster(m, hw, prep, opts, tp=4, ep=2)
    assert flagged(err.value).startswith("--ep 2 is not a multiple of --tp 4")


@pytest.mark.parametrize("layout", ["pp", "ep"])
def test_simulated_lone_request_sees_the_layouts_estimate(layout):
    from planner.serving.metrics import summary
    from planner.serving.sim import SchedulerConfig, simulate
    from planner.serving.traffic import synthetic

    m, hw, prep, opts, c = _costers(layout)
    reqs = synthetic(20, prompt_tokens=1024, output_tokens=64, request_rate=0.01, seed=1)
    s = summary(simulate(reqs, c, SchedulerConfig(max_num_batched_tokens=16384)))
    if layout == "pp":
        r = pipeline(m, hw, prep, opts, tp=2, pp=4, batch=1, prompt_tokens=1024,
                     output_tokens=64)
    else:
        r = expert_parallel(m, hw, prep, opts, ep=8, batch=1, prompt_tokens=1024,
                            output_tokens=64)
    path_s = prep.engine.request_path_s(1024)  # served: the request path outside the steps
    assert s["median_ttft_ms"] == pytest.approx((r.ttft_s + path_s) * 1e3, rel=1e-6)
    # TPOT: the mean decode step over the output, which estimate takes at its mean context
    assert s["median_tpot_ms"] == pytest.approx(r.tpot_s * 1e3, rel=1e-3)
    assert s["max_running_requests"] == 1


def test_simulate_cli_takes_a_layout(run_json, run_cli):
    d = run_json("simulate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "2", "--pp", "2",
                 "-n", "30", "--request-rate", "1")
    assert (d["tp"], d["pp"], d["num_gpus"], d["completed"]) == (2, 2, 4, 30)
    d = run_json("simulate", "-m", "qwen3-30b-a3b", "-g", "h100-sxm", "--ep", "4", "-n", "30")
    assert d["ep"] == 4 and d["num_gpus"] == 4 and d["completed"] == 30
    for args, msg in ((["-m", "llama-3.1-8b", "--ep", "2"], "no experts"),
                      (["-m", "qwen3-30b-a3b", "--ep", "2", "--pp", "2"], "give --pp 1"),
                      (["-m", "tiny-llama-test", "--pp", "9"], "exceeds")):
        code, _, err = run_cli("simulate", *args, "-g", "h100-sxm", "-n", "5")
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_sweep_rows_of_a_layout_are_its_estimate(run_json, tmp_path):
    from planner.search.sweep import Grid, iter_sweep, sweep, write_csv

    m, hw, eng = catalog.load_model("llama-3.1-70b"), catalog.load_hardware("h100-sxm"), \
        catalog.load_engine("vllm")
    g = Grid(models=[m], gpus=[hw], batches=[1, 48], prompt_tokens=[700], output_tokens=[90],
             tps=[2], pps=[1, 3], engine=eng)
    df = sweep(g)
    assert list(df["pp"]) == [1, 1, 3, 3] and list(df["num_gpus"]) == [2, 2, 6, 6]
    prep = prepare(hw, Precision(), None, Options(), eng)
    for b in (1, 48):
        r = pipeline(m, hw, prep, Options(), tp=2, pp=3, batch=b, prompt_tokens=700,
                     output_tokens=90)
        row = df[(df["pp"] == 3) & (df["batch"] == b)].iloc[0]
        assert row["tpot_s"] == pytest.approx(r.tpot_s, rel=1e-12)
        assert row["ttft_s"] == pytest.approx(r.ttft_s, rel=1e-12)
        assert row["total_memory_bytes"] == pytest.approx(r.max_memory_per_gpu_bytes)
        assert row["cost_usd_per_million_output_tokens"] == pytest.approx(
            r.cost_usd_per_million_output_tokens(hw.price.usd_per_gpu_hour, b, 90))
    assert write_csv(iter_sweep(g), tmp_path / "s.csv") == 4
    rows = run_json("sweep", "-m", "qwen3-30b-a3b", "-g", "h100-sxm", "--ep", "1,4", "--tp",
                    "1,2,8", "-b", "16", "-p", "512", "-o", "128")
    by = {(r["tp"], r["ep"]): r for r in rows}
    assert by[(1, 4)]["supported"] and by[(1, 4)]["num_gpus"] == 4
    # TP 2 inside EP 4: two attention groups on the experts' 4 GPUs
    assert by[(2, 4)]["supported"] and by[(2, 4)]["num_gpus"] == 4
    assert not by[(8, 4)]["supported"] and "not a multiple of tp 8" in by[(8, 4)]["note"]
    x = expert_parallel(m := catalog.load_model("qwen3-30b-a3b"), hw,
                        prepare(hw, Precision(), None, Options(), eng), Options(), ep=4,
                        batch=16, prompt_tokens=512, output_tokens=128)
    assert by[(1, 4)]["tpot_s"] == pytest.approx(x.tpot_s, rel=1e-12)


def test_plan_searches_pipeline_stages_when_tp_alone_cannot_hold_the_model(run_json):
    # Llama-3.1-405B in bf16 is 811 GB: 8 H100s (8 x 80 GiB x 0.9 = 618 GB usable) cannot
    # hold it at TP 8, two stages of TP 8 can
    rows = run_json("plan", "-m", "llama-3.1-405b", "-g", "h100-sxm", "--weights", "bf16",
                    "--kv-cache", "16", "--tp", "8", "--pp", "1,2", "--ttft", "10s",
                    "--tpot", "200ms", "--rps", "1", "--scheduler", "static")
    feas = [r for r in rows if r["meets_targets"]]
    assert feas and all((r["tp"], r["pp"]) == (8, 2) for r in feas)
    assert not any(r["fits"] for r in rows if r["pp"] == 1)
    best = feas[0]
    # static sizing: a replica completes `batch` requests per latency
    assert best["replicas"] == math.ceil(1 / (best["batch"] / best["latency_s"]))
    assert best["total_gpus"] == best["replicas"] * 16
    assert best["usd_per_hour"] == pytest.approx(best["total_gpus"] * 6.88)


def test_continuous_plan_sizes_expert_parallel_replicas(run_json):
    rows = run_json("plan", "-m", "qwen3-30b-a3b", "-g", "h100-sxm", "--weights", "bf16",
                    "--kv-cache", "16", "--tp", "1", "--pp", "1", "--ep", "1,4",
                    "--ttft", "2s", "--tpot", "50ms", "--rps", "20", "--sim-requests", "100",
                    "--top", "4", "--disaggregated", "off")
    eps = {r["ep"] for r in rows}
    assert eps == {1, 4}
    for r in rows:
        assert r["total_gpus"] == r["replicas"] * r["ep"] and r["num_gpus"] == r["ep"]
        assert r["p90_ttft_s"] <= 2 and r["p90_tpot_s"] <= 0.05
    # one replica fewer than chosen does not meet the targets
    r = next(r for r in rows if r["ep"] == 4)
    from planner.layouts.deployment import Deployment, Layout
    from planner.search.plan import SimSettings, Targets, replicas_needed

    m, hw = catalog.load_model("qwen3-30b-a3b"), catalog.load_hardware("h100-sxm")
    dep = Deployment.build(m, hw, engine=catalog.load_engine("vllm"), layout=Layout(ep=4))
    n, _ = replicas_needed(dep, prompt_tokens=1024, output_tokens=256,
                           targets=Targets(2, 0.05, 20),
                           settings=SimSettings(num_requests=100), upper_rate=1e9)
    assert n == r["replicas"]


def test_plan_refuses_ep_for_a_dense_model(run_cli):
    code, _, err = run_cli("plan", "-m", "llama-3.1-8b", "--ep", "2", "--ttft", "1s",
                           "--tpot", "50ms", "--rps", "1")
    assert code == 2 and "no experts" in err


def test_check_holds_pipeline_and_expert_deployments_to_their_limits(run_cli, tmp_path):
    from planner.layouts.figures import layout_figures

    b = tmp_path / "b.yaml"
    b.write_text("""deployments:
  - model: llama-3.1-405b
    gpu: h100-sxm
    tp: 8
    pp: 2
    weights: bf16
    workload: {batch: 16, prompt_tokens: 2048, output_tokens: 256}
    limits: {fits: true, tpot_s: 60ms, ttft_s: 5s, fits_at: 64}
  - model: deepseek-v3
    gpu: h200
    ep: 16
    weights: fp8
    workload: {batch: 256, prompt_tokens: 2048, output_tokens: 256}
    limits: {memory_frac: 80%, tpot_s: 40ms}
""")
    code, out, err = run_cli("check", str(b), "--json")
    assert code == 1, err  # the 405B's TTFT over 5 s fails
    d = json.loads(out)
    by = {(r["deployment"], r["limit"]): r for r in d["results"]}
    m, hw = catalog.load_model("llama-3.1-405b"), catalog.load_hardware("h100-sxm")
    prep = prepare(hw, Precision(), None, Options(), catalog.load_engine("vllm"))
    f = layout_figures(m, hw, prep, Options(), tp=8, pp=2, batch=16, prompt_tokens=2048,
                       output_tokens=256)
    k = "llama-3.1-405b on 8x2xh100-sxm bf16"
    assert by[(k, "tpot_s")]["predicted"] == pytest.approx(f.tpot_s) and by[(k, "tpot_s")][
        "passed"]
    assert by[(k, "ttft_s")]["predicted"] == pytest.approx(f.ttft_s) and not by[(k, "ttft_s")][
        "passed"]
    assert by[(k, "fits")]["passed"] and by[(k, "fits_at")]["passed"]
    ds = "deepseek-v3 on EP16 h200 fp8"
    assert by[(ds, "memory_frac")]["passed"] and by[(ds, "tpot_s")]["passed"]
    b.write_text(b.read_text().replace("memory_frac: 80%", "mbu_min: 50%"))
    code, _, err = run_cli("check", str(b))
    assert code == 2 and "mbu_min" in err and len(err.strip().splitlines()) == 1


def test_expert_parallel_ranks_each_schedule_their_own_sequences():
    """Each of the ep GPUs runs its own scheduler limits: a replica of EP 8 with max_num_seqs
    4 runs 32 sequences at once; one TP group with the same limits runs 4."""
    from planner.serving.metrics import summary
    from planner.serving.sim import SchedulerConfig, simulate
    from planner.serving.traffic import synthetic

    m, hw, prep, opts, c = _costers("ep")
    reqs = synthetic(64, prompt_tokens=300, output_tokens=40, request_rate=float("inf"))
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512)
    assert summary(simulate(reqs, c, cfg))["max_running_requests"] == 32
    one = layout_coster(m, hw, prep, opts)
    assert summary(simulate(reqs, one, cfg))["max_running_requests"] == 4


def test_report_draws_a_layout(run_cli, tmp_path):
    code, out, err = run_cli("report", "-m", "llama-3.1-405b", "-g", "h100-sxm", "--tp", "8",
                             "--pp", "2", "-p", "2048", "--out", str(tmp_path),
                             "--serving-requests", "20")
    assert code == 0, err
    import pandas as pd

    thr = pd.read_csv(tmp_path / "llama-3.1-405b_throughput_latency_bf16.csv")
    assert set(thr["pp"]) == {2} and set(thr["bound"]) == {"layout"}
    # the largest batch that fits: it fits, one more does not (every GPU of the layout)
    from planner.io.report import Case

    m, hw = catalog.load_model("llama-3.1-405b"), catalog.load_hardware("h100-sxm")
    from planner.layouts.deployment import Deployment, Layout

    case = Case(Deployment.build(m, hw, engine=catalog.load_engine("vllm"),
                                 layout=Layout(tp=8, pp=2)), 2048, 256)
    mb = int(thr["max_batch"].iloc[0])
    assert mb == case.max_batch() and case.layout(mb).memory.fits
    assert not case.layout(mb + 1).memory.fits
    mem = pd.read_csv(tmp_path / "llama-3.1-405b_tp8-pp2-h100-sxm_bf16_memory.csv")
    r = pipeline(m, hw, prepare(hw, Precision(), None, Options(), catalog.load_engine("vllm")),
                 Options(), tp=8, pp=2, batch=1, prompt_tokens=2048, output_tokens=256)
    assert mem["total_bytes"].iloc[0] == pytest.approx(r.max_memory_per_gpu_bytes)


def test_the_all_to_all_line_gives_a_steps_time_and_a_layers(run_cli):
    """DeepSeek-V3 over 16 H200s, batch 512: the all-to-all figure is a step's, over its 58
    MoE layers (61 layers, the first 3 dense), and the line says so and gives one layer's
    share; it is part of the step's TPOT, not one layer's."""
    from planner.layouts.expert import expert_parallel

    m, hw = catalog.load_model("deepseek-v3"), catalog.load_hardware("h200")
    opts = Options()
    prep = prepare(hw, Precision.of("fp8"), None, opts, catalog.load_engine("vllm"))
    x = expert_parallel(m, hw, prep, opts, ep=16, batch=512, prompt_tokens=1024,
                        output_tokens=256)
    assert x.moe_layers == m.num_moe_layers == 58
    assert x.all_to_all_s < x.tpot_s
    code, out, err = run_cli("estimate", "-m", "deepseek-v3", "-g", "h200", "--ep", "16",
                             "-b", "512")
    assert code == 0, err
    flat = " ".join(out.split())
    assert "a step (each of 58 MoE layers'" in flat and "per MoE layer" not in flat


def test_a_layouts_json_gives_its_own_memory_at_the_top_level(run_json):
    """Llama-3.1-70B over 2 pipeline stages of one H100: the top-level memory fields are the
    fullest stage's (65.7 GiB of weights, under its usable 72 GiB, so it fits), where they had
    been one GPU holding the whole model (141 GB, used 171%) beside fits: true; that group's
    figures are in tp_group. Likewise an expert-parallel GPU's."""
    d = run_json("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--pp", "2", "-b", "8")
    st = max(d["pipeline"]["stages"], key=lambda s: s["total_bytes"])
    assert d["fits"] is True
    assert d["total_memory_bytes"] == pytest.approx(st["total_bytes"])
    assert d["weights_bytes"] == pytest.approx(st["weights_bytes"])
    # of the GPU's capacity, as one TP group's memory_used_frac is (it was of usable memory)
    assert d["memory_used_frac"] == pytest.approx(st["total_bytes"] / (80 * 2**30))
    assert d["memory_used_frac"] < st["total_bytes"] / st["usable_bytes"] < 1
    one = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "8")
    assert one["memory_used_frac"] == pytest.approx(one["total_memory_bytes"] / (80 * 2**30))
    assert d["tp_group"]["total_memory_bytes"] > d["tp_group"]["usable_memory_bytes"]
    assert d["max_batch"] is None  # computed for one TP group only
    x = run_json("estimate", "-m", "qwen3-30b-a3b", "-g", "h100-sxm", "--ep", "4", "-b", "64")
    ep = x["expert_parallel"]
    assert x["total_memory_bytes"] == pytest.approx(ep["total_bytes"])
    assert x["weights_bytes"] == pytest.approx(ep["weights_bytes"])
    assert x["tp_group"]["weights_bytes"] > 3 * x["weights_bytes"]


def test_an_expert_layouts_cost_and_ideal_are_the_layouts(run_cli, run_json):
    """DeepSeek-V3 over 8 H200s with data-parallel attention: the text's Expert parallel
    section gives the deployment's cost for its 8 GPUs (its only dollar figure was one TP
    group's, which does not fit), and --json's ideal, one TP group's roofline (3.2x the
    layout's TPOT), moves under tp_group."""
    args = ("estimate", "-m", "deepseek-v3", "-g", "h200", "--ep", "8", "--tp", "1", "-b", "64")
    d = run_json(*args)
    assert d["ideal"] is None and d["tp_group"]["ideal"]["tpot_s"] > d["tpot_s"]
    code, out, _ = run_cli(*args)
    section = out.split("Expert parallel:")[1].split("Below: one tensor-parallel group")[0]
    cost = f"${d['cost_usd_per_million_output_tokens']:,.3f}"
    assert code == 0 and cost in section and "8 GPUs" in section
    # 8 GPUs' dollars an hour over the output tokens an hour: 64 sequences of 256 tokens in
    # TTFT + TPOT x 255
    latency = d["ttft_s"] + d["tpot_s"] * 255
    tokens_per_hour = 64 * 256 / latency * 3600
    assert d["cost_usd_per_million_output_tokens"] == pytest.approx(
        8 * d["price_usd_per_gpu_hour"] / tokens_per_hour * 1e6)


def test_every_all_reduce_is_a_kernel(run_json):
    """Tensor parallelism adds one all-reduce kernel after each layer's attention and MLP:
    Llama-3.1-8B at TP 8 launches 2 x 32 more kernels a decode step than at TP 1 (an
    all-reduce row had counted one kernel for all its 32, so an eager step's host floor
    left out 62 launches)."""
    one = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h200")
    eight = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h200", "--tp", "8")

    def kernels(d):
        return sum(o["kernels"] for o in d["operators"]["decode"])
    rows = [o for o in eight["operators"]["decode"] if o["name"].startswith("allreduce")]
    assert [(o["count"], o["kernels"]) for o in rows] == [(32, 32), (32, 32)]
    assert kernels(eight) - kernels(one) == 64


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from layout_steps import (  # noqa: E402
    assert_the_bound_pricer_changes_nothing,
    assert_the_bound_pricer_is_step_time,
)

from planner.core.ops import decode_ops  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 8), which=st.sampled_from(
    ["llama-3.1-8b", "gpt-oss-20b", "deepseek-v3", "gemma-2-9b"]))
def test_a_stage_holds_each_operator_in_the_layers_it_spans(pp, which):
    """``stage_ops``: each operator's count on a stage is the number of its layers (its
    attention's full or sliding-window ones, a MoE model's dense or expert ones) in the
    stage's span, counted one by one here; the embedding on the first stage, the head on the
    last; over the stages, every operator's whole count."""
    from planner.layouts.pipeline import _layers_of, stage_layers, stage_ops

    m = catalog.load_model(which)
    ops = decode_ops(m, Precision(), batch=2, context_tokens=300, tp=1)
    per_stage = []
    for i, (s, t) in enumerate(stage_layers(m.num_layers, pp)):
        got = {op.name: op.count for op in stage_ops(ops, m, s, t, i == 0, i == pp - 1)}
        for op in ops:
            layers = _layers_of(op.name, m)
            want = (op.count if (op.name == "embed" and i == 0) or (
                op.name in ("final_norm", "lm_head") and i == pp - 1) else 0) \
                if layers is None else len([k for k in layers if s <= k < t])
            assert got.get(op.name, 0) == want, (op.name, s, t)
        per_stage.append(got)
    for op in ops:
        assert sum(g.get(op.name, 0) for g in per_stage) == op.count, op.name



@pytest.mark.parametrize("model, gpu, w, tp, pp, engine", [
    ("llama-3.1-70b", "h100-sxm", "bf16", 2, 2, "vllm"),
    ("llama-3.1-70b", "l40s", "fp8", 1, 4, "vllm-0.8"),
    ("gpt-oss-20b", "h200", "mxfp4", 1, 3, "vllm"),  # sliding-window layers in every stage
    ("gemma-2-9b", "a100-sxm-80gb", "bf16", 1, 2, "sglang"),
    ("deepseek-v3", "h200", "fp8", 8, 2, "trtllm"),  # multi-head latent attention
    ("deepseek-v3.2", "h200", "fp8", 8, 2, "vllm")])  # sparse attention and its indexer
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 600), per=st.integers(1, 30_000))
def test_the_pipelines_uniform_decode_pricer_is_its_step_time_to_the_bit(model, gpu, w, tp, pp,
                                                                         engine, n, per):
    """``PipelineCoster.uniform_decode_pricer``: the plain pool's decode-only step in one
    call (the largest micro-batch's share through every stage, the sends between them, the
    host's cost) gives ``step_time``'s answer for the shape the pool builds, exactly, one
    micro-batch or several, whichever of the two meets the kept sums first."""
    assert_the_bound_pricer_is_step_time(
        lambda m, hw, prep, opts: PipelineCoster(m, hw, prep, opts, tp=tp, pp=pp), model,
        gpu, w, engine, n, per)


@pytest.mark.parametrize("model, tp, pp, engine", [
    ("llama-3.1-70b", 2, 2, "vllm"), ("gpt-oss-20b", 1, 3, "vllm"),
    ("qwen3-30b-a3b", 1, 2, "sglang"), ("llama-3.1-8b", 1, 4, "trtllm")])
def test_a_pipeline_simulation_is_the_same_with_the_bound_pricer_or_without(model, tp, pp,
                                                                           engine,
                                                                           monkeypatch):
    """The event loop prices a pipeline replica's decode-only steps in one call and steps
    runs of them in its inner loop; with both taken away the run is the same to the bit."""
    from planner.serving.config import SchedulerConfig
    from planner.serving.traffic import synthetic

    m = catalog.load_model(model)
    hw, eng = catalog.load_hardware("h100-sxm"), catalog.load_engine(engine)
    opts = Options()
    prep = prepare(hw, Precision(), None, opts, eng)
    cfg = SchedulerConfig.for_engine(eng, memory_bytes=hw.memory_bytes, max_num_seqs=64,
                                     max_num_batched_tokens=2048)
    reqs = synthetic(300, prompt_tokens=900, output_tokens=120, request_rate=20.0, seed=4,
                     range_ratio=0.5)
    assert_the_bound_pricer_changes_nothing(
        PipelineCoster, lambda: PipelineCoster(m, hw, prep, opts, tp=tp, pp=pp), reqs, cfg,
        monkeypatch)
