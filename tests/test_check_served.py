"""`llmplan check`'s served limits: latency and throughput targets held on a replica simulated
at the deployment's traffic (examples/budget-served.yaml), the figures simulate gives for the
same traffic, at the slow end of the served error bands with --at high, and a budget that asks
for them wrongly refused by file, line and field."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from planner.evidence.bands import served_band_factors
from planner.io import catalog

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _budget(tmp_path, body: str) -> str:
    p = tmp_path / "budget.yaml"
    p.write_text(body)
    return str(p)


BASE = """deployments:
  - name: one
    model: llama-3.1-8b
    gpu: {gpu}
    workload: {{prompt_tokens: 512, output_tokens: 128}}
    traffic: {{request_rate: {rate}, replicas: {replicas}, num_requests: 200, seed: 3,
               percentile: {p}}}
    limits:
      served_ttft_s: 10s
      served_tpot_s: 1s
      served_latency_s: 100s
      served_output_tokens_per_s: 1
"""


@pytest.mark.parametrize("gpu, rate, replicas, p, n, window", [
    # the limits' lifetime: min(100 s, 10 s + 127 x 1 s) = 100 s; two lifetimes of window
    # (over 200 requests' 50 s at 4 a second), one lifetime each side: 4 x 400 s
    ("h100-sxm", 8, 2, 90, 1600, (100, 300)),
    # 3 a second: 200 requests arrive in 67 s, under two lifetimes again: 3 x 400 s
    ("a100-sxm-80gb", 3, 1, 50, 1200, (100, 300))])
def test_served_figures_are_what_simulate_gives(gpu, rate, replicas, p, n, window, tmp_path,
                                                run_cli, run_json):
    """A replica at its share of the rate, seed 3, measured at its steady state: the requests
    arriving one request lifetime (at the limits) after the start, over two lifetimes, the
    stream ending a lifetime later. check's figures are simulate's for that traffic and
    window (the A100 has vLLM's 2,048-token step, which the replica's prefill chunk follows
    in both), the throughput every replica's together."""
    code, out, err = run_cli("check", _budget(tmp_path, BASE.format(gpu=gpu, rate=rate,
                                                                    replicas=replicas, p=p)),
                             "--json")
    assert code == 0, err
    results = json.loads(out)["results"]
    got = {r["limit"]: r["predicted"] for r in results}
    run = results[0]["run"]
    assert (run["measure"], run["simulated_requests"]) == ("steady", n)
    assert (run["measured_from_s"], run["measured_to_s"]) == pytest.approx(window)
    s = run_json("simulate", "-m", "llama-3.1-8b", "-g", gpu, "-p", "512", "-o", "128",
                 "--request-rate", str(rate / replicas), "--num-requests", str(n),
                 "--seed", "3", "--measure-window", f"{window[0]},{window[1]}")
    assert run["measured_requests"] == s["measured_requests"] >= 200
    name = "median" if p == 50 else f"p{p}"
    assert got["served_ttft_s"] == pytest.approx(s[f"{name}_ttft_ms"] / 1e3, rel=1e-12)
    assert got["served_tpot_s"] == pytest.approx(s[f"{name}_tpot_ms"] / 1e3, rel=1e-12)
    assert got["served_latency_s"] == pytest.approx(s[f"{name}_e2el_ms"] / 1e3, rel=1e-12)
    # the steady state's: what arrived in the window, every token served (it keeps up)
    assert run["keeps_up"] is True and not run["capped"] and run["lifetime_s"] == window[0]
    assert got["served_output_tokens_per_s"] == pytest.approx(
        s["measured_output_throughput"] * replicas, rel=1e-12)


def test_measure_all_holds_a_run_from_an_empty_replica(tmp_path, run_cli, run_json):
    """``measure: all``: every one of num_requests requests, ramp-up included, as
    ``simulate -n N`` measures them."""
    body = BASE.format(gpu="h100-sxm", rate=8, replicas=2, p=90).replace(
        "seed: 3,", "seed: 3, measure: all,")
    code, out, err = run_cli("check", _budget(tmp_path, body), "--json")
    assert code == 0, err
    results = json.loads(out)["results"]
    got = {r["limit"]: r["predicted"] for r in results}
    assert results[0]["run"] == {"measure": "all", "simulated_requests": 200,
                                 "measured_requests": 200, "measured_from_s": None,
                                 "measured_to_s": None, "lifetime_s": None,
                                 "capped": False, "keeps_up": None}
    s = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "512", "-o", "128",
                 "--request-rate", "4", "--num-requests", "200", "--seed", "3")
    assert got["served_tpot_s"] == pytest.approx(s["p90_tpot_ms"] / 1e3, rel=1e-12)
    assert got["served_ttft_s"] == pytest.approx(s["p90_ttft_ms"] / 1e3, rel=1e-12)


