"""Error bands (planner.evidence.bands), engine profiles by release, and the request path."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.core.engine import version_key
from planner.core.errors import SpecError
from planner.evidence.bands import (
    Applied,
    Band,
    Figure,
    apply,
    build,
    coverage,
    from_table,
    kind_note,
    pick,
    served_regime,
    widen_near_capacity,
)
from planner.io import catalog


def _figs(engine, phase, regime, ratios, sources):
    return [Figure(engine, phase, regime, s, r) for r, s in zip(ratios, sources, strict=True)]


def test_a_band_is_the_10th_and_90th_percentile_of_measured_over_predicted():
    # 12 ratios 0.80, 0.82, ..., 1.02, four from each of three sources (equal weights): the
    # i-th smallest stands at (i - 0.5) / 12, so p10 lies 0.7 of the way from the 1st to the
    # 2nd (0.814), the median halfway from the 6th to the 7th (0.91), p90 0.3 of the way from
    # the 11th to the 12th (1.006)
    ratios = [0.80 + 0.02 * i for i in range(12)]
    figs = _figs("vllm", "served TPOT", "unsaturated", ratios, ["a", "b", "c"] * 4)
    b = {(x.engine, x.phase, x.regime): x for x in build(figs)}
    own = b[("vllm", "served TPOT", "unsaturated")]
    assert (own.low_ratio, own.median_ratio, own.high_ratio) == \
        pytest.approx((0.814, 0.91, 1.006))
    assert own.n == 12 and own.sources == 3
    # the fallbacks hold the same figures
    assert b[("all", "served TPOT", "all")].n == 12
    # a prediction of 10 ms: measured has been 8.14-10.06 ms
    a = apply(build(figs), 0.010, "vllm", "served TPOT", "unsaturated")
    assert (a.low, a.high) == pytest.approx((0.00814, 0.01006)) and not a.borrowed
    # a rate: 1 / TPOT's band, inverted
    r = apply(build(figs), 100.0, "vllm", "served TPOT", "unsaturated", inverse=True)
    assert (r.low, r.high) == pytest.approx((100 / 1.006, 100 / 0.814))


def test_each_source_counts_as_one_in_a_band():
    """One source measured 1.0x its predictions 100 times, two others 2.0x and 3.0x once each.
    Counted figure by figure, the band would be 1.0-1.0 (98 of 102 figures are 1.0) and say
    nothing of how the other two differ. With each source one third of the weight, the 1.0s
    fill the first third, 2.0 stands at the middle (1.5 / 3) and 3.0 at 2.5 / 3: p10 1.0,
    median 2.0, p90 3.0 (above 3.0's position, the largest holds)."""
    figs = (_figs("e", "decode", "batched", [1.0] * 100, ["big"] * 100)
            + _figs("e", "decode", "batched", [2.0, 3.0], ["p", "q"]))
    band = pick(build(figs), "e", "decode", "batched")
    assert (band.low_ratio, band.median_ratio, band.high_ratio) == pytest.approx((1.0, 2.0, 3.0))
    assert band.n == 102 and band.sources == 3


def test_hazen_quantile_by_hand_and_against_numpy():
    from planner.core.arith import hazen_quantile

    # weights 1, 1, 2 of a total 4: 10 at 0.125, 20 at 0.375, 30 at 0.75
    assert hazen_quantile([30.0, 10.0, 20.0], [2.0, 1.0, 1.0], 0.5) == pytest.approx(
        20 + 10 * (0.5 - 0.375) / (0.75 - 0.375))
    assert hazen_quantile([30.0, 10.0, 20.0], [2.0, 1.0, 1.0], 0.1) == 10.0
    assert hazen_quantile([30.0, 10.0, 20.0], [2.0, 1.0, 1.0], 0.9) == 30.0
    assert math.isnan(hazen_quantile([], [], 0.5))


@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=30),
       st.floats(0.0, 1.0), st.floats(0.1, 10.0))
def test_equal_weights_give_numpys_hazen_quantile(values, q, w):
    import numpy as np

    from planner.core.arith import hazen_quantile

    assert hazen_quantile(values, [w] * len(values), q) == pytest.approx(
        float(np.quantile(values, q, method="hazen")), rel=1e-9, abs=1e-12)


def test_two_sources_are_not_enough_for_a_band_of_their_own():
    # however many figures: a band has to span how sources differ, and two cannot show it
    two = _figs("vllm", "decode", "batched", [0.9, 1.0, 1.1] * 4, ["a", "b"] * 6)
    third = _figs("trtllm", "decode", "batched", [1.3] * 5, ["c"] * 5)
    bands = build(two + third)
    assert pick(bands, "vllm", "decode", "batched").engine == "all"
    a = apply(bands, 1.0, "vllm", "decode", "batched")
    assert a.borrowed and a.sources == 3
    # a third source of the engine's own makes it enough
    bands = build(two + _figs("vllm", "decode", "batched", [1.0], ["d"]))
    b = pick(bands, "vllm", "decode", "batched")
    assert (b.engine, b.regime, b.sources) == ("vllm", "batched", 3)


