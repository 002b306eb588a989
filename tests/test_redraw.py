"""A run's lengths drawn again from its client's seed, where its file gives totals only.

DataCrunch's SGLang 0.4 result lines (the sglang profile's fit source) give each run's total
prompt and output tokens, not each request's. Their client commands pass no --seed, so
bench_serving drew with its default 1; the redraw must give exactly the published totals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from planner.core.errors import LlmplanError
from planner.evidence.formats import FormatError, read_sglang
from planner.evidence.redraw import redrawn, sglang_random_lengths
from planner.evidence.runs import RandomLengths
from planner.io import catalog

SERVED = catalog.SERVED_DIR
ONLINE_70B = "datacrunch-llama33-70b-h200x4-tp4-sglang-online"
RANDOM_1K = RandomLengths(1024, 1024, 0.0)


def _lines(name: str) -> list[dict]:
    return [json.loads(x) for x in (SERVED / f"{name}.jsonl").read_text().splitlines() if x]


@pytest.mark.parametrize("name", [ONLINE_70B, "datacrunch-llama33-70b-h200x4-tp4-sglang-offline",
                                  "datacrunch-llama31-405b-h200x8-tp8-sglang-online"])
def test_seed_1_gives_every_published_random_runs_totals(name):
    random_runs = [d for d in _lines(name) if d["dataset_name"] == "random"]
    assert len(random_runs) >= 4
    for d in random_runs:
        spec = RandomLengths(d["random_input_len"], d["random_output_len"],
                             d["random_range_ratio"])
        inputs, outputs = sglang_random_lengths(1, d["completed"], spec)
        assert (sum(inputs), sum(outputs)) == (d["total_input_tokens"],
                                               d["total_output_tokens"])


def test_another_seed_does_not():
    """The check can fail: seed 0 misses the first online run's published 152,612 / 160,347."""
    inputs, outputs = sglang_random_lengths(0, 300, RANDOM_1K)
    assert (sum(inputs), sum(outputs)) != (152_612, 160_347)
    assert tuple(map(sum, sglang_random_lengths(1, 300, RANDOM_1K))) == (152_612, 160_347)


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300),
       inp=st.integers(1, 5000), out=st.integers(0, 5000), ratio=st.floats(0, 1))
def test_lengths_lie_in_the_range_the_ratio_gives(seed, n, inp, out, ratio):
    inputs, outputs = sglang_random_lengths(seed, n, RandomLengths(inp, out, ratio))
    assert len(inputs) == len(outputs) == n
    assert all(max(int(inp * ratio), 1) <= x <= inp for x in inputs)
    assert all(int(out * ratio) <= x <= out for x in outputs)


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 200), more=st.integers(1, 200))
def test_a_longer_run_begins_with_the_shorter_ones_prompts(seed, n, more):
    """The prompt lengths are drawn first, one after another: 1,200 prompts at 4 req/s begin
    with the 600 sent at 2 req/s (DataCrunch's online sweep)."""
    short = sglang_random_lengths(seed, n, RANDOM_1K)[0]
    assert sglang_random_lengths(seed, n + more, RANDOM_1K)[0][:n] == short


BASE = {"completed": 300, "request_rate": 1.0, "dataset_name": "random",
        "random_input_len": 1024, "random_output_len": 1024, "random_range_ratio": 0.0,
        "total_input_tokens": 152_612, "total_output_tokens": 160_347, "median_ttft_ms": 85.7}


def test_the_sglang_reader_keeps_the_random_datasets_lengths():
    run = read_sglang([BASE], "f")[0]
    assert run.dataset == "random" and run.random_lengths == RANDOM_1K
    share = read_sglang([{**BASE, "dataset_name": "sharegpt"}], "f")[0]
    assert share.dataset == "sharegpt" and share.random_lengths is None
    with pytest.raises(FormatError, match="f:1: random_input_len 1024, random_range_ratio 2"):
        read_sglang([{**BASE, "random_range_ratio": 2}], "f")


