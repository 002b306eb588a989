"""Prefill passes replayed from piecewise CUDA graphs (SGLang 0.5.10 and later:
``planner.core.engine.PrefillGraphs``): the captured token counts, the release they start at,
the server flags that change them, and what they take off a prefill step's host time in the
simulator and the static estimate alike."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cli.compare import served_setup
from planner.cli.flags import server_flags
from planner.core.engine import prefill_graph_counts
from planner.core.errors import LlmplanError
from planner.core.estimate import assemble
from planner.core.ops import StepShape
from planner.io import catalog
from planner.serving import run
from planner.serving.config import SchedulerConfig
from planner.serving.traffic import Request

# SGLang 0.5.12's _generate_piecewise_cuda_graph_tokens (python/sglang/srt/server_args.py),
# written out as it reads
SGLANG_COUNTS = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
                 + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)))


def _sglang(version: str | None = None):
    spec = catalog.load_engine_spec("sglang")
    return spec if version is None else spec.at_version(version)


def _rule():
    return _sglang().model().prefill_graph_rule


def test_on_from_0_5_10_and_off_before():
    assert _sglang("0.5.9").model().prefill_graphs is False
    assert _sglang("0.5.10").model().prefill_graphs is True
    assert _sglang("0.5.14").model().prefill_graphs is True
    assert _sglang().model().prefill_graphs is True  # the newest line
    # the rule stays, so --enable-piecewise-cuda-graph can turn them on before 0.5.10
    assert _sglang("0.5.6").model().prefill_graph_rule[:4] == _rule()[:4]
    # no other profile has them
    for name in ("vllm", "vllm-0.8", "trtllm"):
        assert catalog.load_engine_spec(name).model().prefill_graph_rule is None


def _listed(counts) -> tuple[int, ...]:
    """Every count captured, written out (small budgets only)."""
    out = list(counts.sizes)
    for start, step, last in counts.segments():
        out += range(start, last + 1, step)
    return tuple(out)


def test_the_captured_counts_are_sglangs():
    top = 16384
    expected = SGLANG_COUNTS + list(range(4608, top + 1, 512))
    counts = prefill_graph_counts(_rule(), top)
    assert _listed(counts) == tuple(expected) and counts.largest == top
    # the next count at or above every token count, as SGLang pads a pass
    for t in range(1, top + 1):
        assert counts.padded(t) == min(x for x in expected if x >= t)
    assert counts.padded(top + 1) is None and counts.padded(0.5) == 4
    # the chunked-prefill size is the largest; 2,048 for an MLA model; a server's max tokens
    # before either
    assert prefill_graph_counts(_rule(), 8192).largest == 8192
    assert prefill_graph_counts(_rule(), 8192, mla=True).largest == 2048
    assert prefill_graph_counts(_rule(), 8192, max_tokens=1000).largest == 960
    assert prefill_graph_counts(_rule(), 0) is None
    assert prefill_graph_counts(_rule(), 3) is None
    # a Llama-2 path at most 4,096 where the server gives no maximum
    assert prefill_graph_counts(_rule(), 8192, model_name="llama-2-7b").largest == 4096
    assert prefill_graph_counts(_rule(), 8192, model_name="llama-2-7b",
                                max_tokens=6000).largest == 5632
    assert prefill_graph_counts(_rule(), 8192, model_name="llama-3.1-8b").largest == 8192


def test_a_budget_of_any_size_costs_nothing():
    # the counts are worked out, not listed: 10^13 tokens answers at once
    import time

    t0 = time.perf_counter()
    counts = prefill_graph_counts(_rule(), 10**13)
    assert counts.largest == 10**13 - (10**13 - 4608) % 512
    assert counts.padded(10**12 + 1) == 4608 + -(-(10**12 + 1 - 4608) // 512) * 512
    assert time.perf_counter() - t0 < 1.0


def test_a_context_length_caps_them_from_0_5_14():
    # 0.5.14 clamps the largest count to an explicit --context-length; 0.5.10-0.5.12 do not
    new = _sglang("0.5.14").model().prefill_graph_rule
    old = _sglang("0.5.12").model().prefill_graph_rule
    assert prefill_graph_counts(new, 8192, context_tokens=4096).largest == 4096
    assert prefill_graph_counts(old, 8192, context_tokens=4096).largest == 8192


def _config(engine, *, mla=False, **overrides):
    return SchedulerConfig.for_engine(engine, memory_bytes=80e9, mla=mla, **overrides)


def test_the_scheduler_takes_the_counts_at_its_budget():
    e = _sglang("0.5.12").model()
    assert _config(e).prefill_graphs.largest == e.max_num_batched_tokens
    assert _config(e, max_num_batched_tokens=4096).prefill_graphs.largest == 4096
    assert _config(e, mla=True).prefill_graphs.largest == 2048
    # a budget that does not chunk captures none but MLA's
    assert _config(e, chunked_prefill=False).prefill_graphs is None
    assert _config(e, chunked_prefill=False, mla=True).prefill_graphs.largest == 2048
    # none before 0.5.10, none without CUDA graphs
    assert _config(_sglang("0.5.9").model()).prefill_graphs is None
    assert _config(dataclasses.replace(e, cuda_graphs=False)).prefill_graphs is None


@pytest.mark.parametrize("command, on, top", [
    ("python3 -m sglang.launch_server --model-path M", True, 8192),
    ("python3 -m sglang.launch_server --model-path M --disable-piecewise-cuda-graph", False,
     None),
    ("python3 -m sglang.launch_server --model-path M --disable-prefill-cuda-graph", False, None),
    ("python3 -m sglang.launch_server --model-path M --cuda-graph-backend-prefill disabled",
     False, None),
    ("python3 -m sglang.launch_server --model-path M --piecewise-cuda-graph-max-tokens 1024",
     True, 1024),
    ("python3 -m sglang.launch_server --model-path M --cuda-graph-max-bs-prefill=2000", True,
     1792),
    ("python3 -m sglang.launch_server --model-path M --context-length 4096", True, 8192),
    ("python3 -m sglang.launch_server --model-path M --chunked-prefill-size -1", True, None),
])
def test_sglangs_flags_set_them(command, on, top):
    dep = served_setup("qwen3-30b-a3b", "h100-sxm", _sglang("0.5.12"), 1, None, None,
                       server=server_flags(command))
    counts = run.scheduler(dep).prefill_graphs
    assert dep.engine.prefill_graphs is on
    assert (counts.largest if counts else None) == top
    # the static estimate takes the same counts (its budget, chunking, the server's flags)
    est, eager = _estimate_dep(dep, 1, 1000), _estimate_dep(dep, 1, 1000, eager=True)
    assert (est.prefill.time_s < eager.prefill.time_s) is (top is not None)


def test_enable_turns_them_on_before_0_5_10_and_bad_values_are_one_line():
    cmd = "python3 -m sglang.launch_server --model-path M --enable-piecewise-cuda-graph"
    dep = served_setup("qwen3-30b-a3b", "h100-sxm", _sglang("0.5.8"), 1, None, None,
                       server=server_flags(cmd))
    assert run.scheduler(dep).prefill_graphs.largest == 8192
    with pytest.raises(LlmplanError, match="--cuda-graph-backend-prefill: 'full' is not one"):
        server_flags("python3 -m sglang.launch_server --cuda-graph-backend-prefill full")
    with pytest.raises(LlmplanError, match="--piecewise-cuda-graph-max-tokens.*positive"):
        served_setup("qwen3-30b-a3b", "h100-sxm", _sglang("0.5.12"), 1, None, None,
                     server=server_flags("python3 -m sglang.launch_server "
                                         "--piecewise-cuda-graph-max-tokens 0"))


def _coster(engine_spec, model="qwen3-30b-a3b", gpu="h100-sxm"):
    dep = served_setup(model, gpu, engine_spec, 1, None, None)
    return dep, run.coster(dep)


def _prefill_shape(tokens: int) -> StepShape:
    # one prompt of ``tokens`` tokens from nothing cached, its last row sampled
    pairs = tokens * (tokens + 1) / 2
    return StepShape(float(tokens), pairs, float(tokens), float(tokens), pairs, 1.0, None,
                     pairs, 0.0)


def test_a_graphed_prefill_is_the_eager_one_without_host_costs():
    # with no host launch cost and no host time on MoE layers, replaying the pieces changes
    # nothing at a captured count (no padding): graphs only take host work off
    dep, c = _coster(_sglang("0.5.12"))
    e = dataclasses.replace(c.engine, host_launch_s=0.0, moe_layer_host_s=0.0)
    c0 = c.with_engine(e)
    for tokens in (16, 960, 4096):
        shape = _prefill_shape(tokens)
        eager = c0.step_time(shape, sequences=1, prefill=True, decodes=False)
        graphed = c0.step_time(shape, sequences=1, prefill=True, decodes=False,
                               prefill_graph_tokens=tokens)
        assert graphed == pytest.approx(eager, rel=1e-12)


def test_a_graphed_prefill_pays_no_moe_host_time():
    # Qwen3-30B-A3B, 48 MoE layers: an eager pass of 128 tokens is held by the host's 1.7 ms
    # a MoE layer (82 ms, the profile's moe_layer_host_us); the graphed one is not
    dep, c = _coster(_sglang("0.5.12"))
    layers = dep.model.num_layers
    shape = _prefill_shape(128)
    eager = c.step_time(shape, sequences=1, prefill=True, decodes=False)
    graphed = c.step_time(shape, sequences=1, prefill=True, decodes=False,
                          prefill_graph_tokens=128)
    assert eager >= layers * c.engine.moe_layer_host_s
    assert graphed < eager - 0.9 * layers * c.engine.moe_layer_host_s
    # its host still launches each layer's attention and a piece before it, the last piece
    # and the sampling (final norm, lm_head): 48 x (1 + 1) + 1 + 2 launches at 10 us
    assert c.engine.kernels_for("attention", "attention") == 1
    assert c.prefill_graph_launch_s == pytest.approx((48 * 2 + 1 + 2) * 10e-6)
    assert c.engine.host_launch_s == 10e-6 and layers == 48


class _Recorder:
    """A real coster whose prefill steps are noted: the captured count each replays."""

    def __init__(self, inner):
        self._inner, self.calls = inner, []

    def __getattr__(self, name):
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def with_engine(self, engine):  # the step after idle time (``idle_coster``) noted too
        other = _Recorder(self._inner.with_engine(engine))
        other.calls = self.calls
        return other

    def step_time(self, shape, **kw):
        if kw.get("prefill"):
            self.calls.append((shape.tokens, kw.get("prefill_graph_tokens")))
        return self._inner.step_time(shape, **kw)


_PAD_DEP = None


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 12000))
def test_the_pricer_pads_a_prefill_to_the_next_captured_count(tokens):
    global _PAD_DEP
    if _PAD_DEP is None:
        _PAD_DEP = _coster(_sglang("0.5.12"), model="qwen3-8b")
    dep, c = _PAD_DEP
    sizes = _listed(run.scheduler(dep).prefill_graphs)
    rec = _Recorder(c)
    run.run(dep, [Request(0, 0.0, tokens, 2)], step_coster=rec)
    assert rec.calls, "no prefill step"
    for chunk, padded in rec.calls:  # chunks of at most the budget (8,192 tokens)
        if chunk > sizes[-1]:
            assert padded is None
        else:
            assert padded == min(s for s in sizes if s >= chunk)
    assert sum(chunk for chunk, _ in rec.calls) == tokens


def _ttft_s(dep, prompt: int) -> float:
    res = run.run(dep, [Request(0, 0.0, prompt, 8)])
    return res.requests[0].ttft_s


def test_the_simulator_graphs_prefills_up_to_the_largest_count():
    # one request on an idle server: its first token comes 1.7 ms a MoE layer sooner on
    # 0.5.12, whose prefill of 1,000 tokens replays the graphs, than on 0.5.9, which runs it
    # eagerly. A prompt of 20,000 tokens is prefilled in chunks of the budget, 8,192, the
    # largest count captured: every chunk replays them, and the host's 82 ms is off at least
    # the last, short one (3,616 tokens), whose GPU work is shorter than it
    new, _ = _coster(_sglang("0.5.12"))
    old, _ = _coster(_sglang("0.5.9"))
    layers = new.model.num_layers
    host = new.engine.moe_layer_host_s
    assert _ttft_s(old, 1000) - _ttft_s(new, 1000) > 0.8 * layers * host
    assert _ttft_s(old, 20000) - _ttft_s(new, 20000) > 0.8 * layers * host
    # with a budget of 16,384 (--chunked-prefill-size) and the largest count held at 4,096
    # (--piecewise-cuda-graph-max-tokens), 8,000 tokens run eagerly on both
    cmd = ("python3 -m sglang.launch_server --chunked-prefill-size 16384 "
           "--piecewise-cuda-graph-max-tokens 4096")
    big = [served_setup("qwen3-30b-a3b", "h100-sxm", _sglang(v), 1, None, None,
                        server=server_flags(cmd)) for v in ("0.5.12", "0.5.9")]
    assert _ttft_s(big[0], 8000) == pytest.approx(_ttft_s(big[1], 8000), rel=1e-9)


def _estimate_dep(dep, batch, prompt, output=64, *, eager=False):
    """``dep``'s static estimate; ``eager``: its engine without prefill graphs."""
    from planner.core.estimate import prepare

    engine = dataclasses.replace(dep.engine, prefill_graphs=False) if eager else dep.engine
    prep = prepare(dep.hardware, dep.precision, None, dep.options, engine)
    return assemble(dep.model, dep.hardware, prep, dep.options, tp=dep.tp, batch=batch,
                    prompt_tokens=prompt, output_tokens=output, with_ideal=False)


