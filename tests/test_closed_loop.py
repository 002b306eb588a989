"""A closed loop of clients (``vllm bench serve --max-concurrency``) sends each next request
when the client has the last one whole: the engine's finish plus the request path outside its
steps (planner/serving/arrivals.py ``ClosedLoop.release``). By identity in the simulator, and
against the start times Scicom published for a vLLM 0.15 run whose clients stay in step."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.estimate import prepare
from planner.core.specs import Options, Precision
from planner.io import catalog
from planner.serving.config import SchedulerConfig
from planner.serving.cost import StepCoster
from planner.serving.sim import simulate
from planner.serving.traffic import synthetic

OPTS = Options()
SERVED = Path(__file__).resolve().parent.parent / "planner" / "data" / "served"


@pytest.fixture(scope="module")
def small():
    m, hw = catalog.load_model("llama-3.2-1b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("vllm")
    return m, hw, eng, prepare(hw, Precision(), None, OPTS, eng)


def _coster(small, **path) -> StepCoster:
    m, hw, eng, prep = small
    return StepCoster(m, hw, replace(prep, engine=replace(eng, **path)), OPTS)


@settings(max_examples=25, deadline=None)
@given(clients=st.integers(1, 12), n=st.integers(1, 60), prompt=st.integers(16, 3000),
       out=st.integers(1, 80), ratio=st.sampled_from([0.0, 0.5, 0.9]),
       path_ms=st.floats(0.0, 80.0), token_us=st.floats(0.0, 20.0), seed=st.integers(0, 9))
def test_each_client_sends_when_it_has_its_last_answer(small, clients, n, prompt, out, ratio,
                                                       path_ms, token_us, seed):
    """The first ``clients`` requests go out at t = 0; every later one at the moment some
    client had its previous one whole, so the later send times are the earliest finishes as
    the clients saw them (the request path included), one for one."""
    reqs = synthetic(n, prompt_tokens=prompt, output_tokens=out, range_ratio=ratio,
                     closed_loop=True, seed=seed)
    c = _coster(small, request_overhead_s=path_ms * 1e-3, prompt_token_overhead_s=token_us * 1e-6)
    res = simulate(reqs, c, SchedulerConfig(max_concurrency=clients))
    sent = sorted(r.arrival_s for r in res.requests)
    seen = sorted(r.finish_s for r in res.requests)
    k = min(clients, n)
    assert sent[:k] == [0.0] * k
    assert sent[k:] == pytest.approx(seen[:n - k], rel=1e-12, abs=1e-12)
    for r in res.requests:  # and no request is sent before the one it follows had finished
        assert r.first_token_s > r.arrival_s


def test_a_path_longer_than_the_spread_keeps_clients_in_step(small):
    """Fixed lengths, eight clients: every request finishes within a few decode steps of the
    others sent with it. With a request path (50 ms) longer than that spread, a client's next
    request reaches the engine after the engine has finished the whole wave, so no prefill
    slows the wave's last decodes and every wave after the first goes out within that spread
    again; the path is in each TTFT once."""
    reqs = synthetic(64, prompt_tokens=2000, output_tokens=40, closed_loop=True)
    res = simulate(reqs, _coster(small, request_overhead_s=0.05, prompt_token_overhead_s=0.0),
                   SchedulerConfig(max_concurrency=8))
    by_sent = sorted(res.requests, key=lambda r: r.arrival_s)
    for w in range(8):
        wave = by_sent[8 * w: 8 * w + 8]
        assert wave[-1].arrival_s - wave[0].arrival_s < 0.05
        if w:  # the engine saw none before it had finished the wave before
            assert wave[0].arrival_s >= max(r.finish_s for r in by_sent[8 * w - 8: 8 * w]) - 0.05
    assert min(r.ttft_s for r in res.requests) > 0.05


def _waves(times: np.ndarray, gap_s: float = 0.2) -> list[np.ndarray]:
    t = np.sort(times)
    return np.split(t, np.where(np.diff(t) > gap_s)[0] + 1)


def test_scicom_vllm_clients_in_step(run_cli, tmp_path):
    """Scicom's vLLM 0.15 run of Qwen3-8B at TP 8 on H100s, 10 clients, 4,096 prompt and 128
    output tokens (planner/data/served/maq-vllm-qwen3-8b-h100-tp8-in4096-c10.json): its
    requests go out in waves of 10 about 48 ms wide (median), each wave's prompts prefilled
    two a step, so the mean TTFT is 213 ms, five steps' worth, and the decodes run without
    prefills beside them (mean TPOT 4.51 ms). A loop whose clients send the moment the engine
    is done drifts out of step (one request's prefill slows the last decodes of the rest) and
    came to TTFT 95 ms (-55%) and TPOT 6.0 ms (+33%)."""
    pub = json.loads((SERVED / "maq-vllm-qwen3-8b-h100-tp8-in4096-c10.json").read_text())
    measured = _waves(np.array(pub["start_times"]))
    assert np.median([len(w) for w in measured]) == 10
    trace = tmp_path / "trace.csv"
    code, out, err = run_cli("simulate", "-m", "qwen3-8b", "-g", "h100-sxm", "-tp", "8",
                             "-e", "vllm", "--max-concurrency", "10", "-n", "500", "-p", "4096",
                             "-o", "128", "--range-ratio", "0", "--trace", str(trace), "--json")
    assert code == 0, err
    d = json.loads(out)
    with trace.open() as f:
        sent = np.array([float(r["arrival_s"]) for r in csv.DictReader(f)])
    waves = _waves(sent)
    assert [len(w) for w in waves] == [10] * 50
    width = np.median([w[-1] - w[0] for w in waves])
    assert width <= np.median([w[-1] - w[0] for w in measured])
    assert d["mean_ttft_ms"] == pytest.approx(pub["mean_ttft_ms"], rel=0.2)
    assert d["mean_tpot_ms"] == pytest.approx(pub["mean_tpot_ms"], rel=0.1)


def test_a_rate_beside_the_cap_paces_the_loop():
    """``--request-rate`` and ``--max-concurrency`` together (vllm bench serve makes each
    request's task at its arrival time; the task waits on a semaphore of N and starts its clock
    once it holds it): a request goes out at its time or when a client is free, whichever is
    later."""
    from collections import deque

    from planner.serving.arrivals import ClosedLoop
    from planner.serving.requests import RequestResult, SimRequest

    reqs = [SimRequest.of(RequestResult(i, t, 8, 2)) for i, t in
            enumerate((0.0, 0.1, 0.2, 5.0))]
    loop, waiting = ClosedLoop(reqs, 2), deque()
    assert loop.next_s() == 0.0
    loop.arrive(0.05, waiting)  # the second is not due before 0.1, though a client is free
    assert [q.r.arrival_s for q in waiting] == [0.0] and loop.next_s() == 0.1
    loop.arrive(0.5, waiting)  # the third (due 0.2) waits for a client
    assert [q.r.arrival_s for q in waiting] == [0.0, 0.1] and math.isnan(loop.next_s())
    loop.release(1.0)  # a client free at 1.0 sends the third then, late
    assert loop.next_s() == 1.0
    loop.arrive(1.2, waiting)
    assert waiting[-1].id == 2 and waiting[-1].r.arrival_s == 1.0
    loop.release(1.5)  # free at 1.5, but the fourth is due at 5.0
    assert loop.next_s() == 5.0
    loop.arrive(4.9, waiting)
    assert len(waiting) == 3
    loop.arrive(6.0, waiting)
    assert waiting[-1].id == 3 and waiting[-1].r.arrival_s == 5.0 and loop.arrived == 4


@settings(max_examples=20, deadline=None)
@given(clients=st.integers(1, 10), n=st.integers(1, 50), rate=st.floats(0.5, 400.0),
       prompt=st.integers(16, 2000), out=st.integers(1, 60), seed=st.integers(0, 9))
def test_a_paced_loop_sends_no_request_early_and_holds_at_most_its_clients(
        small, clients, n, rate, prompt, out, seed):
    """Each request goes out no earlier than its arrival time, and when it goes out fewer
    than ``clients`` others are in flight; a cap no smaller than the stream changes nothing
    (the open stream's figures), and an infinite rate leaves the plain closed loop."""
    from planner.serving.metrics import summary

    timed = synthetic(n, prompt_tokens=prompt, output_tokens=out, request_rate=rate, seed=seed)
    c = _coster(small, request_overhead_s=0.01, prompt_token_overhead_s=1e-6)
    res = simulate(timed, c, SchedulerConfig(max_concurrency=clients))
    due = {q.id: q.arrival_s for q in timed}
    done = sorted(r.finish_s for r in res.requests)
    for r in res.requests:
        assert r.arrival_s >= due[r.id]
        in_flight = sum(1 for s in res.requests if s.arrival_s < r.arrival_s) - \
            sum(1 for f in done if f <= r.arrival_s)
        assert in_flight < clients
    uncapped = simulate(timed, c, SchedulerConfig(max_concurrency=n))
    open_stream = simulate(timed, c, SchedulerConfig())
    assert summary(uncapped) == summary(open_stream)
    untimed = synthetic(n, prompt_tokens=prompt, output_tokens=out, closed_loop=True, seed=seed)
    at_once = [replace(q, arrival_s=0.0) for q in untimed]
    assert summary(simulate(untimed, c, SchedulerConfig(max_concurrency=clients))) == \
        summary(simulate(at_once, c, SchedulerConfig(max_concurrency=clients)))


def test_runpod_vllm_run_capped_beside_its_rate():
    """A vLLM 0.18 run of Qwen3-8B on one H100 (adithyaJRunpod/vllm_bench, held out): 1,024
    requests of 128 + 128 tokens at 90 req/s with at most 128 in flight. The cap held it to
    76.4 req/s and a mean ITL of 11.5 ms; replayed at the rate alone, the simulated server
    took up to 300-odd requests at once and came to 33 ms (+187%)."""
    from planner.cli.validate import replay_setup, replayed_runs
    from planner.evidence.compare import simulate_run

    ds, folder = next((d, f) for d, f in catalog.load_served()
                      if d.source.id == "runpod-vllm-bench")
    entry = ds.entry("rpvb-20260331-225633-batched-tokens-4096")
    [run] = replayed_runs(entry, folder, ds)
    sim, notes = simulate_run(run, replay_setup(entry, catalog.load_engine_spec("vllm"), folder))
    assert run.metrics["mean_itl_s"] == pytest.approx(0.01149, abs=1e-5)
    assert sim["mean_itl_ms"] / 1e3 == pytest.approx(run.metrics["mean_itl_s"], rel=0.25)
    assert sim["max_running_requests"] <= 128
    assert sim["request_throughput"] == pytest.approx(76.37, rel=0.15)
    assert any("at most 128 requests in flight" in x for x in notes)


def test_simulate_takes_a_rate_and_a_cap_together(run_cli):
    """`simulate --request-rate R --max-concurrency N`: at most N in flight, the rate kept in
    the JSON, and the server held below the rate where N is what limits it."""
    args = ("simulate", "-m", "llama-3.2-1b", "-g", "h100-sxm", "-n", "200", "-p", "512",
            "-o", "64", "--range-ratio", "0", "--json")
    code, out, err = run_cli(*args, "--request-rate", "200", "--max-concurrency", "4")
    assert code == 0, err
    d = json.loads(out)
    assert d["arrivals"] == "rate and closed loop" and d["request_rate"] == 200
    assert d["max_concurrency"] == 4 and d["max_running_requests"] <= 4
    assert d["request_throughput"] < 0.9 * 200
    code, out, err = run_cli(*args, "--request-rate", "200")
    assert code == 0, err
    assert json.loads(out)["max_running_requests"] > 4


def _drawn_stream(n, prompt, out, ratio, rate, closed, seed, prefix):
    """synthetic's stream as its loop draws it, with no shortcut: a prompt length, an output
    length and (when timed) a gap per request, from one generator."""
    import random

    from planner.serving.traffic import Request, length_range

    rng = random.Random(seed)
    (p_lo, p_hi), (o_lo, o_hi) = length_range(prompt, ratio), length_range(out, ratio)
    timed = not closed and not math.isinf(rate)
    t, reqs = 0.0, []
    for i in range(n):
        p, o = rng.randrange(p_lo, p_hi + 1), rng.randrange(o_lo, o_hi + 1)
        reqs.append(Request(i, t if timed else (math.nan if closed else 0.0), prefix + p, o,
                            *((0, prefix) if prefix else (-1, 0))))
        if timed:
            t += rng.gammavariate(1.0, 1.0 / rate)
    return reqs


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), prompt=st.integers(1, 3000), out=st.integers(1, 300),
       ratio=st.sampled_from([0.0, 0.0, 0.3, 0.9]),
       rate=st.sampled_from([math.inf, 0.5, 40.0]), closed=st.booleans(),
       seed=st.integers(0, 50), prefix=st.sampled_from([0, 0, 128]))
def test_synthetic_stream_is_the_drawn_one(n, prompt, out, ratio, rate, closed, seed, prefix):
    """Fixed lengths sent at once skip the draws (nothing is drawn after them): the stream is
    still the one the drawing loop gives, request for request, for every seed."""
    got = synthetic(n, prompt_tokens=prompt, output_tokens=out, range_ratio=ratio,
                    request_rate=rate, closed_loop=closed, seed=seed, prefix_tokens=prefix)
    want = _drawn_stream(n, prompt, out, ratio, rate, closed, seed, prefix)
    key = [(r.id, repr(r.arrival_s), r.prompt_tokens, r.output_tokens, r.prefix_id,
            r.prefix_tokens) for r in got]
    assert key == [(r.id, repr(r.arrival_s), r.prompt_tokens, r.output_tokens, r.prefix_id,
                    r.prefix_tokens) for r in want]