def test_a_band_names_the_gpu_classes_it_was_measured_on_and_says_when_yours_is_not_one():
    hopper = [Figure("vllm", "decode", "batched", s, r, "hopper")
              for s, r in zip("abcab", [0.9, 1.0, 1.1, 1.0, 0.95], strict=True)]
    ampere = [Figure("trtllm", "decode", "batched", s, 1.2, "ampere") for s in "pqr"]
    bands = build(hopper + ampere)
    own = pick(bands, "vllm", "decode", "batched")
    assert own.engine == "vllm" and own.gpu_classes == ("hopper",)
    everyone = {(b.engine, b.regime): b for b in bands}[("all", "all")]
    assert everyone.gpu_classes == ("ampere", "hopper")
    # measured on the class asked about: nothing added
    a = apply(bands, 1.0, "vllm", "decode", "batched", gpu_class="hopper")
    assert a.gpu_class_measured is True and "GPUs" not in a.basis
    # the engine was never measured on an Ampere GPU, in any phase (TensorRT-LLM was)
    a = apply(bands, 1.0, "vllm", "decode", "batched", gpu_class="ampere")
    assert a.gpu_class_measured is False
    assert a.basis.endswith("; vllm has no held-out figure on ampere GPUs")
    # no engine at all on a Volta GPU
    a = apply(bands, 1.0, "vllm", "decode", "batched", gpu_class="volta")
    assert a.basis.endswith("; no engine has a held-out figure on volta GPUs")
    # measured on Ampere elsewhere (its prefill), but none of this band's figures are
    more = build(hopper + ampere + [Figure("vllm", "prefill", "batched", "a", 1.0, "ampere")])
    a = apply(more, 1.0, "vllm", "decode", "batched", gpu_class="ampere")
    assert a.gpu_class_measured is False and a.basis.endswith("; none of these on ampere GPUs")
    assert a.as_dict()["gpu_class"] == "ampere"
    # no class given, or a table without classes: unknown, nothing said
    assert apply(bands, 1.0, "vllm", "decode", "batched").gpu_class_measured is None
    bare = [Band(b.engine, b.phase, b.regime, b.low_ratio, b.median_ratio, b.high_ratio, b.n,
                 b.sources) for b in bands]
    assert apply(bare, 1.0, "vllm", "decode", "batched", gpu_class="ada").gpu_class_measured \
        is None
    # the table keeps them
    from planner.evidence.bands import to_table
    back = from_table(to_table(bands), "t.yaml")
    assert [b.gpu_classes for b in back] == [b.gpu_classes for b in bands]


def test_too_little_evidence_borrows_a_wider_band_and_says_so():
    mine = _figs("sglang", "decode", "batch-1", [1.1, 1.2], ["x", "x"])
    others = _figs("trtllm", "decode", "batch-1", [0.9, 1.0, 1.0, 1.1, 0.95, 1.05],
                   ["p", "q", "p", "q", "p", "q"])
    bands = build(mine + others)
    b = pick(bands, "sglang", "decode", "batch-1")
    assert (b.engine, b.regime) == ("all", "batch-1") and b.n == 8
    a = apply(bands, 1.0, "sglang", "decode", "batch-1")
    assert a.borrowed and "none enough for sglang" in a.basis
    # an engine never measured at all gets every engine's band
    assert pick(bands, "my-profile", "decode", "batched").engine == "all"
    # nothing of the phase: no band
    assert pick(bands, "sglang", "served TTFT", "saturated") is None


def test_coverage_leaves_the_scored_source_out():
    """Source a measured 1.0x its predictions six times, c 2.0x ten times. Each scored
    against a band built from the other alone lies outside it: 0 of 16 inside. A band built
    from all 16 (p10 1.0, p90 2.0) would hold every one of them."""
    figs = (_figs("e", "decode", "batch-1", [1.0] * 6, ["a"] * 6)
            + _figs("e", "decode", "batch-1", [2.0] * 10, ["c"] * 10))
    cov = {(c.engine, c.phase): c for c in coverage(figs)}
    assert (cov[("e", "all")].n, cov[("e", "all")].inside) == (16, 0)
    assert (cov[("e", "decode")].n, cov[("e", "decode")].inside) == (16, 0)
    whole = pick(build(figs), "e", "decode", "batch-1")
    assert all(whole.low_ratio <= f.ratio <= whole.high_ratio for f in figs)


@given(st.lists(st.floats(0.2, 5.0), min_size=5, max_size=40), st.floats(1e-4, 10.0))
def test_band_holds_the_value_scaled_by_its_quantiles(ratios, value):
    figs = _figs("e", "prefill", "batched", ratios, [f"s{i % 3}" for i in range(len(ratios))])
    a = apply(build(figs), value, "e", "prefill", "batched")
    assert a.low <= value * max(ratios) * (1 + 1e-9)
    assert a.low <= a.high
    assert a.low >= value * min(ratios) * (1 - 1e-9)


def test_served_regime():
    assert served_regime(math.inf, 3.0) == "saturated"
    assert served_regime(10.0, 9.5) == "unsaturated"
    assert served_regime(10.0, 7.0) == "saturated"  # completes under 90% of what was sent
    assert served_regime(math.nan, 5.0, 256, 256) == "saturated"  # a closed loop, batch full
    assert served_regime(math.nan, 5.0, 12, 256) == "unsaturated"