def _estimate(spec, model, gpu, tp, batch, prompt, output=64):
    dep = served_setup(model, gpu, spec, tp, None, None)
    return assemble(dep.model, dep.hardware, dep.prepared, dep.options, tp=tp, batch=batch,
                    prompt_tokens=prompt, output_tokens=output, with_ideal=False)


def test_the_estimate_graphs_a_prefill_that_fits_and_not_one_that_does_not():
    new, old = _sglang("0.5.12"), _sglang("0.5.9")
    # DeepSeek-R1 (MLA: 2,048 tokens at most) at TP 8: 922 tokens graphed, 4,096 not
    fast = _estimate(new, "deepseek-r1", "h200", 8, 1, 922).prefill.time_s
    slow = _estimate(old, "deepseek-r1", "h200", 8, 1, 922).prefill.time_s
    layers = catalog.load_model("deepseek-r1").num_layers
    assert slow - fast > 0.5 * layers * _sglang().model().moe_layer_host_s
    assert _estimate(new, "deepseek-r1", "h200", 8, 1, 4096).prefill.time_s == \
        _estimate(old, "deepseek-r1", "h200", 8, 1, 4096).prefill.time_s
    # a dense model's decode is the same on both; its prefill of 1,000 tokens, whose host
    # floors do not bind, computes the graph's 1,024 rows: a little slower, at most by the
    # padding
    a = _estimate(new, "llama-3.1-8b", "h100-sxm", 1, 1, 1000)
    b = _estimate(old, "llama-3.1-8b", "h100-sxm", 1, 1, 1000)
    assert a.decode.time_s == b.decode.time_s
    assert b.prefill.time_s < a.prefill.time_s < b.prefill.time_s * 1024 / 1000


