"""Speculative decoding: what a draft buys per decode step, and at which batch it stops paying.

Each step a drafter proposes k tokens per sequence; the target model verifies them in one
forward pass over k + 1 tokens per sequence (logits for every position) and keeps the
accepted prefix plus one token of its own. With each proposal accepted independently with
probability a, the tokens a step yields per sequence are (Leviathan, Kalman and Matias, "Fast
Inference from Transformers via Speculative Decoding", ICML 2023, eq. 1)

    E = (1 - a^(k+1)) / (1 - a)          (k + 1 when a = 1)

The step costs the verification plus the drafting: k passes of a draft model at the same batch
and context (``draft-model``: the first over the k + 1 tokens just verified, as vLLM V1 and
SGLang run it, then k - 1 of one token), k such passes of one extra decoder layer and the
lm_head of the target (``mtp``, DeepSeek-V3's multi-token prediction module, whose weights and one
layer's KV cache it holds too; ``eagle`` and ``eagle3``, whose drafting head is one decoder
layer fed the target's hidden states, costed the same way), or nothing on the GPU (``ngram``:
prompt lookup on the host).
So TPOT = (t_verify + t_draft) / E. At batch 1 a decode step is bound by reading the weights
and verifying k + 1 tokens costs little more than one, so speculation pays; as the batch grows
toward the compute bound the verification costs k + 1 times a step's FLOPs and speculation
loses. ``break_even_batch`` is the first batch (doubling from 1, then bisecting, within what
fits and the engine's max_num_seqs) where it does.

Published acceptance is mostly reported as an acceptance length tau, the mean tokens a verify
step yields per sequence at the k the authors drafted; ``acceptance_for_length`` inverts E(a, k)
= tau for the per-token rate a this model takes (``published_acceptance`` picks the entry of
planner/data/speculation.yaml for a method and model). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from planner.core.errors import UsageError
from planner.core.estimate import Prepared
from planner.core.memory import kv_cache_bytes, memory_plan, weight_bytes, weight_bytes_breakdown
from planner.core.ops import StepShape, decode_ops, shape_ops
from planner.core.roofline import step_time
from planner.core.specs import HardwareSpec, ModelSpec, Options

Method = Literal["draft-model", "mtp", "ngram", "eagle", "eagle3"]
METHODS = ("draft-model", "mtp", "ngram", "eagle", "eagle3")
# methods whose drafter is one decoder layer of the target's shape run k times
ONE_LAYER_DRAFTERS = ("mtp", "eagle", "eagle3")
# DeepSeek-V3 technical report (arXiv 2412.19437), section 5.4.3: "the acceptance rate of the
# second token prediction ranges between 85% and 90%"; the lower end is the default for mtp.
MTP_ACCEPTANCE = 0.85
MTP_TOKENS = 1  # DeepSeek-V3 ships one MTP module (num_nextn_predict_layers: 1)


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens per verification step per sequence: (1 - a^(k+1)) / (1 - a)."""
    if not 0 <= acceptance <= 1:
        raise UsageError(f"acceptance rate must be in [0, 1], got {acceptance:g}")
    if acceptance == 1:
        return k + 1.0
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)


def acceptance_for_length(tau: float, k: int) -> float:
    """The per-token acceptance a with (1 - a^(k+1)) / (1 - a) = tau: a published acceptance
    length tau (mean tokens per verify step, the bonus token included) at k drafted tokens, as
    the rate this model takes. E rises from 1 (a = 0) to k + 1 (a = 1), so bisection."""
    if not 1 <= tau <= k + 1:
        raise UsageError(f"acceptance length must be in [1, k + 1] = [1, {k + 1}], got {tau:g}")
    if tau in (1, k + 1):
        return float(tau > 1)
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class PublishedAcceptance:
    """One entry of planner/data/speculation.yaml: a method's published acceptance on a model
    family (``models``: name prefixes, ``architectures``: config.json model types), as an
    acceptance ``length`` at ``k`` or a per-token ``rate``, with its source."""

    method: str
    source: str  # the citation, as printed: paper, table, URL
    retrieved: str
    k: int
    length: float | None = None
    rate: float | None = None
    estimated: bool = False
    models: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    drafts: tuple[str, ...] = ()  # draft-model: the drafts (name prefixes) it was measured with
    note: str = ""

    @property
    def acceptance(self) -> float:
        return self.rate if self.rate is not None else acceptance_for_length(self.length, self.k)

    def covers(self, m: ModelSpec, draft: ModelSpec | None = None) -> bool:
        if self.drafts and (draft is None or not _named(draft, self.drafts)):
            return False
        return m.architecture in self.architectures or _named(m, self.models)

    @property
    def text(self) -> str:
        """How the output names it: the source, what was converted, and whether judged."""
        how = (f"rate {self.rate:g}" if self.rate is not None else
               f"acceptance length {self.length:g} at k = {self.k}")
        return f"{how}: {self.source}" + (" (estimated)" if self.estimated else "")


