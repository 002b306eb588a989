"""One replica of a deployment serving a request stream: the one way every command and search
simulates (``simulate``, ``plan``, ``report``'s serving curve, ``compare``, ``validate``).

The replica's step coster comes from its layout (a TP group, pipeline stages or expert-parallel
GPUs: ``planner.serving.costers.layout_coster``), its scheduler from the engine profile's
defaults unless one is given, and speculative decoding, when asked for, from
``planner.serving.speculation``. Pure.
"""

from __future__ import annotations

from planner.core.errors import UsageError
from planner.layouts.deployment import Deployment
from planner.serving.cost import CostCache
from planner.serving.costers import layout_coster
from planner.serving.sim import SchedulerConfig, SimResult, simulate
from planner.serving.traffic import Request


def coster(dep: Deployment, cache: CostCache | None = None):
    """The step coster of one replica of ``dep``; ``cache``: what it shares with the costers
    of this replica under other engine profiles (``planner.serving.cost.CostCache``)."""
    lay = dep.layout
    return layout_coster(dep.model, dep.hardware, dep.prepared, dep.options, tp=lay.tp,
                         pp=lay.pp, ep=lay.ep, cache=cache)


def scheduler(dep: Deployment, **overrides) -> SchedulerConfig:
    """The engine profile's scheduler defaults, with any field overridden."""
    return SchedulerConfig.for_engine(dep.engine, **overrides)


def check_speculation(dep: Deployment, cfg: SchedulerConfig) -> None:
    """Speculative decoding is simulated on a TP replica with continuous batching."""
    if dep.layout.pp > 1 or dep.layout.ep > 1:
        raise UsageError("speculative is simulated on a TP replica only (pp 1, ep 1)",
                         fields=("speculative", "pp", "ep"))
    if cfg.kind != "continuous":
        raise UsageError("speculative is simulated with scheduler continuous only",
                         fields=("speculative", "scheduler"))


def speculation_serving(dep: Deployment, speculation, cfg: SchedulerConfig):
    """The simulator's speculative decoding for ``speculation`` (a
    ``planner.layouts.speculation.SpeculationConfig``), on the layouts and schedulers that
    have it."""
    from planner.serving.speculation import spec_serving

    check_speculation(dep, cfg)
    return spec_serving(dep.model, dep.hardware, dep.prepared, dep.options, tp=dep.tp,
                        cfg=speculation)


def run(dep: Deployment, requests: list[Request], cfg: SchedulerConfig | None = None, *,
        speculation=None, step_coster=None, sample_every_s: float | None = None) -> SimResult:
    """Serve ``requests`` on one replica of ``dep``. ``speculation``: what
    ``speculation_serving`` returns, or None. ``step_coster`` reuses a coster built by
    ``coster(dep)`` (its per-shape caches) across runs of the same deployment."""
    return simulate(requests, step_coster or coster(dep), cfg or scheduler(dep),
                    sample_every_s=sample_every_s, spec=speculation)
