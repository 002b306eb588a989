"""`llmplan check`'s served limits: latency and throughput targets held on a replica simulated
at the deployment's traffic (examples/budget-served.yaml), the figures simulate gives for the
same traffic, at the slow end of the served error bands with --at high, and a budget that asks
for them wrongly refused by file, line and field."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("gpu, rate, replicas, p", [("h100-sxm", 8, 2, 90),
                                                    ("a100-sxm-80gb", 3, 1, 50)])
def test_served_figures_are_what_simulate_gives(gpu, rate, replicas, p, tmp_path, run_cli,
                                                run_json):
    """A replica at its share of the rate, 200 requests, seed 3: check's figures are
    simulate's for that traffic (the A100 has vLLM's 2,048-token step, which the replica's
    prefill chunk follows in both), the throughput every replica's together."""
    code, out, err = run_cli("check", _budget(tmp_path, BASE.format(gpu=gpu, rate=rate,
                                                                    replicas=replicas, p=p)),
                             "--json")
    assert code == 0, err
    got = {r["limit"]: r["predicted"] for r in json.loads(out)["results"]}
    s = run_json("simulate", "-m", "llama-3.1-8b", "-g", gpu, "-p", "512", "-o", "128",
                 "--request-rate", str(rate / replicas), "--num-requests", "200",
                 "--seed", "3")
    name = "median" if p == 50 else f"p{p}"
    assert got["served_ttft_s"] == pytest.approx(s[f"{name}_ttft_ms"] / 1e3, rel=1e-12)
    assert got["served_tpot_s"] == pytest.approx(s[f"{name}_tpot_ms"] / 1e3, rel=1e-12)
    assert got["served_latency_s"] == pytest.approx(s[f"{name}_e2el_ms"] / 1e3, rel=1e-12)
    assert got["served_output_tokens_per_s"] == pytest.approx(
        s["output_throughput"] * replicas, rel=1e-12)


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
    got = {r["limit"]: r["predicted"] for r in json.loads(out)["results"]}
    s = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "512", "-o", "128",
                 "--dataset-name", "sharegpt", "--request-rate", "6", "--num-requests", "200",
                 "--seed", "3")
    assert got["served_tpot_s"] == pytest.approx(s["p90_tpot_ms"] / 1e3, rel=1e-12)
    assert got["served_ttft_s"] == pytest.approx(s["p90_ttft_ms"] / 1e3, rel=1e-12)
    random = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "512", "-o",
                      "128", "--request-rate", "6", "--num-requests", "200", "--seed", "3")
    assert random["p90_ttft_ms"] != s["p90_ttft_ms"]  # the shape is not the fixed lengths'
    code, _, err = run_cli("check", _budget(tmp_path, body.replace("sharegpt", "alpaca")))
    assert code == 2 and "traffic dataset_name: 'alpaca' is not one of random, sonnet" in err
