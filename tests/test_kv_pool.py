"""A KV cache given outright or capped: vLLM's --kv-cache-memory-bytes (CacheConfig.
kv_cache_memory_bytes, 0.11 and later: exactly that much per GPU, whatever
gpu_memory_utilization says; vllm/v1/worker/gpu_worker.py of 0.34.0 skips the memory
profile and reserves it), SGLang's --max-total-tokens (ModelRunner.init_memory_pool: the
smaller of it and the profiled pool) and TensorRT-LLM's kv_cache_config.max_tokens (the
smaller of it and the fraction's), and vLLM 0.34's --[no-]enable-extensible-kv-cache
(vllm/config/vllm.py of 0.34.0, _resolve_extensible_kv_cache). Figures worked by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli.flags import server_flags
from planner.core.memory import (
    kv_budget_bytes,
    kv_capacity_tokens,
    max_batch,
    memory_plan,
    memory_terms,
    memory_terms_of,
    pool_limits,
    resident_weight_bytes,
    step_activation_bytes,
    usable_bytes,
)
from planner.core.specs import GIB, Options
from planner.io import catalog
from planner.layouts.deployment import Deployment, Layout

# Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 128 KiB a token
PER_TOKEN = 128 * 1024


def _setup(engine: str = "vllm"):
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    e = catalog.load_engine(engine).for_gpu(hw.memory_bytes, hw.name, hw.architecture,
                                             hw.vendor)
    dep = Deployment.build(m, hw, engine=e)
    return m, hw, dep.precision, e


def _budget(**kw):
    return kv_budget_bytes(80 * GIB, weights_bytes=15 * GIB, activation_bytes=2 * GIB,
                           reserve_bytes=GIB, frac=0.9, basis="total", **kw) / GIB


def test_the_budget_by_hand():
    # the fraction's: 0.9 x 80 - 15 - 2 - 1 = 54 GiB
    assert _budget() == pytest.approx(54)
    # given outright, the fraction set aside: 20 GiB; 62 GiB still fits (15 + 2 + 1 + 62 = 80)
    assert _budget(pool_bytes=20 * GIB) == pytest.approx(20)
    # sized from the options: 62 GiB still fits beside 18 (15 + 2 + 1 = 80 - 62); 63 GiB
    # does not, vLLM fails to allocate it, and the pool is 0 (nothing fits)
    for gib, sized in ((62, 62), (63, 0)):
        lim = pool_limits(Options(kv_cache_memory_bytes=gib * GIB), PER_TOKEN,
                          capacity_bytes=80 * GIB, rest_bytes=18 * GIB)
        assert lim == {"pool_bytes": sized * GIB, "cap_bytes": None}
    assert pool_limits(Options(kv_cache_max_tokens=1000), PER_TOKEN, capacity_bytes=80 * GIB,
                       rest_bytes=18 * GIB) == {"pool_bytes": None,
                                                "cap_bytes": 1000 * PER_TOKEN}
    # a cap keeps the smaller
    assert _budget(cap_bytes=10 * GIB) == pytest.approx(10)
    assert _budget(cap_bytes=100 * GIB) == pytest.approx(54)
    assert _budget(pool_bytes=20 * GIB, cap_bytes=10 * GIB) == pytest.approx(10)
    # what the deployment may fill: the rest plus the pool
    assert usable_bytes(80 * GIB, weights_bytes=15 * GIB, activation_bytes=2 * GIB,
                        reserve_bytes=GIB, frac=0.9, basis="total",
                        pool_bytes=20 * GIB) == pytest.approx(38 * GIB)
    # arrays, as a sweep gives them
    lim = pool_limits(Options(kv_cache_memory_bytes=20 * GIB), PER_TOKEN,
                      capacity_bytes=80 * GIB, rest_bytes=np.array([18.0, 73.0]) * GIB)
    assert (lim["pool_bytes"] / GIB).tolist() == [20.0, 0.0]


def test_one_place_decides_fraction_basis_margin_and_pool():
    """memory_terms reads the engine's sizing of a GPU once: the margin exists on the measured
    basis alone (vLLM 0.34: max(1 GiB, 0.75 x the profiling step's activations)), and a pool
    given outright keeps its room beside the weights, the reserve and that step."""
    m, hw, p, e = _setup()  # vllm (0.34: measured, 1.0)
    kw = {"capacity_bytes": 80 * GIB, "weights_bytes": 15 * GIB, "per_token_bytes": PER_TOKEN}
    t = memory_terms(Options(), e, profile_act_bytes=4 * GIB, **kw)
    assert (t.frac, t.basis, t.margin_bytes) == (1.0, "measured", 3 * GIB)  # 0.75 x 4
    assert (t.pool_bytes, t.cap_bytes) == (None, None)
    assert memory_terms(Options(), e, profile_act_bytes=GIB, **kw).margin_bytes == GIB  # floor
    # by hand, what it may fill: min(80, 80 - 3) = 77 GiB; its KV: 77 - 15 - 2 - 1 = 59 GiB
    assert t.usable_bytes(80 * GIB, weights_bytes=15 * GIB, activation_bytes=2 * GIB,
                          reserve_bytes=GIB) == pytest.approx(77 * GIB)
    assert t.kv_budget_bytes(80 * GIB, weights_bytes=15 * GIB, activation_bytes=2 * GIB,
                             reserve_bytes=GIB) == pytest.approx(59 * GIB)
    # SGLang's static basis keeps no margin
    sg = _setup("sglang")[3]
    assert memory_terms(Options(), sg, profile_act_bytes=4 * GIB, **kw).margin_bytes == 0.0
    # a pool: 63 GiB has room beside 15 + 1 + 1 (80 - 17), 64 does not (sized 0)
    for gib, sized in ((63, 63), (64, 0)):
        t = memory_terms(Options(kv_cache_memory_bytes=gib * GIB), e, profile_act_bytes=GIB,
                         **kw)
        assert t.pool_bytes == sized * GIB
    # the cap in bytes at the GPU's own KV bytes a token (a pipeline stage's: half its layers)
    t = memory_terms(Options(kv_cache_max_tokens=1000), e, profile_act_bytes=GIB,
                     **{**kw, "per_token_bytes": PER_TOKEN / 2})
    assert t.cap_bytes == 1000 * PER_TOKEN / 2
    # and memory_plan, max_batch and the serving pool read the same terms: the plan's
    # usable memory is the terms' for the batch's own activations
    o = Options(kv_cache_max_tokens=100_000)
    plan = memory_plan(m, hw, p, batch=8, prompt_tokens=1024, output_tokens=256, options=o,
                       engine=e)
    terms = memory_terms_of(m, p, o, e, capacity_bytes=hw.memory_bytes,
                            weights_bytes=plan.weights_bytes)
    assert (plan.utilization_frac, plan.utilization_basis) == (terms.frac, terms.basis)
    assert plan.usable_bytes == pytest.approx(terms.usable_bytes(
        hw.memory_bytes, weights_bytes=plan.weights_bytes,
        activation_bytes=plan.activation_bytes, reserve_bytes=plan.reserve_bytes))
    assert terms.cap_bytes == 100_000 * PER_TOKEN


def test_the_pool_s_tokens_and_batches_by_hand():
    m, hw, p, e = _setup()
    kw = {"max_num_seqs": e.max_num_seqs, "step_tokens": e.max_num_batched_tokens, "engine": e}
    # 20 GiB / 128 KiB = 163,840 tokens; the memory fraction does not enter (0.5 or 0.9)
    for frac in (None, 0.5, 0.9):
        o = Options(kv_cache_memory_bytes=20 * GIB, memory_utilization_frac=frac)
        assert kv_capacity_tokens(m, hw, p, options=o, **kw) == 163_840
    assert kv_capacity_tokens(m, hw, p, options=Options(kv_cache_max_tokens=100_000),
                              **kw) == 100_000
    # requests of 1,024 + 256 tokens: 163,840 / 1,280 = 128 of them; under a cap of 100,000
    # tokens 78 (78.1)
    wl = {"prompt_tokens": 1024, "output_tokens": 256, "engine": e}
    assert max_batch(m, hw, p, options=Options(kv_cache_memory_bytes=20 * GIB), **wl) == 128
    assert max_batch(m, hw, p, options=Options(kv_cache_max_tokens=100_000), **wl) == 78
    plan = memory_plan(m, hw, p, batch=128, options=Options(kv_cache_memory_bytes=20 * GIB),
                       **wl)
    assert plan.fits and plan.usable_bytes == pytest.approx(
        plan.weights_bytes + plan.activation_bytes + plan.reserve_bytes + 20 * GIB)
    assert not memory_plan(m, hw, p, batch=129,
                           options=Options(kv_cache_memory_bytes=20 * GIB), **wl).fits
    # 70 GiB beside 15 GiB of weights: no room, vLLM would not start
    big = Options(kv_cache_memory_bytes=70 * GIB)
    assert kv_capacity_tokens(m, hw, p, options=big, **kw) == 0
    assert max_batch(m, hw, p, options=big, **wl) == 0
    assert not memory_plan(m, hw, p, batch=1, options=big, **wl).fits


@settings(max_examples=40, deadline=None)
@given(cap=st.integers(1, 2_000_000), pool_gib=st.floats(0.01, 70.0))
def test_a_cap_keeps_the_smaller_and_a_pool_that_fits_is_all_tokens(cap, pool_gib):
    m, hw, p, e = _setup()
    kw = {"max_num_seqs": e.max_num_seqs, "step_tokens": e.max_num_batched_tokens, "engine": e}
    own = kv_capacity_tokens(m, hw, p, options=Options(), **kw)
    assert kv_capacity_tokens(m, hw, p, options=Options(kv_cache_max_tokens=cap),
                              **kw) == min(own, cap)
    pool = pool_gib * GIB
    got = kv_capacity_tokens(m, hw, p, options=Options(kv_cache_memory_bytes=pool), **kw)
    # all of it, or none where the weights, the profiling step's activations and the reserve
    # leave it no room
    room = hw.memory_bytes - resident_weight_bytes(m, p) - GIB - step_activation_bytes(
        m, p, max_num_seqs=e.max_num_seqs, step_tokens=e.max_num_batched_tokens)
    assert got == (int(pool // PER_TOKEN) if pool <= room else 0)


def test_every_layout_s_coster_holds_the_pool_per_gpu():
    """A pipeline stage's GPU holds the pool for its own layers: 16 of 32, 64 KiB a token,
    20 GiB / 64 KiB = 327,680 tokens (vLLM's kv_cache_memory_bytes is per GPU)."""
    from planner.serving.run import coster as coster_of

    m, hw, _, e = _setup()
    dep = Deployment.build(m, hw, engine=e, layout=Layout(pp=2),
                           options=Options(kv_cache_memory_bytes=20 * GIB))
    assert coster_of(dep).kv_capacity_tokens(e.max_num_seqs, e.max_num_batched_tokens) == \
        327_680
    moe = catalog.load_model("qwen3-30b-a3b")
    dep = Deployment.build(moe, hw, engine=e, layout=Layout(tp=1, ep=2),
                           options=Options(kv_cache_max_tokens=50_000))
    # two data-parallel groups, each capped at 50,000 tokens
    assert coster_of(dep).kv_capacity_tokens(e.max_num_seqs, e.max_num_batched_tokens) == \
        100_000


def test_estimate_and_simulate_say_the_pool(run_json, run_cli):
    est = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                   "--kv-cache-memory-bytes", "20G")
    assert est["kv_cache_memory_bytes"] == 20 * GIB and est["kv_cache_max_tokens"] is None
    assert est["kv_concurrency"]["kv_capacity_tokens"] == 163_840
    assert est["max_batch"] == 128
    # vLLM's lower-case suffix is decimal: 20g = 20 x 10^9 bytes
    dec = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                   "--kv-cache-memory-bytes", "20g")
    assert dec["kv_cache_memory_bytes"] == 20e9
    args = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "20", "--request-rate",
            "4")
    sim = run_json(*args, "--kv-cache-memory-bytes", "2G")
    assert sim["kv_capacity_tokens"] == 16_384 and sim["kv_cache_memory_bytes"] == 2 * GIB
    assert run_json(*args, "--max-total-tokens", "10000")["kv_capacity_tokens"] == 9_984
    code, out, err = run_cli(*args, "--kv-cache-memory-bytes", "70G")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "the KV cache given (--kv-cache-memory-bytes, 70.00 GiB) does not fit" in err


