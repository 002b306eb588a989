"""The hand-off of each step to an engine's worker processes where the model spans more than
one GPU (engines_db ``worker_step_overhead_us``; vLLM V1's MultiprocExecutor): paid on every
step of a multi-GPU replica, hidden by no async scheduling, and never on one GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.core.estimate import estimate, prepare
from planner.core.ops import StepShape
from planner.core.specs import Options, Parallelism, Precision, Workload
from planner.io import catalog
from planner.layouts.expert import expert_parallel
from planner.layouts.pipeline import pipeline
from planner.serving.cost import StepCoster

H = 1.4e-3  # a hand-off cost to test with, seconds


def _engines():
    e = catalog.load_engine("vllm")
    return replace(e, worker_step_overhead_s=0.0), replace(e, worker_step_overhead_s=H)


def test_only_where_several_gpus_run_the_model():
    _, e = _engines()
    assert e.worker_s(1) == 0.0
    assert e.worker_s(2) == e.worker_s(8) == H


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_a_step_pays_it_once_beside_async_scheduling(tp):
    """The serving step costs: decode (graphed, async scheduling on) and a prefill chunk,
    each longer by exactly the hand-off at TP above 1, unchanged on one GPU."""
    m, hw = catalog.load_model("qwen3-8b"), catalog.load_hardware("h100-sxm")
    a, b = (StepCoster(m, hw, prepare(hw, Precision(), None, Options(), e), Options(), tp=tp)
            for e in _engines())
    assert a.engine.async_scheduling  # the hand-off is not hidden as the step cost is
    extra = H if tp > 1 else 0.0
    for n, shape, prefill in ((10, StepShape.uniform(10, 1, 300, None), False),
                              (2, StepShape.uniform(2, 2048, 0, None), True)):
        got = b.step_time(shape, sequences=n, prefill=prefill) - \
            a.step_time(shape, sequences=n, prefill=prefill)
        assert got == pytest.approx(extra, abs=1e-12)


@pytest.mark.parametrize("tp", [1, 8])
def test_the_static_estimate_pays_it_per_step_and_per_prefill_pass(tp):
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    w = Workload(batch=4, prompt_tokens=4096, output_tokens=128)
    o = Options(prefill_chunk_tokens=8192)  # 16,384 prompt tokens: two passes
    a, b = (estimate(m, hw, workload=w, parallelism=Parallelism(tp=tp), options=o, engine=e)
            for e in _engines())
    extra = H if tp > 1 else 0.0
    assert b.tpot_s - a.tpot_s == pytest.approx(extra, abs=1e-12)
    assert b.ttft_s - a.ttft_s == pytest.approx(2 * extra, abs=1e-12)
    # the ideal bound beside it pays none (it has no host costs)
    assert b.ideal.tpot_s == a.ideal.tpot_s


def test_pipeline_and_expert_replicas_pay_it_too():
    hw = catalog.load_hardware("h100-sxm")
    o = Options()
    plain, slow = _engines()
    m = catalog.load_model("llama-3.1-70b")
    pa, pb = (pipeline(m, hw, prepare(hw, Precision(), None, o, e), o, tp=2, pp=2, batch=8,
                       prompt_tokens=1024, output_tokens=128) for e in (plain, slow))
    assert pb.tpot_s - pa.tpot_s == pytest.approx(H, abs=1e-12)
    moe = catalog.load_model("qwen3-30b-a3b")
    xa, xb = (expert_parallel(moe, hw, prepare(hw, Precision(), None, o, e), o, ep=4, batch=32,
                              prompt_tokens=1024, output_tokens=128) for e in (plain, slow))
    assert xb.tpot_s - xa.tpot_s == pytest.approx(H, abs=1e-12)


def test_the_explain_tables_show_it(run_cli):
    """Its own row in the operator tables and in the engine-overhead line, at TP 8; none on
    one GPU (vllm's fitted 0.996 ms)."""
    code, out, err = run_cli("estimate", "-m", "qwen3-8b", "-g", "h100-sxm", "-tp", "8",
                             "-b", "10", "--explain")
    assert code == 0, err
    assert "+ worker hand-off 996 µs" in " ".join(out.split())  # the line may wrap
    assert any(line.startswith("worker hand-off") and "996 µs" in line
               for line in out.splitlines())
    code, out, err = run_cli("estimate", "-m", "qwen3-8b", "-g", "h100-sxm", "-b", "10",
                             "--explain")
    assert code == 0, err
    assert "worker hand-off" not in out
