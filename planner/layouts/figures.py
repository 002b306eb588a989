"""One replica's headline figures under any layout: a TP group, TP x PP pipeline stages, or EP
expert-parallel GPUs (attention TP over --tp of them), in the shape sweep, plan and check
consume.

For TP alone the figures are ``estimate``'s; with pipeline stages or expert parallelism they
come from ``planner.layouts.pipeline`` and ``planner.layouts.expert``. Memory is that of the
replica's fullest GPU against one GPU's usable memory, and cost counts every GPU of the
replica. Numbers, or broadcastable arrays (a sweep). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from planner.core.arith import vmin
from planner.core.errors import UsageError
from planner.core.estimate import Prepared
from planner.core.headline import Headline
from planner.core.specs import HardwareSpec, ModelSpec, Options
from planner.layouts.deployment import Layout


@dataclass(frozen=True)
class LayoutMemory:
    total_bytes: object  # the fullest GPU's
    usable_bytes: float
    capacity_bytes: float

    @property
    def used_frac(self):
        """Of the GPU's capacity, as ``MemoryPlan.used_frac``."""
        return self.total_bytes / self.capacity_bytes

    @property
    def fits(self):
        return self.total_bytes <= self.usable_bytes


@dataclass(frozen=True)
class LayoutFigures:
    tp: int
    pp: int
    ep: int
    batch: object
    output_tokens: object
    ttft_s: object
    tpot_s: object
    memory: LayoutMemory
    price_usd_per_gpu_hour: float | None
    extra: dict  # the layout's own figures: micro-batches, expert imbalance, all-to-all
    mbu = None  # not predicted for these layouts

    @property
    def num_gpus(self) -> int:
        return Layout(self.tp, self.pp, self.ep).num_gpus

    @property
    def headline(self) -> Headline:
        return Headline(self.ttft_s, self.tpot_s, self.batch, self.output_tokens, self.num_gpus,
                        self.price_usd_per_gpu_hour)

    @property
    def latency_s(self):
        return self.headline.latency_s

    @property
    def throughput_tokens_per_s(self):
        return self.headline.throughput_tokens_per_s

    @property
    def e2e_throughput_tokens_per_s(self):
        return self.headline.e2e_throughput_tokens_per_s

    @property
    def cost_usd_per_million_output_tokens(self):
        return self.headline.cost_usd_per_million_output_tokens

    def columns(self) -> dict:
        m = self.memory
        return {"total_memory_bytes": m.total_bytes, "usable_memory_bytes": m.usable_bytes,
                "memory_used_frac": m.used_frac, "fits": m.fits, "ttft_s": self.ttft_s,
                "tpot_s": self.tpot_s, "latency_s": self.latency_s,
                "throughput_tokens_per_s": self.throughput_tokens_per_s,
                "e2e_throughput_tokens_per_s": self.e2e_throughput_tokens_per_s,
                "cost_usd_per_million_output_tokens": self.cost_usd_per_million_output_tokens,
                **self.extra}


def layout_figures(m: ModelSpec, hw: HardwareSpec, prep: Prepared, o: Options, *, tp: int = 1,
                   pp: int = 1, ep: int = 1, batch, prompt_tokens, output_tokens,
                   price_usd_per_gpu_hour: float | None = None) -> LayoutFigures:
    """The figures of a pipeline (``pp`` > 1) or expert-parallel (``ep`` > 1) replica."""
    Layout(tp, pp, ep).check(m)
    if ep > 1:
        from planner.layouts.expert import expert_parallel

        r = expert_parallel(m, hw, prep, o, ep=ep, tp=tp, batch=batch,
                            prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        memory, extra = r.total_bytes, {"expert_imbalance": r.imbalance,
                                        "all_to_all_s": r.all_to_all_s,
                                        "moe_reduce_s": r.moe_reduce_s}
        usable = r.usable_bytes
    elif pp > 1:
        from planner.layouts.pipeline import pipeline

        r = pipeline(m, hw, prep, o, tp=tp, pp=pp, batch=batch, prompt_tokens=prompt_tokens,
                     output_tokens=output_tokens)
        memory, extra = r.max_memory_per_gpu_bytes, {"micro_batches": r.micro_batches}
        # the stage with the least headroom under its own usable memory binds
        headroom = reduce(vmin, (st.usable_bytes - st.total_bytes for st in r.stages))
        # on vLLM's bases every stage may fill the same share of its GPU; a KV cache given
        # outright or capped makes each stage's its own
        same = prep.engine.memory_basis in ("total", "measured") and \
            o.kv_cache_memory_bytes is None and o.kv_cache_max_tokens is None
        usable = r.stages[0].usable_bytes if same else memory + headroom
    else:
        raise UsageError("layout_figures: a TP group alone is estimate's")
    return LayoutFigures(tp, pp, ep, batch, output_tokens, r.ttft_s, r.tpot_s,
                         LayoutMemory(memory, usable, hw.memory_bytes),
                         price_usd_per_gpu_hour, extra)
