"""--cpu-offload-gb (vLLM's cpu_offload_gb): N GiB of weights per GPU in host memory, that many
more bytes of KV cache, and every forward pass brings them over the GPU's host link (hardware_db
host_link). Figures worked by hand for Llama-3.1-8B in bf16 on one H100 SXM."""

from __future__ import annotations

import pytest

from planner.core.achievable import HOST_LINK_FRAC
from planner.core.estimate import estimate, prepare
from planner.core.ops import StepShape, decode_ops, host_transfer_ops, prefill_ops
from planner.core.roofline import step_time
from planner.core.specs import Options, Precision, Workload
from planner.io import catalog
from planner.serving.cost import StepCoster, idle_coster
from planner.serving.metrics import summary
from planner.serving.sim import SchedulerConfig, simulate
from planner.serving.traffic import synthetic

GIB = 2**30
OFF = 4 * GIB
KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # 128 KiB
PCIE5_ONE_WAY = 64e9  # H100 SXM: the datasheet's PCIe Gen5 128 GB/s, half each way
ARGS = ("-m", "llama-3.1-8b", "-g", "h100-sxm")


@pytest.fixture
def pair(run_json):
    return run_json("estimate", *ARGS), run_json("estimate", *ARGS, "--cpu-offload-gb", "4")


def test_kv_grows_by_the_offloaded_bytes(pair):
    """4 GiB / 128 KiB a token = 32,768 more tokens (whole 16-token blocks either way)."""
    base, off = pair
    assert off["kv_concurrency"]["kv_capacity_tokens"] - \
        base["kv_concurrency"]["kv_capacity_tokens"] == 4 * GIB // KV_PER_TOKEN == 32_768
    assert base["weights_bytes"] - off["weights_bytes"] == pytest.approx(OFF)
    assert off["cpu_offload_bytes"] == OFF
    assert off["max_batch"] > base["max_batch"]


def test_every_step_pays_the_host_link(pair):
    """TPOT and TTFT (one 1,024-token prefill pass) grow by 4 GiB over the link: vLLM's at the
    achievable 0.78 x 64 GB/s = 49.9 GB/s (86.0 ms), the ideal bound's at 64 GB/s (67.1 ms)."""
    base, off = pair
    real = OFF / (PCIE5_ONE_WAY * HOST_LINK_FRAC)
    assert real == pytest.approx(0.08604, rel=1e-3)
    assert off["tpot_s"] - base["tpot_s"] == pytest.approx(real, rel=1e-9)
    assert off["ttft_s"] - base["ttft_s"] == pytest.approx(real, rel=1e-9)
    assert off["ideal"]["tpot_s"] - base["ideal"]["tpot_s"] == \
        pytest.approx(OFF / PCIE5_ONE_WAY, rel=1e-9)
    op = next(o for o in off["operators"]["decode"] if o["name"] == "weights_from_host")
    assert (op["kind"], op["comm_bytes"], op["bound"]) == ("host_transfer", OFF, "host link")


def test_each_prefill_pass_pays_it(run_json):
    """Two prompts of 8,192 tokens make two passes of the 8,192-token chunk."""
    base = run_json("estimate", *ARGS, "-b", "2", "-p", "8192")
    off = run_json("estimate", *ARGS, "-b", "2", "-p", "8192", "--cpu-offload-gb", "4")
    assert off["ttft_s"] - base["ttft_s"] == \
        pytest.approx(2 * OFF / (PCIE5_ONE_WAY * HOST_LINK_FRAC), rel=1e-9)