def test_the_built_in_table_loads_and_is_checked():
    bands = catalog.load_bands()
    assert any(b.phase == "served TTFT" for b in bands)
    assert all(b.low_ratio <= b.median_ratio <= b.high_ratio for b in bands)
    with pytest.raises(ValueError, match="low <= median <= high"):
        from_table([{"engine": "e", "phase": "p", "regime": "r", "low_ratio": 2,
                     "median_ratio": 1, "high_ratio": 3, "n": 4, "sources": 1}], "x.yaml")
    with pytest.raises(ValueError, match=r"bands\[0\]: gpu_classes: expected a list"):
        from_table([{"engine": "e", "phase": "p", "regime": "r", "low_ratio": 1,
                     "median_ratio": 1, "high_ratio": 3, "n": 4, "sources": 1,
                     "gpu_classes": "hopper"}], "x.yaml")


def test_estimate_and_simulate_carry_bands(run_json):
    d = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-b", "1")
    bands = catalog.load_bands()
    b = pick(bands, "vllm", "decode", "batch-1")
    assert d["tpot_s_low"] == pytest.approx(d["tpot_s"] * b.low_ratio)
    assert d["tpot_s_high"] == pytest.approx(d["tpot_s"] * b.high_ratio)
    assert d["bands"]["tpot_s"]["n"] == b.n
    assert d["bands"]["tpot_s"]["gpu_class"] == "hopper"
    assert d["bands"]["tpot_s"]["gpu_class_measured"] is ("hopper" in b.gpu_classes)
    ideal = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", "ideal")
    assert "tpot_s_low" not in ideal  # a bound, not a prediction
    s = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "100",
                 "--request-rate", "2")
    assert s["regime"] == "unsaturated"
    b = pick(bands, "vllm", "served TPOT", "unsaturated")
    assert s["mean_tpot_ms_low"] == pytest.approx(s["mean_tpot_ms"] * b.low_ratio)
    # the high end is the band's, or wider where a server that much slower is slower still
    near = s["near_capacity"]
    assert near["step_factor"] == pytest.approx(b.high_ratio) and near["slowed_keeps_up"]
    if "mean_tpot_ms" in near["widened"]:
        assert s["mean_tpot_ms_high"] == pytest.approx(
            s["mean_tpot_ms"] * near["slowed_mean_tpot_ratio"])
        assert near["slowed_mean_tpot_ratio"] > b.high_ratio
    else:
        assert s["mean_tpot_ms_high"] == pytest.approx(s["mean_tpot_ms"] * b.high_ratio)
    e2e = pick(bands, "vllm", "served E2E", "unsaturated")  # a band of its own
    assert e2e is not None and s["bands"]["mean_e2el_ms"]["n"] == e2e.n
    assert s["mean_e2el_ms_low"] == pytest.approx(s["mean_e2el_ms"] * e2e.low_ratio)
    assert s["mean_e2el_ms_high"] >= s["mean_e2el_ms"] * e2e.high_ratio * (1 - 1e-9)


def test_plan_sized_at_the_high_end_never_uses_fewer_gpus(run_cli):
    args = ["plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--tp", "1", "--weights", "bf16",
            "--kv-cache", "16", "--ttft", "2s", "--tpot", "40ms", "--rps", "20", "--json"]
    code, out, err = run_cli(*args)
    assert code == 0, err
    code2, out2, err2 = run_cli(*args, "--size-at", "high")
    assert code2 == 0, err2
    pred, high = json.loads(out)[0], json.loads(out2)[0]
    assert high["total_gpus"] >= pred["total_gpus"]
    bands = catalog.load_bands()
    tpot_b, ttft_b = (pick(bands, "vllm", f"served {x}", "unsaturated") for x in ("TPOT", "TTFT"))
    assert high["sized_at_step_factor"] == pytest.approx(tpot_b.high_ratio)
    assert high["sized_at_step_factor"] * high["sized_at_ttft_factor"] == \
        pytest.approx(ttft_b.high_ratio)
    assert pred["sized_at_step_factor"] == 1
    # sized at the prediction, a row carries the band around its figures (their p10-p90)
    assert pred["p90_ttft_s_low"] == pytest.approx(pred["p90_ttft_s"] * ttft_b.low_ratio)
    assert pred["p90_ttft_s_high"] == pytest.approx(pred["p90_ttft_s"] * ttft_b.high_ratio)
    assert pred["p90_tpot_s_high"] == pytest.approx(pred["p90_tpot_s"] * tpot_b.high_ratio)
    assert f"{tpot_b.n} held-out figures" in pred["band_evidence"]
    # the figures it was held to are the slowed replica's, within the targets and above
    # the predicted ones the table shows
    assert high["p90_ttft_s"] < high["p90_ttft_s_high"] <= 2
    assert high["p90_tpot_s"] < high["p90_tpot_s_high"] <= 0.040
    assert "none of those figures" not in err2  # served runs on H100s are in the band


