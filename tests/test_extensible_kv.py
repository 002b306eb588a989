"""vLLM 0.34's extensible KV cache: the "measured" memory basis. The cache is sized from the
memory measured after warm-up, within f of the GPU's memory (gpu_memory_utilization, 1.0 by
default) and keeping free a margin max(floor, 0.75 A) beyond the activation peak A, the floor
1 GiB on CUDA and 3 GiB on ROCm (vllm/v1/worker/extensible_kv_cache.py of 0.34.0,
measure_kv_cache_bytes; engines_db/vllm.yaml memory_fraction). Figures worked by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from planner.core.engine import MemoryFraction
from planner.core.memory import kv_budget_bytes, max_batch, memory_plan, usable_bytes
from planner.core.specs import GIB, Options, Precision
from planner.io import catalog

SPEC = catalog.load_engine_spec("vllm")


def _budget(frac, a_gib, floor_gib=1.0, basis="measured"):
    """The budget with the margin of a profiling step whose activations are ``a_gib``."""
    margin = max(floor_gib, 0.75 * a_gib) * GIB
    return kv_budget_bytes(80 * GIB, weights_bytes=15 * GIB, activation_bytes=a_gib * GIB,
                           reserve_bytes=1 * GIB, frac=frac, basis=basis,
                           margin_bytes=margin) / GIB


def test_the_budget_by_hand():
    # C 80 GiB, W 15, R 1. A 0.5: the 1 GiB floor binds, 80 - 1 - 15 - 0.5 - 1 = 62.5
    assert _budget(1.0, 0.5) == pytest.approx(62.5)
    # A 2: 0.75 x 2 = 1.5 GiB binds, 80 - 1.5 - 15 - 2 - 1 = 60.5
    assert _budget(1.0, 2.0) == pytest.approx(60.5)
    # f 0.9 caps at 72 GiB, below 80 - 1: 72 - 15 - 0.5 - 1 = 55.5, as the total basis
    assert _budget(0.9, 0.5) == pytest.approx(55.5) == pytest.approx(_budget(0.9, 0.5,
                                                                             basis="total"))
    # ROCm's 3 GiB floor: 80 - 3 - 15 - 0.5 - 1 = 60.5
    assert _budget(1.0, 0.5, floor_gib=3) == pytest.approx(60.5)
    # what the deployment may fill: the cap itself
    assert usable_bytes(80 * GIB, weights_bytes=15 * GIB, activation_bytes=2 * GIB,
                        reserve_bytes=GIB, frac=1.0, basis="measured",
                        margin_bytes=1.5 * GIB) == 78.5 * GIB


@pytest.mark.parametrize("version, basis, frac, floor_h100, floor_mi300x", [
    (None, "measured", 1.0, 1, 3), ("0.34", "measured", 1.0, 1, 3),
    ("0.33", "total", 0.92, None, None), ("0.20", "total", 0.92, None, None),
    ("0.19.1", "total", 0.9, None, None), ("0.12", "total", 0.9, None, None)])
def test_the_basis_by_release_and_the_floor_by_maker(version, basis, frac, floor_h100,
                                                     floor_mi300x):
    spec = SPEC if version is None else SPEC.at_version(version)
    assert spec.at_version(version or "0.34") == spec  # applied twice: the same
    mf = spec.memory_fraction
    assert (mf.basis, mf.value) == (basis, frac)
    for gpu, floor in (("h100-sxm", floor_h100), ("mi300x", floor_mi300x)):
        hw = catalog.load_hardware(gpu)
        e = spec.model().for_gpu(hw.memory_bytes, hw.name, hw.architecture, hw.vendor)
        assert (e.memory_basis, e.memory_utilization_frac) == (basis, frac)
        if floor is not None:
            assert (e.memory_margin_floor_bytes, e.memory_margin_frac) == (floor * GIB, 0.75)


def test_a_measured_fraction_states_its_margin_and_only_it_does():
    with pytest.raises(ValidationError, match="margin_floor_gib and margin_of_activations"):
        MemoryFraction(basis="measured", value=1.0, source="x")
    with pytest.raises(ValidationError, match="margin_floor_gib and margin_of_activations"):
        MemoryFraction(basis="total", value=0.9, margin_floor_gib={"nvidia": 1},
                       margin_of_activations=0.75, source="x")
    with pytest.raises(ValidationError, match="name nvidia's floor"):
        MemoryFraction(basis="measured", value=1.0, margin_floor_gib={"amd": 3},
                       margin_of_activations=0.75, source="x")
    with pytest.raises(ValidationError, match="is not before 0.20"):
        MemoryFraction(basis="measured", value=1.0, margin_floor_gib={"nvidia": 1},
                       margin_of_activations=0.75, since="0.20", source="x",
                       before={"basis": "total", "value": 0.9, "since": "0.34",
                               "before": 0.8, "source": "y"})


def _deployment(version: str | None, gpu: str = "h100-sxm"):
    spec = SPEC if version is None else SPEC.at_version(version)
    hw = catalog.load_hardware(gpu)
    e = spec.model().for_gpu(hw.memory_bytes, hw.name, hw.architecture, hw.vendor)
    return catalog.load_model("llama-3.1-8b"), hw, e


@settings(max_examples=40, deadline=None)
@given(prompt=st.integers(16, 32_768), output=st.integers(1, 8_192),
       frac=st.sampled_from([None, 0.5, 0.9, 0.97, 1.0]), chunk=st.sampled_from([None, 2048]))
def test_the_largest_batch_fits_and_one_more_does_not(prompt, output, frac, chunk):
    """max_batch on the measured basis solves the three bounds (f C, C less the floor, C less
    0.75 A(B)) together: memory_plan says its batch fits and one more does not."""
    m, hw, e = _deployment(None)
    o = Options(memory_utilization_frac=frac, prefill_chunk_tokens=chunk)
    p = Precision()
    n = max_batch(m, hw, p, prompt_tokens=prompt, output_tokens=output, options=o, engine=e)
    kw = dict(prompt_tokens=prompt, output_tokens=output, options=o, engine=e)
    if n >= 1:
        assert memory_plan(m, hw, p, batch=n, **kw).fits
    assert not memory_plan(m, hw, p, batch=n + 1, **kw).fits


def test_estimate_and_simulate_give_0_34_its_measured_cache(run_json):
    """The default vllm (0.34) gives Llama-3.1-8B on an 80 GiB H100 a usable 79 GiB (the
    1 GiB floor binds: the activations of a full step are under 1.33 GiB) where 0.33's 0.92
    gave 73.6 GiB; --gpu-memory-utilization 0.9 caps 0.34 at 72 GiB, as 0.19's default."""
    new = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm")
    old = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", "vllm@0.33")
    assert (new["memory_utilization_frac"], new["memory_utilization_basis"]) == (1.0, "measured")
    assert new["usable_memory_bytes"] == 79 * GIB
    assert old["usable_memory_bytes"] == pytest.approx(0.92 * 80 * GIB)
    capped = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm",
                      "--gpu-memory-utilization", "0.9")
    assert capped["usable_memory_bytes"] == pytest.approx(72 * GIB)
    assert capped["memory_utilization_basis"] == "measured"
    # the serving pool: 5 GiB more than 0.92 left, over 128 KiB a token
    args = ("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "20",
            "--request-rate", "4")
    kv_new = run_json(*args)["kv_capacity_tokens"]
    kv_old = run_json(*args, "-e", "vllm@0.33")["kv_capacity_tokens"]
    assert kv_new - kv_old == pytest.approx((80 - 1 - 0.92 * 80) * GIB / (128 * 1024), abs=64)


