"""`llmplan check` budgets (exit codes, JUnit, annotations, errors) and `llmplan plan`."""

from __future__ import annotations

import itertools
import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from planner.core.estimate import estimate
from planner.core.specs import DType, Parallelism, Precision, Workload
from planner.evidence.budget import parse_quantity
from planner.io import catalog
from planner.search.plan import Targets, pareto_front, search

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize("text,kind,value", [
    ("50ms", "time", 0.05), ("2s", "time", 2.0), ("300us", "time", 3e-4), (1.5, "time", 1.5),
    ("80%", "frac", 0.8), ("0.8", "frac", 0.8), ("$0.50", "usd", 0.5), ("1.5k", "number", 1500),
])
def test_units(text, kind, value):
    assert parse_quantity(text, kind) == pytest.approx(value)


@pytest.mark.parametrize("text,kind", [("50 parsecs", "time"), ("fast", "time"), ("80 %%", "frac"),
                                       (True, "number")])
def test_bad_units(text, kind):
    with pytest.raises(ValueError):
        parse_quantity(text, kind)


def test_passing_budget_exit_0(run_json, run_cli):
    code, out, err = run_cli("check", str(EXAMPLES / "budget.yaml"))
    assert code == 0, err
    assert "11 passed, 0 failed" in out
    d = json.loads(run_cli("check", str(EXAMPLES / "budget.yaml"), "--json")[1])
    assert d["passed"] and len(d["results"]) == 11


def test_failing_budget_exit_1_and_junit(run_cli, tmp_path):
    junit = tmp_path / "j.xml"
    code, out, _ = run_cli("check", str(EXAMPLES / "budget-failing.yaml"), "--junit",
                           str(junit))
    assert code == 1 and "2 failed" in out
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "2"
    assert len(suite.findall("testcase/failure")) == 2


def test_limits_by_hand(run_cli, tmp_path):
    # the same deployment, checked against limits just above and below its prediction by
    # check's default engine
    e = estimate(catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm"),
                 workload=Workload(batch=8, prompt_tokens=1000, output_tokens=100),
                 engine=catalog.load_engine("vllm"))
    tpot_ms = e.tpot_s * 1e3
    for factor, expect in ((1.01, 0), (0.99, 1)):
        b = tmp_path / f"b{factor}.yaml"
        b.write_text(f"""deployments:
  - model: llama-3.1-8b
    gpu: h100-sxm
    workload: {{batch: 8, prompt_tokens: 1000, output_tokens: 100}}
    limits: {{tpot_s: {tpot_ms * factor}ms, throughput_tokens_per_s: {
        e.throughput_tokens_per_s / factor}}}
""")
        code, out, err = run_cli("check", str(b), "--json")
        res = json.loads(out)["results"]
        assert code == (0 if expect == 0 else 1)
        assert [r["passed"] for r in res] == [expect == 0, expect == 0]
        assert res[0]["predicted"] == pytest.approx(e.tpot_s)


@pytest.mark.parametrize("fits,code,rows", [(None, 1, 3), ("false", 0, 3), ("true", 1, 3)])
def test_a_deployment_that_does_not_fit_fails_its_latency_limits(run_cli, tmp_path, fits,
                                                                 code, rows):
    """Llama-3.1-70B in bf16 on one H100: 141 GB of weights (70.6B x 2 bytes) against 80 GB.
    Its TPOT and latency limits pass on paper; without a fits: limit the budget still fails,
    on an implied fits row; fits: false (a budget asserting that it does not fit) passes."""
    b = tmp_path / "b.yaml"
    extra = f", fits: {fits}" if fits else ""
    b.write_text(f"""deployments:
  - model: llama-3.1-70b
    gpu: h100-sxm
    workload: {{batch: 8, prompt_tokens: 1024, output_tokens: 256}}
    limits: {{tpot_s: 60ms, latency_s: 30s{extra}}}
""")
    got, out, err = run_cli("check", str(b), "--json")
    assert got == code, err
    res = json.loads(out)["results"]
    assert len(res) == rows
    assert res[0]["limit"] == "fits" and res[0]["predicted"] is False
    assert res[0]["passed"] == (fits == "false")
    assert ("implied" in res[0]["what"]) == (fits is None)
    assert all(r["passed"] for r in res[1:])


def test_slow_end_of_each_band_by_hand():
    """A time's high end, a rate's low end, the cost at that rate, the MBU at that step."""
    from planner.evidence.bands import Applied
    from planner.evidence.budget import slow_end

    bands = {"tpot_s": Applied(0.010, 0.009, 0.016, 50, 5, "b-tpot", False),
             "throughput_tokens_per_s": Applied(6400.0, 4000.0, 7100.0, 50, 5, "b-thr", False)}
    assert slow_end("tpot_s", 0.010, "max", bands) == (0.016, "b-tpot")
    assert slow_end("throughput_tokens_per_s", 6400.0, "min", bands) == (4000.0, "b-thr")
    cost, why = slow_end("cost_usd_per_million_tokens", 0.48, "max", bands)
    assert cost == pytest.approx(0.48 * 6400 / 4000) and why == "b-thr"
    mbu, _ = slow_end("mbu_min", 0.74, "min", bands)
    assert mbu == pytest.approx(0.74 * 0.010 / 0.016)
    assert slow_end("latency_s", 20.0, "max", bands) is None  # no band given for it
    assert slow_end("memory_frac", 0.3, "max", bands) is None  # no band moves memory