def test_the_estimate_and_the_simulator_price_a_graphed_prefill_alike():
    # batch 1 of 960 tokens (a captured count): the estimate's prefill is the simulator's
    # prefill step, but for the step's own host cost, which both add the same way
    spec = _sglang("0.5.12")
    dep, c = _coster(spec)
    est = _estimate(spec, "qwen3-30b-a3b", "h100-sxm", 1, 1, 960)
    sim = c.step_time(_prefill_shape(960), sequences=1, prefill=True, decodes=False,
                      prefill_graph_tokens=960)
    assert est.prefill.time_s == pytest.approx(sim, rel=0.005)


def test_the_sweeps_arrays_agree_with_single_estimates():
    np = pytest.importorskip("numpy")
    spec = _sglang("0.5.12")
    prompts = np.array([100.0, 922.0, 2048.0, 2049.0, 6000.0])
    batch = np.ones_like(prompts)
    grid = _estimate(spec, "deepseek-r1", "h200", 8, batch, prompts).prefill.time_s
    for i, p in enumerate(prompts):
        one = _estimate(spec, "deepseek-r1", "h200", 8, 1, int(p)).prefill.time_s
        assert grid[i] == pytest.approx(one, rel=1e-9)
    assert not any(math.isnan(x) for x in grid)