@pytest.mark.parametrize("extra, message", [
    (("--kv-cache-memory-bytes", "abc"), "--kv-cache-memory-bytes: 'abc' is not a positive"),
    (("--kv-cache-memory-bytes", "0"), "--kv-cache-memory-bytes: '0' is not a positive"),
    (("--kv-cache-memory-bytes", "2000T"), "is above the limit"),
    (("--kv-cache-tokens", "-5"), "--kv-cache-tokens: must be positive"),
    (("-e", "vllm@0.33", "--extensible-kv-cache"), "vllm@0.33 has none (vLLM 0.34 and later"),
    (("--extensible-kv-cache", "--kv-cache-memory-bytes", "20G"), "vLLM refuses them together"),
    (("-g", "gaudi3", "--enable-extensible-kv-cache"), "NVIDIA and AMD GPUs only"),
])
def test_bad_pools_and_refused_flags_are_one_line(run_cli, extra, message):
    args = ["estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", *extra]
    code, out, err = run_cli(*args)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert message in err


def test_the_extensible_cache_off_sizes_as_0_33(run_json):
    """--no-enable-extensible-kv-cache on the default vllm (0.34): 0.92 of the total, as
    0.20-0.33; a pool given outright turns it off as vLLM does when it is unset."""
    off = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                   "--no-enable-extensible-kv-cache")
    old = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", "vllm@0.33")
    assert (off["memory_utilization_frac"], off["memory_utilization_basis"]) == (0.92, "total")
    # the same pool, in 0.34's blocks of 64 tokens where 0.33's were 16
    cap_off, cap_old = (d["kv_concurrency"]["kv_capacity_tokens"] for d in (off, old))
    assert cap_off == cap_old - cap_old % 64 == 461_760
    on = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--extensible-kv-cache")
    assert on["memory_utilization_basis"] == "measured"
    pool = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                    "--kv-cache-memory-bytes", "20G")
    assert pool["memory_utilization_basis"] == "total"