def test_redrawn_replays_each_requests_lengths_and_checks_the_totals():
    run = redrawn(read_sglang([BASE], "f")[0], 1, "here")
    assert len(run.input_lens) == 300 and sum(run.output_lens) == 160_347
    assert "seed 1" in run.notes[-1]
    with pytest.raises(LlmplanError, match="here: lengths drawn again with seed 2 .* 152,612"):
        redrawn(read_sglang([BASE], "f")[0], 2, "here")
    listed = read_sglang([{**BASE, "completed": 2, "input_lens": [1, 2],
                           "output_lens": [3, 4]}], "f")[0]
    assert redrawn(listed, 2, "here") is listed  # the file's own lengths stand
    shared = read_sglang([{**BASE, "dataset_name": "sharegpt"}], "f")[0]
    assert redrawn(shared, 1, "here") is shared


def test_datacrunchs_runs_replay_each_requests_lengths():
    from planner.cli.validate import replayed_runs

    ds, folder = next((d, f) for d, f in catalog.load_served()
                      if d.source.id == "datacrunch-h200")
    runs = replayed_runs(ds.entry(ONLINE_70B), folder, ds)
    assert [r.dataset for r in runs] == ["random"] * 5 + ["sharegpt"] * 2
    for r in runs:  # every request's own lengths, none at the mean
        assert len(r.input_lens) == r.completed and len(set(r.input_lens)) > 100
    assert runs[2].input_lens[:600] == runs[1].input_lens  # the same draws, one seed
    assert "ShareGPT" in runs[-1].notes[-1] or "sharegpt" in runs[-1].notes[-1]


def _manifest(tmp_path, seed) -> str:
    shutil.copy(SERVED / f"{ONLINE_70B}.jsonl", tmp_path)
    data = yaml.safe_load((SERVED / "datacrunch-h200.yaml").read_text())
    data["runs"] = [dict(data["runs"][0], traffic={"seed": seed})]
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    return str(tmp_path / "m.yaml")


@pytest.mark.parametrize("seed, says", [(-1, "traffic.seed"), ("one", "traffic.seed"),
                                        (7, "lengths drawn again with seed 7")])
def test_a_wrong_seed_is_one_line(run_cli, tmp_path, seed, says):
    code, _, err = run_cli("validate", "--served-dataset", _manifest(tmp_path, seed),
                           "--no-rows")
    assert code == 2 and says in err, err
    assert len(err.strip().splitlines()) == 1


def test_compare_seed_replays_each_requests_lengths(run_json):
    args = (str(SERVED / f"{ONLINE_70B}.jsonl"), "-m", "llama-3.3-70b", "-g", "h200",
            "--tp", "4", "-e", "sglang")
    plain, drawn = run_json("compare", *args), run_json("compare", *args, "--seed", "1")
    assert "seed 1" in drawn["runs"][0]["notes"][-1]
    assert not any("seed" in n for n in plain["runs"][0]["notes"])

    def ttft(d, i):
        return d["runs"][i]["metrics"]["median_ttft_s"]["simulated"]
    # some prompts of up to 1,024 tokens now, not all 509: the median first token moves
    assert ttft(drawn, 0) != pytest.approx(ttft(plain, 0), rel=1e-3)


def test_compare_with_another_seed_is_one_line(run_cli):
    code, _, err = run_cli("compare", str(SERVED / f"{ONLINE_70B}.jsonl"), "-m",
                           "llama-3.3-70b", "-g", "h200", "--tp", "4", "-e", "sglang",
                           "--seed", "3")
    assert code == 2 and "--seed: " in err and "seed 3" in err and "152,612" in err, err
    assert len(err.strip().splitlines()) == 1


def test_calibrate_takes_the_seed_too(run_cli, tmp_path):
    """The wrong seed is refused before any fit: the option reaches calibrate's replay."""
    code, _, err = run_cli("calibrate", str(SERVED / f"{ONLINE_70B}.jsonl"), "-m",
                           "llama-3.3-70b", "-g", "h200", "--tp", "4", "--base-engine",
                           "sglang", "-o", str(tmp_path / "p.yaml"), "--seed", "3")
    assert code == 2 and "--seed: " in err and "seed 3" in err, err
    assert not (tmp_path / "p.yaml").exists()


