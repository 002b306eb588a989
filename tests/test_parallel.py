"""Parallelism across servers: TP beyond a node pays the inter-node network."""

from __future__ import annotations

import math

import pytest

from planner import catalog
from planner.estimate import estimate
from planner.specs import DType, Parallelism, Precision, Workload


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
    per8 = 2 * 7 / 8 * s / 450e9 + 5e-6
    per16 = 2 * 15 / 16 * s / 50e9 + 5e-6
    assert _allreduce_s(e8) == pytest.approx(2 * 126 * per8)
    assert _allreduce_s(e16) == pytest.approx(2 * 126 * per16)
    # a GPU file without a node block keeps its intra-node link at any TP
    bare = hw.model_copy(update={"node": None})
    e16b = estimate(m, bare, parallelism=Parallelism(tp=16), **kw)
    assert _allreduce_s(e16b) == pytest.approx(2 * 126 * (2 * 15 / 16 * s / 450e9 + 5e-6))


from planner.estimate import prepare  # noqa: E402
from planner.pipeline import pipeline, stage_layers  # noqa: E402
from planner.specs import Options  # noqa: E402


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
    from planner.memory import weight_bytes

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


from planner.expert import expert_parallel, max_load  # noqa: E402


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
    from planner.memory import weight_bytes_breakdown

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
    (["-m", "mixtral-8x7b", "--ep", "2", "--tp", "2"], "--tp 1"),
])
def test_bad_ep_is_one_line(run_cli, args, msg):
    code, _, err = run_cli("estimate", *args, "-g", "h100-sxm")
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1