def test_sizing_at_slower_steps_sees_the_queue_a_factor_on_the_prediction_misses():
    """Multiplying a replica's predicted TTFT and TPOT by the bands' high ends passes a
    replica count at which a server that much slower is past its capacity; simulating the
    slower server does not, so it sizes more replicas."""
    from planner.layouts.deployment import Deployment
    from planner.search.plan import SimSettings, Targets, replicas_needed

    dep = Deployment.build(catalog.load_model("llama-3.1-8b"),
                           catalog.load_hardware("h100-sxm"), engine=catalog.load_engine("vllm"))
    kw = dict(prompt_tokens=1024, output_tokens=256, targets=Targets(2.0, 0.040, 20),
              upper_rate=1e9)
    factored, _ = replicas_needed(dep, settings=SimSettings(ttft_factor=3.6, tpot_factor=2.07),
                                  **kw)
    slowed, s = replicas_needed(dep, settings=SimSettings(ttft_factor=3.6 / 2.07,
                                                          step_factor=2.07), **kw)
    assert 0 < factored < slowed
    assert s["sized_at"]["p90_tpot_ms"] > s["p90_tpot_ms"]  # held to the slower figures
    # at the factored count the slower replica's p90 TPOT is past the target, where the
    # predicted one's times 2.07 is well within it: slower steps keep more requests
    # running, whose larger batches make each step slower still
    from planner.serving import run
    from planner.serving.metrics import summary
    from planner.serving.steps import SlowedCoster
    from planner.serving.traffic import synthetic

    reqs = synthetic(SimSettings().num_requests, prompt_tokens=1024, output_tokens=256,
                     request_rate=20 / factored, seed=0)
    c = run.coster(dep)
    pred = summary(run.run(dep, reqs, step_coster=c), itl=False)
    slow = summary(run.run(dep, reqs, step_coster=SlowedCoster(c, 2.07)), itl=False)
    assert pred["p90_tpot_ms"] * 2.07 < 30 < 40 < slow["p90_tpot_ms"]
    assert slow["mean_running_requests"] > 2.07 * pred["mean_running_requests"]


def test_plan_names_the_gpus_it_sizes_on_other_gpus_evidence(run_cli):
    code, _, err = run_cli("plan", "-m", "llama-3.1-8b", "-g", "l40s", "-e", "sglang",
                           "--weights", "bf16", "--kv-cache", "16", "--ttft", "2s", "--tpot",
                           "60ms", "--rps", "2", "--size-at", "high", "--top", "1")
    assert code == 0, err
    # no held-out served SGLang run on an Ada GPU: both bands say so, naming the GPU
    assert err.count("none of those figures on a GPU of the class of l40s") == 2, err


def test_a_band_knows_whether_it_was_measured_on_a_class():
    b = Band("e", "decode", "batch-1", 0.9, 1.0, 1.2, 10, 3, ("ampere", "hopper"))
    assert b.measured_on("hopper") is True and b.measured_on("ada") is False
    assert b.measured_on(None) is None and b.measured_on("") is None
    assert Band("e", "decode", "batch-1", 0.9, 1.0, 1.2, 10, 3).measured_on("ada") is None


def test_engine_profiles_by_release():
    assert catalog.load_engine_spec("vllm@0.6.3").name == "vllm-v0"
    assert catalog.load_engine_spec("vllm@0.7").name == "vllm-v0"
    assert catalog.load_engine_spec("vllm@0.8").name == "vllm-0.8"
    assert catalog.load_engine_spec("vllm@0.11.0").name == "vllm-0.8"
    assert catalog.load_engine_spec("vllm@0.12").name == "vllm"
    assert catalog.load_engine_spec("vllm@0.19.1").name == "vllm"
    assert catalog.load_engine_spec("sglang@0.4.5").name == "sglang"
    assert version_key("0.10.1") > version_key("0.9.2")  # numbers, not text
    assert version_key("0.11") == version_key("0.11.0") < version_key("0.11.0.1")  # padded
    with pytest.raises(SpecError, match="no vllm profile covers release 0.5"):
        catalog.load_engine_spec("vllm@0.5")
    with pytest.raises(SpecError, match="not a release number"):
        catalog.load_engine_spec("vllm@latest")
    # a release as engines name it: pre-, post- and development releases, a leading v
    for ref, name in (("vllm@0.10.1.post1", "vllm-0.8"), ("vllm@v0.8.2", "vllm-0.8"),
                      ("vllm@0.11.0rc2", "vllm-0.8"), ("vllm@0.12.0rc1", "vllm"),
                      ("sglang@0.5.3.post3", "sglang"), ("sglang@0.5.3rc0", "sglang"),
                      ("trtllm@1.2.0rc1", "trtllm"), ("vllm@0.6.3.dev12", "vllm-v0")):
        assert catalog.load_engine_spec(ref).name == name, ref
    for bad in ("vllm@0.8-beta", "vllm@rc1", "vllm@0.8.", "vllm@"):
        with pytest.raises(SpecError, match="not a release number"):
            catalog.load_engine_spec(bad)