def test_off_on_gpus_that_are_not_nvidias():
    # SGLang's _handle_piecewise_cuda_graph turns them off on HIP (AMD), XPU (Intel) and the
    # rest; the estimate prices such a prefill eagerly, as before 0.5.10
    dep = served_setup("qwen3-30b-a3b", "mi300x", _sglang("0.5.12"), 1, None, None)
    assert not dep.engine.prefill_graphs and run.scheduler(dep).prefill_graphs is None
    new = _estimate(_sglang("0.5.12"), "qwen3-30b-a3b", "mi300x", 1, 1, 1000)
    old = _estimate(_sglang("0.5.9"), "qwen3-30b-a3b", "mi300x", 1, 1, 1000)
    assert new.prefill.time_s == old.prefill.time_s


def test_none_under_disaggregation_speculation_or_offload():
    # SGLang turns the prefill graphs off under PD disaggregation and CPU offload; 0.5.10
    # under any speculative algorithm, 0.5.12 and later for an EAGLE / MTP target. A lone
    # 1,000-token prompt's first token is then the eager one, as on 0.5.9
    from planner.layouts.speculation import SpeculationConfig

    new, old = (served_setup("qwen3-30b-a3b", "h100-sxm", _sglang(v), 1, None, None)
                for v in ("0.5.12", "0.5.9"))
    req = [Request(0, 0.0, 1000, 8)]

    def ttft_split(dep):
        res = run.run_disaggregated(dep, dep, req, prefill_instances=1, decode_instances=1)
        return res.combined().requests[0].ttft_s

    assert ttft_split(new) == pytest.approx(ttft_split(old), rel=1e-9)
    spec = SpeculationConfig("ngram", 3, 0.6)

    def ttft_spec(dep):
        cfg = run.scheduler(dep)
        res = run.run(dep, req, cfg, speculation=run.speculation_serving(dep, spec, cfg))
        return res.requests[0].ttft_s

    assert ttft_spec(new) == pytest.approx(ttft_spec(old), rel=1e-9)
    assert _ttft_s(new, 1000) < 0.8 * ttft_spec(new)  # and without speculation, graphed
    offload = served_setup("qwen3-30b-a3b", "h100-sxm", _sglang("0.5.12"), 1, None, None,
                           server={"--cpu-offload-gb": 4.0})
    assert run.scheduler(offload).prefill_graphs is None
    est, eager = _estimate_dep(offload, 1, 1000), _estimate_dep(offload, 1, 1000, eager=True)
    assert est.prefill.time_s == eager.prefill.time_s