def test_server_commands_and_options_files_give_them(tmp_path, run_json):
    assert server_flags("vllm serve m --kv-cache-memory-bytes 20G "
                        "--no-enable-extensible-kv-cache") == {
        "--kv-cache-memory-bytes": 20 * GIB, "--extensible-kv-cache": False}
    assert server_flags("vllm serve m --enable-extensible-kv-cache") == {
        "--extensible-kv-cache": True}
    assert server_flags("python -m sglang.launch_server --max-total-tokens 50000") == {
        "--kv-cache-tokens": 50_000}
    from planner.cli.compare import served_setup

    dep = served_setup("llama-3.1-8b", "h100-sxm", catalog.load_engine_spec("vllm"), 1, None,
                       None, server=server_flags("vllm serve m --kv-cache-memory-bytes 20G"))
    assert dep.options.kv_cache_memory_bytes == 20 * GIB
    assert dep.engine.memory_basis == "total"  # vLLM turns the extensible cache off for it
    f = tmp_path / "opts.yaml"
    f.write_text("kv_cache_config:\n  max_tokens: 12010\n")
    got = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", "trtllm", "-n",
                   "20", "--request-rate", "4", "--extra-llm-api-options", str(f))
    assert got["kv_capacity_tokens"] == 12_000  # whole blocks of 32