def test_check_at_the_band_slow_end(run_cli, tmp_path):
    """--at high holds each timing limit at its error band's slow end: the example budget's
    70B latency (20 s predicted, 30 s allowed) fails there; a deployment's own `at:` wins,
    and --at takes only predicted or high."""
    from planner.evidence.bands import pick

    code, out, err = run_cli("check", str(EXAMPLES / "budget.yaml"), "--at", "high", "--json")
    assert code == 1, err
    res = {(r["deployment"], r["limit"]): r for r in json.loads(out)["results"]}
    lat = res[("chat-70b-fp8", "latency_s")]
    b = pick(catalog.load_bands(), "vllm", "end-to-end", "batched")
    assert lat["at"] == "high" and not lat["passed"]
    assert lat["predicted"] == pytest.approx(lat["prediction"] * b.high_ratio)
    assert lat["prediction"] <= 30 < lat["predicted"] and "held-out" in lat["band"]
    assert res[("chat-8b", "memory_frac")]["at"] == "predicted"  # no band moves memory
    assert res[("chat-8b", "fits")]["at"] == "predicted"
    body = (EXAMPLES / "budget.yaml").read_text().replace(
        "  - name: chat-70b-fp8\n", "  - name: chat-70b-fp8\n    at: predicted\n")
    assert "at: predicted" in body
    mine = tmp_path / "b.yaml"
    mine.write_text(body)
    code, out, err = run_cli("check", str(mine), "--at", "high", "--json")
    mine_res = {(r["deployment"], r["limit"]): r for r in json.loads(out)["results"]}
    ours = [r for (d, _), r in mine_res.items() if d == "chat-70b-fp8"]
    assert ours and all(r["at"] == "predicted" and r["passed"] for r in ours), out + err
    assert mine_res[("chat-8b", "tpot_s")]["at"] == "high"  # chat-8b is still held there
    code, _, err = run_cli("check", str(EXAMPLES / "budget.yaml"), "--at", "p99")
    assert code == 2 and "--at" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(body.replace("at: predicted", "at: p99"))
    code, _, err = run_cli("check", str(bad))
    assert code == 2 and "deployments.1.at" in err and len(err.strip().splitlines()) == 1, err


def test_github_annotations(run_cli, monkeypatch, capsys):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    code, out, _ = run_cli("check", str(EXAMPLES / "budget-failing.yaml"))
    assert code == 1
    ann = [ln for ln in out.splitlines() if ln.startswith("::error ")]
    # each annotation points at the failing limit's own line
    assert len(ann) == 2 and "line=8," in ann[0] and "line=9," in ann[1]
    assert "TPOT predicted" in ann[1]
    code, out, err = run_cli("check", str(EXAMPLES / "budget-failing.yaml"), "--json")
    json.loads(out)  # stdout stays JSON; the annotations went to stderr
    assert "::error" in err


@pytest.mark.parametrize("body,needle", [
    ("deployments:\n  - model: gpt2\n    gpu: h100-sxm\n    workload: {batch: 1, "
     "prompt_tokens: 8, output_tokens: 8}\n    limits: {tpot_s: 5 parsecs}\n",
     ":5: deployments.0.limits.tpot_s: '5 parsecs' is not a time"),
    ("deployments:\n  - model: gpt2\n    gpu: h100-sxm\n    workload: {batch: 1, "
     "prompt_tokens: 8, output_tokens: 8}\n    limits: {tpot: 5ms}\n",
     "deployments.0.limits.tpot: unknown key"),
    # (a workload left out is the default one, tests/test_defaults.py; limits are not)
    ("deployments:\n  - model: gpt2\n    gpu: h100-sxm\n",
     ":2: deployments.0.limits: missing required field"),
    ("deployments:\n  - model: gpt9\n    gpu: h100-sxm\n    workload: {batch: 1, "
     "prompt_tokens: 8, output_tokens: 8}\n    limits: {}\n", ":2: deployment gpt9"),
    ("deployments: [\n", "malformed YAML"),
    ("deployments: []\n", "deployments: List should have at least 1 item"),
])
def test_bad_budget_exit_2(run_cli, tmp_path, body, needle):
    b = tmp_path / "bad.yaml"
    b.write_text(body)
    code, out, err = run_cli("check", str(b))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


# --------------------------------------------------------------------------- plan

GPUS = ["h100-sxm", "h200", "a100-sxm-80gb"]
TARGETS = Targets(ttft_s=1.5, tpot_s=0.03, requests_per_s=7.0)
BATCHES = [1, 4, 16, 32, 64, 128]


@pytest.fixture(scope="module")
def planned():
    return search(catalog.load_model("llama-3.1-8b"), [catalog.load_hardware(g) for g in GPUS],
                  prompt_tokens=1024, output_tokens=256, targets=TARGETS, tps=[1, 2],
                  weights=[DType.bf16, DType.fp8], kv_cache=[None, DType.fp8],
                  batches=BATCHES)


def _brute_force_costs():
    """Every configuration through the scalar estimator, costed as the plan's docstring says."""
    m = catalog.load_model("llama-3.1-8b")
    out = []
    for g, tp, w, kv, b in itertools.product(GPUS, [1, 2], [DType.bf16, DType.fp8],
                                             [DType.bf16, DType.fp8], BATCHES):
        hw = catalog.load_hardware(g)
        e = estimate(m, hw, precision=Precision(weights=w, kv_cache=kv),
                     parallelism=Parallelism(tp=tp),
                     workload=Workload(batch=b, prompt_tokens=1024, output_tokens=256))
        if not (e.memory.fits and e.ttft_s <= TARGETS.ttft_s and e.tpot_s <= TARGETS.tpot_s):
            continue
        replicas = math.ceil(TARGETS.requests_per_s / (b / e.latency_s))
        cost = replicas * tp * hw.price.usd_per_gpu_hour / (7.0 * 256 * 3600) * 1e6
        out.append((cost, g, tp, w.value, kv.value, b, e))
    return sorted(out, key=lambda x: x[0])