def _named(m: ModelSpec, prefixes: tuple[str, ...]) -> bool:
    return any(m.name.lower().startswith(p) for p in prefixes)


def published_acceptance(table, m: ModelSpec, method: str,
                         draft: ModelSpec | None = None) -> PublishedAcceptance | None:
    """The first entry of ``table`` for ``method`` that covers ``m`` (and ``draft``); None if
    none does."""
    return next((e for e in table if e.method == method and e.covers(m, draft)), None)


@dataclass(frozen=True)
class SpeculationConfig:
    method: Method
    k: int
    acceptance: float
    draft: ModelSpec | None = None  # draft-model only
    acceptance_source: str = "--acceptance-rate"  # where the rate came from, as printed

    def __post_init__(self):
        if not 1 <= self.k <= 64:
            raise UsageError(f"num_speculative_tokens must be in 1..64, got {self.k}",
                             fields=("num_speculative_tokens",))
        expected_tokens(self.acceptance, self.k)
        if (self.method == "draft-model") != (self.draft is not None):
            raise UsageError("draft_model is needed with speculative draft-model, and only "
                             "then", fields=("draft_model", "speculative"))


@dataclass(frozen=True)
class SpeculationPoint:
    batch: int
    baseline_tpot_s: float
    tpot_s: float

    @property
    def speedup(self) -> float:
        return self.baseline_tpot_s / self.tpot_s


@dataclass(frozen=True)
class SpeculationResult:
    """Speculation at the workload's batch; ``by_batch`` the doubling sweep and
    ``break_even_batch`` the first batch, within ``batch_limit`` (what fits and the engine's
    max_num_seqs), where it is slower than decoding without it."""

    config: SpeculationConfig
    tokens_per_step: float
    verify_s: float
    draft_s: float
    baseline_tpot_s: float
    batch: int
    extra_weights_bytes: float  # the drafter's weights, per GPU
    extra_kv_cache_bytes: float  # the drafter's KV cache for the batch, per GPU
    fits: bool
    by_batch: tuple[SpeculationPoint, ...]
    break_even_batch: int | None  # first batch where speculation is slower; None: never
    batch_limit: int = 0  # the largest batch searched

    @property
    def step_s(self) -> float:
        return self.verify_s + self.draft_s

    @property
    def tpot_s(self) -> float:
        return self.step_s / self.tokens_per_step

    @property
    def speedup(self) -> float:
        return self.baseline_tpot_s / self.tpot_s

    @property
    def throughput_tokens_per_s(self) -> float:
        return self.batch / self.tpot_s

    def as_dict(self) -> dict:
        c = self.config
        return {
            "method": c.method, "num_speculative_tokens": c.k, "acceptance_rate": c.acceptance,
            "acceptance_source": c.acceptance_source,
            "draft_model": c.draft.name if c.draft else None,
            "tokens_per_step": self.tokens_per_step, "verify_s": self.verify_s,
            "draft_s": self.draft_s, "tpot_s": self.tpot_s,
            "baseline_tpot_s": self.baseline_tpot_s, "speedup": self.speedup,
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "extra_weights_bytes": self.extra_weights_bytes,
            "extra_kv_cache_bytes": self.extra_kv_cache_bytes, "fits": self.fits,
            "break_even_batch": self.break_even_batch, "break_even_search_max_batch":
            self.batch_limit,
            "by_batch": [{"batch": p.batch, "baseline_tpot_s": p.baseline_tpot_s,
                          "tpot_s": p.tpot_s, "speedup": p.speedup} for p in self.by_batch],
        }


def mtp_layer(m: ModelSpec) -> ModelSpec:
    """The MTP module as a one-layer model of the target's shape (its last layer's kind)."""
    upd: dict = {"num_layers": 1, "name": f"{m.name}-mtp", "vision_params": 0,
                 "vision_replicated_params": 0}
    if m.moe is not None:
        upd["moe"] = m.moe.model_copy(update={"first_dense_layers": 0, "layer_step": 1})
    if m.sliding_window_pattern:
        upd["sliding_window_pattern"] = m.sliding_window_pattern[-1:]
    return m.model_copy(update=upd)