NEAR_CAPACITY = """deployments:
  - name: one
    model: llama-3.1-8b
    gpu: h100-sxm
    workload: {{prompt_tokens: 512, output_tokens: 128}}
    traffic: {{request_rate: 40, num_requests: 200, seed: 3, measure: {measure}}}
    limits:
      served_ttft_s: 1s
      served_tpot_s: 15ms
"""


def test_a_replica_that_meets_a_limit_only_while_it_fills_fails(tmp_path, run_cli):
    """Llama-3.1-8B at 40 requests a second on one H100: the first 200 requests (5 s, the
    batch still filling) have a p90 TPOT of about 14 ms, inside 15 ms; at its steady state
    (the requests arriving 2.9-8.7 s: a lifetime at the limits is 1 s + 127 x 15 ms = 2.905
    s; 465 simulated) about 21 ms. The budget fails, as plan would not size this replica."""
    code, out, _ = run_cli("check", _budget(tmp_path, NEAR_CAPACITY.format(measure="all")),
                           "--json")
    ramp = {r["limit"]: r for r in json.loads(out)["results"]}["served_tpot_s"]
    assert code == 0 and ramp["predicted"] < 0.015
    code, out, _ = run_cli("check", _budget(tmp_path, NEAR_CAPACITY.format(measure="steady")),
                           "--json")
    steady = {r["limit"]: r for r in json.loads(out)["results"]}["served_tpot_s"]
    assert code == 1 and not steady["passed"] and steady["predicted"] > 0.018
    assert steady["run"]["simulated_requests"] == 465  # ceil(40 x 4 x 2.905)
    assert steady["run"]["measured_from_s"] == pytest.approx(2.905)
    assert steady["run"]["measured_to_s"] == pytest.approx(3 * 2.905)


def test_a_throughput_limit_alone_measures_after_the_runs_own_lifetime(tmp_path, run_cli,
                                                                      run_json):
    """No time limit to take a lifetime from: the p90 end-to-end latency of num_requests
    from an empty replica stands for it."""
    body = """deployments:
  - name: one
    model: llama-3.1-8b
    gpu: h100-sxm
    workload: {prompt_tokens: 512, output_tokens: 128}
    traffic: {request_rate: 4, num_requests: 100, seed: 3}
    limits:
      served_output_tokens_per_s: 1
"""
    code, out, err = run_cli("check", _budget(tmp_path, body), "--json")
    assert code == 0, err
    run = json.loads(out)["results"][0]["run"]
    first = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "512", "-o",
                     "128", "--request-rate", "4", "--num-requests", "100", "--seed", "3")
    life = first["p90_e2el_ms"] / 1e3
    assert run["measured_from_s"] == pytest.approx(life)
    # 100 requests arrive in 25 s, longer than two lifetimes of about 1 s
    assert run["measured_to_s"] == pytest.approx(life + 25)
    assert run["simulated_requests"] == math.ceil(4 * (25 + 2 * life))


def test_the_served_example_passes_and_fails_at_the_slow_end(run_cli):
    code, out, _ = run_cli("check", str(EXAMPLES / "budget-served.yaml"), "--json")
    assert code == 0
    rows = json.loads(out)["results"]
    assert {r["limit"] for r in rows} >= {"served_ttft_s", "served_tpot_s", "served_latency_s",
                                          "served_output_tokens_per_s", "fits"}
    code, out, _ = run_cli("check", str(EXAMPLES / "budget-served.yaml"), "--at", "high",
                           "--json")
    assert code == 1
    high = [r for r in json.loads(out)["results"] if r["limit"].startswith("served")]
    assert all(r["at"] == "high" and "every step x" in r["band"] for r in high)
    nominal = {(r["deployment"], r["limit"]): r["predicted"] for r in rows}
    for r in high:  # the prediction beside the slow end is the prediction at predicted
        assert r["prediction"] == pytest.approx(nominal[(r["deployment"], r["limit"])])