def test_a_printed_block_is_redrawn_from_its_manifests_command():
    """sgl-project/sglang#7631's block (SGLang 0.4.8, DeepSeek-V3 on 8x H20) prints totals
    only; its command: random 1,024 / 512 at range ratio 0, 200 prompts, no --seed. Seed 1
    gives the block's 103,005 input and 53,590 generated tokens."""
    from planner.cli.validate import replayed_runs

    ds, folder = next((d, f) for d, f in catalog.load_served() if d.source.id == "engine-prs")
    entry = ds.entry("sglang-pr7631-deepseek-v3-h20-tp8-r1024-c8-tuned")
    run = replayed_runs(entry, folder, ds)[0]
    assert run.random_lengths == RandomLengths(1024, 512, 0.0)
    assert (len(run.input_lens), sum(run.input_lens), sum(run.output_lens)) == (
        200, 103_005, 53_590)
    unseeded = entry.model_copy(update={"traffic": entry.traffic.model_copy(
        update={"seed": None})})
    assert replayed_runs(unseeded, folder, ds)[0].input_lens is None  # the means, as before


def test_simulate_sends_the_lengths_sglangs_bench_serving_sends(run_json):
    """--dataset-name sglang-random --seed 1 with DataCrunch's first command (300 prompts,
    --random-input 1024 --random-output 1024): the published 152,612 / 160,347 tokens."""
    d = run_json("simulate", "-m", "llama-3.3-70b", "-g", "h200", "--tp", "4", "-e", "sglang",
                 "-n", "300", "-p", "1024", "-o", "1024", "--request-rate", "1",
                 "--dataset-name", "sglang-random", "--seed", "1")
    assert (d["total_input_tokens"], d["total_output_tokens"]) == (152_612, 160_347)
    vllm_style = run_json("simulate", "-m", "llama-3.3-70b", "-g", "h200", "--tp", "4", "-e",
                          "sglang", "-n", "300", "-p", "1024", "-o", "1024",
                          "--request-rate", "1", "--seed", "1")
    assert vllm_style["total_input_tokens"] == 300 * 1024  # vLLM's ratio 0: fixed lengths


def test_sglang_random_from_the_range_ratio_up(run_json):
    d = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "200", "-p", "1000",
                 "-o", "100", "--range-ratio", "0.5", "--dataset-name", "sglang-random")
    inputs, outputs = sglang_random_lengths(0, 200, RandomLengths(1000, 100, 0.5))
    assert d["total_input_tokens"] == sum(inputs) and d["total_output_tokens"] == sum(outputs)
    assert min(inputs) >= 500 and max(inputs) <= 1000


def test_a_served_budget_takes_sglangs_random_lengths(run_json, tmp_path):
    """SGLang's ratio 0 sends prompts of 1 to 1,024 tokens (median about 512), vLLM's all of
    1,024: the median first token of the same traffic is earlier."""
    def ttft(name):
        budget = {"deployments": [{
            "name": "d", "model": "llama-3.1-8b", "gpu": "h100-sxm",
            "workload": {"prompt_tokens": 1024, "output_tokens": 128},
            "traffic": {"request_rate": 4, "num_requests": 50, "dataset_name": name,
                        "percentile": 50},
            "limits": {"served_ttft_s": "10s"}}]}
        (tmp_path / "b.yaml").write_text(yaml.safe_dump(budget))
        return run_json("check", str(tmp_path / "b.yaml"))["results"][0]["predicted"]
    assert ttft("sglang-random") < 0.8 * ttft("random")


def test_a_seed_that_draws_nothing_is_one_line(run_cli):
    """A file that lists each request's lengths (or a printed block) has nothing to draw."""
    code, _, err = run_cli("compare", "tests/fixtures/servers/vllm_bench_serve.json", "-m",
                           "llama-3.1-8b", "-g", "h100-sxm", "--seed", "1")
    assert code == 2 and "--seed: no run given" in err, err
    assert len(err.strip().splitlines()) == 1


