"""fp8_gemm_row_tiles: a W8A8 fp8 GEMM computes its rows in the tiles its kernel's dispatch
picks for M (vLLM's CUTLASS sm90 dispatch: 16, 64, 128 rows, then 256 at a time), on the
architectures a profile names; every other GEMM keeps the 16-row tile."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.core.engine import Engine
from planner.core.estimate import estimate
from planner.core.ops import Op
from planner.core.roofline import Ceilings, op_time, tiled_rows
from planner.core.specs import DType, Precision, Workload
from planner.io import catalog

INF = float("inf")
SM90 = ((16.0, 16.0), (64.0, 64.0), (128.0, 128.0), (INF, 256.0))  # vllm.yaml's Hopper tiles


@pytest.mark.parametrize("m, rows", [(1, 16), (16, 16), (17, 64), (64, 64), (65, 128),
                                     (128, 128), (129, 256), (256, 256), (257, 512),
                                     (1000, 1024), (1025, 1280), (4096, 4096)])
def test_rows_by_hand(m, rows):
    # 129 tokens: past 128 the default configuration (a 128-row tile in a 2 x 1 cluster)
    # computes 256 rows at a time, so one whole 256; 257 needs two
    assert tiled_rows(m, SM90) == rows


@given(st.integers(1, 100_000), st.integers(1, 100_000))
def test_rows_cover_m_in_whole_tiles_and_never_shrink_as_m_grows(a, b):
    lo, hi = sorted((a, b))
    r = tiled_rows(lo, SM90)
    granule = next(g for bound, g in SM90 if lo <= bound)
    assert lo <= r < lo + granule and r % granule == 0
    assert tiled_rows(hi, SM90) >= r


def test_an_array_of_m_is_tiled_as_each_m_is():
    ms = np.array([1.0, 17.0, 65.0, 128.0, 129.0, 300.0, 5000.0])
    assert tiled_rows(ms, SM90).tolist() == [tiled_rows(float(m), SM90) for m in ms]


E = Engine(name="hand", ceilings="achievable", gemm_tile_m=16.0, overlap_frac=1.0,
           fp8_gemm_row_tiles_by_arch=(("hopper", SM90),))
C = Ceilings(bandwidth_bytes_per_s=1e12, flops_per_s={DType.bf16: 100e12, DType.fp8: 200e12},
             link_bytes_per_s=100e9)


def _gemm(m: int, dtype: DType = DType.fp8, name: str = "mlp_down_proj") -> Op:
    # compute-bound: 2 x m x 8192 x 8192 FLOPs over 64 MiB of weights
    return Op(name, "matmul", 1, flops=2.0 * m * 8192 * 8192, weight_bytes=8192 * 8192,
              act_bytes=2.0 * m * 2 * 8192, dtype=dtype, weight_dtype=dtype, m_rows=m)


def test_an_fp8_gemm_past_a_bound_computes_the_next_configurations_rows_on_hopper_only():
    hop, ada = E.for_gpu(80e9, "h100", "hopper"), E.for_gpu(48e9, "l40s", "ada")
    assert hop.fp8_gemm_row_tiles == SM90 and ada.fp8_gemm_row_tiles == ()
    per_row = 2.0 * 8192 * 8192 / 200e12  # one row's FLOPs at the fp8 rate
    # 129 rows compute 256 on Hopper; on Ada the plain 16-row tile: 144
    assert op_time(_gemm(129), C, engine=hop).compute_s == pytest.approx(256 * per_row)
    assert op_time(_gemm(129), C, engine=ada).compute_s == pytest.approx(144 * per_row)
    assert op_time(_gemm(128), C, engine=hop).compute_s == pytest.approx(128 * per_row)
    # a 16-bit GEMM and the routed experts (a fused MoE kernel) keep the 16-row tile
    bf16 = op_time(_gemm(129, DType.bf16), C, engine=hop).compute_s
    assert bf16 == pytest.approx(144 * 2.0 * 8192 * 8192 / 100e12)
    assert op_time(_gemm(129, name="experts_down_proj"), C, engine=hop).compute_s == \
        pytest.approx(144 * per_row)
    # fp8 arithmetic on weights of another type (--weights int4 --compute fp8) is no W8A8
    # CUTLASS GEMM: the 16-row tile
    int4 = dataclasses.replace(_gemm(129), weight_dtype=DType.int4)
    assert op_time(int4, C, engine=hop).compute_s == pytest.approx(144 * per_row)
    # an engine resolved for no GPU, or with no tiles, is as before
    assert op_time(_gemm(129), C, engine=E).compute_s == pytest.approx(144 * per_row)
    plain = dataclasses.replace(E, fp8_gemm_row_tiles_by_arch=())
    assert op_time(_gemm(129), C, engine=plain.for_gpu(80e9, "h100", "hopper")).compute_s == \
        pytest.approx(144 * per_row)


@pytest.mark.parametrize("name", ["vllm", "vllm-0.8", "vllm-v0", "sglang"])
def test_the_profiles_state_the_sm90_tiles_with_their_evidence(name):
    # the current dispatch runs M <= 16 in a swap-AB configuration of 16 rows; the older one
    # and SGLang's in 64, where the profiles keep 16 as a judgement their notes give reasons for
    spec = catalog.load_engine_spec(name)
    t = spec.fp8_gemm_row_tiles
    assert t.value == {"hopper": ((16, 16), (64, 64), (128, 128), (None, 256))}
    assert "--fp8-row-tiles" in t.note
    assert name == "vllm" or "judgement" in t.note
    assert catalog.load_engine("trtllm").fp8_gemm_row_tiles_by_arch == ()  # smooth in its table


def test_a_520_token_fp8_prefill_on_an_h100_costs_its_768_rows_and_an_l40s_one_does_not():
    spec = catalog.load_engine_spec("vllm")
    flat = spec.model_copy(update={"fp8_gemm_row_tiles": None})
    m = catalog.load_model("llama-3.1-8b")

    def ttft(s, gpu, weights, prompt):
        return estimate(m, catalog.load_hardware(gpu), engine=s.model(),
                        workload=Workload(batch=1, prompt_tokens=prompt, output_tokens=8),
                        precision=Precision.of(weights, "bf16")).ttft_s

    # 520 rows compute as 768 where the 16-row tile computes 528: a compute-bound prefill,
    # slower by most of 768 / 528 in its GEMMs, never by more
    r = ttft(spec, "h100-sxm", "fp8", 520) / ttft(flat, "h100-sxm", "fp8", 520)
    assert 1.15 < r < 768 / 528
    # near the ridge (200 rows), the tiles' arithmetic hides under the weights' reading
    assert 1.0 < ttft(spec, "h100-sxm", "fp8", 200) / ttft(flat, "h100-sxm", "fp8", 200) < 1.05
    # at a whole number of tiles, on another architecture, or in 16 bits: unchanged
    assert ttft(spec, "h100-sxm", "fp8", 512) == ttft(flat, "h100-sxm", "fp8", 512)
    assert ttft(spec, "l40s", "fp8", 520) == ttft(flat, "l40s", "fp8", 520)
    assert ttft(spec, "h100-sxm", "bf16", 520) == ttft(flat, "h100-sxm", "bf16", 520)


@pytest.mark.parametrize("bad, why", [
    ({"hopper": [[16, 16], [64, 64]]}, "last bound is None"),
    ({"hopper": [[16, 16], [None, 64], [None, 256]]}, "last bound is None"),
    ({"hopper": [[64, 64], [16, 16], [None, 256]]}, "must increase"),
    ({"hopper": [[16, 0], [None, 256]]}, "greater than or equal to 1"),
    ({"hopper": []}, "no tiles"),
    ({"Hopper": [[None, 256]]}, "lower case"),
    ({"hoper": [[None, 256]]}, "'hoper' is not one of"),  # would never apply
    ({"hopper": [["16", 16], [None, 256]]}, "valid integer"),  # strict: no text for a count
    ({"hopper": [[16, True], [None, 256]]}, "valid integer"),
    ({}, "at least 1"),
])
def test_row_tiles_that_cannot_apply_are_refused(bad, why):
    data = catalog.load_engine_spec("vllm").model_dump(exclude_none=True)
    data["fp8_gemm_row_tiles"]["value"] = bad
    with pytest.raises(ValueError, match="fp8_gemm_row_tiles") as err:
        type(catalog.load_engine_spec("vllm")).model_validate(data)
    assert why in str(err.value)


def test_the_engines_listing_shows_the_row_tiles(run_json):
    rows = {r["name"]: r for r in run_json("engines")}
    assert rows["vllm"]["fp8_gemm_row_tiles"] == {
        "hopper": [[16, 16], [64, 64], [128, 128], [None, 256]]}
    assert rows["trtllm"]["fp8_gemm_row_tiles"] == {}


def test_a_sweep_prices_each_rows_tiles_as_the_estimate_does():
    """The sweep passes arrays of M through the same arithmetic (tiled_rows' array branch):
    each of its fp8 rows on an H100 equals the scalar estimate, across the bounds."""
    from planner.search.sweep import Grid, sweep

    eng = catalog.load_engine("vllm")
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    g = Grid(models=[m], gpus=[hw], batches=[1, 100, 129, 300],
             prompt_tokens=[200, 520, 1025], output_tokens=[16], weights=[DType.fp8],
             engine=eng)
    rows = sweep(g).to_dict(orient="records")
    assert len(rows) == 12
    for r in rows:
        # the grid's fp8 over the 16-bit checkpoint is quantized at load, as estimate's
        e = estimate(m, hw, engine=eng, precision=Precision.of("fp8", None, at_load=True),
                     workload=Workload(batch=r["batch"], prompt_tokens=r["prompt_tokens"],
                                       output_tokens=16))
        assert (r["ttft_s"], r["tpot_s"]) == pytest.approx((e.ttft_s, e.tpot_s), rel=1e-12)