def test_a_lightly_loaded_replica_at_the_slow_end_decodes_its_steps_slower(tmp_path, run_cli):
    """At 0.2 req/s a replica decodes one request at a time: every step slowed by the served
    TPOT band's high end makes its TPOT that many times the prediction."""
    step = served_band_factors(catalog.load_bands(), "vllm")[0]["step_factor"]
    body = BASE.format(gpu="h100-sxm", rate=0.2, replicas=1, p=50)
    code, out, err = run_cli("check", _budget(tmp_path, body), "--at", "high", "--json")
    assert code == 0, err
    tpot = next(r for r in json.loads(out)["results"] if r["limit"] == "served_tpot_s")
    assert tpot["predicted"] / tpot["prediction"] == pytest.approx(step, rel=0.02)
    assert step > 1


def test_the_ideal_engine_is_held_as_predicted(tmp_path, run_cli):
    body = BASE.format(gpu="h100-sxm", rate=1, replicas=1, p=90).replace(
        "    gpu: h100-sxm\n", "    gpu: h100-sxm\n    engine: ideal\n")
    code, out, err = run_cli("check", _budget(tmp_path, body), "--at", "high", "--json")
    assert code == 0, err
    assert {r["at"] for r in json.loads(out)["results"]} == {"predicted"}


def test_a_broken_served_limit_fails_with_its_margin(tmp_path, run_cli):
    body = BASE.format(gpu="h100-sxm", rate=1, replicas=1, p=90).replace(
        "served_tpot_s: 1s", "served_tpot_s: 1ms")
    code, out, _ = run_cli("check", _budget(tmp_path, body), "--json")
    assert code == 1
    r = next(r for r in json.loads(out)["results"] if r["limit"] == "served_tpot_s")
    assert not r["passed"] and r["margin_frac"] == pytest.approx(
        (0.001 - r["predicted"]) / 0.001)


@pytest.mark.parametrize("edit, says", [
    (("    traffic: {request_rate: 1, replicas: 1, num_requests: 200, seed: 3,\n"
      "               percentile: 90}\n", ""), "served_ttft_s: a served limit needs"),
    (("served_ttft_s: 10s", "ttft_s: 10s"), None),  # still served limits: passes below
    (("percentile: 90", "percentile: 95"), "percentile"),
    (("request_rate: 1,", "request_rate: 0,"), "request_rate"),
    (("request_rate: 1,", "request_rate: .nan,"), "request_rate"),
    (("served_tpot_s: 1s", "served_tpot_s: fast"), "served_tpot_s"),
    (("seed: 3,", "seed: 3, measure: ramp,"), "measure"),
])
def test_a_bad_served_budget_is_named_in_one_line(edit, says, tmp_path, run_cli):
    body = BASE.format(gpu="h100-sxm", rate=1, replicas=1, p=90).replace(*edit)
    code, _, err = run_cli("check", _budget(tmp_path, body))
    if says is None:
        assert code == 0
        return
    assert code == 2 and says in err and "budget.yaml" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_traffic_without_a_served_limit_is_refused(tmp_path, run_cli):
    body = """deployments:
  - model: llama-3.1-8b
    gpu: h100-sxm
    traffic: {request_rate: 1}
    limits: {tpot_s: 1s}
"""
    code, _, err = run_cli("check", _budget(tmp_path, body))
    assert code == 2 and "traffic: no served limit" in err


@pytest.mark.parametrize("mode, engine, code, says", [
    ("throughput", "vllm", 0, None),
    ("throughput", "sglang", 2, "performance_mode: throughput: an option of vLLM 0.17"),
    ("fast", "vllm", 2, "performance_mode"),
])
def test_a_served_deployment_may_run_under_vllms_performance_mode(mode, engine, code, says,
                                                                  tmp_path, run_cli):
    body = BASE.format(gpu="h100-sxm", rate=1, replicas=1, p=90).replace(
        "    gpu: h100-sxm\n", f"    gpu: h100-sxm\n    engine: {engine}\n"
                            f"    performance_mode: {mode}\n")
    got, out, err = run_cli("check", _budget(tmp_path, body), "--json")
    assert got == code, err
    if says is not None:
        assert says in err and len(err.strip().splitlines()) == 1