def test_the_seed_draws_the_earlier_runs_lengths_too(run_json, tmp_path):
    """--cached-from needs each request's length from the earlier file as well: one that gives
    totals only is drawn again from the seed. The same run sent twice: the second finds every
    prompt but its last token cached."""
    line = (SERVED / f"{ONLINE_70B}.jsonl").read_text().splitlines()[0]
    (tmp_path / "a.jsonl").write_text(line + "\n")
    d = run_json("compare", str(tmp_path / "a.jsonl"), "--cached-from",
                 str(tmp_path / "a.jsonl"), "--seed", "1", "-m", "llama-3.3-70b", "-g",
                 "h200", "--tp", "4", "-e", "sglang")
    notes = d["runs"][0]["notes"]
    assert any("seed 1" in n for n in notes)
    assert any(n.startswith("100% of the prompt tokens were in the prefix cache") for n in notes)


def test_a_manifest_seed_that_draws_nothing_is_one_line(run_cli, tmp_path):
    shutil.copy(Path(__file__).parent / "fixtures" / "servers" / "vllm_bench_serve.json",
                tmp_path)
    data = {"source": {"id": "try", "url": "https://example.com/r", "repo": "o/r",
                       "commit": "0123456789abcdef0123456789abcdef01234567",
                       "date": "2026-11-21", "engine": "vllm", "engine_version": "0.11",
                       "hardware_note": "1xH100-80GB-SXM"},
            "runs": [{"id": "one", "file": "vllm_bench_serve.json", "path": "r/a.json",
                      "sha256": "0" * 64, "model": "llama-3.1-8b", "gpu": "h100-sxm",
                      "traffic": {"seed": 1}}]}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    code, _, err = run_cli("validate", "--served-dataset", str(tmp_path / "m.yaml"),
                           "--no-rows")
    assert code == 2 and "one: traffic.seed: no run of vllm_bench_serve.json" in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_vllm_runs_random_command_states_no_sglang_lengths():
    """vLLM's random dataset reads --random-range-ratio as a spread around the length, not
    SGLang's low end: a vLLM run whose manifest states that dataset, its lengths and ratio
    (Scicom's vLLM 0.15 runs) carries no RandomLengths, which are SGLang's."""
    from planner.cli.validate import replayed_runs

    ds, folder = next((d, f) for d, f in catalog.load_served()
                      if d.source.id == "scicom-benchmaq-vllm")
    entry = next(e for e in ds.runs if e.traffic and e.traffic.dataset == "random"
                 and e.traffic.range_ratio is not None and e.traffic.input_len)
    run = replayed_runs(entry, folder, ds)[0]
    assert run.tool.startswith("vllm") and run.random_lengths is None


# --- lengths from a twin run: the same requests, whose file lists them ---

NEBIUS = "r1bench-deepseek-r1-nebius-h200x8-tp8-vllm084-sharegpt"
BREWSTER = "r1bench-deepseek-r1-h200x8-tp8-vllm084-sharegpt"


def _r1_benchmark():
    return next((d, f) for d, f in catalog.load_served() if d.source.id == "r1-benchmark")


def test_the_nebius_sharegpt_run_replays_its_twins_lengths():
    """R1-Benchmark's Nebius ShareGPT summary lists no lengths; the DGX H200 run of the same
    command (500 ShareGPT prompts, seed 0) lists them, and both files total 102,975 / 107,666
    tokens. The replay takes each request's, not the mean 206 / 215."""
    from planner.cli.validate import replayed_runs

    ds, folder = _r1_benchmark()
    run = replayed_runs(ds.entry(NEBIUS), folder, ds)[0]
    twin = json.loads((SERVED / f"{BREWSTER}.json").read_text())
    assert run.input_lens == tuple(twin["input_lens"])
    assert run.output_lens == tuple(twin["output_lens"])
    assert (sum(run.input_lens), sum(run.output_lens)) == (102_975, 107_666)
    assert max(run.input_lens) > 3 * 206  # not every request at the mean
    assert "from " + BREWSTER in run.notes[-1]


