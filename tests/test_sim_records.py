"""A run's per-request records (planner.serving.records): rows of machine numbers written as
each request is done, the objects let go (issue 27: a million requests took 769 MiB), the
figures the same to the bit as over the objects, and every request handed to the caller's
sink once, its figures final."""

from __future__ import annotations

import gc
import math
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.estimate import prepare
from planner.core.specs import Options, Precision
from planner.io import catalog
from planner.serving.cost import StepCoster
from planner.serving.metrics import summary
from planner.serving.records import RequestRecords
from planner.serving.requests import RequestResult
from planner.serving.sim import SchedulerConfig, simulate
from planner.serving.traffic import synthetic


@pytest.fixture(scope="module")
def coster():
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("vllm")
    return StepCoster(m, hw, prepare(hw, Precision(), None, Options(), eng), Options())


times = st.floats(0, 1e6) | st.just(math.nan)
results = st.builds(RequestResult, st.integers(0, 2**62), times, st.integers(1, 10**6),
                    st.integers(1, 10**6), times, times, st.integers(0, 100),
                    st.sampled_from(["", "too long"]), st.integers(0, 10**6))


@settings(max_examples=50, deadline=None)
@given(st.lists(results, max_size=30))
def test_rows_read_back_the_results_written(rs):
    rec = RequestRecords.of(rs)
    assert len(rec) == len(rs)
    for a, b in zip(rec, rs, strict=True):
        for f in ("id", "prompt_tokens", "output_tokens", "preemptions", "cached_tokens",
                  "failed"):
            assert getattr(a, f) == getattr(b, f)
        for f in ("arrival_s", "first_token_s", "finish_s"):
            x, y = getattr(a, f), getattr(b, f)
            assert x == y or (math.isnan(x) and math.isnan(y))
    assert rec.first_failure() == next((r.failed for r in rs if r.failed), None)
    if rs:
        assert rec[-1].id == rs[-1].id and [r.id for r in rec[1:3]] == [r.id for r in rs[1:3]]


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)), k


@pytest.mark.parametrize("cfg", [SchedulerConfig(), SchedulerConfig(kind="static"),
                                 SchedulerConfig(max_concurrency=8),
                                 SchedulerConfig(max_model_len=1500)],
                         ids=["continuous", "static", "closed-loop", "refusals"])
def test_summary_over_rows_is_the_summary_over_objects_to_the_bit(coster, cfg):
    reqs = synthetic(400, prompt_tokens=1000, output_tokens=200, range_ratio=0.6,
                     request_rate=30.0, seed=3)
    got = []
    res = simulate(reqs, coster, cfg, on_record=got.append)
    assert isinstance(res.requests, RequestRecords)
    objects = type(res)(**{**res.__dict__, "requests": list(res.requests)})
    s = summary(res, ttft_slo_s=0.2, tpot_slo_s=0.02)
    _same(s, summary(objects, ttft_slo_s=0.2, tpot_slo_s=0.02))
    # the sink saw every request once, with the figures its row keeps
    assert sorted(r.id for r in got) == sorted(q.id for q in reqs)
    rows = {r.id: r for r in res.requests}
    for r in got:
        assert r == rows[r.id] or (r.failed and r.failed == rows[r.id].failed)
    if cfg.max_model_len == 1500:
        assert s["failed"] and s["failed_reason"] == res.requests.first_failure()


def test_memory_per_request_is_a_row_not_objects(coster):
    """Before the rows, a run held a RequestResult and a SimRequest per request for all of
    it (about 500 bytes a request beside the stream given); now it holds a row (72 bytes)
    and the requests in flight. The token gaps are a record per step (``SimResult.itl``,
    about 90 bytes a step), counted apart."""
    n = 40_000
    reqs = synthetic(n, prompt_tokens=500, output_tokens=50, request_rate=40.0, seed=1)
    tracemalloc.start()
    try:
        res = simulate(reqs, coster, SchedulerConfig())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(res.requests) == n
    per_request = (peak - 90 * res.steps) / n
    assert per_request < 150, f"{per_request:.0f} bytes a request"


def test_a_run_makes_no_reference_cycles_and_leaves_the_collector_as_it_was(coster):
    """The event loop and the stream run with the cycle collector paused
    (``planner.serving.gcpause``), which is sound only while they make no reference cycles:
    a run with preemptions and prefix caching leaves no cyclic garbage behind. The collector
    is on again after the run, off after a run started with it off, and on after an error
    inside the pause."""
    from planner.serving.gcpause import no_cycle_collection

    eng = catalog.load_engine("vllm")
    reqs = synthetic(4000, prompt_tokens=512, output_tokens=256, prefix_tokens=512, seed=2)
    gc.collect()
    gc.disable()
    try:
        res = simulate(reqs, coster, SchedulerConfig.for_engine(eng))
        assert res.preemptions and res.prefix_hit_tokens
        del res
        assert gc.collect() == 0
    finally:
        gc.enable()
    simulate(reqs[:50], coster, SchedulerConfig())
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(reqs[:50], coster, SchedulerConfig())
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), no_cycle_collection():
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()