def test_a_performance_mode_without_traffic_is_refused(tmp_path, run_cli):
    body = """deployments:
  - model: llama-3.1-8b
    gpu: h100-sxm
    performance_mode: throughput
    limits: {tpot_s: 1s}
"""
    code, _, err = run_cli("check", _budget(tmp_path, body))
    assert code == 2 and "performance_mode: it sets the served replica" in " ".join(err.split())


def test_a_served_budget_takes_sharegpts_lengths_as_simulate_does(tmp_path, run_cli, run_json):
    """dataset_name: sharegpt draws ShareGPT's published length shape at the workload's means
    (planner/data/lengths), as simulate --dataset-name sharegpt does: the same figures."""
    body = BASE.format(gpu="h100-sxm", rate=6, replicas=1, p=90).replace(
        "num_requests: 200,", "num_requests: 200, dataset_name: sharegpt,")
    code, out, err = run_cli("check", _budget(tmp_path, body), "--json")
    assert code == 0, err
    results = json.loads(out)["results"]
    got, run = {r["limit"]: r["predicted"] for r in results}, results[0]["run"]
    s = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "512", "-o", "128",
                 "--dataset-name", "sharegpt", "--request-rate", "6", "--num-requests",
                 str(run["simulated_requests"]), "--seed", "3", "--measure-window",
                 f"{run['measured_from_s']!r},{run['measured_to_s']!r}")
    assert got["served_tpot_s"] == pytest.approx(s["p90_tpot_ms"] / 1e3, rel=1e-12)
    assert got["served_ttft_s"] == pytest.approx(s["p90_ttft_ms"] / 1e3, rel=1e-12)
    random = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "512", "-o",
                      "128", "--request-rate", "6", "--num-requests",
                      str(run["simulated_requests"]), "--seed", "3", "--measure-window",
                      f"{run['measured_from_s']!r},{run['measured_to_s']!r}")
    assert random["p90_ttft_ms"] != s["p90_ttft_ms"]  # the shape is not the fixed lengths'
    code, _, err = run_cli("check", _budget(tmp_path, body.replace("sharegpt", "alpaca")))
    assert code == 2 and "traffic dataset_name: 'alpaca' is not one of random, sonnet" in err
    assert "budget.yaml:6: deployment one" in err  # the traffic block's line
    # no lengths in the workload: ShareGPT's own, as simulate draws them without -p / -o
    own = body.replace("    workload: {prompt_tokens: 512, output_tokens: 128}\n", "")
    code, out, err = run_cli("check", _budget(tmp_path, own), "--json")
    assert code == 0, err
    results = json.loads(out)["results"]
    got, run = {r["limit"]: r["predicted"] for r in results}, results[0]["run"]
    s = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--dataset-name",
                 "sharegpt", "--request-rate", "6", "--num-requests",
                 str(run["simulated_requests"]), "--seed", "3", "--measure-window",
                 f"{run['measured_from_s']!r},{run['measured_to_s']!r}")
    assert got["served_tpot_s"] == pytest.approx(s["p90_tpot_ms"] / 1e3, rel=1e-12)
    assert s["total_input_tokens"] < 300 * run["simulated_requests"]  # not 1,024 each


OVERLOADED = """deployments:
  - name: over
    model: llama-3.1-8b
    gpu: h100-sxm
    workload: {{prompt_tokens: 512, output_tokens: 128}}
    traffic: {{request_rate: {rate}{extra}}}
    limits:
      served_latency_s: {limit}
"""