def _twin_manifest(tmp_path, twin_id, totals=None, extra=None) -> str:
    for e in (NEBIUS, BREWSTER):
        shutil.copy(SERVED / f"{e}.json", tmp_path)
    if totals is not None:  # the summary's totals changed: not the same requests
        p = tmp_path / f"{NEBIUS}.json"
        d = json.loads(p.read_text())
        d["total_input_tokens"], d["total_output_tokens"] = totals
        p.write_text(json.dumps(d))
    data = yaml.safe_load((SERVED / "r1-benchmark.yaml").read_text())
    # the summary first: its refusal comes before the twin's own replay (DeepSeek-R1, TP 8)
    data["runs"] = sorted((e for e in data["runs"] if e["id"] in (NEBIUS, BREWSTER)),
                          key=lambda e: e["id"] != NEBIUS)
    for e in data["runs"]:
        e["sha256"] = "0" * 64
        if e["id"] == NEBIUS:
            e["traffic"].update(extra or {}, lengths_from=twin_id)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    return str(tmp_path / "m.yaml")


@pytest.mark.parametrize("twin_id, totals, extra, says", [
    (NEBIUS, None, None, f"run {NEBIUS}: traffic.lengths_from: '{NEBIUS}' is not another run"),
    ("r1bench-elsewhere", None, None,
     "traffic.lengths_from: 'r1bench-elsewhere' is not another run"),
    ("", None, None, "lengths_from"),
    (BREWSTER, None, {"seed": 0}, "seed and lengths_from both given"),
    (BREWSTER, (102_976, 107_666), None, "500 requests add up to 102,975 prompt / 107,666 "
                                         "output tokens, where this file says 102,976 / 107,666"),
])
def test_a_wrong_twin_is_one_line(run_cli, tmp_path, twin_id, totals, extra, says):
    code, _, err = run_cli("validate", "--served-dataset",
                           _twin_manifest(tmp_path, twin_id, totals, extra), "--no-rows")
    assert code == 2 and says in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_twin_for_a_run_that_lists_its_lengths_is_one_line(run_cli, tmp_path):
    """Naming a twin for a file that lists its own lengths takes nothing: refused, as a seed
    that draws nothing is."""
    path = _twin_manifest(tmp_path, NEBIUS)
    data = yaml.safe_load(open(path))
    for e in data["runs"]:  # the twin relation turned round: the detailed run names the summary
        e.get("traffic", {}).pop("lengths_from", None)
        if e["id"] == BREWSTER:
            e["traffic"] = {"dataset": "sharegpt", "lengths_from": NEBIUS}
    data["runs"].reverse()  # the refused entry first
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    code, _, err = run_cli("validate", "--served-dataset", path, "--no-rows")
    assert code == 2 and f"{BREWSTER}: traffic.lengths_from" in err and "nothing to take" in err
    assert len(err.strip().splitlines()) == 1


def test_a_twin_that_lists_no_lengths_is_refused():
    from planner.evidence.redraw import copied_lengths
    from planner.evidence.runs import ServedRun

    run = ServedRun(source="a.json", tool="vllm-bench-serve", label="a", request_rate=10.0,
                    max_concurrency=None, num_prompts=2, completed=2, mean_input_tokens=3.0,
                    mean_output_tokens=4.0)
    with pytest.raises(LlmplanError, match="b.json must hold one run that lists"):
        copied_lengths(run, [run], "b.json", "x")
    twin = ServedRun(**{**run.__dict__, "input_lens": (2, 4), "output_lens": (5, 3)})
    got = copied_lengths(run, [twin], "b.json", "x")
    assert (got.input_lens, got.output_lens) == ((2, 4), (5, 3))
    assert copied_lengths(twin, [run], "b.json", "x") is twin  # lists its own: as it is
    with pytest.raises(LlmplanError, match="not the same requests"):
        copied_lengths(run, [ServedRun(**{**twin.__dict__, "output_lens": (5, 4)})],
                       "b.json", "x")
    with pytest.raises(LlmplanError, match="b.json lists 2 input_lens and 1 output_lens"):
        # the sums match, the lists do not
        copied_lengths(run, [ServedRun(**{**twin.__dict__, "output_lens": (8,)})],
                       "b.json", "x")
    with pytest.raises(LlmplanError, match="3 requests add up to 6 prompt / 8 output tokens"):
        copied_lengths(run, [ServedRun(**{**twin.__dict__, "input_lens": (1, 1, 4),
                                          "output_lens": (5, 3, 0)})], "b.json", "x")
    with pytest.raises(LlmplanError, match="for 3 sent, 2 completed: not the same"):
        copied_lengths(ServedRun(**{**run.__dict__, "num_prompts": 3}), [twin], "b.json", "x")
    for twins in ([twin, twin], [ServedRun(**{**twin.__dict__, "output_lens": None})]):
        with pytest.raises(LlmplanError, match="must hold one run that lists"):
            copied_lengths(run, twins, "b.json", "x")


