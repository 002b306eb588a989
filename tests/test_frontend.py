"""The API server as a shared resource (planner/serving/frontend.py): its admission queue and
its streaming rate, by hand, in the simulator, and from the CLI."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.estimate import prepare
from planner.core.specs import Options, Precision
from planner.io import catalog
from planner.serving.arrivals import Arrivals, ClosedLoop
from planner.serving.config import SchedulerConfig
from planner.serving.cost import StepCoster
from planner.serving.frontend import Frontend
from planner.serving.metrics import summary
from planner.serving.requests import RequestResult, SimRequest
from planner.serving.sim import simulate
from planner.serving.traffic import synthetic

OPTS = Options()


def _req(i: int, arrival_s: float = 0.0) -> SimRequest:
    return SimRequest.of(RequestResult(i, arrival_s, 10, 10))


def test_one_process_admits_in_turn():
    """1 ms a request, three at t = 0: the engine sees them at 1, 2 and 3 ms; one arriving
    at 10 ms, when the process is idle, at 11 ms."""
    f = Frontend(request_s=1e-3)
    seen = [f.admit(t) for t in (0.0, 0.0, 0.0, 0.010)]
    assert seen == pytest.approx([1e-3, 2e-3, 3e-3, 11e-3])


def test_processes_share_the_queue():
    """Two processes, 1 ms a request, four at t = 0: each request still takes its own 1 ms,
    and the pair admits one every 0.5 ms: 1, 1, 1.5, 2 ms."""
    f = Frontend(request_s=1e-3, servers=2)
    assert [f.admit(0.0) for _ in range(4)] == pytest.approx([1e-3, 1e-3, 1.5e-3, 2e-3])


def test_streaming_floor_by_hand():
    """20 us a token: a step emitting 1,000 tokens takes at least 20 ms on one process,
    5 ms on four; a free process costs nothing."""
    assert Frontend(token_s=20e-6).step_floor_s(1000) == pytest.approx(0.020)
    assert Frontend(token_s=20e-6, servers=4).step_floor_s(1000) == pytest.approx(0.005)
    assert Frontend().step_floor_s(1000) == 0.0 and not Frontend().active


def test_bad_frontend_refused():
    with pytest.raises(ValueError):
        Frontend(servers=0)
    with pytest.raises(ValueError):
        Frontend(request_s=-1.0)


def test_arrivals_wait_for_the_api_server():
    reqs = [_req(i) for i in range(3)]
    arr, waiting = Arrivals(reqs, Frontend(request_s=1e-3)), deque()
    arr.arrive(0.0, waiting)
    assert not waiting and arr.next_s() == pytest.approx(1e-3)
    arr.arrive(2e-3, waiting)
    assert [q.id for q in waiting] == [0, 1] and arr.next_s() == pytest.approx(3e-3)


def test_closed_loop_sends_through_the_api_server():
    """Two clients, 1 ms a request: both send at t = 0, the engine sees them at 1 and 2 ms;
    the client of the first finished request has it whole at 5 ms and sends then, seen at
    6 ms."""
    closed, waiting = ClosedLoop([_req(i) for i in range(3)], 2, Frontend(request_s=1e-3)),\
        deque()
    closed.arrive(0.0, waiting)
    assert not waiting and closed.next_s() == pytest.approx(1e-3)
    closed.arrive(2e-3, waiting)
    assert [q.id for q in waiting] == [0, 1] and closed.arrived == 2
    closed.release(5e-3)
    closed.arrive(5e-3, waiting)
    assert closed.pending[0].r.arrival_s == 5e-3
    assert closed.next_s() == pytest.approx(6e-3)


@pytest.fixture(scope="module")
def small():
    m, hw = catalog.load_model("llama-3.2-1b"), catalog.load_hardware("h100-sxm")
    eng = replace(catalog.load_engine("vllm"), request_overhead_s=0.0,
                  prompt_token_overhead_s=0.0, frontend_request_s=0.0, frontend_token_s=0.0)
    prep = prepare(hw, Precision(), None, OPTS, eng)
    return m, hw, eng, prep


def _coster(small, **front) -> StepCoster:
    m, hw, eng, prep = small
    e = replace(eng, **front)
    return StepCoster(m, hw, replace(prep, engine=e), OPTS)


def test_a_burst_queues_at_the_api_server(small):
    """400 requests at once through one process at 2 ms each: the last reaches the engine
    0.8 s in, so the run lasts at least that, the k-th request's first token comes no sooner
    than k x 2 ms, and requests wait 0.401 s on average ((1 + 400) / 2 x 2 ms) before the
    engine sees them."""
    reqs = synthetic(400, prompt_tokens=100, output_tokens=20)
    cfg = SchedulerConfig()
    res = simulate(reqs, _coster(small, frontend_request_s=2e-3), cfg)
    assert res.duration_s >= 0.8
    for k, r in enumerate(sorted(res.requests, key=lambda r: r.id), start=1):
        assert r.first_token_s >= k * 2e-3 - 1e-12
    d = summary(res)
    assert d["mean_api_server_wait_s"] == pytest.approx(0.401, rel=1e-9)
    base = summary(simulate(reqs, _coster(small), cfg))
    assert base["mean_api_server_wait_s"] == 0.0
    assert d["mean_ttft_ms"] > base["mean_ttft_ms"] + 200


@settings(max_examples=15, deadline=None)
@given(n=st.integers(5, 300), out=st.integers(2, 200), token_us=st.floats(5.0, 200.0),
       servers=st.integers(1, 4))
def test_streaming_caps_output_throughput(small, n, out, token_us, servers):
    """Every decode step takes at least its tokens x token_s / servers, so the tokens after
    each request's first come out no faster than servers / token_s a second."""
    reqs = synthetic(n, prompt_tokens=64, output_tokens=out)
    cfg = SchedulerConfig(api_servers=servers)
    res = simulate(reqs, _coster(small, frontend_token_s=token_us * 1e-6), cfg)
    decoded = sum(r.output_tokens - 1 for r in res.requests)
    assert decoded / res.duration_s <= servers / (token_us * 1e-6) * (1 + 1e-9)