def test_plan_top_meets_targets_and_nothing_is_cheaper(planned):
    top = planned.iloc[0]
    assert top["rank"] == 1 and top["meets_targets"]
    e = estimate(catalog.load_model("llama-3.1-8b"), catalog.load_hardware(top["gpu"]),
                 precision=Precision(weights=DType(top["weights"]),
                                     kv_cache=DType(top["kv_cache"])),
                 parallelism=Parallelism(tp=int(top["tp"])),
                 workload=Workload(batch=int(top["batch"]), prompt_tokens=1024,
                                   output_tokens=256))
    assert e.memory.fits and e.ttft_s <= 1.5 and e.tpot_s <= 0.03
    # replicas serve the traffic
    assert top["replicas"] * top["batch"] / e.latency_s >= 7.0
    brute = _brute_force_costs()
    assert brute, "the brute-force search found nothing"
    assert top["cost_usd_per_million_output_tokens_at_traffic"] == pytest.approx(brute[0][0])
    assert len(planned[planned.meets_targets]) == len(brute)


def test_pareto_front_is_non_dominated(planned):
    feas = planned[planned.meets_targets]
    front = pareto_front(feas)
    c = "cost_usd_per_million_output_tokens_at_traffic"
    for r in front.itertuples():
        dominated = feas[(feas.latency_s < r.latency_s) & (feas[c] < getattr(r, c))]
        assert dominated.empty


def test_plan_cli(run_cli, tmp_path):
    png = tmp_path / "p.png"
    code, out, err = run_cli("plan", "-m", "llama-3.1-8b", "--ttft", "1500ms", "--tpot",
                             "30ms", "--rps", "7", "-p", "1024", "-o", "256", "-g",
                             ",".join(GPUS), "--tp", "1,2", "--weights", "bf16,fp8",
                             "--plot", str(png), "--top", "3", "--scheduler", "static")
    assert code == 0, err
    assert "meet TTFT <= 1500ms" in out and png.stat().st_size > 10_000
    code, out, _ = run_cli("plan", "-m", "llama-3.1-70b", "--ttft", "10ms", "--tpot", "1ms",
                           "--rps", "1", "-g", "h100-sxm")
    assert code == 1 and "no configuration" in out


@pytest.mark.parametrize("args,needle", [
    (["--ttft", "2s", "--tpot", "fast", "--rps", "1"], "--tpot: 'fast' is not a time"),
    (["--ttft", "2s", "--tpot", "50ms"], "exactly one of --rps or --tokens-per-s"),
    (["--ttft", "2s", "--tpot", "50ms", "--rps", "-3"], "--rps: must be positive"),
    (["--ttft", "2s", "--tpot", "50ms", "--rps", "1", "--weights", "fp3"], "--weights: 'fp3'"),
    # a layout the model cannot take is a bad command, not a search that found nothing
    (["--ttft", "2s", "--tpot", "50ms", "--rps", "1", "--tp", "3"],
     "--tp: tp 3 does not divide llama-3.1-8b's 32 attention heads"),
    (["--ttft", "2s", "--tpot", "50ms", "--rps", "1", "--pp", "96"],
     "--pp: pp 96 exceeds the model's 32 layers"),
    (["--ttft", "2s", "--tpot", "50ms", "--rps", "1", "--tp", "3,5"],
     "--tp: none of 3, 5 runs llama-3.1-8b"),
])
def test_plan_bad_input(run_cli, args, needle):
    code, _, err = run_cli("plan", "-m", "llama-3.1-8b", *args)
    assert code == 2 and needle in err


def test_a_deployment_names_its_engine(run_cli, tmp_path):
    preds = {}
    for eng in ("ideal", "vllm", "hf-eager"):
        b = tmp_path / f"{eng}.yaml"
        b.write_text(f"""deployments:
  - model: llama-3.1-8b
    gpu: h100-sxm
    engine: {eng}
    workload: {{batch: 8, prompt_tokens: 1000, output_tokens: 100}}
    limits: {{tpot_s: 1s}}
""")
        code, out, err = run_cli("check", str(b), "--json")
        assert code == 0, err
        preds[eng] = json.loads(out)["results"][0]["predicted"]
    assert preds["ideal"] < preds["vllm"] < preds["hf-eager"]
    b = tmp_path / "bad.yaml"
    b.write_text(b_text := (tmp_path / "vllm.yaml").read_text().replace("vllm", "nope"))
    assert "nope" in b_text
    code, _, err = run_cli("check", str(b))
    assert code == 2 and "unknown engine 'nope'" in err


