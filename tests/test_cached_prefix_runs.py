"""Runs whose prompts began with those of the runs before them on the same server.

SGLang's ``bench_serving --dataset-name random`` builds prompt i of every run from the same
ShareGPT conversation (shuffled with the seed, default 1), repeated or cut to that run's
length i; Scicom's harness ran 1,024-, 2,048-, 4,096- and 8,192-token runs in that order
against one server with the radix cache on. So request i of a later run found the beginning
that the earlier runs sent in the cache: min(its length, the longest earlier prompt i)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from planner.evidence.formats import FormatError, read_sglang
from planner.evidence.served import ServedDataset
from planner.io import catalog

SERVED = catalog.SERVED_DIR
H100 = "scicom-benchmaq-h100-sglang"
LLAMA = "scicom-maq-llama31-70b-sglang-tp8-h100"
H100_DENSE_BF16_FLOPS = 989e12  # hardware_db/h100-sxm.yaml, dense


def _dataset(name: str) -> ServedDataset:
    return ServedDataset.model_validate(yaml.safe_load((SERVED / f"{name}.yaml").read_text()))


def _published(length: int) -> dict:
    return json.loads((SERVED / f"{LLAMA}-{length}.jsonl").read_text().splitlines()[0])


def test_the_sglang_reader_keeps_each_requests_lengths():
    base = {"completed": 2, "request_rate": 4.0, "total_input_tokens": 300,
            "total_output_tokens": 20, "mean_ttft_ms": 10.0}
    run = read_sglang([{**base, "input_lens": [100, 200], "output_lens": [5, 15]}], "f")[0]
    assert run.input_lens == (100, 200) and run.output_lens == (5, 15)
    assert read_sglang([base], "f")[0].input_lens is None  # written with --output-details only
    with pytest.raises(FormatError, match="f:1: input_lens"):
        read_sglang([{**base, "input_lens": [100, "x"]}], "f")


def test_each_request_of_the_last_run_replays_the_beginning_the_earlier_runs_sent():
    """By hand from the published lengths of requests 0-3 (1,024 / 2,048 / 4,096 / 8,192-token
    runs): 37 / 1,061 / 1,061 / 5,157 -> 1,061 of 5,157 cached; 235 in all four -> all 235;
    908 / 1,932 / 3,980 / 3,980 -> all 3,980; 72 / 1,096 / 1,096 / 5,192 -> 1,096."""
    from planner.cli.validate import replayed_runs

    ds = _dataset(H100)
    run = replayed_runs(ds.entry(f"{LLAMA}-8192"), SERVED, ds)[0]
    assert run.input_lens[:4] == (5157, 235, 3980, 5192)
    assert run.cached_prefix_lens[:4] == (1061, 235, 3980, 1096)
    first = replayed_runs(ds.entry(f"{LLAMA}-1024"), SERVED, ds)[0]
    assert first.cached_prefix_lens is None and first.cached_prefix_tokens == 0


@pytest.mark.parametrize("length", [2048, 4096, 8192])
def test_the_published_first_tokens_need_the_cache(length):
    """The evidence, from the files alone: prefilling every prompt token before the last first
    token (2 x 70.6e9 FLOP a token, decodes and attention left out: a lower bound) would take
    Llama-3.1-70B on 8 H100s to 777-877 TFLOP/s a GPU, near the dense 989 peak, where the cold
    first run reached 395; with each prompt's cached beginning taken off it is 406-417 in every
    later run, the first run's pace."""
    flops_per_token = 2 * 70.6e9

    def per_gpu(tokens: int, d: dict) -> float:
        return tokens * flops_per_token / max(d["ttfts"]) / 8

    cold = per_gpu(sum(_published(1024)["input_lens"]), _published(1024))
    d = _published(length)
    earlier = [_published(n)["input_lens"] for n in (1024, 2048, 4096) if n < length]
    cached = sum(min(p, max(e[i] for e in earlier)) for i, p in enumerate(d["input_lens"]))
    assert per_gpu(sum(d["input_lens"]), d) > 0.75 * H100_DENSE_BF16_FLOPS
    assert per_gpu(sum(d["input_lens"]) - cached, d) == pytest.approx(cold, rel=0.1)