def _step(m: ModelSpec, prep: Prepared, o: Options, tp: int, shape: StepShape,
          fixed_s: float, e=None) -> float:
    e = e or prep.engine
    ops = shape_ops(m, prep.precision, shape, tp=tp, attention=o.attention,
                    lm_head_sharded=e.lm_head_sharded)
    return step_time(ops, prep.ceilings, tp=tp, options=o, engine=e, graphed=e.cuda_graphs,
                     fixed_s=fixed_s, serial_s=e.worker_s(tp), stream=True).time_s


def _costs(m: ModelSpec, prep: Prepared, o: Options, tp: int, cfg: SpeculationConfig, batch: int,
           ctx: float) -> tuple[float, float, float]:
    """(baseline TPOT, verification step, drafting) in seconds at ``batch`` and ``ctx``; the
    speculative steps under the engine as it runs with ``cfg``'s method (async scheduling
    off where the engine turns it off for it: ``Engine.for_speculation``)."""
    e = prep.engine
    fixed = e.step_overhead_s + e.per_sequence_overhead_s * batch
    base = _step(m, prep, o, tp, StepShape.uniform(batch, 1, ctx - 1, m.attention_window), fixed)
    e = e.for_speculation(cfg.method)
    k = cfg.k
    # k + 1 new tokens per sequence after ctx - 1 cached, every position's logits sampled
    verify = _step(m, prep, o, tp, replace(StepShape.uniform(batch, k + 1, ctx - 1,
                                                             m.attention_window, prefill=False),
                                           logit_rows=batch * (k + 1)), fixed, e)
    if cfg.method == "ngram":
        draft = 0.0
    else:
        # the first pass over the k + 1 tokens just verified (a row of logits a sequence:
        # ``uniform``'s), then k - 1 of one token
        # (``planner.serving.decoding.SpecDecodePool.draft_s``)
        d = drafter(m, cfg)
        first = shape_ops(d, prep.precision,
                          StepShape.uniform(batch, k + 1, ctx - 1, d.attention_window,
                                            prefill=False),
                          tp=tp, attention=o.attention, lm_head_sharded=e.lm_head_sharded)
        draft = step_time(first, prep.ceilings, tp=tp, options=o, engine=e,
                          graphed=e.cuda_graphs, stream=True).time_s
        if k > 1:
            one = step_time(decode_ops(d, prep.precision, batch=batch, context_tokens=ctx,
                                       tp=tp, attention=o.attention,
                                       lm_head_sharded=e.lm_head_sharded),
                            prep.ceilings, tp=tp, options=o, engine=e, graphed=e.cuda_graphs,
                            stream=True)
            draft += (k - 1) * one.time_s
    return base, verify, draft


def drafter(m: ModelSpec, cfg: SpeculationConfig) -> ModelSpec | None:
    """The model that drafts: the draft model, one decoder layer of the target's shape (MTP,
    EAGLE heads), or None (n-gram lookup runs on the host)."""
    if cfg.method == "draft-model":
        return cfg.draft
    return mtp_layer(m) if cfg.method in ONE_LAYER_DRAFTERS else None


# Architectures whose checkpoints ship multi-token-prediction layers (DeepSeek-V3 and R1:
# num_nextn_predict_layers 1 in their config.json)
MTP_ARCHITECTURES = ("deepseek_v3",)


def has_mtp(m: ModelSpec) -> bool:
    """Whether the checkpoint ships a multi-token-prediction layer: as its config.json says
    (``ModelSpec.mtp_layers``: Kimi-K2, a DeepSeek-V3 architecture, ships none), else as its
    architecture's do."""
    if m.mtp_layers is not None:
        return m.mtp_layers > 0
    return m.architecture in MTP_ARCHITECTURES


def check_method(m: ModelSpec, method: str) -> None:
    """MTP needs a model that ships the layer."""
    if method == "mtp" and not has_mtp(m):
        raise UsageError(f"speculative mtp: {m.name} ships no multi-token-prediction layer "
                         "that llmplan knows of (its config.json's num_nextn_predict_layers, "
                         f"or a built-in {', '.join(MTP_ARCHITECTURES)} model's); use "
                         "draft-model, eagle3 or ngram", fields=("speculative",))


def check_tokenizer(m: ModelSpec, draft: ModelSpec) -> None:
    """A draft must share the target's tokenizer (its vocabulary, as far as a spec tells)."""
    if draft.vocab_size != m.vocab_size:
        raise UsageError(f"draft model {draft.name} has a vocabulary of "
                         f"{draft.vocab_size:,} tokens, {m.name} of {m.vocab_size:,}: "
                         "a draft must share the target's tokenizer")


def check_draft(m: ModelSpec, cfg: SpeculationConfig, tp: int) -> None:
    """MTP needs a model that ships the layer; a draft model must share the target's
    tokenizer and split over the same TP."""
    check_method(m, cfg.method)
    if cfg.draft is None:
        return
    check_tokenizer(m, cfg.draft)
    if cfg.draft.num_attention_heads % tp or (cfg.draft.num_kv_heads % tp
                                              and tp % cfg.draft.num_kv_heads):
        raise UsageError(f"draft model {cfg.draft.name} cannot be split over --tp {tp}")