def test_continuous_plan_sizes_the_fewest_replicas(run_cli):
    """Each row's replica count is the fewest whose share of the traffic, simulated, keeps
    p90 TTFT and TPOT within the targets in the run's steady state (the requests arriving
    from one lifetime at the targets, 1 + 0.03 x 127 = 4.81 s, for at least two lifetimes
    and 150 requests): one replica fewer misses them."""
    from planner.core.estimate import prepare
    from planner.core.specs import Options, Precision
    from planner.search.plan import (
        SimSettings,
        Targets,
        _percentile_ok,
        request_lifetime_s,
        search_continuous,
        sizing_requests,
    )
    from planner.serving.cost import StepCoster
    from planner.serving.metrics import summary
    from planner.serving.sim import SchedulerConfig, simulate
    from planner.serving.traffic import synthetic

    m = catalog.load_model("llama-3.1-8b")
    gpus = [catalog.load_hardware(g) for g in ("h100-sxm", "a100-sxm-80gb")]
    eng = catalog.load_engine("vllm")
    targets = Targets(1.0, 0.03, 12.0)
    st = SimSettings(num_requests=150)
    df = search_continuous(m, gpus, prompt_tokens=1024, output_tokens=128, targets=targets,
                           tps=(1, 2), weights=(DType.bf16, DType.fp8), kv_cache=(None,),
                           engine=eng, settings=st, top=3)
    assert len(df) and list(df["rank"]) == list(range(1, len(df) + 1))
    assert (df["usd_per_hour"] >= df["lower_bound_usd_per_hour"] - 1e-9).all()
    assert df["usd_per_hour"].is_monotonic_increasing
    top = df.iloc[0]
    hw = catalog.load_hardware(top["gpu"])
    prep = prepare(hw, Precision.of(top["weights"]), None, Options(), eng)
    coster = StepCoster(m, hw, prep, Options(), tp=int(top["tp"]))

    life = request_lifetime_s(targets, 128)
    assert life == pytest.approx(1.0 + 0.03 * 127)

    def ok(n: int) -> bool:
        rate = targets.requests_per_s / n
        count, window = sizing_requests(rate, life, st)
        assert window[0] == pytest.approx(life)
        assert window[1] - window[0] >= max(2 * life, 150 / rate) - 1e-9
        reqs = synthetic(count, prompt_tokens=1024, output_tokens=128, request_rate=rate,
                         seed=0)
        s = summary(simulate(reqs, coster, SchedulerConfig()), window=window)
        assert s["measured_requests"] < s["completed"]  # ramp-up and drain left out
        return _percentile_ok(s, targets, SimSettings(percentile=90))

    n = int(top["replicas"])
    assert ok(n)
    assert n == 1 or not ok(n - 1)
    assert top["rate_per_replica"] == pytest.approx(12.0 / n)
    assert top["p90_ttft_s"] <= 1.0 and top["p90_tpot_s"] <= 0.03