def test_a_release_starts_with_its_own_scheduler_defaults():
    """vLLM before 0.8.5 ran 256 sequences and 2,048 tokens a step on every GPU (its
    _set_default_args_v1); 0.8.5 and later pick 1024 / 8192 on an H100 and 256 / 2048 on an
    A100. A served run's engine version text picks the release it was measured on."""
    from planner.cli.validate import at_release
    from planner.core.engine import release_in

    old = catalog.load_engine_spec("vllm@0.8.2").model()
    assert (old.max_num_seqs, old.max_num_batched_tokens, old.small_gpu) == (256, 2048, None)
    h100 = catalog.load_hardware("h100-sxm")
    assert old.for_gpu(h100.memory_bytes, h100.name).max_num_seqs == 256
    new = catalog.load_engine_spec("vllm@0.8.5").model().for_gpu(h100.memory_bytes, h100.name)
    assert (new.max_num_seqs, new.max_num_batched_tokens) == (1024, 8192)
    assert release_in("vLLM 0.8.2 (Llama; 2025-03-30) and 0.8.4; SGLang 0.4.4.post3",
                      "vllm") == "0.8.2"
    assert release_in("vLLM 0.8.2 and SGLang 0.4.4.post3", "sglang") == "0.4.4"
    assert release_in("TensorRT-LLM 1.2.0rc1", "trtllm") == "1.2.0"
    assert release_in("SGLang from lmsysorg/sglang:latest", "sglang") is None
    spec = catalog.load_engine_spec("vllm")
    assert at_release(spec, "vLLM 0.8.3").model().max_num_seqs == 256
    # a run names its release: the profile of that release, unless told to keep the one given
    assert at_release(spec, "vLLM 0.11.0").name == "vllm-0.8"
    assert at_release(spec, "vLLM 0.11.0", pick=False).name == "vllm"
    # 0.14 runs as the profile says, less --performance-mode, which came in 0.17
    from dataclasses import replace

    # 0.14.1 before the options and defaults of later releases (tests/test_vllm_releases.py)
    assert at_release(spec, "vLLM 0.14.1").model() == replace(
        spec.model(), performance_modes=None, memory_utilization_frac=0.9,
        memory_basis="total", memory_margin_floor_by_vendor=(), memory_fallback=None,
        block_size=16,
        async_speculation=("eagle", "eagle3", "mtp"), large_gpu=None, graph_arch_caps=(),
        full_prompt_admission=False, async_with_pp=False)
    assert at_release(spec, "vLLM 0.34.0") is spec and at_release(spec, None) is spec


def test_every_profile_states_versions_that_do_not_overlap():
    specs = [catalog.load_engine_spec(n) for n in catalog._names("engines_db")]
    fam: dict[str, list] = {}
    for s in specs:
        if s.versions is not None:
            fam.setdefault(s.versions.family, []).append(s.versions)
    assert set(fam) >= {"vllm", "sglang", "trtllm"}
    for vs in fam.values():
        vs.sort(key=lambda v: version_key(v.from_))
        for a, b in zip(vs, vs[1:], strict=False):
            assert a.until is not None and version_key(a.until) <= version_key(b.from_)


def test_the_request_path_delays_the_first_token_not_the_tokens_after():
    """By hand: a lone request's TTFT is its steps' plus request_overhead + prompt x
    per-token cost; its TPOT is unchanged."""
    from dataclasses import replace as dc_replace

    from planner.core.estimate import prepare
    from planner.core.specs import Options, Precision
    from planner.serving.cost import StepCoster
    from planner.serving.sim import SchedulerConfig, simulate
    from planner.serving.traffic import Request

    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    base = catalog.load_engine("vllm")
    free = dc_replace(base, request_overhead_s=0.0, prompt_token_overhead_s=0.0)
    paid = dc_replace(base, request_overhead_s=0.012, prompt_token_overhead_s=2e-6)
    out = []
    for e in (free, paid):
        c = StepCoster(m, hw, prepare(hw, Precision(), None, Options(), e), Options())
        out.append(simulate([Request(0, 0.0, 1000, 50)], c, SchedulerConfig()).requests[0])
    assert out[1].ttft_s - out[0].ttft_s == pytest.approx(0.012 + 1000 * 2e-6)
    assert out[1].tpot_s == pytest.approx(out[0].tpot_s)


def test_band_dataclass_round_trips():
    b = Band("e", "decode", "batch-1", 0.9, 1.0, 1.2, 10, 3)
    assert from_table([b.as_dict()], "x")[0] == b
    b = Band("e", "decode", "batch-1", 0.9, 1.0, 1.2, 10, 3, ("ampere", "hopper"))
    assert from_table([b.as_dict()], "x")[0] == b


def test_shaped_lengths_keep_the_shape_at_the_runs_means():
    from planner.serving.traffic import shaped_lengths

    pairs = [(10, 100), (30, 300)]  # means 20 and 200
    got = shaped_lengths(pairs, 2, mean_prompt=200, mean_output=50, seed=3)
    assert sorted(got) == [(100, 25), (300, 75)]  # each scaled x10 and x0.25, each once
    many = shaped_lengths(catalog.load_lengths("sharegpt"), 500, mean_prompt=1000,
                          mean_output=300)
    assert sum(p for p, _ in many) / 500 == pytest.approx(1000, rel=0.01)
    assert sum(o for _, o in many) / 500 == pytest.approx(300, rel=0.01)
    outs = sorted(o for _, o in many)
    assert outs[-1] > 3 * outs[250]  # ShareGPT's long tail, which a mean-only replay loses
    with pytest.raises(SpecError, match="unknown length distribution"):
        catalog.load_lengths("nope")


def test_simulate_sharegpt_lengths_take_longer_than_constant_ones(run_json):
    args = ["simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "500", "-p", "200",
            "-o", "200"]
    flat = run_json(*args)
    shaped = run_json(*args, "--dataset-name", "sharegpt")
    assert shaped["total_output_tokens"] == pytest.approx(flat["total_output_tokens"], rel=0.01)
    assert shaped["duration"] > 1.1 * flat["duration"]  # the longest requests finish last