def test_a_pipeline_s_fit_is_every_stage_s_own():
    """Qwen2.5-7B (28 layers) over 3 stages: each stage's GPU holds the pool for its own
    layers, and the layout fits only where every stage does (a pool makes each stage's
    usable memory its own, not stage 0's)."""
    from planner.layouts.figures import layout_figures
    from planner.layouts.pipeline import pipeline

    m, hw = catalog.load_model("qwen2.5-7b"), catalog.load_hardware("h100-sxm")
    e = catalog.load_engine("vllm").for_gpu(hw.memory_bytes, hw.name, hw.architecture,
                                             hw.vendor)
    o = Options(kv_cache_memory_bytes=10 * GIB)
    dep = Deployment.build(m, hw, engine=e, layout=Layout(pp=3), options=o)
    kw = {"tp": 1, "prompt_tokens": 1024, "output_tokens": 256}
    seen = set()
    for batch in range(300, 700, 20):
        r = pipeline(m, hw, dep.prepared, o, pp=3, batch=batch, **kw)
        fig = layout_figures(m, hw, dep.prepared, o, pp=3, batch=batch, **kw)
        assert bool(fig.memory.fits) == all(st.fits for st in r.stages), batch
        seen.add(all(st.fits for st in r.stages))
    assert seen == {True, False}  # the range crosses the edge