def test_continuous_plan_cli(run_cli, tmp_path):
    code, out, err = run_cli("plan", "-m", "llama-3.1-8b", "--ttft", "1s", "--tpot", "30ms",
                             "--rps", "5", "-g", "h100-sxm", "--tp", "1", "--weights", "bf16",
                             "--sim-requests", "100", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert rows[0]["scheduler"] == "continuous" and rows[0]["percentile"] == 90
    for args, needle in ((["--percentile", "75"], "--percentile"),
                         (["--scheduler", "dynamic"], "--scheduler"),
                         (["--rps", "nan"], "--rps"), (["--plot", "x.txt"], ".png")):
        base = ["plan", "-m", "llama-3.1-8b", "--ttft", "1s", "--tpot", "30ms", "-g",
                "h100-sxm"]
        if "--rps" not in args:
            base += ["--rps", "5"]
        code, _, err = run_cli(*base, *args)
        assert code == 2 and needle in err, (args, err)


@pytest.mark.slow
def test_plan_says_which_gpus_it_left_out_for_want_of_a_price(run_cli, tmp_path):
    """A GPU with no price (a hardware_db copy without its price block; H20 and Gaudi 3 have
    none in hardware_db): a plan over only such GPUs is a usage error that says so, not 'no
    configuration meets the targets'; beside a priced GPU they are named."""
    import yaml

    unpriced = []
    for name in ("h100-pcie", "h100-nvl"):
        d = yaml.safe_load((catalog.db_dir("hardware_db") / f"{name}.yaml").read_text())
        d.pop("price", None)
        d["name"] = f"{name}-unpriced"
        path = tmp_path / f"{name}-unpriced.yaml"
        path.write_text(yaml.safe_dump(d))
        unpriced.append(str(path))
    base = ["plan", "-m", "llama-3.1-8b", "--ttft", "2s", "--tpot", "50ms", "--rps", "1",
            "--top", "1", "--tp", "1", "--weights", "bf16,fp8"]
    code, _, err = run_cli(*base, "-g", ",".join(unpriced))
    assert code == 2 and "no price for h100-pcie-unpriced, h100-nvl-unpriced" in err
    assert "--price-per-hour" in err
    for sched in ("continuous", "static"):
        code, out, err = run_cli(*base, "-g", f"{unpriced[0]},h100-sxm", "--scheduler", sched)
        assert code == 0 and "left out, not sold in price set" in err
        assert "h100-pcie-unpriced" in err and "llmplan prices" in " ".join(err.split())
        assert "h100-sxm" in out
    code, _, err = run_cli(*base, "-g", ",".join(unpriced), "--price-per-hour", "1.0")
    assert code in (0, 1) and "no price" not in err


def test_plan_with_compute_fp16_finds_t4_configurations(run_cli, run_json):
    """Without --compute a T4 (no bf16) has no supported int4 configuration; with fp16
    matmuls the plan finds some, and every row runs fp16."""
    base = ["plan", "-m", "llama-3.1-8b", "-g", "t4", "--weights", "int4", "--ttft", "3s",
            "--tpot", "60ms", "--rps", "1", "--price-per-hour", "0.35", "--top", "2",
            "--scheduler", "static"]
    code, _, err = run_cli(*base)  # nothing runs: the reason, not "no configuration meets"
    assert code == 2 and "no bf16 tensor-core rate" in err and "--compute" in err
    rows = run_json(*base, "--compute", "fp16")
    ok = [r for r in rows if r["meets_targets"]]
    assert ok and all(r["compute"] == "fp16" for r in rows if r["supported"])


def test_budget_compute_lets_a_t4_run_int4(run_cli, tmp_path):
    """`compute: fp16` in a deployment says what the matmuls run in, as --compute does."""
    text = ("deployments:\n  - model: llama-3.1-8b\n    gpu: t4\n    weights: int4\n"
            "    compute: fp16\n    workload: {batch: 1, prompt_tokens: 512, output_tokens: 64}\n"
            "    limits: {fits: true, tpot_s: 1s}\n")
    p = tmp_path / "b.yaml"
    p.write_text(text)
    code, out, err = run_cli("check", str(p))
    assert code == 0, err
    p.write_text(text.replace("    compute: fp16\n", ""))
    code, _, err = run_cli("check", str(p))
    assert code == 2 and "compute: (fp16" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("sched", ["continuous", "static"])
def test_plan_that_finds_nothing_says_what_binds(run_cli, sched):
    """Issue 26: no configuration meets the targets -> which target binds and the nearest
    miss, with how far it is from each target; exit 1."""
    base = ["plan", "-m", "llama-3.1-70b", "-g", "h100-sxm", "-p", "2048", "-o", "256",
            "--rps", "20", "--scheduler", sched, "--disaggregated", "off"]
    code, out, _ = run_cli(*base, "--ttft", "3s", "--tpot", "2ms")
    text = " ".join(out.split())
    assert code == 1 and "TPOT binds: the fastest single request decodes at" in text
    assert "Nearest: h100-sxm TP8" in text and re.search(r"(% over|\dx) the target", text)
    code, out, _ = run_cli(*base, "--ttft", "10ms", "--tpot", "50ms")
    text = " ".join(out.split())
    assert code == 1 and "TTFT binds: the fastest single prompt takes" in text
    code, out, _ = run_cli("plan", "-m", "llama-3.1-405b", "-g", "l4", "--tp", "1", "--pp",
                           "1", "--ttft", "3s", "--tpot", "50ms", "--rps", "1", "--scheduler",
                           sched, "--weights", "bf16", "--disaggregated", "off")
    assert code == 1 and "memory binds: nothing fits" in " ".join(out.split())


def test_the_steady_state_window_by_hand():
    """A replica at 10 requests a second whose requests live at most 5 s at the targets: the
    200 measured arrive over max(200 / 10, 5) = 20 s from t = 5 s, and the run simulates
    10 x (20 + 2 x 5) = 300 requests; at 1,000 a second with 10 s lifetimes the 5,000-request
    cap spans 5 s, its margins a quarter each; an infinite rate measures every request."""
    from planner.search.plan import (
        MAX_SIZING_REQUESTS,
        SimSettings,
        Targets,
        request_lifetime_s,
        sizing_requests,
    )

    st = SimSettings()
    assert request_lifetime_s(Targets(1.0, 0.02, 1.0), 201) == pytest.approx(5.0)
    n, w = sizing_requests(10.0, 5.0, st)
    assert n == 300 and w == pytest.approx((5.0, 25.0))
    n, w = sizing_requests(1000.0, 10.0, st)
    assert n == MAX_SIZING_REQUESTS == 5000 and w == pytest.approx((1.25, 3.75))
    assert sizing_requests(math.inf, 5.0, st) == (200, None)


def test_a_search_cut_in_order_is_the_same_in_workers():
    """Candidates by lower bound 1..6 costing 3, 1, 4, 10, 2, 8, the top 2 kept: one process
    sizes the first three (the fourth's bound, 4, is above the second-cheapest cost so far,
    3) and stops; forked workers size more but return the same three, in order."""
    from functools import partial

    from planner.evidence.workers import prefetched
    from planner.search.plan import cut_in_order

    costs = [3, 1, 4, 10, 2, 8]
    sized = []

    def size(i):
        sized.append(i)
        return {"usd_per_hour": costs[i], "i": i}

    one = cut_in_order([1, 2, 3, 4, 5, 6], size, 2)
    assert [r["i"] for r in one] == [0, 1, 2] and sized == [0, 1, 2]
    two = partial(prefetched, jobs=2)
    assert set(two([1, 2, 3, 4, 5, 6], size, 2, lambda r: r["usd_per_hour"])) >= {0, 1, 2}
    assert cut_in_order([1, 2, 3, 4, 5, 6], size, 2, prefetch=two) == one
    # a candidate that cannot be sized (None) is passed over, not counted
    assert [r["i"] for r in cut_in_order([1, 2, 3, 4], lambda i: None if i == 1 else size(i),
                                         2, prefetch=two)] == [0, 2, 3]


def test_plan_rows_do_not_depend_on_jobs(run_json):
    args = ["plan", "-m", "llama-3.1-8b", "-g", "h100-sxm,a100-sxm-80gb", "--ttft", "1s",
            "--tpot", "40ms", "--rps", "30", "--top", "3", "--tp", "1,2", "--weights",
            "bf16,fp8", "--kv-cache", "16"]
    one, two = run_json(*args, "-j", "1"), run_json(*args, "-j", "2")
    assert len(one) >= 6 and one == two
    assert {r["disaggregated"] for r in one} == {True, False}  # both searches forked


def test_the_screen_is_the_same_swept_gpu_by_gpu_in_forked_workers():
    """``search(map_gpus=...)``: each GPU's rows swept apart (here in two forked workers, as
    `plan -j 2` screens) give the frame the one sweep gives, row for row, with pipeline
    stages and expert parallelism searched too; ``forked_map`` keeps its results in order."""
    import pandas as pd

    from planner.evidence.workers import forked_map
    from planner.search.plan import screen

    assert forked_map(lambda i: i * i, 5, jobs=2) == [0, 1, 4, 9, 16]
    assert forked_map(lambda i: -i, 3, jobs=1) == [0, -1, -2]
    m = catalog.load_model("qwen3-30b-a3b")
    gpus = [catalog.load_hardware(g) for g in ("h100-sxm", "a100-sxm-80gb", "l40s", "h200")]
    kw = dict(prompt_tokens=1024, output_tokens=256,
              targets=Targets(2.0, 0.05, 10.0), tps=(1, 2), pps=(1, 2), eps=(1, 2),
              engine=catalog.load_engine("vllm"))
    one = screen(m, gpus, **kw)
    calls = []

    def mapped(task, n):
        calls.append(n)
        return forked_map(task, n, jobs=2)

    two = screen(m, gpus, map_gpus=mapped, **kw)
    assert calls == [4, 4]  # the TP / PP sweep, then expert parallelism's
    assert len(one) > 40 and set(one["gpu"]) == {g.name for g in gpus}
    pd.testing.assert_frame_equal(one, two)


def test_plan_says_which_sizes_it_left_out(run_cli):
    code, out, err = run_cli("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--ttft", "1s",
                             "--tpot", "40ms", "--rps", "5", "--tp", "3,1", "--top", "1")
    assert code == 0, err
    assert "left out: --tp 3 (tp 3 does not divide llama-3.1-8b's 32 attention heads)" in \
        " ".join(err.split())


def test_a_plan_row_is_simulate_over_its_steady_window(run_json):
    """Llama-3.1-8B fp8 on H100s at 100 requests a second (1 s, 20 ms): each replica's
    requests live at most 1 + 0.02 x 255 = 6.1 s, so the row's figures are of those arriving
    from 6.1 s over 12.2 s (two lifetimes; 200 requests take 8 s at 25 a second), and
    `simulate -n N --measure-window FROM,TO` at the row's rate gives them. Three replicas
    (33 a second each) would pass on a run's first 200 requests, not in steady state:
    simulated over 70 s (seeds 1-3), their p90 TPOT is 21-23 ms; it takes four."""
    rows = run_json("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "1024", "-o", "256",
                    "--ttft", "1s", "--tpot", "20ms", "--rps", "100", "--disaggregated", "off",
                    "--weights", "fp8", "--kv-cache", "fp8", "--tp", "1", "--top", "1")
    r = rows[0]
    assert r["replicas"] == 4 and r["rate_per_replica"] == pytest.approx(25)
    assert r["measured_from_s"] == pytest.approx(6.1)
    assert r["measured_to_s"] == pytest.approx(6.1 + 12.2)
    assert r["simulated_requests"] == math.ceil(25 * (12.2 + 2 * 6.1))
    sim = ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "1024", "-o", "256",
           "--weights", "fp8", "--kv-cache", "fp8"]
    d = run_json(*sim, "-n", str(r["simulated_requests"]), "--request-rate", "25",
                 "--measure-window", f"{r['measured_from_s']},{r['measured_to_s']}")
    assert d["p90_tpot_ms"] / 1e3 == pytest.approx(r["p90_tpot_s"], rel=1e-9)
    assert d["p90_ttft_ms"] / 1e3 == pytest.approx(r["p90_ttft_s"], rel=1e-9)
    assert d["measured_requests"] < d["completed"]
    three = sorted(run_json(*sim, "-n", "3000", "--request-rate", str(100 / 3), "--seed",
                            str(seed), "--measure-window", "10,80")["p90_tpot_ms"]
                   for seed in (1, 2, 3))
    assert three[1] > 20  # 21.4, 22.6, 22.8 ms