def test_sharegpt_keeps_its_own_means_unless_lengths_are_given(run_json, run_cli):
    """vLLM's bench serve --dataset-name sharegpt sends the conversations' own lengths; so
    does simulate unless -p / -o ask for other means (until 2026-12-06 the defaults, 1,024 and
    256, rescaled ShareGPT to prompts five times its own)."""
    from planner.serving.traffic import shaped_lengths

    pairs = catalog.load_lengths("sharegpt")
    assert sorted(shaped_lengths(pairs, len(pairs), mean_prompt=None, mean_output=None,
                                 seed=5)) == sorted(pairs)  # each pair once, unscaled
    # 500 requests take each of the 500 pairs once: the file's own sums
    s = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", str(len(pairs)),
                 "--dataset-name", "sharegpt", "--request-rate", "4")
    assert s["total_input_tokens"] == sum(p for p, _ in pairs) == 102_975
    assert s["total_output_tokens"] == sum(o for _, o in pairs) == 107_666
    # one of -p / -o given: that mean scaled to, the other kept
    s = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "500", "-p", "1000",
                 "--dataset-name", "sharegpt", "--request-rate", "4")
    assert s["total_input_tokens"] == pytest.approx(500_000, rel=0.01)
    assert s["total_output_tokens"] == 107_666
    # the random dataset keeps the commands' default workload
    s = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "10")
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (10 * 1024, 10 * 256)
    # the help's means are the file's
    code, out, _ = run_cli("simulate", "--help")
    assert code == 0
    mp, mo = (round(sum(x[i] for x in pairs) / len(pairs)) for i in (0, 1))
    assert f"means {mp} and {mo}" in " ".join(out.split())


def test_targets_are_computed_on_held_out_figures_only():
    from types import SimpleNamespace as NS

    from planner.evidence.validate import targets

    served = [NS(in_sample=False, phase="served TPOT", error=e) for e in (0.05, -0.10, 0.30)]
    served.append(NS(in_sample=True, phase="served TPOT", error=5.0))  # fitted: not counted
    static = [NS(in_sample=False, batch=1, metric="tpot_s", engine="vllm", error=-0.04),
              NS(in_sample=False, batch=1, metric="tpot_s", engine="hf-eager", error=0.9),
              NS(in_sample=False, batch=8, metric="tpot_s", engine="vllm", error=0.9),
              NS(in_sample=False, batch=1, metric="tpot_s", engine="vllm-0.8", error=0.06),
              NS(in_sample=False, batch=1, metric="tpot_s", engine="vllm-v0", error=0.9)]
    t = {r.label: r for r in targets(static, served)}
    med = t["served TPOT, median"]
    assert (med.n, med.value, med.met) == (3, pytest.approx(0.10), True)
    assert t["served TPOT, mean per run"].value == pytest.approx(0.15)
    b1 = t["batch-1 decode, current engines, median"]
    # vLLM V1 (vllm, vllm-0.8) counts, V0 does not: median of 0.04 and 0.06
    assert (b1.n, b1.value, b1.met) == (2, pytest.approx(0.05), True)
    ttft = t["served TTFT, median"]
    assert ttft.n == 0 and not ttft.met  # no evidence is not a pass


def test_served_figures_by_engine_count_runs_and_leave_in_sample_out():
    from types import SimpleNamespace as NS

    from planner.evidence.validate import served_by_engine

    def c(engine, run, phase, error, in_sample=False):
        return NS(engine=engine, source="s", run=run, phase=phase, error=error,
                  in_sample=in_sample)

    served = [c("sglang", "a", "served TPOT", 0.4), c("vllm", "a", "served TPOT", -0.02),
              c("vllm", "a", "served TTFT", 0.30), c("vllm", "b", "served TPOT", 0.16),
              c("vllm", "c", "served TPOT", -0.06), c("vllm", "d", "served TPOT", 9.0, True),
              c("gpt-fast", "x", "served TPOT", 0.5)]
    got = {e.engine: e for e in served_by_engine(served)}
    assert [e.engine for e in served_by_engine(served)] == ["vllm", "sglang", "gpt-fast"]
    v = got["vllm"]
    assert v.runs == 3  # run d was fitted on
    n, med, mean = v.phases["served TPOT"]
    assert (n, med, mean) == (3, pytest.approx(0.06), pytest.approx(0.08))
    assert v.phases["served TTFT"] == (1, pytest.approx(0.30), pytest.approx(0.30))
    assert "served E2E" not in v.phases
    assert v.as_dict()["phases"]["served TPOT"]["n"] == 3


def test_vllm_scheduler_defaults_follow_the_gpu_as_its_source_does():
    """vLLM's get_batch_defaults: 1024 sequences and 8192 tokens a step on a GPU of 70 GiB or
    more whose name has no 'a100'; 256 and 2048 below 70 GiB and on every A100. A server's
    own flags stand over either."""
    from planner.cli.compare import served_setup, server_overrides
    from planner.core.estimate import prepare
    from planner.core.specs import Options, Precision

    e = catalog.load_engine("vllm")
    got = {g: prepare(catalog.load_hardware(g), Precision(), None, Options(), e).engine
           for g in ("h100-sxm", "h200", "a100-sxm-80gb", "l40s")}
    assert [(x.max_num_seqs, x.max_num_batched_tokens) for x in got.values()] == \
        [(1024, 8192), (1024, 8192), (256, 2048), (256, 2048)]
    spec = catalog.load_engine_spec("vllm")
    s = served_setup("llama-3.1-8b", "a100-sxm-80gb", spec, 1, "bf16", None,
                     server=server_overrides("vllm serve x --max-num-batched-tokens 4096"))
    assert (s.engine.max_num_seqs, s.engine.max_num_batched_tokens) == (256, 4096)
    assert s.options.prefill_chunk_tokens == 4096


