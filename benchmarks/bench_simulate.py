"""Speed of the serving simulator: 100,000 requests of 1024 in / 256 out, all at t = 0,
Llama-3.1-8B on one H100 with the vLLM profile (issue: at most 2 s on one core), under
continuous batching; then with every serving part switched on (vLLM's defaults: CUDA-graph
padding and prefix caching, the prompts sharing a 512-token prefix; then SGLang's separate
prefill steps and TensorRT-LLM's no-evict admission; then SGLang's own scheduler, its
admission holding KV back for the running requests' outputs), the same stream under static
batching, vLLM 0.6's multi-step scheduling (8 steps a block, tokens streamed or in bursts),
gpt-oss-20b's sliding-window layers under vLLM's defaults, a queue the KV cache holds back
(Gemma-3-27B on one H100), an expert-parallel replica at a low rate (DeepSeek-V3 over 8
H200, a tenth of the requests), and a smaller one (the speculative pool tracks each decoding
request, O(running) a step) with n-gram speculation.

    python benchmarks/bench_simulate.py [--requests 100000] [--spec-requests 5000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.core.estimate import prepare  # noqa: E402
from planner.core.specs import Options, Precision  # noqa: E402
from planner.io import catalog  # noqa: E402
from planner.layouts.speculation import SpeculationConfig  # noqa: E402
from planner.serving.cost import StepCoster  # noqa: E402
from planner.serving.metrics import summary  # noqa: E402
from planner.serving.sim import SchedulerConfig, simulate  # noqa: E402
from planner.serving.speculation import spec_serving  # noqa: E402
from planner.serving.traffic import synthetic  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--spec-requests", type=int, default=5_000)
    args = ap.parse_args()
    m, hw = catalog.load_model("llama-3.1-8b"), catalog.load_hardware("h100-sxm")
    eng = catalog.load_engine("vllm")
    opts = Options()
    prep = prepare(hw, Precision(), None, opts, eng)
    coster = StepCoster(m, hw, prep, opts)
    t0 = time.perf_counter()
    reqs = synthetic(args.requests, prompt_tokens=1024, output_tokens=256)
    t1 = time.perf_counter()
    res = simulate(reqs, coster, SchedulerConfig())
    t2 = time.perf_counter()
    s = summary(res)
    t3 = time.perf_counter()
    print(f"{args.requests:,} requests, {res.steps:,} steps: traffic {t1 - t0:.2f} s, "
          f"simulation {t2 - t1:.2f} s, summary {t3 - t2:.2f} s; total {t3 - t0:.2f} s "
          f"(target <= 2 s); {s['request_throughput']:.1f} req/s simulated")
    for name, cfg in (
            ("vLLM defaults (graph padding, prefix cache)", SchedulerConfig.for_engine(eng)),
            ("+ separate prefill, no-evict", SchedulerConfig.for_engine(
                eng, mixed_batches=False, capacity_policy="guaranteed-no-evict")),
            ("SGLang's scheduler (separate prefill, its admission holding KV back)",
             SchedulerConfig.for_engine(catalog.load_engine("sglang"),
                                        memory_bytes=hw.memory_bytes)),
            ("SGLang, ignore_eos and the radix cache off (whole outputs at admission)",
             SchedulerConfig.for_engine(catalog.load_engine("sglang"),
                                        memory_bytes=hw.memory_bytes, ignore_eos=True,
                                        prefix_caching=False))):
        t0 = time.perf_counter()
        shared = synthetic(args.requests, prompt_tokens=512, output_tokens=256,
                           prefix_tokens=512)
        res = simulate(shared, coster, cfg)
        s = summary(res)
        t1 = time.perf_counter()
        hit = s["prefix_cache_hit_rate"]
        print(f"{name}: {args.requests:,} requests, {res.steps:,} steps, prefix hit rate "
              f"{'off' if hit is None else format(hit, '.0%')}: traffic, simulation and summary "
              f"{t1 - t0:.2f} s (target <= 2 s)")
    v0 = catalog.load_engine("vllm-v0")
    v0_coster = StepCoster(m, hw, prepare(hw, Precision(), None, opts, v0), opts)
    for name, stream in (("streamed", True), ("in bursts", False)):
        cfg = SchedulerConfig.for_engine(v0, context_tokens=m.max_position_embeddings,
                                         scheduler_steps=8, multi_step_stream=stream)
        t0 = time.perf_counter()
        res = simulate(reqs, v0_coster, cfg)
        t1 = time.perf_counter()
        print(f"vLLM 0.6 multi-step (8 steps a block, {name}): {args.requests:,} requests, "
              f"{res.steps:,} steps: simulation {t1 - t0:.2f} s (target <= 2 s)")
    # sliding-window layers (half of gpt-oss-20b's, a window of 128) under vLLM's defaults:
    # its hybrid KV cache holds the windowed groups apart
    _other_model("gpt-oss-20b", "sliding-window layers", args.requests, hw, eng, opts,
                 "target <= 2 s")
    # a queue the KV cache holds back: Gemma-3-27B in bf16 leaves one H100 room for about
    # 40 of these requests' KV beside 1,024 free seats, so every request waits for a finish
    _other_model("gemma-3-27b", "a queue the KV cache holds back", args.requests, hw, eng,
                 opts, "no target: six times the steps")
    _expert_parallel(args.requests // 10, eng, opts)
    t0 = time.perf_counter()
    res = simulate(reqs, coster, SchedulerConfig(kind="static"))
    t1 = time.perf_counter()
    print(f"static batching: {args.requests:,} requests, {res.steps:,} steps: simulation "
          f"{t1 - t0:.2f} s; {summary(res)['request_throughput']:.1f} req/s simulated")
    spec = spec_serving(m, hw, prep, opts, tp=1, cfg=SpeculationConfig("ngram", 3, 0.6))
    reqs = synthetic(args.spec_requests, prompt_tokens=1024, output_tokens=256)
    t0 = time.perf_counter()
    res = simulate(reqs, coster, SchedulerConfig(), spec=spec)
    t1 = time.perf_counter()
    print(f"n-gram speculation (k 3, acceptance 0.6): {args.spec_requests:,} requests, "
          f"{res.steps:,} steps: simulation {t1 - t0:.2f} s; "
          f"{summary(res)['request_throughput']:.1f} req/s simulated")


def _other_model(name: str, what: str, requests: int, hw, eng, opts, note: str) -> None:
    """The plain stream on another model under the engine's defaults, timed with its traffic
    and summary."""
    m = catalog.load_model(name)
    coster = StepCoster(m, hw, prepare(hw, Precision(), None, opts, eng), opts)
    t0 = time.perf_counter()
    res = simulate(synthetic(requests, prompt_tokens=1024, output_tokens=256), coster,
                   SchedulerConfig.for_engine(eng, memory_bytes=hw.memory_bytes))
    s = summary(res)
    t1 = time.perf_counter()
    print(f"{what} ({name}, vLLM's defaults): {requests:,} requests, {res.steps:,} steps, "
          f"{s['mean_running_requests']:.0f} running: traffic, simulation and summary "
          f"{t1 - t0:.2f} s ({note})")


def _expert_parallel(requests: int, eng, opts) -> None:
    """DeepSeek-V3 (fp8) over 8 H200, its experts spread over all 8 and attention
    data-parallel (8 groups of TP 1, each with vLLM's limits), vLLM's defaults: the
    expert-parallel replica's steps (``ExpertCoster``), at 2 req/s: a few dozen running, so
    most steps decode alone, as in the runs a plan sizes replicas with."""
    from planner.serving.costers import layout_coster

    m, hw = catalog.load_model("deepseek-v3"), catalog.load_hardware("h200")
    prep = prepare(hw, Precision(weights="fp8"), None, opts, eng)
    coster = layout_coster(m, hw, prep, opts, tp=1, ep=8)
    cfg = SchedulerConfig.for_engine(eng, memory_bytes=hw.memory_bytes,
                                     ranks=coster.dp_ranks)
    t0 = time.perf_counter()
    res = simulate(synthetic(requests, prompt_tokens=1024, output_tokens=256,
                             request_rate=2.0), coster, cfg)
    s = summary(res)
    t1 = time.perf_counter()
    print(f"expert parallel (deepseek-v3 fp8, EP 8 over 8 groups of TP 1 on H200, vLLM's "
          f"defaults, 2 req/s): {requests:,} requests, {res.steps:,} steps, "
          f"{s['mean_running_requests']:.0f} running: traffic, simulation and summary "
          f"{t1 - t0:.2f} s (no target)")


if __name__ == "__main__":
    main()