def test_a_replica_whose_queue_grows_through_its_window_is_not_sized_on_it():
    """plan's test of a replica's steady state: latencies within the targets do not pass a
    replica that finishes under 90% of what arrives in the window measured."""
    from planner.search.plan import SimSettings, Targets, _percentile_ok

    s = {"completed": 500, "failed": 0, "p90_ttft_ms": 100.0, "p90_tpot_ms": 10.0,
         "measured_arrival_rate": 10.0, "measured_request_throughput": 9.5}
    targets = Targets(requests_per_s=10, ttft_s=1.0, tpot_s=0.05)
    assert _percentile_ok(s, targets, SimSettings())
    assert not _percentile_ok({**s, "measured_request_throughput": 8.9}, targets,
                              SimSettings())
    no_window = {k: v for k, v in s.items() if not k.startswith("measured")}
    assert _percentile_ok(no_window, targets, SimSettings())


@pytest.mark.parametrize("window, says", [
    ("100,200", "no request arrives in 100-200 s; the stream's 50 arrive at 0-4.796 s"),
    ("inf,5", "expected 0 <= FROM < TO"), (",", "expected FROM,TO")])
def test_a_measure_window_the_stream_cannot_fill_is_refused(window, says, run_cli):
    """Fifty requests at 10 a second arrive in their first 5 s: a window at 100-200 s
    measures nothing, and says so in one line (exit 2), as a malformed one does."""
    code, _, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "50",
                           "--request-rate", "10", "--measure-window", window)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    code, _, _ = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "50",
                         "--request-rate", "10", "--measure-window", "1,3")
    assert code == 0


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_plan_json_exits_1_when_nothing_meets_the_targets(run_cli, scheduler):
    """--json prints its rows (none for continuous sizing, every one for static) and exits 1,
    as the table does, with the reason on stderr: a CI step reading the JSON must not take
    "nothing meets the targets" for a pass (it had exited 0 with [])."""
    code, out, err = run_cli("plan", "-m", "llama-3.1-8b", "--rps", "5", "--ttft", "1ms",
                             "--tpot", "1ms", "-g", "h100-sxm", "--scheduler", scheduler,
                             "--json")
    rows = json.loads(out)
    assert code == 1 and "no configuration" in err
    assert not any(r["meets_targets"] for r in rows)
    assert (rows == []) == (scheduler == "continuous")


