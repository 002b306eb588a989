"""One value for the thing planned (planner/layouts/deployment.py), the headline figures defined
once (planner/core/headline.py), and the commands that share them: estimate and simulate
agree on the deployment they build."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.core.errors import UsageError
from planner.core.headline import Headline
from planner.core.specs import Precision, Workload
from planner.io import catalog
from planner.layouts.deployment import Deployment, Layout, estimate_deployment


@pytest.mark.parametrize("engine", catalog.engine_names())
def test_estimate_and_simulate_agree_on_kv_capacity(engine, run_json):
    """The KV pool estimate reports is the one simulate serves from, for every profile, at
    the same step budget: the engine's block size, max_num_seqs and step budget (sglang's
    1-token pages and 2048 sequences, trtllm's 32-token blocks; vllm-v0's 512-token chunks
    at Llama-3.1-8B's 128K context, where estimate's own default is 8,192)."""
    from planner.serving import run

    args = ("-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", engine)
    dep = Deployment.build(catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm"),
                           engine=catalog.load_engine(engine))
    budget = run.scheduler(dep).max_num_batched_tokens
    est = run_json("estimate", *args, "--prefill-chunk-tokens", str(budget))["kv_concurrency"]
    sim = run_json("simulate", *args, "-n", "20", "-p", "256", "-o", "16")
    eng = catalog.load_engine(engine)
    assert est["block_size"] == eng.block_size
    assert est["kv_capacity_tokens"] == sim["kv_capacity_tokens"]
    if engine == "vllm-v0":
        assert budget == 512


def test_simulate_takes_the_deployment_options_estimate_takes(run_json):
    base = ("-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "20", "-p", "512", "-o", "32")
    plain = run_json("simulate", *base)
    fp8 = run_json("simulate", *base, "--weights", "fp8", "--compute", "fp8")
    assert fp8["mean_tpot_ms"] < plain["mean_tpot_ms"]
    cal = "tests/fixtures/measure/cpu-calibration.yaml"
    # the CPU's measured ceilings stand in for the H100's: decode is far slower
    assert run_json("simulate", *base, "--calibration", cal)["mean_tpot_ms"] > \
        100 * plain["mean_tpot_ms"]
    lower = run_json("simulate", *base, "--memory-utilization", "0.5", "--block-size", "32")
    assert lower["kv_capacity_tokens"] < plain["kv_capacity_tokens"]
    eager = run_json("simulate", *base, "--kernel-overhead-us", "20")
    assert eager["mean_tpot_ms"] > plain["mean_tpot_ms"]


def test_simulate_refuses_a_request_beyond_the_context_unless_asked(run_cli):
    args = ("simulate", "-m", "llama-2-7b", "-g", "h100-sxm", "-n", "5", "-p", "4000",
            "-o", "200")
    code, _, err = run_cli(*args)
    assert code == 2 and "--allow-longer-context" in err and "4,096" in err
    code, _, err = run_cli(*args, "--allow-longer-context", "--json")
    assert code == 0, err


@pytest.mark.parametrize(("layout", "gpus", "label", "text"), [
    (Layout(), 1, "TP1", "1"),
    (Layout(tp=4), 4, "TP4", "4"),
    (Layout(tp=8, pp=2), 16, "TP8xPP2", "16 (TP 8 x PP 2)"),
    (Layout(ep=16), 16, "EP16", "16 (EP)"),
    (Layout(tp=8, ep=8), 8, "TP8xEP8", "8 (TP 8, EP 8)"),
    (Layout(tp=2, ep=8), 8, "TP2xEP8", "8 (TP 2 x DP 4, EP 8)"),
])
def test_layout_names_and_counts_its_gpus(layout, gpus, label, text):
    assert (layout.num_gpus, layout.label, layout.gpus_text) == (gpus, label, text)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_a_layout_refuses_what_is_not_a_gpu_count(bad):
    with pytest.raises(UsageError, match="tp"):
        Layout(tp=bad)


def test_a_layout_takes_numpys_integers_as_ints():
    lay = Layout(np.int64(4), np.int64(2))
    assert lay.tp == 4 and type(lay.tp) is int and lay.label == "TP4xPP2"


@pytest.mark.parametrize(("model", "layout", "match"), [
    ("llama-3.1-8b", Layout(tp=3), "does not divide"),
    ("llama-3.1-8b", Layout(pp=64), "exceeds the model's 32 layers"),
    ("llama-3.1-8b", Layout(ep=2), "no experts"),
    ("mixtral-8x7b", Layout(tp=4, ep=2), "not a multiple of tp 4"),
    ("mixtral-8x7b", Layout(ep=2, pp=2), "give pp 1"),
    ("mixtral-8x7b", Layout(ep=3), "does not divide"),
])
def test_a_layout_checks_itself_against_the_model(model, layout, match):
    m = catalog.load_model(model)
    with pytest.raises(UsageError, match=match):
        Deployment.build(m, catalog.load_hardware("h100-sxm"), layout=layout)


def test_estimate_deployment_is_the_estimate_and_the_layouts_figures():
    """The deployment's estimate equals the loose-argument estimate, and a pipeline layout
    adds the pipeline's figures (held equal to estimate --pp by tests/test_parallel.py)."""
    from planner.core.estimate import estimate
    from planner.core.specs import Parallelism

    m, hw = catalog.load_model("llama-3.1-70b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("vllm")
    w = Workload(batch=8, prompt_tokens=1024, output_tokens=128)
    dep = Deployment.build(m, hw, engine=eng, precision=Precision.of("fp8"),
                           layout=Layout(tp=4, pp=2))
    res = estimate_deployment(dep, w)
    loose = estimate(m, hw, engine=eng, precision=Precision.of("fp8"), workload=w,
                     parallelism=Parallelism(tp=4))
    assert res.estimate.tpot_s == loose.tpot_s and res.estimate.ttft_s == loose.ttft_s
    assert res.pipeline is not None and res.expert is None
    assert res.fits == res.pipeline.fits
    assert res.to_dict()["pipeline"]["pp"] == 2


@given(ttft=st.floats(1e-4, 10), tpot=st.floats(1e-4, 1), batch=st.integers(1, 4096),
       out=st.integers(1, 8192), gpus=st.integers(1, 64), price=st.floats(0.1, 100))
def test_headline_figures_follow_their_definitions(ttft, tpot, batch, out, gpus, price):
    h = Headline(ttft, tpot, batch, out, gpus, price)
    assert h.latency_s == pytest.approx(ttft + tpot * (out - 1))
    assert h.throughput_tokens_per_s == pytest.approx(batch / tpot)
    assert h.e2e_throughput_tokens_per_s * h.latency_s == pytest.approx(batch * out)
    # cost: GPU-hours per output token; hand form: price x gpus x latency / 3600 / tokens
    assert h.cost_usd_per_million_output_tokens == pytest.approx(
        price * gpus * h.latency_s / 3600 / (batch * out) * 1e6)
    assert Headline(ttft, tpot, batch, out, gpus).cost_usd_per_million_output_tokens is None


def test_headline_by_hand():
    # TTFT 0.5 s, TPOT 20 ms, 256 tokens, batch 32 on 4 GPUs at $2/GPU-h:
    # latency 0.5 + 0.02 x 255 = 5.6 s; 32 x 256 / 5.6 = 1462.857 tok/s;
    # $8/h = 0.0022222 $/s -> 1.519 $ per 1M tokens
    h = Headline(0.5, 0.02, 32, 256, 4, 2.0)
    assert h.latency_s == pytest.approx(5.6)
    assert h.e2e_throughput_tokens_per_s == pytest.approx(1462.857, rel=1e-6)
    assert h.cost_usd_per_million_output_tokens == pytest.approx(1.519, rel=1e-3)


def test_a_layout_error_names_the_flag_on_the_cli_and_the_key_in_a_budget(run_cli, tmp_path):
    """The core names the field (tp); the CLI says its flag, a budget file its key."""
    code, _, err = run_cli("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "3")
    assert code == 2 and "--tp 3 does not divide" in err
    budget = tmp_path / "b.yaml"
    budget.write_text("deployments:\n  - name: odd\n    model: llama-3.1-70b\n    gpu: h100-sxm\n"
                      "    tp: 3\n    workload: {batch: 1, prompt_tokens: 128, "
                      "output_tokens: 16}\n    limits: {fits: true}\n")
    code, _, err = run_cli("check", str(budget))
    assert code == 2 and "deployment odd: tp 3 does not divide" in err and "--tp" not in err


def test_plan_takes_the_memory_options_simulate_takes(run_json):
    args = ("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--ttft", "1s", "--tpot", "50ms",
            "--rps", "5", "--tp", "1", "--weights", "bf16", "--kv-cache", "16",
            "--scheduler", "static")
    full = run_json(*args)[0]
    less = run_json(*args, "--memory-utilization", "0.3", "--reserve-gib", "4")[0]
    # the same weights in a smaller share of the GPU: 80 GB x (0.9 - 0.3) less headroom
    assert less["memory_headroom_frac"] < full["memory_headroom_frac"] - 0.5


def test_layout_figures_are_the_headline(run_json, run_cli):
    """With pipeline stages or expert parallelism the deployment's figures lead: the top-level
    JSON is the layout's (one TP group's in ``tp_group``), and the table opens with the
    layout's section, not with one TP group that does not fit (issue 26)."""
    d = run_json("estimate", "-m", "deepseek-v3", "-g", "h200", "--tp", "8", "--ep", "8",
                 "--weights", "fp8", "-b", "64", "-p", "1000", "-o", "1000")
    x = d["expert_parallel"]
    assert d["headline"] == "expert_parallel" and d["num_gpus"] == 8
    assert (d["tpot_s"], d["ttft_s"], d["fits"]) == (x["tpot_s"], x["ttft_s"], x["fits"])
    assert d["throughput_tokens_per_s"] == pytest.approx(64 / x["tpot_s"])
    assert d["tp_group"]["tpot_s"] != d["tpot_s"] and d["mbu"] is None
    p = run_json("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "2", "--pp", "2",
                 "-b", "8")
    assert p["headline"] == "pipeline" and p["tpot_s"] == p["pipeline"]["tpot_s"]
    assert p["num_gpus"] == 4
    code, out, _ = run_cli("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "2",
                           "--pp", "2", "-b", "8")
    assert code == 0 and out.lstrip().startswith("Pipeline")