# --- compare / calibrate: --lengths-from and --dataset-name for a user's files ---

DS_SETUP = ["-m", "deepseek-r1", "-g", "h200", "--tp", "8", "--weights", "fp8",
            "-e", "vllm@0.8.4"]


def test_compare_lengths_from_replays_the_twins_requests(run_json):
    """The Nebius summary with --lengths-from its DGX twin is the same 500 requests at the
    same rate: the simulated server is the twin's own, figure for figure."""
    nebius, brewster = (str(SERVED / f"{x}.json") for x in (NEBIUS, BREWSTER))
    got = run_json("compare", nebius, *DS_SETUP, "--lengths-from", brewster)
    own = run_json("compare", brewster, *DS_SETUP)
    sim = {k: v["simulated"] for k, v in got["runs"][0]["metrics"].items()}
    assert sim == {k: v["simulated"] for k, v in own["runs"][0]["metrics"].items()}
    at_mean = run_json("compare", nebius, *DS_SETUP)
    assert at_mean["runs"][0]["metrics"]["output_throughput"]["simulated"] > \
        1.1 * sim["output_throughput"]  # every request at the mean: 24% too fast
    assert any("from " in n and BREWSTER in n for n in got["runs"][0]["notes"])


def test_compare_dataset_name_shapes_a_summarys_lengths(run_json):
    nebius = str(SERVED / f"{NEBIUS}.json")
    got = run_json("compare", nebius, *DS_SETUP, "--dataset-name", "sharegpt")
    assert any("sharegpt's distribution" in n for n in got["runs"][0]["notes"])
    at_mean = run_json("compare", nebius, *DS_SETUP)
    assert got["runs"][0]["metrics"]["output_throughput"]["simulated"] != \
        at_mean["runs"][0]["metrics"]["output_throughput"]["simulated"]


@pytest.mark.parametrize("args, says", [
    (["--dataset-name", "nosuch"], "--dataset-name: 'nosuch' is not a dataset"),
    (["--lengths-from", str(SERVED / f"{NEBIUS}.json")], "must hold one run that lists"),
    (["--lengths-from", str(SERVED / f"{BREWSTER}.json"), "--seed", "1"],
     "--seed and --lengths-from both given"),
    (["--lengths-from", str(SERVED / "r1bench-llama31-8b-fp8-h200x1-vllm082-1000in-2000out.json")],
     "50 requests add up to 50,000 prompt / 100,000 output tokens, where this file says "
     "102,975 / 107,666 for 500 sent, 500 completed: not the same requests"),
])
def test_compare_wrong_lengths_is_one_line(run_cli, args, says):
    code, _, err = run_cli("compare", str(SERVED / f"{NEBIUS}.json"), *DS_SETUP, *args)
    assert code == 2 and says in err, err
    assert len(err.strip().splitlines()) == 1


def test_compare_lengths_from_a_file_that_lists_its_own_is_one_line(run_cli):
    brewster = str(SERVED / f"{BREWSTER}.json")
    code, _, err = run_cli("compare", brewster, *DS_SETUP, "--lengths-from", brewster)
    assert code == 2 and "every run given lists its own per-request lengths" in err, err