@pytest.mark.parametrize("limit", ["10s", "30s"])
def test_a_replica_that_does_not_keep_up_fails_its_time_limits(limit, tmp_path, run_cli):
    """56 requests a second of 512 / 128 tokens on one H100: the replica finishes about 46
    a second of the 55 arriving in the window, so its queue grows through it and its p90
    latency there is whatever the window's length makes it (9 s over 10-30 s, more later):
    a looser limit only measures later. It fails, saying so; ``measure: all`` (every request
    from an empty replica, no window) is held as it was."""
    body = OVERLOADED.format(rate=56, extra="", limit=limit)
    code, out, _ = run_cli("check", _budget(tmp_path, body), "--json")
    r = json.loads(out)["results"][0]
    assert code == 1 and not r["passed"] and r["margin_frac"] is None
    assert "does not keep up: finishes" in r["what"] and r["run"]["keeps_up"] is False
    assert r["predicted"] < float(limit.removesuffix("s"))  # the latency alone would pass
    code, out, _ = run_cli("check", _budget(tmp_path, body))
    assert "does not keep up: its queue grows" in " ".join(out.split())
    code, out, _ = run_cli("check", _budget(tmp_path, OVERLOADED.format(
        rate=56, extra=", measure: all", limit=limit)), "--json")
    r = json.loads(out)["results"][0]
    assert r["run"]["keeps_up"] is None and "keep up" not in r["what"]


def test_a_replica_that_keeps_up_is_held_on_its_latency(tmp_path, run_cli):
    code, out, _ = run_cli("check", _budget(tmp_path, OVERLOADED.format(
        rate=8, extra="", limit="10s")), "--json")
    r = json.loads(out)["results"][0]
    assert code == 0 and r["run"]["keeps_up"] is True and r["margin_frac"] > 0


def test_a_run_capped_short_of_a_steady_state_says_so(tmp_path, run_cli):
    """A million requests a second: 5,000 requests arrive in 5 ms, so the window cannot
    start a lifetime after the start; the line says the run was capped, and the throughput
    is the whole run's (no request finishes within the 2.5 ms window)."""
    body = OVERLOADED.format(rate="1e6", extra="", limit="10s").replace(
        "      served_latency_s: 10s\n", "      served_latency_s: 10s\n"
        "      served_output_tokens_per_s: 1\n")
    code, out, _ = run_cli("check", _budget(tmp_path, body), "--json")
    rows = {r["limit"]: r for r in json.loads(out)["results"]}
    run = rows["served_latency_s"]["run"]
    assert run["capped"] and run["simulated_requests"] == 5000 and run["lifetime_s"] == 10
    assert run["measured_from_s"] < run["lifetime_s"]
    assert rows["served_output_tokens_per_s"]["predicted"] > 1000
    # 30 a second, a 200 s lifetime: 24,000 requests for a steady window, capped at 5,000
    # (166.7 s of arrivals), the window a quarter of them in from each end
    code, out, _ = run_cli("check", _budget(tmp_path, OVERLOADED.format(
        rate=30, extra="", limit="200s")), "--json")
    run = json.loads(out)["results"][0]["run"]
    assert run["capped"] and run["keeps_up"] is True
    assert (run["measured_from_s"], run["measured_to_s"]) == pytest.approx((5000 / 120,
                                                                            5000 / 40))
    code, out, _ = run_cli("check", _budget(tmp_path, OVERLOADED.format(
        rate=30, extra="", limit="200s")))
    assert "capped at 5,000 requests" in " ".join(out.split())


def test_at_the_slow_end_the_window_starts_after_the_slower_replicas_lifetime(tmp_path,
                                                                             run_cli):
    """A throughput limit alone, held at the slow end: the lifetime is the longer of the
    predicted and the slowed replica's p90 end-to-end latency (the slower replica fills
    later), and its steady output is what arrives, served: 8 x 256 tokens a second, about."""
    body = """deployments:
  - name: t
    model: llama-3.1-8b
    gpu: h100-sxm
    workload: {prompt_tokens: 1024, output_tokens: 256}
    traffic: {request_rate: 8}
    limits:
      served_output_tokens_per_s: 2k
"""
    code, out, _ = run_cli("check", _budget(tmp_path, body), "--json")
    nominal = json.loads(out)["results"][0]
    code, out, _ = run_cli("check", _budget(tmp_path, body), "--at", "high", "--json")
    high = json.loads(out)["results"][0]
    assert code == 0 and high["run"]["keeps_up"] is True
    step = served_band_factors(catalog.load_bands(), "vllm")[0]["step_factor"]
    assert step > 1.05  # vLLM's served TPOT band's high end: x1.10 on 2026-12-05
    assert high["run"]["lifetime_s"] > step * nominal["run"]["lifetime_s"]
    assert high["predicted"] == pytest.approx(2048, rel=0.05)
