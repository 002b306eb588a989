"""The thing planned: this model on these GPUs with this engine, precision and layout.

``Layout`` is how one replica spreads over GPUs and checks itself against a model once;
``Deployment`` carries the model, the GPU, the layout, the options and the engine prepared for
the precision (``planner.core.estimate.Prepared``: the precision as it runs, the engine's
ceilings and the ideal ones), so that every command builds one value at its edge and hands it
to the library instead of seven loose arguments. ``estimate_deployment`` is one replica's
prediction at a workload with every section the layout and speculation add. Pure.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace

from planner.core.engine import IDEAL, Engine
from planner.core.errors import UsageError
from planner.core.estimate import Estimate, Prepared, estimate_prepared, prepare
from planner.core.ops import check_runs_on
from planner.core.specs import (
    Calibration,
    HardwareSpec,
    ModelSpec,
    Options,
    Precision,
    Workload,
)


@dataclass(frozen=True)
class Layout:
    """One replica's GPUs: ``tp``-way tensor parallel groups, ``pp`` pipeline stages of them,
    or, for a MoE model, ``ep`` expert-parallel GPUs: the routed experts spread over all ``ep``
    (1/ep of them on each), attention and every other weight tensor-parallel over ``tp`` GPUs
    in ``dp`` = ep / tp data-parallel groups (``tp`` 1: attention data-parallel on every GPU,
    SGLang's DP attention; ``tp`` = ``ep``: one TP group, vLLM's ``--tensor-parallel-size N
    --enable-expert-parallel``). The replica has ``ep`` GPUs; ep must be a multiple of tp."""

    tp: int = 1
    pp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep"):
            v = getattr(self, name)
            try:
                n = operator.index(v)  # an int, or numpy's (a sweep's or a frame's column)
            except TypeError:
                n = 0
            if isinstance(v, bool) or n < 1:
                raise UsageError(f"{name}: must be a whole number >= 1, got {v!r}",
                                 fields=(name,))
            object.__setattr__(self, name, n)

    @property
    def dp(self) -> int:
        """Data-parallel attention groups within the replica (each of ``tp`` GPUs)."""
        return self.ep // self.tp if self.ep > 1 else 1

    @property
    def num_gpus(self) -> int:
        # with experts spread, ep = tp x dp GPUs (pp 1); else tp x pp
        return self.pp * max(self.tp, self.ep)

    @property
    def label(self) -> str:
        """"TP4", "TP8xPP2", "EP16" (attention data-parallel), "TP8xEP8" (attention TP 8
        over the experts' 8 GPUs), "TP2xEP8" (four TP 2 attention groups)."""
        if self.ep > 1:
            return f"TP{self.tp}xEP{self.ep}" if self.tp > 1 else f"EP{self.ep}"
        return f"TP{self.tp}" + (f"xPP{self.pp}" if self.pp > 1 else "")

    @property
    def gpus_text(self) -> str:
        """"4", "8 (TP 4 x PP 2)", "16 (EP)", "8 (TP 8, EP 8)", "8 (TP 2 x DP 4, EP 8)": the
        GPUs of one replica."""
        if self.ep > 1:
            if self.tp == 1:
                return f"{self.ep} (EP)"
            dp = f" x DP {self.dp}" if self.dp > 1 else ""
            return f"{self.ep} (TP {self.tp}{dp}, EP {self.ep})"
        return f"{self.num_gpus} (TP {self.tp} x PP {self.pp})" if self.pp > 1 else str(self.tp)

    def check(self, m: ModelSpec) -> Layout:
        """A layout the model allows: TP dividing its heads, at most one stage per layer, EP
        dividing its experts, a multiple of TP and without pipeline stages. Returns itself."""
        from planner.core.ops import check_tp
        from planner.layouts.expert import check_ep
        from planner.layouts.pipeline import stage_layers

        if self.ep > 1 and self.pp > 1:
            raise UsageError("ep spreads the experts over one stage's GPUs: give pp 1 with it",
                             fields=("ep", "pp"))
        if self.ep > 1 and self.ep % self.tp:
            raise UsageError(f"ep {self.ep} is not a multiple of tp {self.tp}: the ep GPUs "
                             "hold whole attention groups of tp", fields=("ep", "tp"))
        check_tp(m, self.tp)
        stage_layers(m.num_layers, self.pp)
        if self.ep > 1:
            check_ep(m, self.ep)
        return self


@dataclass(frozen=True)
class Deployment:
    """A model served by an engine on a layout of GPUs, prepared for prediction."""

    model: ModelSpec
    hardware: HardwareSpec
    prepared: Prepared
    layout: Layout = Layout()
    options: Options = Options()
    calibration: Calibration | None = None
    # where the weights' precision came from: "checkpoint" (the model's quantization_config),
    # "--weights" (the user's) or "default" (bf16)
    weights_source: str = "default"

    @classmethod
    def build(cls, model: ModelSpec, hardware: HardwareSpec, *, engine: Engine = IDEAL,
              precision: Precision | None = None, layout: Layout = Layout(),
              options: Options | None = None,
              calibration: Calibration | None = None,
              weights_source: str = "default") -> Deployment:
        """Check the layout against the model and prepare the engine for the precision
        (a ``UsageError`` when the GPU cannot run it)."""
        o = options or Options()
        layout.check(model)
        check_runs_on(model, hardware)
        prep = prepare(hardware, precision or Precision(), calibration, o, engine)
        check_offload(model, hardware, prep, layout, o)
        return cls(model, hardware, prep, layout, o, calibration, weights_source)

    @property
    def engine(self) -> Engine:
        return self.prepared.engine

    @property
    def precision(self) -> Precision:
        """The precision as it runs (the engine's byte accounting applied)."""
        return self.prepared.precision

    @property
    def tp(self) -> int:
        return self.layout.tp

    def for_speculation(self, method: str | None) -> Deployment:
        """The same deployment as its engine serves with speculative decoding by ``method``
        (``Engine.for_speculation``: async scheduling off where the engine turns it off for
        that method; re-prepared then); itself for None (no speculation)."""
        engine = self.engine if method is None else self.engine.for_speculation(method)
        if engine == self.engine:
            return self
        return replace(self, prepared=prepare(self.hardware, self.prepared.precision,
                                              self.calibration, self.options, engine))

    def with_options(self, **changes) -> Deployment:
        """The same deployment under other options (re-prepared: ceilings depend on them)."""
        o = self.options.model_copy(update=changes)
        return replace(self, options=o, prepared=prepare(
            self.hardware, self.prepared.precision, self.calibration, o, self.engine))


def check_offload(model: ModelSpec, hardware: HardwareSpec, prep: Prepared, layout: Layout,
                  o: Options) -> None:
    """Weights kept in host memory (``Options.cpu_offload_bytes``): a tensor-parallel replica
    (pipeline stages and expert parallelism hold other shares, not modelled with it), a GPU
    whose host link hardware_db states, and no more than the decoder layers' weights one GPU
    holds (all vLLM's cpu_offload_gb can move)."""
    from planner.core.memory import offloadable_weight_bytes

    off = o.cpu_offload_bytes
    if not off:
        return
    gib = 2**30
    if layout.pp > 1 or layout.ep > 1:
        raise UsageError("cpu_offload_gb is modelled for tensor-parallel replicas only, not "
                         "with pp or ep above 1", fields=("cpu_offload_gb", "pp", "ep"))
    if hardware.host_link is None:
        raise UsageError(f"cpu_offload_gb: {hardware.name}'s hardware file states no "
                         "host_link (the link weights in host memory cross every step)",
                         fields=("cpu_offload_gb",))
    most = offloadable_weight_bytes(model, prep.precision, tp=layout.tp,
                                    lm_head_sharded=prep.engine.lm_head_sharded)
    if off > most:
        raise UsageError(f"cpu_offload_gb: {off / gib:g} GiB is more than the {most / gib:.2f} "
                         f"GiB of decoder-layer weights each GPU holds ({model.name}, tp "
                         f"{layout.tp}); embeddings and lm_head stay on the GPU",
                         fields=("cpu_offload_gb",))


@dataclass(frozen=True)
class DeploymentEstimate:
    """One replica at a workload: the TP group's estimate (operators, memory, roofline), the
    layout's own figures when it has pipeline stages or expert parallelism, and speculation."""

    deployment: Deployment
    estimate: Estimate
    pipeline: object = None  # planner.layouts.pipeline.Pipeline
    expert: object = None  # planner.layouts.expert.ExpertParallel
    speculation: object = None  # planner.layouts.speculation.SpeculationResult

    @property
    def fits(self) -> bool:
        if self.pipeline is not None:
            return self.pipeline.fits
        if self.expert is not None:
            return self.expert.fits
        return self.estimate.memory.fits

    @property
    def memory_needed_per_gpu_bytes(self) -> float:
        if self.pipeline is not None:
            return self.pipeline.max_memory_per_gpu_bytes
        if self.expert is not None:
            return self.expert.total_bytes
        return self.estimate.memory.total_bytes

    @property
    def layout_section(self) -> str | None:
        """"pipeline" or "expert_parallel" where the replica is more than one TP group, whose
        figures are then the deployment's (the estimate's are one TP group's)."""
        if self.pipeline is not None:
            return "pipeline"
        if self.expert is not None:
            return "expert_parallel"
        return None

    @property
    def baseline(self):
        """The headline figures without speculation (``planner.core.headline.Headline``): the
        layout's where it has pipeline stages or expert parallelism, else the TP group's."""
        e = self.estimate
        if self.pipeline is not None:
            return self.pipeline.headline(e.batch, e.output_tokens, e.price_usd_per_gpu_hour)
        if self.expert is not None:
            return self.expert.headline(e.batch, e.output_tokens, e.price_usd_per_gpu_hour)
        return e.headline

    @property
    def headline(self):
        """The headline figures as served: with speculative decoding when it is asked for
        (its TPOT at the workload's batch; TTFT unchanged), else the estimate's own."""
        if self.speculation is None:
            return self.baseline
        return replace(self.baseline, tpot_s=self.speculation.tpot_s)

    def _layout_memory(self) -> dict:
        capacity = self.deployment.hardware.memory_bytes
        if self.pipeline is not None:
            st = max(self.pipeline.stages, key=lambda s: s.total_bytes / (s.usable_bytes or 1))
            return _per_gpu_memory(st.weights_bytes, st.kv_cache_bytes, st.activation_bytes,
                                   st.total_bytes, st.usable_bytes, capacity)
        x = self.expert
        return _per_gpu_memory(x.weights_bytes, x.kv_cache_bytes,
                               x.total_bytes - x.weights_bytes - x.kv_cache_bytes
                               - self.deployment.options.reserve_bytes,
                               x.total_bytes, x.usable_bytes, capacity)

    def to_dict(self) -> dict:
        """``Estimate.to_dict`` with the layout's and speculation's sections. With
        speculation the headline keys (``tpot_s``, ``latency_s``, throughputs, cost) are the
        speculative figures, ``baseline`` holds them without it, ``speedup`` is baseline TPOT
        / TPOT and ``speculation_break_even_batch`` the first batch where it is slower."""
        e = self.estimate
        d = e.to_dict(operators=True)
        d.update(weights_fields(self.deployment))
        if self.layout_section is not None:
            # the top-level figures are the deployment's; one TP group's stay in tp_group
            d["tp_group"] = {**_headline_keys(e.headline), "ttft_s": e.headline.ttft_s,
                             "fits": e.memory.fits}
            for k in ("mbu", "mfu", "prefill_mfu"):  # one TP group's, not predicted for all
                if k in d:
                    d["tp_group"][k] = d[k]
                    d[k] = None
            # the ideal roofline is one TP group's too (a bound on it, not on the layout: an
            # EP layout's TPOT ran 3.2 times under it), so it moves with that group's figures
            d["tp_group"]["ideal"], d["ideal"] = d.get("ideal"), None
            d.update(_headline_keys(self.baseline))
            d["ttft_s"] = self.baseline.ttft_s
            d["fits"] = self.fits
            d["num_gpus"] = self.deployment.layout.num_gpus
            d["headline"] = self.layout_section
            # memory: one TP group holding the whole model is tp_group's; the top level is
            # the layout's most loaded GPU (its tightest stage, or an expert-parallel GPU)
            mem = ("weights_bytes", "kv_cache_bytes", "activation_bytes", "total_memory_bytes",
                   "usable_memory_bytes", "memory_used_frac", "max_batch", "kv_concurrency")
            d["tp_group"].update({k: d[k] for k in mem if k in d})
            d.update(self._layout_memory())
        if self.speculation is not None:
            s = self.speculation
            d["baseline"] = _headline_keys(self.baseline)
            d.update(_headline_keys(self.headline))
            d["speedup"] = s.speedup
            d["speculation_break_even_batch"] = s.break_even_batch
            d["headline"] = "speculative"
            d["speculative"] = s.as_dict()
        if self.pipeline is not None:
            d["pipeline"] = self.pipeline.as_dict(e.batch, e.output_tokens,
                                                  e.price_usd_per_gpu_hour)
        if self.expert is not None:
            d["expert_parallel"] = self.expert.as_dict(e.batch)
        return d


def _per_gpu_memory(weights, kv, act, total, usable, capacity) -> dict:
    """The top-level memory fields of a layout, from its most loaded GPU's figures; the
    largest batch that fits and the paged concurrency are one TP group's, not the layout's
    (None: not computed for it). ``memory_used_frac`` is of the GPU's capacity, as one TP
    group's is (it was of the usable memory here)."""
    return {"weights_bytes": weights, "kv_cache_bytes": kv, "activation_bytes": act,
            "total_memory_bytes": total, "usable_memory_bytes": usable,
            "memory_used_frac": total / capacity, "max_batch": None, "kv_concurrency": None}


def _headline_keys(h) -> dict:
    keys = ("tpot_s", "latency_s", "throughput_tokens_per_s", "e2e_throughput_tokens_per_s",
            "cost_usd_per_million_output_tokens")
    return {k: v for k, v in h.as_dict().items() if k in keys}


def weights_fields(dep: Deployment) -> dict:
    """JSON fields on where the weights' precision came from: ``weights_source``
    ("checkpoint", "--weights" or "default") and ``checkpoint_quantization``, what the
    model's quantization_config says (null without one), with ``used`` False where
    --weights stood in for it."""
    q = dep.model.quantization
    ck = None
    if q is not None:
        ck = {"file": q.file, "method": q.method, "label": q.label,
              "weights": q.weights.value if q.weights else None, "group_size": q.group_size,
              "scale_bytes": q.scale_bytes, "zero_point_bytes": q.zero_point_bytes,
              "fp8_scale_group": q.fp8_scale_group, "fp8_blocks": q.fp8_blocks,
              "fp8_dynamic_tensor": q.fp8_dynamic_tensor,
              "quantized_layers": q.quantized_layers,
              "lm_head_quantized": q.lm_head_quantized, "notes": list(q.notes),
              "problem": q.problem, "used": dep.weights_source == "checkpoint"}
    p = dep.precision
    return {"weights_source": dep.weights_source, "checkpoint_quantization": ck,
            "weight_group_size": p.group_size if p.weights.value in ("int8", "int4") else None}


def estimate_deployment(dep: Deployment, workload: Workload, *, speculation=None,
                        price_usd_per_gpu_hour: float | None = None,
                        measured_tpot_s: float | None = None,
                        measured_ttft_s: float | None = None) -> DeploymentEstimate:
    """Predict one replica of ``dep`` serving ``workload``. ``speculation`` is a
    ``planner.layouts.speculation.SpeculationConfig`` or None."""
    m, hw, prep, o, lay = dep.model, dep.hardware, dep.prepared, dep.options, dep.layout
    w = workload
    est = estimate_prepared(m, hw, prep, o, tp=lay.tp, workload=w, calibration=dep.calibration,
                            price_usd_per_gpu_hour=price_usd_per_gpu_hour,
                            measured_tpot_s=measured_tpot_s, measured_ttft_s=measured_ttft_s)
    sizes = {"batch": w.batch, "prompt_tokens": w.prompt_tokens,
             "output_tokens": w.output_tokens}
    expert = pipe = spec = None
    if lay.ep > 1:
        from planner.layouts.expert import expert_parallel

        expert = expert_parallel(m, hw, prep, o, ep=lay.ep, tp=lay.tp, **sizes)
    if lay.pp > 1:
        from planner.layouts.pipeline import pipeline

        pipe = pipeline(m, hw, prep, o, tp=lay.tp, pp=lay.pp, **sizes)
    if speculation is not None:
        from planner.layouts.speculation import speculate

        if lay.pp > 1 or lay.ep > 1:
            raise UsageError("speculative is modelled on a tensor-parallel replica only (pp 1, "
                             "ep 1)", fields=("speculative", "pp", "ep"))

        spec = speculate(m, hw, prep, o, tp=lay.tp, cfg=speculation, **sizes)
    return DeploymentEstimate(dep, est, pipe, expert, spec)