def test_replaying_the_cached_beginnings_brings_the_first_tokens_to_the_published_ones():
    from dataclasses import replace

    from planner.cli.validate import replay_setup, replayed_runs
    from planner.evidence.compare import simulate_run

    ds = _dataset(H100)
    entry = ds.entry(f"{LLAMA}-8192")
    run = replayed_runs(entry, SERVED, ds)[0]
    setup = replay_setup(entry, catalog.load_engine_spec("sglang"))
    warm, notes = simulate_run(run, setup)
    cold, _ = simulate_run(replace(run, cached_prefix_lens=None), setup)
    measured = run.metrics["mean_ttft_s"] * 1e3
    assert any("of the prompt tokens were in the prefix cache" in n for n in notes)
    assert warm["mean_ttft_ms"] < 0.7 * cold["mean_ttft_ms"]
    assert abs(warm["mean_ttft_ms"] / measured - 1) < abs(cold["mean_ttft_ms"] / measured - 1)


MANIFEST = {
    "source": {"id": "try", "url": "https://example.invalid/runs", "repo": "someone/runs",
               "commit": "0123456789abcdef0123456789abcdef01234567", "date": "2026-11-21",
               "engine": "vllm", "engine_version": "0.11", "hardware_note": "1xH100-80GB-SXM"},
    "runs": [{"id": "first", "file": "vllm_bench_serve_detailed.json", "path": "r/a.json",
              "sha256": "0" * 64, "model": "llama-3.1-8b", "gpu": "h100-sxm"},
             {"id": "second", "file": "vllm_bench_serve_detailed.json", "path": "r/b.json",
              "sha256": "0" * 64, "model": "llama-3.1-8b", "gpu": "h100-sxm",
              "traffic": {"cached_prefix_runs": ["first"]}}],
}


def _manifest(tmp_path: Path, data: dict) -> Path:
    for f in ("vllm_bench_serve_detailed.json", "vllm_bench_serve.json"):
        shutil.copy(Path(__file__).parent / "fixtures" / "servers" / f, tmp_path)
    p = tmp_path / "try.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_a_run_after_the_same_prompts_replays_them_from_the_cache(run_json, tmp_path):
    d = run_json("validate", "--served-dataset", str(_manifest(tmp_path, MANIFEST)),
                 "--no-rows")
    ttft = {r["run"]: r["predicted"] for r in d["served_rows"] if r["metric"] == "mean_ttft_s"}
    assert ttft["second"] < 0.8 * ttft["first"]


@pytest.mark.parametrize("change, says", [
    ({"traffic": {"cached_prefix_runs": ["nope"]}}, "'nope' is not another run"),
    ({"traffic": {"cached_prefix_runs": ["second"]}}, "'second' is not another run"),
    ({"traffic": {"cached_prefix_runs": ["first"], "cached_prefix_tokens": 10}}, "give one"),
    ({"file": "vllm_bench_serve.json"}, "lists no per-request input_lens"),
])
def test_a_wrong_cached_prefix_runs_is_one_line_naming_the_run(run_cli, tmp_path, change, says):
    bad = dict(MANIFEST, runs=[MANIFEST["runs"][0], {**MANIFEST["runs"][1], **change}])
    code, _, err = run_cli("validate", "--served-dataset", str(_manifest(tmp_path, bad)),
                           "--no-rows")
    assert code == 2 and says in err and "second" in err, err
    assert len(err.strip().splitlines()) == 1


def test_an_earlier_run_without_lengths_is_named(run_cli, tmp_path):
    bad = dict(MANIFEST, runs=[{**MANIFEST["runs"][0], "file": "vllm_bench_serve.json"},
                               MANIFEST["runs"][1]])
    code, _, err = run_cli("validate", "--served-dataset", str(_manifest(tmp_path, bad)),
                           "--no-rows")
    assert code == 2 and "vllm_bench_serve.json does not list one input length" in err, err


def test_compare_replays_a_sweeps_cached_beginnings(run_json):
    """`compare --cached-from` is the same replay for a user's own sweep: the 2,048-token run
    after the 1,024-token one on the same server (46% of its prompt tokens cached)."""
    args = ("compare", str(SERVED / f"{LLAMA}-2048.jsonl"), "-m", "llama-3.1-70b", "-g",
            "h100-sxm", "--tp", "8", "-e", "sglang")
    cold = run_json(*args)["runs"][0]
    warm = run_json(*args, "--cached-from", str(SERVED / f"{LLAMA}-1024.jsonl"))["runs"][0]
    assert cold["notes"] == [] and warm["notes"][0].startswith("46% of the prompt tokens")
    ttft = warm["metrics"]["mean_ttft_s"]
    assert ttft["simulated"] < 0.7 * cold["metrics"]["mean_ttft_s"]["simulated"]
    assert abs(ttft["error"]) < abs(cold["metrics"]["mean_ttft_s"]["error"])