def extra_weight_bytes(m: ModelSpec, prep: Prepared, tp: int, cfg: SpeculationConfig) -> float:
    """The drafter's weights per GPU (the MTP layer shares the target's embedding and head)."""
    return _extra_memory(m, prep, tp, cfg, 0, 1)[0]


def _extra_memory(m: ModelSpec, prep: Prepared, tp: int, cfg: SpeculationConfig, batch: int,
                  seq_len: int) -> tuple[float, float]:
    p, sharded = prep.precision, prep.engine.lm_head_sharded
    if cfg.method == "ngram":
        return 0.0, 0.0
    if cfg.method == "draft-model":
        d = cfg.draft
        return (weight_bytes(d, p, tp=tp, lm_head_sharded=sharded),
                kv_cache_bytes(d, p, batch=batch, seq_len=seq_len, tp=tp))
    layer = mtp_layer(m)  # shares the target's embedding and lm_head (EAGLE: assumed so too)
    parts = weight_bytes_breakdown(layer, p, tp=tp, lm_head_sharded=sharded)
    own = sum(v for k, v in parts.items() if k not in ("embed/tokens", "lm_head"))
    return own, kv_cache_bytes(layer, p, batch=batch, seq_len=seq_len, tp=tp)


def speculation_tpot(m: ModelSpec, prep: Prepared, o: Options, *, tp: int,
                     cfg: SpeculationConfig, batch: int, ctx: float) -> SpeculationPoint:
    """TPOT without and with speculation at ``batch`` sequences of ``ctx`` tokens."""
    base, verify, draft = _costs(m, prep, o, tp, cfg, batch, ctx)
    return SpeculationPoint(batch, base, (verify + draft) / expected_tokens(cfg.acceptance,
                                                                            cfg.k))


def break_even(m: ModelSpec, prep: Prepared, o: Options, *, tp: int, cfg: SpeculationConfig,
               ctx: float, limit: int) -> tuple[tuple[SpeculationPoint, ...], int | None]:
    """The doubling sweep 1, 2, 4, ... up to ``limit`` and the first batch where speculation
    is slower: doubling brackets it, bisection between the last batch that gains and the
    first that loses finds it (speedup falls with the batch as the verify step turns
    compute-bound). None when it gains at every batch up to ``limit``."""
    def at(b: int) -> SpeculationPoint:
        return speculation_tpot(m, prep, o, tp=tp, cfg=cfg, batch=b, ctx=ctx)

    points, b, lo, hi = [], 1, 0, None  # lo: the largest batch seen to gain
    while hi is None and b <= limit:
        points.append(at(b))
        lo, hi = (lo, b) if points[-1].speedup < 1 else (b, None)
        b *= 2
    if hi is None and lo < limit:  # the limit itself, between the last doubling and twice it
        points.append(at(limit))
        lo, hi = (lo, limit) if points[-1].speedup < 1 else (limit, None)
    if hi is None:
        return tuple(points), None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if at(mid).speedup < 1:
            hi = mid
        else:
            lo = mid
    return tuple(points), hi


def speculate(m: ModelSpec, hw: HardwareSpec, prep: Prepared, o: Options, *, tp: int,
              batch: int, prompt_tokens: int, output_tokens: int,
              cfg: SpeculationConfig) -> SpeculationResult:
    """Speculative decoding of this deployment, and the batch where it stops paying."""
    check_draft(m, cfg, tp)
    ctx = prompt_tokens + output_tokens / 2
    seq = prompt_tokens + output_tokens
    e_tok = expected_tokens(cfg.acceptance, cfg.k)
    base, verify, draft = _costs(m, prep, o, tp, cfg, batch, ctx)
    w, kv = _extra_memory(m, prep, tp, cfg, batch, seq)
    mem = memory_plan(m, hw, prep.precision, batch=batch, prompt_tokens=prompt_tokens,
                      output_tokens=output_tokens, tp=tp, options=o,
                      lm_head_sharded=prep.engine.lm_head_sharded, engine=prep.engine)
    fits = mem.total_bytes + w + kv <= mem.usable_bytes
    limit = max(1, min(mem.max_batch, prep.engine.max_num_seqs))
    points, breakeven = break_even(m, prep, o, tp=tp, cfg=cfg, ctx=ctx, limit=limit)
    return SpeculationResult(cfg, e_tok, verify, draft, base, batch, w, kv, fits, points,
                             breakeven, limit)