def test_a_vllm_server_flag_is_read_on_the_release_s_basis():
    """A published vLLM server command's --gpu-memory-utilization is a fraction of total memory
    (flags.BASIS_OF); replayed by a 0.34 profile it caps the measured sizing, by 0.33's it is
    0.33's; SGLang's own basis stays its own."""
    from planner.core.memory import memory_share

    o = Options(memory_utilization_frac=0.9, memory_utilization_basis="total")
    new, old = (SPEC if v is None else SPEC.at_version(v) for v in (None, "0.33"))
    assert memory_share(o, new.model(), 80 * GIB) == (0.9, "measured")
    assert memory_share(o, old.model(), 80 * GIB) == (0.9, "total")
    sglang = catalog.load_engine("sglang")
    assert memory_share(Options(memory_utilization_frac=0.8, memory_utilization_basis="static"),
                        sglang, 80 * GIB) == (0.8, "static")


@pytest.mark.parametrize("before, message", [
    ("abc", "memory_fraction.before: a fraction in (0, 1], or a fraction of its own"),
    ({"basis": "total", "value": 0.9}, "memory_fraction.before: source: Field required"),
    (1.5, "memory_fraction.before: a fraction in (0, 1]"),
])
def test_a_bad_earlier_fraction_is_one_line(run_cli, tmp_path, before, message):
    """An engine file whose earlier fraction is neither a number nor a fraction of its own:
    one line naming the field, exit 2 (not one message per kind the union tries)."""
    import yaml

    data = yaml.safe_load((catalog.db_dir("engines_db") / "vllm.yaml").read_text())
    data["memory_fraction"]["before"] = before
    f = tmp_path / "e.yaml"
    f.write_text(yaml.safe_dump(data))
    code, out, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", str(f))
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert f"{f}: {message}" in err