def test_compare_cached_from_a_file_without_lengths_is_one_line(run_cli):
    code, _, err = run_cli("compare", str(SERVED / f"{LLAMA}-2048.jsonl"), "-m",
                           "llama-3.1-70b", "-g", "h100-sxm", "--tp", "8", "--cached-from",
                           str(Path(__file__).parent / "fixtures" / "servers" /
                               "vllm_bench_serve.json"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "vllm_bench_serve.json does not list one input length for each of the 100" in err


def test_an_earlier_file_of_several_runs_is_refused_by_name():
    from planner.core.errors import LlmplanError
    from planner.evidence.compare import warmed_by
    from planner.evidence.formats import read_sglang

    base = {"completed": 2, "request_rate": 4.0, "total_input_tokens": 300,
            "total_output_tokens": 20, "mean_ttft_ms": 10.0, "input_lens": [100, 200],
            "output_lens": [5, 15]}
    run = read_sglang([base], "now.jsonl")[0]
    two = read_sglang([base, base], "sweep.jsonl")
    with pytest.raises(LlmplanError, match="sweep.jsonl holds 2 runs"):
        warmed_by(run, [("sweep.jsonl", two)], "now.jsonl")
    warm = warmed_by(run, [("one.jsonl", two[:1]), ("two.jsonl", two[1:])], "now.jsonl")
    assert warm.cached_prefix_lens == (100, 200)


def test_compare_sweep_warms_each_run_with_the_ones_before_it(run_json):
    """`--sweep`: the files in the order given ran on one server; the 2,048-token run replays
    as it does with `--cached-from` the 1,024-token one, and the first run stays cold."""
    files = [str(SERVED / f"{LLAMA}-{n}.jsonl") for n in (1024, 2048)]
    args = ("-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "8", "-e", "sglang")
    swept = run_json("compare", *files, "--sweep", *args)["runs"]
    alone = run_json("compare", files[1], "--cached-from", files[0], *args)["runs"][0]
    assert swept[0]["notes"] == [] and swept[1]["notes"] == alone["notes"]
    assert swept[1]["metrics"]["mean_ttft_s"]["simulated"] == pytest.approx(
        alone["metrics"]["mean_ttft_s"]["simulated"])


def test_calibrate_on_a_sweep_sees_the_cache(run_cli, tmp_path):
    """Calibrating on Scicom's four-length sweep without --sweep starts from figures 92% off
    (median, base profile) and ends 62% off; with it, 26% and 4%. (Either fit ends at the edge
    of its ranges, SGLang's GEMMs there at their kernels' full rates, and is refused: exit 1.)
    """
    import statistics

    files = [str(SERVED / f"{LLAMA}-{n}.jsonl") for n in (1024, 2048, 4096, 8192)]

    def errors(*extra: str) -> tuple[float, float]:
        code, out, _ = run_cli("calibrate", *files, *extra, "-m", "llama-3.1-70b", "-g",
                               "h100-sxm", "--tp", "8", "--base-engine", "sglang", "-o",
                               str(tmp_path / "p.yaml"), "--no-leave-one-out", "--json")
        assert code in (0, 1)
        d = json.loads(out)
        return tuple(statistics.median(abs(e[k]) for e in d["errors"])
                     for k in ("before", "in_sample"))

    (cold, cold_fit), (warm, warm_fit) = errors(), errors("--sweep")
    assert cold > 0.8 and cold_fit > 0.5
    assert warm < 0.35 and warm_fit < 0.1


def test_an_earlier_run_of_fewer_requests_warms_only_the_indices_it_sent():
    """The SGLang cookbook's Qwen3 page sends 10, then 80, then 500 requests with seed 1 to
    one server: request i < 10 of the 80-request run began as the 10-request run's request i
    did (its first ten lengths are those ten, drawn first), so all of it is cached; the other
    70 are cold. The earlier runs' lengths are drawn again from the seed (their blocks give
    totals only)."""
    from planner.cli.validate import replayed_runs

    ds = _dataset("sglang-cookbook")
    page = "cookbook-qwen3-235b-a22b-b200x8-tp8-r1000in-1000out"
    first = replayed_runs(ds.entry(f"{page}-c1"), SERVED, ds)[0]
    second = replayed_runs(ds.entry(f"{page}-c16"), SERVED, ds)[0]
    third = replayed_runs(ds.entry(f"{page}-c100"), SERVED, ds)[0]
    assert second.input_lens[:10] == first.input_lens
    assert second.cached_prefix_lens == first.input_lens + (0,) * 70
    assert third.cached_prefix_lens == second.input_lens + (0,) * 420


def test_a_longer_earlier_run_warms_with_its_first_requests():
    from planner.evidence.compare import warmed_by

    base = {"completed": 2, "request_rate": 4.0, "total_input_tokens": 300,
            "total_output_tokens": 20, "mean_ttft_ms": 10.0}
    run = read_sglang([{**base, "input_lens": [100, 200], "output_lens": [5, 15]}], "n")[0]
    longer = read_sglang([{**base, "completed": 3, "total_input_tokens": 450,
                           "input_lens": [150, 50, 250], "output_lens": [5, 5, 10]}], "b")
    assert warmed_by(run, [("b", longer)], "n").cached_prefix_lens == (100, 50)


A100_ROUND2 = "cssnoeasy-qwen25-7b-a100pcie-tp1-r512-o256-c8-round2"


def test_compare_replays_a_repeated_run_from_the_prefix_cache(run_json, run_cli):
    """A run repeated on one server with one seed (vLLM's random dataset sends the same
    prompts again) is replayed by `compare --cached-prefix-tokens N` as `validate` replays it
    from its manifest's traffic.cached_prefix_tokens: the same predicted figures. Cached, the
    first token needs no prefill and comes sooner; refused beside --sweep, which gives each
    request its own beginning."""
    f = str(SERVED / f"{A100_ROUND2}.json")
    # the report's release, as validate replays it (its defaults: 16-token KV blocks)
    args = (f, "-m", "qwen2.5-7b", "-g", "a100-pcie-80gb", "--weights", "fp16",
            "-e", "vllm@0.19.0")
    warm = run_json("compare", *args, "--cached-prefix-tokens", "512")["runs"][0]["metrics"]
    cold = run_json("compare", *args)["runs"][0]["metrics"]
    assert warm["median_ttft_s"]["simulated"] < 0.5 * cold["median_ttft_s"]["simulated"]
    assert warm["request_throughput"]["simulated"] > cold["request_throughput"]["simulated"]
    d = run_json("validate", "--source", "cssnoeasy-a100-vllm")
    row = {r["metric"]: r for r in d["served_rows"]
           if r["run"].startswith(A100_ROUND2)}
    for k in ("median_ttft_s", "request_throughput"):
        assert row[k]["predicted"] == pytest.approx(warm[k]["simulated"], rel=1e-9), k
    code, _, err = run_cli("compare", *args, "--cached-prefix-tokens", "512", "--sweep")
    assert code == 2 and "--cached-prefix-tokens with --cached-from or --sweep" in err


def test_a_cached_beginning_is_not_counted_in_the_measured_mfu():
    """The measured MFU counts the FLOPs the run computed: a prompt found in the prefix cache
    was computed by an earlier run. The A100 report's round 2 (512 + 256 tokens, all but the
    last prompt token cached): by hand, a request's prefill less its first 511 tokens' is one
    token's worth, so the run's FLOPs are its 256 decode tokens' plus that, and its MFU falls
    in proportion."""
    from dataclasses import replace

    from planner.cli.compare import read_result_file, served_setup
    from planner.core.ops import decode_ops, prefill_ops, total_flops
    from planner.core.specs import DType
    from planner.evidence.compare import utilization

    run = read_result_file(SERVED / f"{A100_ROUND2}.json")[0]
    s = served_setup("qwen2.5-7b", "a100-pcie-80gb", catalog.load_engine_spec("vllm"), 1,
                     DType.fp16, None)
    cold = utilization(run, s)[3]
    warm = utilization(replace(run, cached_prefix_tokens=512), s)[3]
    m, p = s.model, s.precision
    ctx = round(512 + 256 / 2)
    prefill = total_flops(prefill_ops(m, p, batch=1, prompt_tokens=512))
    rest = prefill - total_flops(prefill_ops(m, p, batch=1, prompt_tokens=511))
    decode = 256 * total_flops(decode_ops(m, p, batch=1, context_tokens=ctx))
    assert warm / cold == pytest.approx((rest + decode) / (prefill + decode), rel=1e-9)
    assert 0.2 < warm / cold < 0.5  # the prefill was about two thirds of the work
