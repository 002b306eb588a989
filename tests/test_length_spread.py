"""A served run of vLLM's random dataset with a range ratio, whose file lists no lengths:
replayed with lengths spread as the client drew them, adding up to the run's totals, not
every request at the means."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from planner.cli.compare import read_result_file
from planner.evidence.runs import ServedRun
from planner.evidence.served import ServedDataset, Traffic
from planner.io import catalog
from planner.serving.traffic import Request, length_range, synthetic, with_totals


def _run(tool="vllm-bench-serve", **kw) -> ServedRun:
    base = dict(source="f", tool=tool, label="x", request_rate=math.inf, max_concurrency=4,
                num_prompts=24, completed=24, mean_input_tokens=2000.0,
                mean_output_tokens=200.0)
    return ServedRun(**{**base, **kw})


def test_the_range_ratio_of_vllms_random_dataset_spreads_the_replayed_lengths():
    t = Traffic(dataset="random", range_ratio=0.15, input_len=2000, output_len=200)
    assert t.apply(_run()).length_spread_frac == 0.15
    # not another dataset, not a file that lists its lengths, not a ratio of 0 (fixed
    # lengths), not SGLang's client (its own draw, RandomLengths, from the ratio up)
    assert Traffic(dataset="sharegpt", range_ratio=0.15).apply(_run()).length_spread_frac == 0
    listed = _run(input_lens=(2000,) * 24, output_lens=(200,) * 24)
    assert listed.lists_lengths and t.apply(listed).length_spread_frac == 0
    assert Traffic(dataset="random", range_ratio=0.0).apply(_run()).length_spread_frac == 0
    sg = t.apply(_run(tool="sglang-bench-serving"))
    assert sg.length_spread_frac == 0 and sg.random_lengths is not None


def test_a_ratio_read_from_the_ratio_up_spreads_about_its_mean():
    """InferenceX's client draws each length from 0.8 L up to L: mean 0.9 L, half-width
    0.1 L, so 1/9 of the mean either side (by hand); 0.5: [0.5 L, L], mean 0.75 L, 1/3."""
    t = Traffic(dataset="random", range_ratio=0.8, range_style="from-ratio")
    assert t.apply(_run()).length_spread_frac == pytest.approx(1 / 9)
    half = Traffic(dataset="random", range_ratio=0.5, range_style="from-ratio")
    assert half.apply(_run()).length_spread_frac == pytest.approx(1 / 3)
    # the default reading, stated or not, is vLLM's +-ratio
    assert Traffic(dataset="random", range_ratio=0.8,
                   range_style="plus-minus").apply(_run()).length_spread_frac == 0.8
    with pytest.raises(ValueError):
        Traffic(dataset="random", range_ratio=0.8, range_style="from-the-top")
    # a style says how a random dataset's ratio is read: without either it is refused
    for bad in (dict(dataset="random"), dict(dataset="sharegpt", range_ratio=0.8)):
        with pytest.raises(ValueError, match="range_style"):
            Traffic(range_style="from-ratio", **bad)


def _reqs(prompts, outputs):
    return [Request(i, 0.0, p, o) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))]


def test_drawn_lengths_are_shifted_to_the_stated_totals_by_hand():
    """[10, 12, 14] (36) to 39: each +1; to 37: the first +1; to 33: each -1; within
    [6, 14] (10 +-40%, as length_range gives it) the last is at the top, so the other two
    take the 3: +2 and +1."""
    r = _reqs([10, 12, 14], [5, 5, 5])
    assert [x.prompt_tokens for x in with_totals(r, 39, 15, 12, 5, 0.4)] == [11, 13, 15]
    assert [x.prompt_tokens for x in with_totals(r, 37, 15, 12, 5, 0.4)] == [11, 12, 14]
    assert [x.prompt_tokens for x in with_totals(r, 33, 15, 12, 5, 0.4)] == [9, 11, 13]
    assert length_range(10, 0.4) == (6, 14)
    assert [x.prompt_tokens for x in with_totals(r, 39, 15, 10, 5, 0.4)] == [12, 13, 14]
    # every value at the top: as near as the range allows
    assert [x.prompt_tokens for x in with_totals(r, 60, 15, 10, 5, 0.4)] == [14, 14, 14]
    assert [x.output_tokens for x in with_totals(r, 39, 18, 12, 5, 0.4)] == [6, 6, 6]
    assert with_totals([], 1, 1, 1, 1, 0.1) == []


@given(n=st.integers(1, 400), mean=st.integers(1, 50_000), ratio=st.floats(0.01, 0.9),
       seed=st.integers(0, 2**31), off=st.floats(-0.03, 0.03))
def test_shifted_draws_add_up_to_any_total_the_range_allows_and_stay_in_it(
        n, mean, ratio, seed, off):
    reqs = synthetic(n, prompt_tokens=mean, output_tokens=mean, range_ratio=ratio, seed=seed,
                     closed_loop=True)
    lo, hi = length_range(mean, ratio)
    total = min(max(round(mean * n * (1 + off)), lo * n), hi * n)
    got = with_totals(reqs, total, total, mean, mean, ratio)
    assert all(lo <= r.prompt_tokens <= hi and lo <= r.output_tokens <= hi for r in got)
    assert sum(r.prompt_tokens for r in got) == total == sum(r.output_tokens for r in got)


def test_a_spread_run_is_replayed_at_its_totals_with_the_note():
    """24 requests within 50% of 2,000 / 200 tokens: the simulated totals are the run's (24 x
    the means) as at fixed lengths, the schedule is not the fixed one's, and the note says
    the lengths were drawn."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType
    from planner.evidence.compare import simulate_run

    dep = served_setup("llama-3.1-8b", "h100-sxm", catalog.load_engine_spec("vllm"), 1,
                       DType.bf16, None)
    fixed, _ = simulate_run(_run(), dep)
    spread, notes = simulate_run(_run(length_spread_frac=0.5), dep)
    for d in (fixed, spread):
        assert (d["total_input_tokens"], d["total_output_tokens"]) == (24 * 2000, 24 * 200)
    assert spread["median_ttft_ms"] != fixed["median_ttft_ms"]
    assert any("drawn uniformly within 50% of the means, adding up to the run's totals" in n
               for n in notes)