def test_the_steady_lifetime_by_hand():
    """A window is sized on the targets' lifetime, or on 4 x the p99 end-to-end latency of
    the run's first requests where that is shorter (a batch job's loose targets)."""
    from planner.search.plan import OBSERVED_LIFETIMES, steady_lifetime_s

    assert OBSERVED_LIFETIMES == 4.0
    assert steady_lifetime_s(111.0, 2500.0) == pytest.approx(10.0)
    assert steady_lifetime_s(6.0, 2500.0) == 6.0  # the targets' is shorter
    for p99_ms in (None, math.nan, 0.0):
        assert steady_lifetime_s(111.0, p99_ms) == 111.0


def test_loose_targets_size_on_the_lifetime_the_replica_shows(monkeypatch):
    """Targets of a batch job (60 s TTFT, 200 ms TPOT, 256 tokens out: a request meeting them
    lives up to 111 s) at 5 requests a second: a window of two such lifetimes had simulated
    2,220 requests for each count tried. Sized on 4 x the p99 lifetime its first 200 requests
    show, the run is a tenth as long, measures at least 200 requests, and gives the same count
    with its p90 TTFT and TPOT within a few percent of the long run's."""
    import planner.search.plan as plan
    from planner.layouts.deployment import Deployment

    dep = Deployment.build(catalog.load_model("llama-3.1-8b"),
                           catalog.load_hardware("h100-sxm"), engine=catalog.load_engine("vllm"))
    kw = dict(prompt_tokens=1024, output_tokens=256, targets=plan.Targets(60.0, 0.2, 5.0),
              upper_rate=1e9, settings=plan.SimSettings())
    n, s = plan.replicas_needed(dep, **kw)
    monkeypatch.setattr(plan, "OBSERVED_LIFETIMES", math.inf)  # the targets' lifetime
    n_long, s_long = plan.replicas_needed(dep, **kw)
    assert n == n_long == 1
    assert s["completed"] < s_long["completed"] / 5 and s_long["completed"] == 2220
    assert s["measured_requests"] >= 200
    assert s["p90_tpot_ms"] == pytest.approx(s_long["p90_tpot_ms"], rel=0.05)
    assert s["p90_ttft_ms"] == pytest.approx(s_long["p90_ttft_ms"], rel=0.1)


def test_a_run_filled_by_hand():
    """A replica filled where its batch reached max_num_seqs, its KV pool 90% reserved, or a
    request was preempted; not where none of those happened (or nothing says so)."""
    from planner.search.plan import filled

    calm = {"preemptions": 0, "kv_cache_reserved_frac_peak": 0.5, "max_running_requests": 40}
    assert not filled(calm, 256) and not filled({}, 256) and not filled(calm, None)
    assert filled({**calm, "preemptions": 3}, 256)
    assert filled({**calm, "kv_cache_reserved_frac_peak": 0.9}, 256)
    assert not filled({**calm, "kv_cache_reserved_frac_peak": 0.89}, 256)
    assert filled({**calm, "max_running_requests": 256}, 256)
    assert not filled({**calm, "max_running_requests": 256}, None)


def _loose_8b(rate: float, upper_rate: float = 1e9):
    import planner.search.plan as plan
    from planner.layouts.deployment import Deployment

    dep = Deployment.build(catalog.load_model("llama-3.1-8b"),
                           catalog.load_hardware("h100-sxm"), engine=catalog.load_engine("vllm"))
    return dep, dict(prompt_tokens=1024, output_tokens=256,
                     targets=plan.Targets(60.0, 0.2, rate), upper_rate=upper_rate,
                     settings=plan.SimSettings())


def test_loose_targets_near_capacity_size_as_the_targets_window_does(monkeypatch):
    """100 requests a second of the batch job's targets, from one replica up (no analytic
    bound): at 4 replicas (25 a second each, about 15% over what one sustains) the window
    sized on the early run's lifetime finished requests at 0.904 of those that arrived in it
    (24.0 a second, below the 25 offered: fewer arrivals, a noisier count) and passed, and 4
    replicas were planned. Its run filled (KV pool full, requests preempted), so the count
    is sized again over the targets' window, which it fails: 5, as the targets' lifetime
    alone gives. At 20 a second each the replica is near its capacity too, its batch still
    growing through the targets' 125 s window (since attention's fixed time, 2026-12-06): the
    capped window's p90 TPOT comes out 15% under it (30.2 ms against 35.6), where plan's
    analytic bound keeps the cap off (CAPPED_LOAD_FRAC; none here)."""
    import planner.search.plan as plan

    dep, kw = _loose_8b(100.0)
    n, s = plan.replicas_needed(dep, **kw)
    monkeypatch.setattr(plan, "OBSERVED_LIFETIMES", math.inf)  # the targets' lifetime
    n_long, s_long = plan.replicas_needed(dep, **kw)
    assert n == n_long == 5
    assert s["p90_ttft_ms"] == pytest.approx(s_long["p90_ttft_ms"], rel=0.1)
    assert 0.8 < s["p90_tpot_ms"] / s_long["p90_tpot_ms"] <= 1.0