def test_calibrate_takes_the_twins_lengths(run_cli, tmp_path):
    """A summary saved without --save-detailed (vLLM's default drops input_lens and
    output_lens) and a detailed run of the same requests: calibrate fits on the twin's
    lengths. Made from the fixture: lengths that vary, the same totals."""
    summary, detailed = _summary_and_detailed(tmp_path)
    args = ["calibrate", summary, "-m", "llama-3.1-8b", "-g", "h100-sxm",
            "--no-leave-one-out", "--out", str(tmp_path / "p.yaml"), "--json"]
    code, out, err = run_cli(*args, "--lengths-from", detailed)
    assert code in (0, 1), err  # 1: a fit refused at a range's edge, still reported
    twin = json.loads(out)
    code, out, err = run_cli(*args)
    at_mean = json.loads(out)
    # the same measured figures, fitted from other simulated requests
    assert [e["measured"] for e in twin["errors"]] == [e["measured"] for e in at_mean["errors"]]
    assert [e["in_sample"] for e in twin["errors"]] != [e["in_sample"] for e in at_mean["errors"]]


def _summary_and_detailed(tmp_path) -> tuple[str, str]:
    """A vLLM summary (no input_lens / output_lens, as bench serve saves without
    --save-detailed) and the detailed file of the same requests, from the fixture."""
    detailed = json.loads((Path(__file__).parent / "fixtures" / "servers" /
                           "vllm_bench_serve_detailed.json").read_text())
    detailed["input_lens"] = [512, 1536] * 4  # 8,192 in all, as the file says
    summary = {k: v for k, v in detailed.items() if k not in ("input_lens", "output_lens")}
    (tmp_path / "detailed.json").write_text(json.dumps(detailed))
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    return str(tmp_path / "summary.json"), str(tmp_path / "detailed.json")


LLAMA = ["-m", "llama-3.1-8b", "-g", "h100-sxm"]


@pytest.mark.parametrize("extra, says", [
    (["--sweep", "--dataset-name", "sharegpt"], "--dataset-name with --lengths-from, --sweep"),
    (["--cached-from", "DETAILED", "--dataset-name", "sharegpt"], "--dataset-name with"),
    (["--lengths-from", "DETAILED", "--dataset-name", "sharegpt"], "--dataset-name with"),
    # a summary as the run before: its lengths are not taken from the twin (other lengths)
    (["--cached-from", "SUMMARY", "--lengths-from", "DETAILED"],
     "does not list one input length"),
    (["--lengths-from", "/nonexistent.json"], "--lengths-from: /nonexistent.json"),
])
def test_lengths_options_with_the_cache_are_one_line(run_cli, tmp_path, extra, says):
    summary, detailed = _summary_and_detailed(tmp_path)
    extra = [{"DETAILED": detailed, "SUMMARY": summary}.get(a, a) for a in extra]
    code, _, err = run_cli("compare", summary, *LLAMA, *extra)
    assert code == 2 and says in err, err
    assert len(err.strip().splitlines()) == 1


def test_dataset_name_that_shapes_nothing_is_one_line(run_cli, tmp_path):
    _, detailed = _summary_and_detailed(tmp_path)
    code, _, err = run_cli("compare", detailed, *LLAMA, "--dataset-name", "sharegpt")
    assert code == 2 and "--dataset-name: every run given lists its own" in err, err


def test_lengths_from_takes_only_for_the_files_that_list_none(run_json, tmp_path):
    summary, detailed = _summary_and_detailed(tmp_path)
    d = run_json("compare", summary, detailed, *LLAMA, "--lengths-from", detailed)
    took = ["from " in " ".join(r["notes"]) for r in d["runs"]]
    assert took == [True, False]


def test_compare_shapes_an_sglang_sharegpt_line_by_itself(run_json):
    """DataCrunch's SGLang 0.4 lines name their dataset; the ShareGPT ones list no lengths and
    are shaped like ShareGPT at their means without any option, as validate replays them."""
    d = run_json("compare", str(SERVED / f"{ONLINE_70B}.jsonl"), "-m", "llama-3.3-70b",
                 "-g", "h200", "--tp", "4", "-e", "sglang")
    shaped = ["sharegpt's distribution" in " ".join(r["notes"]) for r in d["runs"]]
    assert shaped == [False] * 5 + [True] * 2