def test_the_estimate_graphs_each_chunk_as_the_simulator_does():
    # Qwen3-30B-A3B at the budget (8,192) and past it: the simulator graphs every chunk of
    # 8,192 and the rest, so the estimate does too, and nothing jumps at 8,193
    spec = _sglang("0.5.12")
    t = {p: _estimate(spec, "qwen3-30b-a3b", "h100-sxm", 1, 1, p).prefill.time_s
         for p in (8192, 8193, 20000)}
    eager = _estimate(_sglang("0.5.9"), "qwen3-30b-a3b", "h100-sxm", 1, 1, 20000)
    assert t[8193] < t[8192] * 1.05
    assert t[20000] < eager.prefill.time_s
    # DeepSeek-R1 (MLA: 2,048 at most) in chunks of 8,192: eager past 2,048
    dsr1 = {v: _estimate(_sglang(v), "deepseek-r1", "h200", 8, 1, 3000).prefill.time_s
            for v in ("0.5.12", "0.5.9")}
    assert dsr1["0.5.12"] == dsr1["0.5.9"]


@pytest.mark.parametrize("entry, needle", [
    ("{value: true, sizes: [true, 4], source: x}", "expected whole numbers"),
    ("{value: true, sizes: [4, 8], steps: [[4, 4]], source: x}", "below the first step"),
    ("{value: true, source: x}", "give sizes or steps"),
    ("{value: true, sizes: [4], name_caps: {llama-2: 0}, source: x}", "name_caps"),
])
def test_a_malformed_entry_is_one_line(tmp_path, entry, needle):
    import subprocess
    import sys

    text = (catalog.db_dir("engines_db") / "sglang.yaml").read_text()
    start = text.index("  prefill_graphs:\n")
    end = text.index("  decode_reserve:\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text[:start] + f"  prefill_graphs: {entry}\n" + text[end:])
    out = subprocess.run([sys.executable, "-m", "planner", "simulate", "-m", "qwen3-8b", "-g",
                          "h100-sxm", "-e", str(bad), "-n", "3"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "prefill_graphs" in lines[0] and needle in lines[0], lines


def test_enforce_wins_over_disable_and_a_clash_names_the_flags():
    # SGLang 0.5.10's _handle_piecewise_cuda_graph: --enforce-piecewise-cuda-graph skips every
    # rule that turns the graphs off, --disable-piecewise-cuda-graph included, in either order
    for cmd in ("--disable-piecewise-cuda-graph --enforce-piecewise-cuda-graph",
                "--enforce-piecewise-cuda-graph --disable-piecewise-cuda-graph"):
        # and says so: the MoE runner's rule is skipped too (``--enforced``)
        assert server_flags(f"python3 -m sglang.launch_server {cmd}") == {
            "--prefill-graphs": True, "--enforced": ("--prefill-graphs",)}
    with pytest.raises(LlmplanError, match=r"gives --prefill-graphs twice: False "
                       r"\(--disable-piecewise-cuda-graph\) and True "
                       r"\(--enable-piecewise-cuda-graph\)"):
        server_flags("python3 -m sglang.launch_server --disable-piecewise-cuda-graph "
                     "--enable-piecewise-cuda-graph")


@pytest.mark.parametrize("version, model, gpu, weights, graphed", [
    # SGLang 0.5.10-0.5.12 on an SM100 GPU: DeepSeek-V3 / R1 and Qwen3-MoE run the FlashInfer
    # TensorRT-LLM MoE runner by default, whose bypassed top-k takes the prefill graphs away
    ("0.5.10", "deepseek-r1", "b200", None, False),
    ("0.5.12", "deepseek-r1", "b200", None, False),
    ("0.5.12", "qwen3-235b-a22b", "b200", None, False),
    ("0.5.12", "qwen3-235b-a22b", "b200", "fp8", False),
    # an int4 checkpoint keeps its own runner; gpt-oss's MoE block is one custom op
    ("0.5.12", "qwen3-235b-a22b", "b200", "int4", True),
    ("0.5.12", "gpt-oss-120b", "b200", None, True),
    # not on Hopper, not in 0.5.14 (the rule gone), not for a dense model
    ("0.5.12", "deepseek-r1", "h200", None, True),
    ("0.5.14", "deepseek-r1", "b200", None, True),
    (None, "deepseek-r1", "b200", None, True),
    ("0.5.12", "llama-3.1-70b", "b200", None, True),
])
def test_blackwell_s_moe_runner_takes_them_away_in_0_5_10_to_0_5_12(version, model, gpu,
                                                                     weights, graphed):
    dep = served_setup(model, gpu, _sglang(version), 8, weights, None)
    assert dep.engine.prefill_graphs is True
    assert (run.scheduler(dep).prefill_graphs is not None) is graphed
    est, eager = _estimate_dep(dep, 1, 1000), _estimate_dep(dep, 1, 1000, eager=True)
    assert (est.prefill.time_s < eager.prefill.time_s) is graphed


def test_enforce_wins_over_the_moe_runner_s_rule():
    """--enforce-piecewise-cuda-graph skips the rule, as every other (ServerArgs)."""
    cmd = "python3 -m sglang.launch_server --model-path M --tp 8"
    for extra, graphed in (("", False), (" --enforce-piecewise-cuda-graph", True),
                           (" --enable-piecewise-cuda-graph", False)):
        dep = served_setup("deepseek-r1", "b200", _sglang("0.5.12"), 8, None, None,
                           server=server_flags(cmd + extra))
        assert (run.scheduler(dep).prefill_graphs is not None) is graphed, extra


def test_the_rule_s_releases_and_a_bad_rule_is_one_line(run_cli, tmp_path):
    mo = catalog.load_engine_spec("sglang").serving.prefill_graphs.moe_runner_off
    assert (mo.since, mo.until, mo.gpu_architectures) == ("0.5.10", "0.5.13", ("blackwell",))
    assert _sglang("0.5.12").at_version("0.5.12") == _sglang("0.5.12")  # applied once
    assert _sglang("0.5.9").serving.prefill_graphs.moe_runner_off is None
    import yaml

    data = yaml.safe_load((catalog.db_dir("engines_db") / "sglang.yaml").read_text())
    data["serving"]["prefill_graphs"]["moe_runner_off"]["gpu_architectures"] = ["volta2"]
    f = tmp_path / "e.yaml"
    f.write_text(yaml.safe_dump(data))
    code, out, err = run_cli("estimate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-e", str(f))
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "moe_runner_off.gpu_architectures" in err
