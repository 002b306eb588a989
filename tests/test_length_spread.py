"""A served run of vLLM's random dataset with a range ratio, whose file lists no lengths:
replayed with lengths spread as the client drew them, not every request at the means."""

from __future__ import annotations

import math

import pytest
import yaml

from planner.evidence.runs import ServedRun
from planner.evidence.served import ServedDataset, Traffic
from planner.io import catalog


def _run(tool="vllm-bench-serve", **kw) -> ServedRun:
    base = dict(source="f", tool=tool, label="x", request_rate=math.inf, max_concurrency=4,
                num_prompts=24, completed=24, mean_input_tokens=2000.0,
                mean_output_tokens=200.0)
    return ServedRun(**{**base, **kw})


def test_the_range_ratio_of_vllms_random_dataset_spreads_the_replayed_lengths():
    t = Traffic(dataset="random", range_ratio=0.15, input_len=2000, output_len=200)
    assert t.apply(_run()).length_spread == 0.15
    # not another dataset, not a file that lists its lengths, not a ratio of 0 (fixed
    # lengths), not SGLang's client (its own draw, RandomLengths, from the ratio up)
    assert Traffic(dataset="sharegpt", range_ratio=0.15).apply(_run()).length_spread == 0
    listed = _run(input_lens=(2000,) * 24, output_lens=(200,) * 24)
    assert t.apply(listed).length_spread == 0
    assert Traffic(dataset="random", range_ratio=0.0).apply(_run()).length_spread == 0
    sg = Traffic(dataset="random", range_ratio=0.15, input_len=2000, output_len=200).apply(
        _run(tool="sglang-bench-serving"))
    assert sg.length_spread == 0 and sg.random_lengths is not None


def test_a_spread_run_is_replayed_with_lengths_within_its_ratio_of_the_means():
    """24 requests within 50% of 2,000 / 200 tokens: the simulated totals are not 24 x the
    means (every request at them) but within [1,000, 3,000] and [100, 300] a request, and the
    note says the lengths were drawn."""
    from planner.cli.compare import served_setup
    from planner.core.specs import DType
    from planner.evidence.compare import simulate_run

    dep = served_setup("llama-3.1-8b", "h100-sxm", catalog.load_engine_spec("vllm"), 1,
                       DType.bf16, None)
    fixed, _ = simulate_run(_run(), dep)
    spread, notes = simulate_run(_run(length_spread=0.5), dep)
    assert fixed["total_input_tokens"] == 24 * 2000
    assert fixed["total_output_tokens"] == 24 * 200
    assert spread["total_input_tokens"] != 24 * 2000
    assert 24 * 1000 <= spread["total_input_tokens"] <= 24 * 3000
    assert 24 * 100 <= spread["total_output_tokens"] <= 24 * 300
    assert any("drawn uniformly within 50% of the means" in n for n in notes)


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


def test_the_blog_tables_manifest_states_its_traffic():
    ds = ServedDataset.model_validate(yaml.safe_load(
        (catalog.SERVED_DIR / "vllm-blog-fp8-kvcache-served.yaml").read_text()))
    assert len(ds.runs) == 4 and all(e.kept == "table" for e in ds.runs)
    for e in ds.runs:
        t = e.traffic
        assert (t.dataset, t.range_ratio, t.max_concurrency, t.num_prompts) == (
            "random", 0.15, 8, 150)
        assert e.kv_cache.value == ("fp8" if "-kv-fp8-" in e.id else "bf16")