# The post's Tables 4 and 5 (vllm-project.github.io _posts/2026-04-22-fp8-kvcache.md at
# 5ffe2dd, lines 142, 143, 149, 150): median TTFT ms, median ITL ms, duration s, output tok/s
POST = {"vllmblog-llama31-8b-h100-kv-bf16-c8": (763.6, 15.18, 672.6, 450.3),
        "vllmblog-llama31-8b-h100-kv-fp8-c8": (742.8, 12.93, 585.2, 517.5),
        "vllmblog-gpt-oss-20b-h100-kv-bf16-c8": (468.9, 8.09, 364.2, 831.6),
        "vllmblog-gpt-oss-20b-h100-kv-fp8-c8": (451.7, 7.90, 355.1, 853.0)}


def test_the_blog_tables_rows_are_kept_as_printed_with_their_traffic():
    ds = ServedDataset.model_validate(yaml.safe_load(
        (catalog.SERVED_DIR / "vllm-blog-fp8-kvcache-served.yaml").read_text()))
    assert {e.id for e in ds.runs} == set(POST) and all(e.kept == "table" for e in ds.runs)
    for e in ds.runs:
        t = e.traffic
        assert (t.dataset, t.range_ratio, t.max_concurrency, t.num_prompts, t.input_len,
                t.output_len) == ("random", 0.15, 8, 150, 20000, 2000)
        assert e.kv_cache.value == ("fp8" if "-kv-fp8-" in e.id else "bf16")
        (run,) = read_result_file(catalog.SERVED_DIR / e.file)
        ttft_ms, itl_ms, duration_s, tok_s = POST[e.id]
        m = run.metrics
        assert m["median_ttft_s"] == pytest.approx(ttft_ms / 1e3)
        assert m["median_itl_s"] == pytest.approx(itl_ms / 1e3)
        assert m["output_throughput"] == tok_s and run.duration_s == duration_s
        # derived: outputs as tok/s x duration, 150 requests over the duration
        assert run.mean_output_tokens * 150 == round(tok_s * duration_s)
        assert m["request_throughput"] == pytest.approx(150 / duration_s, abs=1e-4)
        assert (run.completed, run.mean_input_tokens) == (150, 20000)


@pytest.mark.slow  # replays one published run of 150 long requests (about 10 s)
def test_the_vllm_blogs_concurrency_8_run_starts_its_requests_one_at_a_time(run_json):
    """The vLLM blog's FP8 KV-cache post, Table 4, Llama-3.1-8B BF16 on one H100 (vLLM
    0.19.1): 150 requests of about 20,000 tokens in and 2,000 out (+-15%), 8 in flight;
    measured median TTFT 763.6 ms. At the means every request of a wave of 8 ends together
    and the next 8 start together, each prefill waiting on the others' (1.83 s, +139%);
    spread within 15%, they end and start one at a time, each prefilling nearly alone."""
    d = run_json("validate", "--source", "vllm-blog-fp8-kvcache-served", "--no-rows")
    rows = {r["metric"]: r for r in d["served_rows"]
            if r["run"] == "vllmblog-llama31-8b-h100-kv-bf16-c8"}
    assert rows["median_ttft_s"]["measured"] == pytest.approx(0.7636)
    assert abs(rows["median_ttft_s"]["error"]) < 0.15
    assert rows["median_itl_s"]["measured"] == pytest.approx(0.01518)
    assert abs(rows["median_itl_s"]["error"]) < 0.2