def test_plan_reports_the_batch_limit_the_gpu_runs_with(run_json):
    """The row's batch is the scheduler's own on that GPU: 256 on an A100, 1024 on an H100."""
    rows = run_json("plan", "-m", "llama-3.1-8b", "-g", "a100-sxm-80gb,h100-sxm", "--tp", "1",
                    "--weights", "bf16", "--kv-cache", "16", "--ttft", "2s", "--tpot", "60ms",
                    "--rps", "4")
    assert {r["gpu"]: r["batch"] for r in rows} == {"a100-sxm-80gb": 256, "h100-sxm": 1024}


def _applied(value: float, low: float, high: float) -> Applied:
    return Applied(value, value * low, value * high, 100, 5, "basis", False)


def test_bands_widen_where_a_slower_server_falls_behind():
    """By hand: steps x2 slower; TTFT band x0.9-x3 (so x1.5 beyond the step factor); the
    slower server's TTFT x10, TPOT x1.5 (inside x2), throughput x0.4 (below x0.5)."""
    applied = {"mean_ttft_ms": _applied(100.0, 0.9, 3.0),
               "mean_tpot_ms": _applied(10.0, 0.8, 2.0),
               "output_throughput": _applied(1000.0, 0.5, 1.1)}
    nominal = {"mean_ttft_ms": 50.0, "mean_tpot_ms": 8.0, "output_throughput": 900.0}
    slowed = {"mean_ttft_ms": 500.0, "mean_tpot_ms": 12.0, "output_throughput": 360.0}
    out, widened = widen_near_capacity(applied, nominal, slowed, 2.0)
    assert widened == ["mean_ttft_ms", "output_throughput"]
    assert out["mean_ttft_ms"].high == pytest.approx(100.0 * 10 * 1.5)
    assert out["mean_ttft_ms"].low == applied["mean_ttft_ms"].low
    assert "x10.00" in out["mean_ttft_ms"].basis
    assert out["mean_tpot_ms"] == applied["mean_tpot_ms"]  # x1.5 is inside its band
    assert out["output_throughput"].low == pytest.approx(400.0)
    # a slower server that keeps pace within the bands widens nothing
    same, none = widen_near_capacity(applied, nominal, {"mean_ttft_ms": 100.0,
                                                        "mean_tpot_ms": 16.0,
                                                        "output_throughput": 900.0}, 2.0)
    assert none == [] and same == applied


def test_simulate_widens_the_bands_of_a_stream_near_capacity(run_json):
    """At 22 req/s a Llama-3.1-8B replica on an H100 keeps up; one whose steps take the TPOT
    band's high end (x1.10 since 2026-12-05, vLLM's own band; x2.01 on 2026-11-27, when 16
    req/s showed it) does not, and its TTFT grows without bound: the TTFT band's high end is
    that server's, far past the band's own (x1.69). At 1 req/s nothing widens but the TPOT a
    little, and a closed loop of clients is not checked."""
    fast = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "1500",
                    "--request-rate", "22")
    b = pick(catalog.load_bands(), "vllm", "served TTFT", "unsaturated")
    near = fast["near_capacity"]
    assert fast["regime"] == "unsaturated" and not near["slowed_keeps_up"]
    assert "mean_ttft_ms" in near["widened"]
    # the slowed server's mean TTFT, 4.2x the band's end (x1.10 steps since 2026-12-05; 5x and
    # more at x1.12)
    assert fast["mean_ttft_ms_high"] > 3 * b.high_ratio * fast["mean_ttft_ms"]
    assert "widened near capacity" in fast["bands"]["mean_ttft_ms"]["basis"]
    slow = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "300",
                    "--request-rate", "1")
    assert slow["near_capacity"]["slowed_keeps_up"]
    assert "mean_ttft_ms" not in slow["near_capacity"]["widened"]
    assert slow["mean_ttft_ms_high"] == pytest.approx(slow["mean_ttft_ms"] * b.high_ratio)
    closed = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "200",
                      "--max-concurrency", "4")
    assert closed["near_capacity"] is None  # a closed loop: not checked, the key still there


def test_a_streams_output_throughput_band_stops_at_what_it_offers(run_json):
    """8 requests a second of 256 output tokens offer 2,048 tokens a second: a replica that
    keeps up cannot deliver more, so the band's high end is held there (or at the figure,
    where the run's sampled lengths put it above)."""
    d = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--request-rate", "8",
                 "-n", "587")
    assert d["output_throughput_high"] == pytest.approx(max(2048, d["output_throughput"]))
    assert d["output_throughput_low"] < d["output_throughput"]
    assert "held at the offered 2,048 tok/s" in d["bands"]["output_throughput"]["basis"]