def test_the_margin_is_the_profiling_step_s_not_the_batch_s(run_json):
    """vLLM fixes the margin once, from the activations of its profiling step (a full step of
    max_num_batched_tokens), whatever batch is served: Gemma-3-27B at batch 1 on an H100
    keeps 0.75 x that step's 2.15 GiB free, 1.61 GiB, not the floor."""
    from planner.core.memory import memory_terms_of, profile_activation_bytes

    def margin(model):
        return memory_terms_of(model, Precision(), Options(), e, capacity_bytes=80 * GIB,
                               weights_bytes=0.0).margin_bytes

    m, hw, e = _deployment(None)
    g = catalog.load_model("gemma-3-27b")
    a = profile_activation_bytes(g, Precision(), engine=e)
    assert a == pytest.approx(2.15 * GIB, rel=0.01)
    assert margin(g) == pytest.approx(0.75 * a)
    d = run_json("estimate", "-m", "gemma-3-27b", "-g", "h100-sxm", "-b", "1")
    assert d["usable_memory_bytes"] == pytest.approx(80 * GIB - 0.75 * a, rel=1e-9)
    # Llama-3.1-8B's step (1.27 GiB) leaves the 1 GiB floor
    assert margin(m) == GIB


def test_where_vllm_cannot_measure_it_sizes_as_before(run_json):
    """vLLM 0.34 measures on CUDA and ROCm alone, and turns the extensible cache off for a KV
    connector such as NIXL without an IMEX channel: Gaudi 3 and the pools of a disaggregated
    simulation take 0.92 of the total, as 0.20-0.33 did."""
    d = run_json("estimate", "-m", "llama-3.1-8b", "-g", "gaudi3")
    assert (d["memory_utilization_frac"], d["memory_utilization_basis"]) == (0.92, "total")
    pools = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "--prefill-instances",
                     "1", "--decode-instances", "1", "-n", "20", "--request-rate", "2")
    one = run_json("simulate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-n", "20",
                   "--request-rate", "2", "-e", "vllm@0.33")
    assert pools["decode"]["kv_capacity_tokens"] // 64 == one["kv_capacity_tokens"] // 64
    assert SPEC.model().without_measured_kv().memory_basis == "total"
    assert SPEC.at_version("0.33").model().without_measured_kv() == SPEC.at_version(
        "0.33").model()


@pytest.mark.parametrize("field, value, message", [
    ("before", float("nan"), "memory_fraction.before: a fraction in (0, 1]"),
    ("margin_floor_gib", {"nvidia": True}, "memory_fraction.margin_floor_gib: a number of GiB"),
])
def test_a_bad_number_in_the_measured_fraction_is_one_line(run_cli, tmp_path, field, value,
                                                           message):
    import yaml

    data = yaml.safe_load((catalog.db_dir("engines_db") / "vllm.yaml").read_text())
    data["memory_fraction"][field] = value
    f = tmp_path / "e.yaml"
    f.write_text(yaml.safe_dump(data))
    code, out, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", str(f))
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and f"{f}: {message}" in err
