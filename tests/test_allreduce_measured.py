"""The engines' own all-reduce as timed on a GPU (hardware_db ``allreduce_measured``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.core.engine import IDEAL
from planner.core.errors import SpecError
from planner.core.ops import Op
from planner.core.roofline import allreduce_table, ceilings, interpolate_loglog, op_time
from planner.core.specs import Calibration, MeasuredAllreduce
from planner.io import catalog

MIB = 1 << 20


def _ar(message_bytes: float) -> Op:
    return Op("allreduce_attn", "allreduce", 1, flops=0.0, comm_bytes=message_bytes)


def _engine(name: str):
    return catalog.load_engine(name)


def test_interpolation_is_straight_in_log_log():
    sizes, secs = (1.0, 100.0), (10.0, 1000.0)
    assert interpolate_loglog(sizes, secs, 10.0) == pytest.approx(100.0)  # halfway in log
    assert interpolate_loglog(sizes, secs, 0.5) == 10.0  # flat below the first size
    assert interpolate_loglog(sizes, secs, 400.0) == pytest.approx(4000.0)  # bandwidth beyond


def test_a_slow_point_is_lifted_out_by_the_larger_messages():
    m = MeasuredAllreduce(engine_version="x 1", source="s", message_bytes=[1, 2, 4],
                          graph_us={2: [5.0, 38.0, 6.0]})
    rows = {(n, g): secs for n, g, _, secs in allreduce_table(m)}
    # 38 us for 2 bytes where 4 bytes took 6: the noise of the timing run
    assert rows[(2, True)] == pytest.approx((5e-6, 6e-6, 6e-6))
    assert rows[(2, False)] == rows[(2, True)]  # no eager timing: the graph's


def test_h100_vllm_tp8_takes_the_timed_latencies():
    hw = catalog.load_hardware("h100-sxm")
    e = _engine("vllm")
    c = ceilings(hw, engine=e)
    t = hw.allreduce_measured["vllm"]
    i = t.message_bytes.index(16 * MIB)  # 8 Mi bf16 elements
    # vLLM 0.14.0 on an H100, 8 GPUs, 16 MiB (aiconfigurator): 121.8 us from a CUDA graph,
    # 139.7 us launched eagerly
    assert t.graph_us[8][i] == 121.8 and t.eager_us[8][i] == 139.7
    graphed = op_time(_ar(16 * MIB), c, tp=8, engine=e, graphed=True)
    eager = op_time(_ar(16 * MIB), c, tp=8, engine=e, graphed=False)
    assert graphed.comm_s == pytest.approx(121.8e-6)
    assert eager.comm_s == pytest.approx(139.7e-6)
    # the formula it replaces: 2 x 7/8 x 16 MiB over 0.8 x 450 GB/s + vllm's latency
    formula = 2 * 7 / 8 * 16 * MIB / (0.8 * 450e9) + e.allreduce_latency_s
    assert eager.comm_s > 1.4 * formula
    # 24 MiB lies between 16 and 32 MiB (139.7 and 241.0 us eager): log-log
    between = op_time(_ar(24 * MIB), c, tp=8, engine=e, graphed=False).comm_s
    f = math.log(1.5) / math.log(2)
    assert between == pytest.approx(139.7e-6 * (241.0 / 139.7) ** f)


def test_the_table_stands_aside_where_it_does_not_reach():
    hw = catalog.load_hardware("h100-sxm")
    e = _engine("vllm")
    c = ceilings(hw, engine=e)
    s = 4 * MIB
    link = hw.interconnect.unidirectional_bytes_per_s
    # TP 6 was not timed, TP 16 spans two servers: the formula
    six = op_time(_ar(s), c, tp=6, engine=e).comm_s
    assert six == pytest.approx(2 * 5 / 6 * s / (link * e.allreduce_bandwidth_frac)
                                + e.allreduce_latency_s)
    assert c.measured_allreduce_s(16, True, s) is None
    # the ideal engine and an engine with no family keep the datasheet formula
    ideal = ceilings(hw, engine=IDEAL)
    assert op_time(_ar(s), ideal, tp=8).comm_s == pytest.approx(2 * 7 / 8 * s / link + 2e-6)
    gpt_fast = _engine("gpt-fast")
    assert gpt_fast.family is None
    assert ceilings(hw, engine=gpt_fast).allreduce_table == ()
    # a calibration's measured all-reduce is the user's own server: it wins
    cal = Calibration(device="H100", memory_bandwidth_gb_per_s=3000,
                      allreduce_bus_gb_per_s=300, allreduce_latency_us=10)
    cc = ceilings(hw, calibration=cal, engine=e)
    assert cc.allreduce_table == ()
    assert op_time(_ar(s), cc, tp=8, engine=e).comm_s == pytest.approx(
        2 * 7 / 8 * s / 300e9 + 10e-6)


def test_every_engine_family_with_a_table_names_its_release():
    for name in catalog.gpu_names():
        hw = catalog.load_hardware(name)
        for family, t in hw.allreduce_measured.items():
            assert family in ("vllm", "sglang", "trtllm"), (name, family)
            assert t.engine_version and t.source.startswith("https://"), (name, family)
            assert set(t.graph_us) == {2, 4, 8}, (name, family)


@given(st.sampled_from(["h100-sxm", "h200", "a100-sxm-80gb"]),
       st.sampled_from(["vllm", "sglang", "trtllm"]), st.sampled_from([2, 4, 8]),
       st.booleans(), st.floats(1, 4e9), st.floats(1.0, 8.0))
def test_a_larger_message_never_takes_less_time(gpu, family, tp, graphed, size, factor):
    c = ceilings(catalog.load_hardware(gpu), engine=_engine(family))
    small = c.measured_allreduce_s(tp, graphed, size)
    large = c.measured_allreduce_s(tp, graphed, size * factor)
    assert small is not None and large >= small > 0


def test_a_malformed_table_is_refused_naming_the_field(tmp_path):
    import yaml

    hw = yaml.safe_load((catalog.db_dir("hardware_db") / "h100-sxm.yaml").read_text())
    hw["allreduce_measured"]["vllm"]["graph_us"][8] = [4.7, 4.8]
    bad = tmp_path / "h100.yaml"
    bad.write_text(yaml.safe_dump(hw))
    with pytest.raises(SpecError, match=r"graph_us\.8: 2 latencies for 23 sizes"):
        catalog.load_hardware(str(bad))


def test_a_sweep_of_message_sizes_gets_the_same_times():
    np = pytest.importorskip("numpy")
    c = ceilings(catalog.load_hardware("h200"), engine=_engine("sglang"))
    sizes = np.array([100.0, 3e3, 5e5, 16 * MIB, 3e9])
    arr = c.measured_allreduce_s(4, False, sizes)
    one = [c.measured_allreduce_s(4, False, float(x)) for x in sizes]
    assert arr == pytest.approx(one)


def test_the_output_says_whose_all_reduce_it_used(run_json):
    """`estimate --json` names where a TP all-reduce's time came from: the engine's own
    timing on an H100, the formula on an L40S (no table taken) and for an engine with no
    family; nothing on one GPU."""
    h100 = run_json("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "8")
    assert h100["allreduce_source"].startswith("vLLM 0.14.0's own, timed on NVIDIA H100")
    l40s = run_json("estimate", "-m", "llama-3.1-70b", "-g", "l40s", "--tp", "4")
    assert l40s["allreduce_source"].startswith("link formula")
    fast = run_json("estimate", "-m", "llama-3.1-70b", "-g", "h100-sxm", "--tp", "8",
                    "-e", "gpt-fast")
    assert fast["allreduce_source"].startswith("link formula")
    one = run_json("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm")
    assert one["allreduce_source"] is None