def test_plan_says_which_rows_miss_the_targets_at_the_slow_end(run_cli):
    """Sized at the prediction, plan prints the bands and names the rows shown whose slow end
    misses a target (a review found a one-H100 plan that --size-at high sized at three, with
    no band or word in the default table). At 22 ms the one-H100 row's p90 TPOT (20.8 ms, its
    fp8 cache read at vLLM's Hopper pace since 2026-12-05; 18.3 ms before) meets the target and
    its slow end (x1.10, vLLM's band since 2026-12-05) does not."""
    code, out, err = run_cli("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "1024",
                             "-o", "256", "--ttft", "1s", "--tpot", "22ms", "--rps", "20",
                             "--weights", "bf16", "--disaggregated", "off", "--top", "3")
    flat = " ".join(out.split())
    assert code == 0, err
    assert "error bands (p10-p90" in flat and "at the slow end, rank" in flat
    assert "--size-at high sizes replicas" in flat
    code, out, err = run_cli("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-p", "1024",
                             "-o", "256", "--ttft", "30s", "--tpot", "1s", "--rps", "1",
                             "--weights", "bf16", "--disaggregated", "off", "--top", "3")
    assert code == 0, err
    assert "aggregated rows shown meet the targets at the slow end too" in " ".join(out.split())


def test_a_kind_of_model_that_errs_apart_is_named_beside_the_band():
    """MoE runs held out were measured slower than dense ones (validate: MoE served TPOT -25%
    signed). Their own bands are built, not picked (they covered fewer held-out figures, left
    out a source at a time), and a prediction for a MoE model says how MoE runs alone have
    erred where that median is more than 10% off the band's."""
    dense = [Figure("vllm", "served TPOT", "unsaturated", s, r, "", "dense")
             for r, s in zip([0.95, 1.0, 1.05, 1.0, 0.98, 1.02], "pqrpqr", strict=True)]
    moe = [Figure("vllm", "served TPOT", "unsaturated", s, r, "", "MoE")
           for r, s in zip([1.3, 1.4, 1.5, 1.35, 1.45, 1.4], "abcabc", strict=True)]
    bands = build(dense + moe)
    kinds = {(b.engine, b.model_kind) for b in bands if b.model_kind}
    assert kinds == {("vllm", "MoE"), ("vllm", "dense"), ("all", "MoE"), ("all", "dense")}
    b = pick(bands, "vllm", "served TPOT", "unsaturated")
    assert b.model_kind == "" and b.n == 12  # every kind: the band itself is unchanged
    note = kind_note(bands, "vllm", "served TPOT", "unsaturated", "MoE")
    assert note.startswith("MoE models alone (vllm): measured / predicted median x1.40")
    a = apply(bands, 10.0, "vllm", "served TPOT", "unsaturated", model_kind="MoE")
    assert (a.low, a.high) == (10.0 * b.low_ratio, 10.0 * b.high_ratio) and note in a.basis
    assert kind_note(bands, "vllm", "served TPOT", "unsaturated", "") == ""
    # too few MoE figures (two sources): no note
    thin = build(dense + [f for f in moe if f.source != "c"])
    assert kind_note(thin, "vllm", "served TPOT", "unsaturated", "MoE") == ""
    # the table keeps the kind; an unknown kind is refused
    rows = [x.as_dict() for x in bands]
    assert [x.model_kind for x in from_table(rows, "t")] == [x.model_kind for x in bands]
    rows[0]["model_kind"] = "hybrid"
    with pytest.raises(ValueError, match="model_kind"):
        from_table(rows, "t")


def test_a_band_borrowed_from_every_regime_says_how_few_are_of_this_one():
    """The batched-decode band of estimate rests on batch-1 figures: the basis says how many of
    them are batched (a review found 2 of 207 hidden behind 'every regime')."""
    one = [Figure("x", "decode", "batch-1", s, r) for r, s in
           zip([1.0, 1.1, 0.9, 1.0, 1.05, 0.95], "pqrpqr", strict=True)]
    two = [Figure("x", "decode", "batched", "p", 1.8), Figure("x", "decode", "batched", "p", 2.5)]
    a = apply(build(one + two), 5.0, "x", "decode", "batched")
    assert "every regime" in a.basis and "batched: 2 of them, from 1 source" in a.basis
    slow = [Figure("x", "decode", "batch-1", s, r) for r, s in
            zip([1.2, 1.3, 1.4, 1.25, 1.35, 1.3], "pqrpqr", strict=True)]
    a = apply(build(slow), 5.0, "x", "decode", "batch-1")
    assert a.low > 5.0 and "the band lies above it" in a.basis


def test_a_static_plan_carries_the_static_bands(run_cli):
    """--scheduler static rows carry estimate's bands (prefill for TTFT, decode for TPOT, by
    the row's batch) in --json, and the table says them; they had none."""
    base = ("plan", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--rps", "5", "--ttft", "1s",
            "--tpot", "50ms", "--scheduler", "static")
    code, out, err = run_cli(*base, "--json")
    assert code == 0, err
    bands = catalog.load_bands()
    for r in json.loads(out)[:20]:
        regime = "batch-1" if r["batch"] == 1 else "batched"
        t, d = pick(bands, "vllm", "prefill", regime), pick(bands, "vllm", "decode", regime)
        assert r["ttft_s_high"] == pytest.approx(r["ttft_s"] * t.high_ratio)
        assert r["tpot_s_low"] == pytest.approx(r["tpot_s"] * d.low_ratio)
        assert "held-out figures" in r["band_evidence"]
    code, out, err = run_cli(*base, "--top", "3")
    assert code == 0 and "error bands (p10-p90" in " ".join(out.split())
