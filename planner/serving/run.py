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


def scheduler(dep: Deployment, mode: str | None = None, **overrides) -> SchedulerConfig:
    """The engine profile's scheduler defaults on the deployment's GPU and TP, under vLLM's
    --performance-mode ``mode`` (``Engine.in_mode``; None: not given), with any field
    overridden; defaults that depend on the served context length take the model's where no
    max_model_len is given (vLLM's default max-model-len). Weights kept in host memory
    (--cpu-offload-gb) leave no prefill graphs (SGLang turns them off), nor does a MoE model
    whose default MoE runner on this GPU takes them away (``Engine.prefill_graphs_for``),
    nor a model with sparse attention (SGLang's ``_handle_piecewise_cuda_graph`` turns them
    off for DeepSeek-V3.2)."""
    if dep.options.cpu_offload_bytes or dep.model.sparse_topk is not None or \
            not dep.engine.prefill_graphs_for(dep.model.architecture,
                                              dep.precision.weights.value):
        overrides.setdefault("prefill_graphs", None)
    return SchedulerConfig.for_engine(dep.engine.in_mode(mode),
                                      memory_bytes=dep.hardware.memory_bytes,
                                      tp=dep.layout.tp,
                                      context_tokens=dep.model.max_position_embeddings,
                                      mla=dep.model.mla is not None, model_name=dep.model.name,
                                      **overrides)


def chat_parse_s(dep: Deployment, chat: bool) -> float:
    """The API server's CPU per request for parsing the model's chat template, beyond the
    profile's front-end cost (``SchedulerConfig.chat_template_parse_s``): for chat requests
    (``chat``) of a model whose template is rendered from Jinja, on a release that parses it
    anew for each (``Engine.chat_template_parse_s``); 0 otherwise (a harmony model, the
    completions API, any other release)."""
    t = dep.model.chat_template
    if not chat or t is None or t.renderer != "jinja":
        return 0.0
    return dep.engine.chat_template_parse_s


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
        speculation=None, step_coster=None, sample_every_s: float | None = None,
        on_record=None, warm_prefixes: dict[int, int] | None = None) -> SimResult:
    """Serve ``requests`` on one replica of ``dep``. ``speculation``: what
    ``speculation_serving`` returns, or None. ``step_coster`` reuses a coster built by
    ``coster(dep)`` (its per-shape caches) across runs of the same deployment.
    ``on_record``: the caller's sink for each request's result as it is done or refused
    (``simulate``'s); ``warm_prefixes``: prefixes cached before the run (``simulate``'s)."""
    return simulate(requests, step_coster or coster(dep), cfg or scheduler(dep),
                    sample_every_s=sample_every_s, spec=speculation, on_record=on_record,
                    warm_prefixes=warm_prefixes)


KV_LINKS = ("auto", "intra-node", "inter-node")


def kv_link(prefill: Deployment, decode: Deployment, *, prefill_instances: int,
            decode_instances: int, where: str = "auto"):
    """The link a prompt's KV crosses from a prefill instance to a decode instance
    (``planner.serving.disagg.KVLink``): the GPUs' own link within a server
    (``interconnect``: NVLink, or PCIe where that is all the GPU has), or the inter-node
    network's per-GPU share (``node.inter_node``, with its latency) between servers. "auto":
    within a server when both pools are of one GPU and all their GPUs fit one server of it,
    else between servers (within, where hardware_db states no inter-node network). Each of
    the min(prefill TP, decode TP) GPU pairs carries its share
    of the KV at once."""
    from planner.serving.disagg import KVLink

    if where not in KV_LINKS:
        raise UsageError(f"--kv-link: {where!r} is not one of {', '.join(KV_LINKS)}",
                         fields=("kv_link",))
    hp, hd = prefill.hardware, decode.hardware
    gpus = prefill_instances * prefill.layout.num_gpus + decode_instances * \
        decode.layout.num_gpus
    per_node = hp.node.gpus_per_node if hp.node is not None else None
    one_server = hp.name == hd.name and per_node is not None and gpus <= per_node
    networked = all(h.node is not None and h.node.inter_node is not None for h in (hp, hd))
    # auto without an inter-node figure: the GPUs' own link, as collectives fall back to it
    # (``Ceilings.link``)
    across = (not one_server and networked) if where == "auto" else where == "inter-node"
    if not across and hp.name != hd.name:
        raise UsageError(f"--kv-link intra-node: the pools are on different GPUs ({hp.name}, "
                         f"{hd.name}), which share no server", fields=("kv_link",))
    pairs = min(prefill.layout.tp, decode.layout.tp)
    if across:
        nets = [h.node.inter_node if h.node is not None else None for h in (hp, hd)]
        missing = next((h.name for h, n in zip((hp, hd), nets, strict=True) if n is None), None)
        if missing:
            raise UsageError(f"--kv-link: {missing}'s hardware file states no node.inter_node "
                             "network, which the KV would cross between servers",
                             fields=("kv_link",))
        bw = min(n.bandwidth_gb_per_s for n in nets) * 1e9
        lat = max((n.latency_us or 0.0) for n in nets) * 1e-6
        kind = nets[0].kind if nets[0].kind == nets[1].kind else f"{nets[0].kind}/{nets[1].kind}"
        return KVLink(bw * pairs, lat, kind, pairs)
    ic = hp.interconnect
    return KVLink(ic.unidirectional_bytes_per_s * pairs, 0.0, ic.kind, pairs)


def check_pools(prefill: Deployment, decode: Deployment) -> None:
    """The two pools of a disaggregated deployment: one model, one KV cache layout (the KV
    crosses as it is), tensor-parallel replicas."""
    if prefill.model.name != decode.model.name:
        raise UsageError(f"the prefill and decode pools serve different models "
                         f"({prefill.model.name}, {decode.model.name})")
    if prefill.precision.kv_cache != decode.precision.kv_cache:
        raise UsageError(f"the prefill pool's KV cache is {prefill.precision.kv_cache.value} "
                         f"and the decode pool's {decode.precision.kv_cache.value}: the KV "
                         "crosses as it is, so they must match", fields=("kv_cache",))
    for name, dep in (("prefill", prefill), ("decode", decode)):
        if dep.layout.pp > 1 or dep.layout.ep > 1:
            raise UsageError(f"disaggregated serving: the {name} pool is simulated on "
                             "tensor-parallel replicas only (pp 1, ep 1)",
                             fields=("pp", "ep"))


def run_disaggregated(prefill: Deployment, decode: Deployment, requests: list[Request], *,
                      prefill_instances: int, decode_instances: int,
                      prefill_cfg: SchedulerConfig | None = None,
                      decode_cfg: SchedulerConfig | None = None, link=None,
                      prefill_coster=None, decode_coster=None):
    """Serve ``requests`` on ``prefill_instances`` replicas of ``prefill`` and
    ``decode_instances`` of ``decode`` (``planner.serving.disagg``); ``link``: a
    ``KVLink``, by default ``kv_link``'s "auto"."""
    from planner.core.memory import kv_cache_bytes_per_token
    from planner.serving.disagg import Pool, simulate_disaggregated

    check_pools(prefill, decode)
    link = link or kv_link(prefill, decode, prefill_instances=prefill_instances,
                           decode_instances=decode_instances)
    return simulate_disaggregated(
        requests,
        Pool(prefill_coster or coster(prefill), prefill_cfg or scheduler(prefill),
             prefill_instances),
        Pool(decode_coster or coster(decode), decode_cfg or scheduler(decode),
             decode_instances),
        link, kv_cache_bytes_per_token(decode.model, decode.precision))