def test_hybrid_pools_and_speculation(run_json, run_cli):
    """On vLLM's hybrid pool (gpt-oss: one group of 12 layers of each kind) a cap still
    bounds the tokens the pool counts; a pool or cap with --speculative is refused in one
    line (not modelled together)."""
    got = run_json("simulate", "-m", "gpt-oss-20b", "-g", "h100-sxm", "-n", "20",
                   "--request-rate", "4", "--kv-cache-tokens", "20000")
    assert got["kv_capacity_tokens"] == 20_000 - 20_000 % 64 and got["hybrid_kv_cache"]
    for cmd in ("estimate", "simulate"):
        code, out, err = run_cli(cmd, "-m", "llama-3.1-8b", "-g", "h100-sxm",
                                 "--kv-cache-memory-bytes", "4G", "--speculative", "ngram",
                                 "--num-speculative-tokens", "3", "--acceptance-rate", "0.6")
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert "--kv-cache-memory-bytes with --speculative: not modelled together" in err


def test_one_fit_rule_for_estimate_simulate_and_plan(run_json, run_cli):
    """63 GiB beside Llama-3.1-8B's 15 GiB of weights, the reserve and the profiling step's
    activations (a full step of 8,192 tokens): no room. estimate says it does not fit,
    simulate refuses, plan leaves such layouts out and keeps those that fit (int4 weights)."""
    est = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                   "--kv-cache-memory-bytes", "63G")
    assert not est["fits"] and est["max_batch"] == 0
    assert est["kv_concurrency"]["kv_capacity_tokens"] == 0
    code, _, err = run_cli("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "20",
                           "--request-rate", "4", "--kv-cache-memory-bytes", "63G")
    assert code == 2 and "does not fit beside the weights" in err
    rows = run_json("plan", "-m", "llama-3.1-8b", "--gpu", "h100-sxm", "--rps", "2", "--ttft",
                    "2s", "--tpot", "50ms", "--tp", "1", "--pp", "1",
                    "--kv-cache-memory-bytes", "70G")
    rows = rows if isinstance(rows, list) else rows["rows"]
    assert rows and {r["weights"] for r in rows if not r["disaggregated"]} <= {"int4", "int8"}
    assert all(r["kv_cache_memory_bytes"] == 70 * GIB for r in rows)