@pytest.mark.parametrize("batch,ctx", [(1, 1), (64, 2048)])
def test_the_simulators_step_is_the_estimates(batch, ctx):
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    o = Options(cpu_offload_bytes=OFF)
    prep = prepare(hw, Precision(), None, o, catalog.load_engine("vllm"))
    eng = prep.engine  # resolved for the GPU, as the coster's
    c = StepCoster(m, hw, prep, o)
    dec = step_time(decode_ops(m, prep.precision, batch=batch, context_tokens=ctx)
                    + host_transfer_ops(OFF), prep.ceilings, options=o, engine=eng,
                    graphed=eng.cuda_graphs,
                    fixed_s=eng.step_overhead_s + eng.per_sequence_overhead_s * batch).time_s
    got = c.step_time(StepShape.uniform(batch, 1, ctx - 1), sequences=batch, prefill=False)
    assert got == pytest.approx(dec, rel=1e-9)
    pre = step_time(prefill_ops(m, prep.precision, batch=1, prompt_tokens=ctx)
                    + host_transfer_ops(OFF), prep.ceilings, options=o, engine=eng,
                    graphed=False,
                    fixed_s=eng.prefill_step_overhead_s + eng.per_sequence_overhead_s).time_s
    # a lone prefill, as the estimate's: nothing before it to run its host work beside
    got = idle_coster(c).step_time(StepShape.uniform(1, ctx, 0), sequences=1, prefill=True,
                             decodes=False)
    assert got == pytest.approx(pre, rel=1e-9)


def test_a_lone_request_sees_the_estimates_tpot():
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    o = Options(cpu_offload_bytes=OFF)
    prep = prepare(hw, Precision(), None, o, catalog.load_engine("vllm"))
    eng = prep.engine  # resolved for the GPU, as the coster's
    reqs = synthetic(10, prompt_tokens=1024, output_tokens=64, request_rate=0.01, seed=1)
    s = summary(simulate(reqs, StepCoster(m, hw, prep, o), SchedulerConfig()))
    e = estimate(m, hw, engine=eng, options=o,
                 workload=Workload(batch=1, prompt_tokens=1024, output_tokens=64))
    assert s["median_tpot_ms"] == pytest.approx(e.tpot_s * 1e3, rel=1e-3)


def test_simulate_holds_the_larger_pool(run_json):
    sim = ("simulate", *ARGS, "-n", "10", "-p", "128", "-o", "8")
    assert run_json(*sim, "--cpu-offload-gb", "4")["kv_capacity_tokens"] - \
        run_json(*sim)["kv_capacity_tokens"] == 32_768


@pytest.mark.parametrize("extra, says", [
    (("--cpu-offload-gb", "-1"), "--cpu-offload-gb: must be non-negative"),
    (("--cpu-offload-gb", "nan"), "--cpu-offload-gb: must be a finite number"),
    (("--cpu-offload-gb", "inf"), "--cpu-offload-gb: must be a finite number"),
    # 8B: 14.96 GiB of weights, of which the embedding and lm_head (0.98 GiB each) stay
    (("--cpu-offload-gb", "14"), "--cpu-offload-gb: 14 GiB is more than the 13.00 GiB"),
    (("--cpu-offload-gb", "1", "--pp", "2"), "--cpu-offload-gb is modelled for"),
    (("--cpu-offload-gb", "1", "--speculative", "ngram", "--num-speculative-tokens", "2",
      "--acceptance-rate", "0.5"), "--cpu-offload-gb with --speculative"),
])
def test_bad_offload_is_refused_in_one_line(extra, says, run_cli):
    code, out, err = run_cli("estimate", *ARGS, *extra)
    assert code == 2 and out == ""
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_gpu_without_a_host_link_is_refused(run_cli, tmp_path):
    import yaml

    d = yaml.safe_load((catalog.db_dir("hardware_db") / "h100-sxm.yaml").read_text())
    del d["host_link"]
    p = tmp_path / "gpu.yaml"
    p.write_text(yaml.safe_dump(d))
    code, _, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", str(p),
                           "--cpu-offload-gb", "1")
    assert code == 2 and "states no host_link" in err
    assert run_cli("estimate", "-m", "llama-3.1-8b", "-g", str(p))[0] == 0


@pytest.mark.parametrize("name", catalog.gpu_names())
def test_every_gpu_states_its_host_link(name):
    """One direction, a source and a date; an estimated achievable figure is the datasheet's
    x HOST_LINK_FRAC."""
    h = catalog.load_hardware(name).host_link
    assert h is not None and h.source and h.date
    assert h.bandwidth_gb_per_s in (16, 32, 64, 450)
    if h.achievable is not None and h.achievable.estimated:
        assert h.achievable.value == pytest.approx(h.bandwidth_gb_per_s * HOST_LINK_FRAC,
                                                   abs=0.01)