def test_shaping_a_huge_summary_stops_at_the_requests_simulated(tmp_path):
    """A file may say a billion requests; the replay simulates the first 5,000, and the
    shaped lengths are as many, not a billion (that took minutes and gigabytes)."""
    from dataclasses import replace

    from planner.cli.compare import read_result_file, shape_lengths
    from planner.evidence.compare import MAX_SIM_REQUESTS

    summary, _ = _summary_and_detailed(tmp_path)
    run = replace(read_result_file(Path(summary))[0], num_prompts=10**9, completed=10**9)
    assert len(shape_lengths(run, "sharegpt").input_lens) == MAX_SIM_REQUESTS
    assert shape_lengths(replace(run, mean_output_tokens=0.0), "sharegpt") == \
        replace(run, mean_output_tokens=0.0)  # no output to shape: left at its means



def test_compare_says_when_every_request_is_at_the_mean(run_cli, tmp_path):
    summary, detailed = _summary_and_detailed(tmp_path)
    code, out, _ = run_cli("compare", summary, *LLAMA)
    assert code == 0 and "every request at the file's means" in " ".join(out.split())
    code, out, _ = run_cli("compare", summary, *LLAMA, "--lengths-from", detailed)
    assert code == 0 and "every request at the file's means" not in " ".join(out.split())


def _printed_totals(name: str) -> tuple[int, int, int]:
    text = (SERVED / f"{name}.txt").read_text()

    def field(label):
        return int(text.split(label)[1].split()[0])

    return (field("Successful requests:"), field("Total input tokens:"),
            field("Total generated tokens:"))


@pytest.mark.parametrize("page, floor", [("qwen3-235b-a22b-b200x8-tp8", 0),
                                         ("deepseek-r1-b200x8-tp8", 0),
                                         ("deepseek-v3.1-mi300x-x8-tp8", 1)])
def test_each_cookbook_page_matches_one_client_releases_draw(page, floor):
    """SGLang 0.5.6's client drew output lengths from 0 (bench_serving.py's own draw); the
    0.5.7 page's from 1 (compute_random_lens floors both at 1). Every block's totals are
    those of exactly one of the two draws with seed 1, the same for all nine of a page."""
    for io in ("r1000in-1000out", "r1000in-8000out", "r8000in-1000out"):
        for conc in (1, 16, 100, 64):
            name = f"cookbook-{page}-{io}-c{conc}"
            if not (SERVED / f"{name}.txt").exists():
                continue
            n, total_in, total_out = _printed_totals(name)
            inp, out = (int(x) for x in io[1:].replace("out", "").split("in-"))
            sums = {f: tuple(map(sum, sglang_random_lengths(1, n, RandomLengths(inp, out, 0.0),
                                                            f))) for f in (0, 1)}
            assert sums[floor] == (total_in, total_out), name
            assert sums[1 - floor] != (total_in, total_out), name


def test_the_redraw_takes_the_later_clients_floor_and_says_when_neither_fits():
    spec = RandomLengths(1000, 1000, 0.0)
    later = sglang_random_lengths(1, 10, spec, output_floor=1)
    assert later[1] == tuple(x + 1 for x in sglang_random_lengths(1, 10, spec)[1])
    base = {"completed": 10, "request_rate": 4.0, "dataset_name": "random",
            "random_input_len": 1000, "random_output_len": 1000, "random_range_ratio": 0.0,
            "total_input_tokens": sum(later[0]), "total_output_tokens": sum(later[1]),
            "mean_ttft_ms": 50.0}
    run = redrawn(read_sglang([base], "f")[0], 1, "f")
    assert (run.input_lens, run.output_lens) == later
    with pytest.raises(LlmplanError, match="another seed or client release"):
        redrawn(read_sglang([{**base, "total_output_tokens": sum(later[1]) + 5}], "f")[0], 1,
                "f")