def test_a_replica_loaded_near_its_bound_keeps_the_targets_window():
    """The lifetime cap is taken only for a replica loaded to at most half the analytic
    bound on its rate (CAPPED_LOAD_FRAC): at 5 requests a second against a bound of 8, its
    run is the targets' window's 2,220 requests; against a bound of 10, the capped run's."""
    import planner.search.plan as plan

    assert plan.CAPPED_LOAD_FRAC == 0.5
    dep, kw = _loose_8b(5.0, upper_rate=8.0)
    n, s = plan.replicas_needed(dep, **kw)
    assert n == 1 and s["completed"] == 2220
    dep, kw = _loose_8b(5.0, upper_rate=10.0)
    n, s = plan.replicas_needed(dep, **kw)
    assert n == 1 and s["completed"] < 2220 / 5


def test_loose_targets_size_a_disaggregated_pair_on_the_lifetimes_its_sides_show(run_json,
                                                                                 monkeypatch):
    """The same targets over disaggregated layouts: each side's steady state, and the pair's
    (on the sum of the two sides' p99 lifetimes), is a tenth as long as on the targets'
    lifetime, for the same instances and cost."""
    import planner.search.plan as plan

    args = ("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--tp", "1", "--weights", "bf16",
            "--kv-cache", "16", "--ttft", "60s", "--tpot", "200ms", "--rps", "5",
            "--disaggregated", "only", "--top", "1", "-j", "1")
    short = run_json(*args)[0]
    monkeypatch.setattr(plan, "OBSERVED_LIFETIMES", math.inf)
    long = run_json(*args)[0]
    keys = ("prefill_instances", "decode_instances", "usd_per_hour")
    assert [short[k] for k in keys] == [long[k] for k in keys]
    assert short["simulated_requests"] < long["simulated_requests"] / 5
    assert long["simulated_requests"] == 2220
    assert short["p90_tpot_s"] == pytest.approx(long["p90_tpot_s"], rel=0.05)


@pytest.mark.parametrize("size_at", ["predicted", "high"])
@pytest.mark.parametrize("which", ["sides", "pair"])
def test_a_filled_disaggregated_run_is_sized_again_over_the_targets_window(run_json,
                                                                          monkeypatch,
                                                                          size_at, which):
    """Where the sides' runs filled (``plan.filled`` made to say so: each side is sized
    again over the targets' window, and the pair is not capped), or only the pair's
    (``_pair_filled``: it is simulated again over the targets' window), the row is the one
    the targets' lifetime alone gives, its run of 2,220 requests and its figures the same to
    the digit; sized at the bands' slow end too, where the predicted pair is re-run on the
    window it was sized on."""
    import planner.search.disagg as disagg
    import planner.search.plan as plan

    args = ("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--tp", "1", "--weights", "bf16",
            "--kv-cache", "16", "--ttft", "60s", "--tpot", "200ms", "--rps", "5",
            "--disaggregated", "only", "--top", "1", "-j", "1", "--size-at", size_at)
    if which == "sides":
        monkeypatch.setattr(plan, "filled", lambda s, max_num_seqs: True)
    else:
        monkeypatch.setattr(disagg, "_pair_filled", lambda res, p_cfg, d_cfg: True)
    refilled = run_json(*args)[0]
    monkeypatch.setattr(plan, "OBSERVED_LIFETIMES", math.inf)
    long = run_json(*args)[0]
    assert refilled["simulated_requests"] == 2220
    assert refilled == long


def test_a_short_run_is_not_capped_and_its_nominal_rerun_matches_it():
    """Where a count's whole run is hardly longer than its first requests (at most twice
    ``--sim-requests``), the whole run is its early run and nothing caps its window: sized
    at the band's slow end, the predicted replica is re-run on the same requests and window
    as the run it was sized on (10 s TTFT, 100 ms TPOT, 1 request a second: 271 requests,
    arrivals measured over 35.5-235.5 s; the cap had taken the nominal re-run's lifetime from
    that whole run, 218 requests over 8.5-208.5 s)."""
    import planner.search.plan as plan
    from planner.layouts.deployment import Deployment

    dep = Deployment.build(catalog.load_model("llama-3.1-8b"),
                           catalog.load_hardware("h100-sxm"), engine=catalog.load_engine("vllm"))
    n, s = plan.replicas_needed(dep, prompt_tokens=1024, output_tokens=256,
                                targets=plan.Targets(10.0, 0.1, 1.0), upper_rate=1e9,
                                settings=plan.SimSettings(step_factor=1.2))
    high = s["sized_at"]
    assert n == 1 and s["arrived"] == high["arrived"] == 271
    assert (s["measured_from_s"], s["measured_to_s"]) == \
        (high["measured_from_s"], high["measured_to_s"]) == pytest.approx((35.5, 235.5))


def test_an_early_run_of_a_few_requests_caps_no_window(run_json):
    """With ``--sim-requests 1`` a request's p99 lifetime is its own, and a window sized on it
    held a handful of arrivals, whose keep-up share was chance: a disaggregated pair for 5
    requests a second came out as 19 prefill instances and 1 decode. Under
    CAPPED_MIN_REQUESTS (100) the targets' window is kept: one of each, 2,220 requests."""
    import planner.search.plan as plan

    assert plan.CAPPED_MIN_REQUESTS == 100
    row = run_json("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--tp", "1", "--weights",
                   "bf16", "--kv-cache", "16", "--ttft", "60s", "--tpot", "200ms", "--rps",
                   "5", "--sim-requests", "1", "--disaggregated", "only", "--top", "1",
                   "-j", "1")[0]
    assert (row["prefill_instances"], row["decode_instances"]) == (1, 1)
    assert row["simulated_requests"] == 2220