def test_more_api_servers_never_slower(small):
    reqs = synthetic(500, prompt_tokens=64, output_tokens=64)
    c = _coster(small, frontend_request_s=1e-3, frontend_token_s=50e-6)
    one = simulate(reqs, c, SchedulerConfig(api_servers=1))
    four = simulate(reqs, c, SchedulerConfig(api_servers=4))
    assert four.duration_s < one.duration_s
    assert summary(four)["mean_ttft_ms"] < summary(one)["mean_ttft_ms"]


def test_profile_states_its_api_server_costs():
    """vllm's profile carries both costs, each sourced and marked as a guess; the ideal
    engine has none."""
    spec = catalog.load_engine_spec("vllm")
    for p in (spec.frontend_request_us, spec.frontend_token_us):
        assert p is not None and p.source.startswith("https://") and p.estimated
    ideal = catalog.load_engine("ideal")
    assert ideal.frontend_request_s == 0.0 and ideal.frontend_token_s == 0.0


def test_server_command_sets_api_server_count():
    from planner.cli.flags import server_flags

    assert server_flags("vllm serve m --api-server-count 4")["--api-server-count"] == 4
    assert server_flags("vllm serve m -asc=2")["--api-server-count"] == 2


def test_cli_api_server_count(run_cli):
    args = ["simulate", "-m", "llama-3.2-1b", "--gpu", "h100-sxm", "-n", "300", "-p", "100",
            "-o", "20", "--json"]
    (c1, o1, e1), (c4, o4, e4) = (run_cli(*args, "--api-server-count", "1"),
                                  run_cli(*args, "-asc", "4"))
    assert c1 == 0 and c4 == 0, e1 + e4
    d1, d4 = json.loads(o1), json.loads(o4)
    assert (d1["api_servers"], d4["api_servers"]) == (1, 4)
    assert d4["mean_api_server_wait_s"] < d1["mean_api_server_wait_s"]
    assert 0.0 <= d1["api_server_stream_bound_frac"] <= 1.0
    code, out, err = run_cli(*args, "--api-server-count", "0")
    assert code == 2 and "--api-server-count" in err and len(err.strip().splitlines()) == 1
