"""Engine profiles: what a serving engine adds to, and takes away from, the ideal roofline.

The ideal roofline (``ideal``: datasheet peaks, no overheads) is a bound no engine reaches. A
real engine runs each operator at a fraction of the GPU's *achievable* ceilings (a published
copy benchmark and a published GEMM benchmark of that GPU, see hardware_db), pays a fixed cost
per kernel it launches, and a fixed CPU cost per step (scheduling, sampling, detokenizing) that
its overlap scheduler does not hide. An engine profile (engines_db/NAME.yaml) states those
numbers, each with its source:

    t_c, t_m = F' / (R x e_c), B / (W x e_b)
    t_op   = max(t_c, t_m) + (1 - o) x min(t_c, t_m) + k x t_kernel + t_fixed  (per instance)
    t_op   = max(t_op, k x t_host)          when the operator is not replayed from a CUDA graph
    t_step = sum of t_op + t_step_fixed + batch x t_sequence
    t_step = max(sum of t_op, sum of k x t_host + t_step_fixed + batch x t_sequence)
             with async scheduling, for a step that follows another (t_host where eager)

where F is the operator's FLOPs, F' = F x ceil(M / m_tile) x m_tile / M its FLOPs padded to
the GEMM tile height (tile quantization: a decode GEMM of M = batch rows costs a whole tile of
rows; NVIDIA, "Matrix Multiplication Background User's Guide", "Tile quantization"; a W8A8
fp8 GEMM on an architecture the profile's ``fp8_gemm_row_tiles`` names takes the height of the
configuration its kernel dispatches for M, up to 256 rows), B its
bytes, R and W the achievable matmul rate of its precision and the achievable bandwidth, e_c and
e_b the engine's efficiencies for the operator's kind (GEMM, weight-only int8 / int4, fp8,
attention, element-wise; a matmul's e_c, plain or quantized, times the share s of it that the
release line's served steps attain, 1 unless a profile fitted on served runs says otherwise;
a routed expert's, 16-bit or fp8, times its fused MoE kernel's factor for the GPU's
architecture and K / (K + K_half) for the depth K its GEMM sums over, ``experts_k_half``),
o the fraction of the shorter of the two times hidden under the
longer (1: the roofline's perfect overlap; 0: the background notes' additive form; real kernels
lose most near the ridge point, where the two are equal), k the kernels it launches and
t_kernel the device-side cost of each (launch latency, ramp-up and tail), t_fixed device time
the profile adds to that operator by name (``operator_fixed_us``: a measured block's time its
operators do not account for), t_host the host's cost to launch a kernel eagerly. An
all-reduce of S bytes over N GPUs costs t_lat + 2 (N - 1) / N x S / (link x e_link).

Byte accounting differs between engines too: whether the lm_head is split across TP ranks
(vLLM's ParallelLMHead) or replicated (gpt-fast's TP leaves the output layer whole), whether it
is quantized with the rest (gpt-fast's int8 / int4 handlers replace every nn.Linear), and how
many bytes a quantization group's zero point adds to its scale.

Pure: the YAML is read by ``planner.io.catalog``; this module only validates and resolves.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from typing import Annotated, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from planner.core.arith import no_bool_numbers
from planner.core.errors import UsageError
from planner.core.specs import DType, check_architecture


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    _no_bools = field_validator("*", mode="before")(no_bool_numbers)


class _Sourced(_Frozen):
    """A number with where it came from. ``estimated``: a documented judgement, not a
    measurement; ``fitted_on``: dataset row ids (``source:row``) it was fitted to."""

    source: str = Field(min_length=1)
    date: str | None = None
    estimated: bool = False
    fitted_on: tuple[str, ...] = ()
    note: str | None = None


class Num(_Sourced):
    value: float = Field(ge=0, le=10_000_000, allow_inf_nan=False)


class NumSince(Num):
    """A default that holds from the release ``since`` on, ``before`` in the releases before
    it (vLLM's KV block size: 64 tokens from 0.34, 16 before); without ``since``, every
    release's."""

    since: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    before: float | None = Field(None, ge=0, le=10_000_000, allow_inf_nan=False)

    @model_validator(mode="after")
    def _pair(self) -> NumSince:
        if (self.since is None) != (self.before is None):
            raise ValueError("give since and before together (the value before that release)")
        return self


class ReleaseCost(Num):
    """A cost only the releases from ``since`` up to (not including) ``until`` pay: a
    regression one release brought and a later one removed (vLLM 0.11.0 parses the chat
    template anew for every request; 0.11.1 caches it). A profile at a named release
    (``EngineSpec.at_version``: a served run's version, ``--engine vllm@0.11.0``) keeps it,
    its span cleared (``resolved``), where that release is in the span, and drops it where
    not; the first release named decides, as for the profile's other release-bound defaults
    (a second ``at_version`` leaves it as the first left it). With a span, a profile at no
    named release pays none, whatever releases its line covers; stated without one, the cost
    is every release's. Releases compare padded with zeros (0.11 is 0.11.0, the line's first
    release); a pre- or post-release is read as its release (``release_number``)."""

    since: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    until: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")

    @model_validator(mode="after")
    def _span(self) -> ReleaseCost:
        if self.since is not None and self.until is not None and \
                version_key(self.until) <= version_key(self.since):
            raise ValueError(f"until ({self.until}) must come after since ({self.since})")
        return self

    @property
    def resolved(self) -> bool:
        """Every release pays it: no span left to test (``at_version`` cleared it)."""
        return self.since is None and self.until is None

    def at(self, version: str) -> ReleaseCost | None:
        """As the release ``version`` has it: the cost, its span cleared, where the span holds
        that release; None where not."""
        v = version_key(version)  # padded: 0.11 is 0.11.0
        if (self.since is not None and v < version_key(self.since)) or \
                (self.until is not None and v >= version_key(self.until)):
            return None
        note = (f"release {version} pays it" + (f": {self.note}" if self.note else ""))
        return self.model_copy(update={"since": None, "until": None, "note": note})


class Frac(_Sourced):
    value: float = Field(gt=0, le=1, allow_inf_nan=False)


class Flag(_Sourced):
    value: bool


class FlagSince(Flag):
    """A default that holds from the release ``since`` on; the releases before it had the
    opposite (vLLM's multi_step_stream_outputs: on from 0.6.3, off before)."""

    since: str = Field(pattern=r"^[0-9]+(\.[0-9]+)*$")


class Fp8Kernels(Num):
    """Kernels of the profile's plain cost beside each W8A8 fp8 GEMM (``value``: one weight
    scale per tensor, and per channel, not told apart), its input's quantization or the
    GEMM's own fixed cost counted in kernels. ``block``: beside a block-scaled one (128 x 128
    weight scales: DeepSeek's and Qwen's -FP8 checkpoints), where its path differs (None:
    ``value``). ``dense_only``: the routed experts' fused MoE kernel quantizes inside itself
    and pays none. ``since``: none before that release (TensorRT-LLM's PyTorch backend, the
    default from 1.0). ``input_reads``: how often the quantization reads each 16-bit input
    element from memory before writing its fp8 copy, a pass of its own before the GEMM (1: a
    static scale, or a scale per token or per block of 128 found in the same pass; 0: not
    stated, the pass is left out); ``dynamic_tensor_reads``: the same where one scale for
    the whole input is found at run time, a maximum over the tensor first (a dynamic
    per-tensor scheme; vLLM's --quantization fp8 over a 16-bit checkpoint; None:
    ``input_reads``)."""

    block: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    dense_only: bool = False
    input_reads: float = Field(0.0, ge=0, le=4, allow_inf_nan=False)
    dynamic_tensor_reads: float | None = Field(None, ge=0, le=4, allow_inf_nan=False)
    since: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")

    @property
    def block_value(self) -> float:
        """The kernels beside a block-scaled fp8 GEMM: ``block``, else ``value``."""
        return self.value if self.block is None else self.block


class _ByArchitecture(_Sourced):
    """A figure by GPU architecture (a hardware file's ``architecture``: ampere, hopper, ...),
    ``value`` typed by each subclass."""

    @field_validator("value", check_fields=False)
    @classmethod
    def _known_architectures(cls, v: dict) -> dict:
        # for_gpu looks the GPU's architecture up by name: "Ampere" or "hoper" would never apply
        for k in sorted(v):
            check_architecture(k)
        return v

    def pairs(self, scale: float = 1.0) -> tuple[tuple[str, float], ...]:
        """(architecture, value x ``scale``), ... sorted: the form ``Engine`` holds."""
        return tuple(sorted((k, v * scale) for k, v in self.value.items()))


class ArchFracs(_ByArchitecture):
    """A factor by GPU architecture; an architecture not named keeps 1."""

    value: dict[str, Annotated[float, Field(gt=0, le=2, allow_inf_nan=False)]] = Field(
        min_length=1)


class ArchRates(_ByArchitecture):
    """A rate in GB/s by GPU architecture; an architecture not named has none."""

    value: dict[str, Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]] = Field(
        min_length=1)


class ArchDepths(_ByArchitecture):
    """A GEMM depth (K, in elements) by GPU architecture; an architecture not named has none."""

    value: dict[str, Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)]] = Field(
        min_length=1)


class ArchHeads(_ByArchitecture):
    """A count of attention heads by GPU architecture; an architecture not named has none."""

    value: dict[str, Annotated[int, Field(gt=0, le=4096)]] = Field(min_length=1)


class ArchMicros(_ByArchitecture):
    """A device time in microseconds by GPU architecture; an architecture not named has none."""

    value: dict[str, Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)]] = Field(
        min_length=1)


class RowTiles(_ByArchitecture):
    """How a GEMM kernel's rows are computed, by GPU architecture: for each bound on M (the
    activation rows) up to which one kernel configuration is dispatched, the rows it computes
    at a time (its tile's rows times its thread-block cluster's along M); the last bound is
    None (every larger M). A GEMM of M rows computes the whole tiles of the first bound M is
    within. An architecture not named: the engine's plain tile height (``gemm_tile_m``)."""

    value: dict[str, tuple[tuple[Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None,
                                 Annotated[StrictInt, Field(ge=1, le=4096)]], ...]] = Field(
        min_length=1)  # strict: "16" or true is not a row count

    @field_validator("value")
    @classmethod
    def _bounds(cls, v: dict) -> dict:
        for arch, tiles in v.items():
            if not tiles:
                raise ValueError(f"{arch}: no tiles")
            bounds = [b for b, _ in tiles]
            if bounds[-1] is not None or None in bounds[:-1]:
                raise ValueError(f"{arch}: only the last bound is None (every larger M), "
                                 "and it must be")
            if any(a >= b for a, b in zip(bounds[:-2], bounds[1:-1], strict=True)):
                raise ValueError(f"{arch}: the bounds on M must increase")
        return v

    def pairs(self, scale: float = 1.0) -> tuple[tuple[str, tuple], ...]:
        """(architecture, ((bound or inf, rows), ...)), ... sorted: the form ``Engine``
        holds (``scale`` unused: rows are counts)."""
        inf = float("inf")
        return tuple(sorted((k, tuple((inf if b is None else float(b), float(r))
                                      for b, r in t)) for k, t in self.value.items()))


class Kernels(_Sourced):
    """Kernels launched per operator instance, by operator name (``qkv_proj``) or kind
    (``norm``, ``matmul``, ``attention``, ``elementwise``, ``allreduce``); 1 where unnamed."""

    value: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Kernels:
        for k, v in self.value.items():
            if not 0 <= v <= 10_000:
                raise ValueError(f"kernels.{k} must be a number in 0..10000, got {v}")
        return self


class OperatorFixed(_Sourced):
    """Device time per operator instance beyond its kernels' own fixed cost, in microseconds,
    by operator name: what a measured block of kernels takes that its operators' rooflines and
    kernel costs do not account for. Device work: a CUDA graph does not remove it, and it adds
    no launches to an eager step."""

    value: dict[str, float] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> OperatorFixed:
        for k, v in self.value.items():
            if not 0 <= v <= 100_000:
                raise ValueError(f"operator_fixed_us.{k} must be a number in 0..100000, "
                                 f"got {v}")
        return self


class Versions(_Frozen):
    """The releases of an engine a profile covers: ``from_`` (inclusive) up to ``until``
    (exclusive; None: every later release), dotted numbers such as ``0.8`` or ``0.10.1``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    family: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9._-]*$")  # vllm, sglang, ...
    from_: str = Field(alias="from", pattern=r"^[0-9]+(\.[0-9]+)*$")
    until: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    source: str = Field(min_length=1)  # where the boundary comes from (a release note)
    note: str | None = None

    @model_validator(mode="after")
    def _order(self) -> Versions:
        if self.until is not None and version_key(self.until) <= version_key(self.from_):
            raise ValueError(f"versions: until {self.until} must come after from {self.from_}")
        return self

    def covers(self, version: str) -> bool:
        v = version_key(version)
        return version_key(self.from_) <= v and (self.until is None
                                                 or v < version_key(self.until))


# how each engine family's releases are named in free text ("vLLM 0.8.2", "TensorRT-LLM 1.0")
_FAMILY_NAMES = {"vllm": ("vllm",), "sglang": ("sglang",),
                 "trtllm": ("tensorrt-llm", "tensorrt_llm", "trtllm", "trt-llm")}


def release_in(text: str | None, family: str) -> str | None:
    """The first release of ``family`` that ``text`` names ("vLLM 0.8.2 (...) and 0.8.4" ->
    "0.8.2"), digits and dots only; None where it names none."""
    import re

    if not text:
        return None
    names = "|".join(re.escape(n) for n in _FAMILY_NAMES.get(family, (family,)))
    m = re.search(rf"(?:{names})[^0-9]{{0,12}}?v?([0-9]+(?:\.[0-9]+)+)", text, re.IGNORECASE)
    return m.group(1) if m else None


def release_number(text: str) -> str:
    """A release as engines publish its name, read as the release it is a build of: a leading
    ``v`` and a pre-, post- or development-release suffix dropped ("v0.8.2" -> "0.8.2",
    "0.5.3.post3" -> "0.5.3", "1.2.0rc1" -> "1.2.0", "0.11.0rc2" -> "0.11.0"); a ValueError for
    anything else, as ``version_key`` gives."""
    import re

    m = re.fullmatch(r"\s*v?([0-9]+(?:\.[0-9]+)*)(?:[.-]?(?:post|rc|a|b|dev)[0-9]*)*\s*",
                     text, re.IGNORECASE)
    if m is None:
        raise ValueError(f"not a release number: {text!r} (expected digits and dots, such as "
                         "0.8, 0.10.1 or 1.2.0rc1)")
    return m.group(1)


def version_key(version: str) -> tuple[int, ...]:
    """``0.10.1`` -> (0, 10, 1, 0): release numbers compared as numbers, not as text, padded
    with zeros to four parts, so that a line is its first release (0.11 is 0.11.0) wherever
    two are compared."""
    parts = version.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a release number: {version!r} (expected digits and dots, "
                         "such as 0.8 or 0.10.1)")
    return tuple(int(p) for p in parts) + (0,) * (4 - len(parts))


class QuantPath(_Frozen):
    """Efficiency of one quantized GEMM path, relative to the GPU's achievable ceilings (the
    16-bit matmul rate for weight-only paths, whose tensor cores run in 16-bit)."""

    bandwidth_frac: Frac
    compute_frac: Frac


class Policy(_Sourced):
    """How the scheduler reserves KV cache for a request (TensorRT-LLM's names):
    ``max-utilization`` allocates blocks as tokens arrive and preempts when they run out
    (vLLM, SGLang); ``guaranteed-no-evict`` admits a request only when its prompt and its
    whole output fit beside what the running requests will still need, and never preempts
    (TensorRT-LLM's default capacity scheduler)."""

    value: Literal["max-utilization", "guaranteed-no-evict"]


class BatchWait(_Sourced):
    """TensorRT-LLM's batch waiting (its PyTorch executor: ``PyExecutor._waiting_requests``):
    with ``timeout_iters`` and ``max_tokens_ratio`` both above 0 a step that would run
    context requests beside generation ones holds them back, running the generation alone,
    until their prompts and the generation tokens reach that share of max_num_tokens or it
    has held them that many steps (``SchedulerConfig.batch_wait_iters``). The profile states
    the engine's defaults (0: off)."""

    timeout_iters: int = Field(ge=0, le=1_000_000)
    max_tokens_ratio: float = Field(ge=0, le=1)


class ReserveRule(NamedTuple):
    """``DecodeReserve`` as the scheduler applies it."""

    init_ratio: float  # the ratio a server starts (and, idle, starts over) from
    min_ratio: float  # the least it falls to
    ratio_fall_per_step: float  # its fall with each decode step
    clip_tokens: int  # a request's output counts up to this many tokens
    retract_steps: int  # steps a retraction adds to each decoder's progress
    fewest_outputs_first: bool = False  # the victim: fewest outputs, longest prompt; else newest


class DecodeReserve(_Frozen):
    """Admission that holds KV back for the running requests' future tokens (SGLang's
    ``PrefillAdder``): a waiting request is admitted only if its uncached prompt and
    min(its output, ``clip_tokens``) fit in the free and evictable KV less what the running
    requests may still write, min(their remaining output, ``clip_tokens``) x a ratio, and
    less what the requests admitted before it in the same step asked for. The ratio starts at
    ``init_ratio``, falls by (init - init x ``min_ratio_factor``) / ``decay_steps`` with every
    decode step to init x ``min_ratio_factor``, returns to ``init_ratio`` when the server
    idles, and after a retraction (a preemption to make room for decodes) is set to
    min(1, (tokens decoded + ``retract_steps`` x requests decoding) / their outputs).
    ``retract_order``: which decoding request a retraction takes first, the newest running
    one, or (``fewest_outputs``) the one with the fewest output tokens, the longest prompt
    among those (SGLang's ``ScheduleBatch.retract_decode``)."""

    init_ratio: float = Field(gt=0, le=1)
    min_ratio_factor: float = Field(gt=0, le=1)
    decay_steps: float = Field(gt=0, le=1_000_000)
    clip_tokens: int = Field(ge=1, le=100_000_000)
    retract_steps: int = Field(ge=0, le=1_000_000)
    retract_order: Literal["newest", "fewest_outputs"] = "newest"
    source: str = Field(min_length=1)
    date: str | None = None
    note: str | None = None

    def rule(self) -> ReserveRule:
        low = self.init_ratio * self.min_ratio_factor
        return ReserveRule(self.init_ratio, low, (self.init_ratio - low) / self.decay_steps,
                           self.clip_tokens, self.retract_steps,
                           self.retract_order == "fewest_outputs")


class GraphCapTier(_Frozen):
    """On a GPU with less memory than ``below_gib``: the largest decode batch captured at TP
    below 4 (``cap``) and at TP 4 or more (``cap_tp4``; None: ``cap``)."""

    below_gib: float = Field(gt=0, le=100_000)
    cap: int = Field(ge=1, le=1_000_000)
    cap_tp4: int | None = Field(None, ge=1, le=1_000_000)


def _check_captured(sizes: tuple[int, ...], steps: tuple[tuple[int, int], ...],
                    what: str) -> None:
    """A capture rule's sizes and ``[start, step]`` ranges: some, each at least 1, the
    ranges starting in increasing order; ``what``: what a captured size is of."""
    if not sizes and not steps:
        raise ValueError(f"give sizes or steps (with neither, no {what} would be captured)")
    if any(s < 1 for s in sizes) or any(a < 1 or b < 1 for a, b in steps):
        raise ValueError("sizes and steps must be at least 1")
    starts = [a for a, _ in steps]
    if starts != sorted(set(starts)):
        raise ValueError("steps must start in increasing order")


class GraphSizes(_Frozen):
    """The decode batch sizes an engine captures CUDA graphs at: ``sizes``, then from each
    ``[start, step]`` of ``steps`` every step-th size up to the next start, all up to
    min(``cap``, ``cap_per_seq`` x max_num_seqs, max_num_batched_tokens). ``cap_by_memory``:
    an engine that picks its cap from the GPU's memory and the TP size (SGLang), the first
    tier the GPU is below, else ``cap``. A decode step of n sequences replays the smallest
    captured size >= n (padding the rest); one larger than every size runs without a
    graph. ``padding`` false: only a batch of exactly a captured size replays its graph, any
    other runs without one (TensorRT-LLM's PyTorch backend, whose enable_padding is off by
    default)."""

    sizes: tuple[int, ...] = ()
    steps: tuple[tuple[int, int], ...] = ()
    cap: int = Field(ge=1, le=1_000_000)
    cap_per_seq: float | None = Field(None, gt=0, le=1000)
    cap_by_memory: tuple[GraphCapTier, ...] = ()
    # ((architecture, cap), ...): the cap in place of ``cap`` on GPUs of that architecture
    # (vLLM from 0.28: 1,024 on Blackwell's SM100), from ``arch_caps_since`` on
    arch_caps: tuple[tuple[str, int], ...] = ()
    arch_caps_since: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    padding: bool = True
    # the release these sizes start at (``EngineSpec.at_version``); before it the engine
    # captured none of its own: every decode step is priced as the profile's fit priced it
    since: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    source: str = Field(min_length=1)
    date: str | None = None
    estimated: bool = False
    note: str | None = None

    @model_validator(mode="after")
    def _check(self) -> GraphSizes:
        _check_captured(self.sizes, self.steps, "decode batch")
        below = [t.below_gib for t in self.cap_by_memory]
        if below != sorted(set(below)):
            raise ValueError("cap_by_memory tiers must rise in below_gib")
        if any(c < 1 for _, c in self.arch_caps):
            raise ValueError("arch_caps must be at least 1")
        for a, _ in self.arch_caps:
            check_architecture(a)
        return self


class MoeRunnerOff(_Frozen):
    """Releases that run no prefill graphs for the mixture-of-experts models whose experts a
    GPU architecture's own MoE runner serves by default (SGLang 0.5.10-0.5.12 on Blackwell:
    the FlashInfer TensorRT-LLM runner, whose bypassed top-k torch.compile cannot trace):
    ``model_types`` (the HF model_type) to the weight types that pick that runner."""

    # the first and last releases with the rule: the profile as its newest release has it
    # (at_version not applied) has no such rule unless the file gives neither (every release)
    since: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    until: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    gpu_architectures: tuple[str, ...] = Field(min_length=1)
    model_types: dict[str, tuple[str, ...]] = Field(min_length=1)
    source: str = Field(min_length=1)
    date: str | None = None
    note: str | None = None

    @field_validator("gpu_architectures")
    @classmethod
    def _known(cls, v):
        return tuple(check_architecture(a) for a in v)


class PrefillGraphs(_Frozen):
    """Prefill (extend) passes replayed from piecewise CUDA graphs (SGLang's, on by default
    from ``since``; ``--disable-piecewise-cuda-graph`` turns them off, and before ``since``
    ``--enable-piecewise-cuda-graph`` on): a pass of up to the largest captured token count
    pads up to the next captured count and replays the graph pieces between its attention
    calls, which run eagerly, one launch each, as does each piece's replay. So such a pass
    pays no host launch per kernel nor the host's time on its MoE layers
    (``moe_layer_host_us``), only its attention's launches and the pieces'. The captured
    counts: ``sizes``, then from each ``[start, step]`` of ``steps`` every step-th count up
    to the next start, all up to the largest: the step's token budget (the chunked-prefill
    size), or ``mla_max_tokens`` for a model with MLA attention, or what the server says
    (``--piecewise-cuda-graph-max-tokens``), and no more than a server's own context
    length."""

    value: bool
    since: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    sizes: tuple[int, ...] = ()
    steps: tuple[tuple[int, int], ...] = ()
    mla_max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    # the largest count for a model whose name holds the key, where the server gives none
    # (SGLang's: "llama-2" paths at most 4,096)
    name_caps: dict[str, int] = {}
    # the largest count no more than a server's own context length, from this release on
    context_cap_since: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    context_cap: bool = True  # at_version: False before context_cap_since
    # none for some MoE models on some GPUs in some releases (SGLang 0.5.10-0.5.12)
    moe_runner_off: MoeRunnerOff | None = None
    source: str = Field(min_length=1)
    date: str | None = None
    estimated: bool = False
    note: str | None = None

    @field_validator("sizes", "steps", mode="before")
    @classmethod
    def _no_bools(cls, v):
        flat = [x for item in (v if isinstance(v, (list, tuple)) else ())
                for x in (item if isinstance(item, (list, tuple)) else (item,))]
        if any(isinstance(x, bool) for x in flat):
            raise ValueError("expected whole numbers, got true / false")
        return v

    @model_validator(mode="after")
    def _check(self) -> PrefillGraphs:
        _check_captured(self.sizes, self.steps, "prefill pass")
        if self.steps and self.sizes and max(self.sizes) >= self.steps[0][0]:
            raise ValueError("sizes must all be below the first step's start")
        if any(c < 1 for c in self.name_caps.values()):
            raise ValueError("name_caps must be at least 1")
        return self


@dataclass(frozen=True)
class PrefillCounts:
    """The token counts an engine's prefill graphs are captured at, up to ``top``:
    ``sizes`` (ascending, below the first step), then each ``(start, step)`` of ``steps``
    every step-th count from its start up to the next start (or ``top``); worked out, not
    listed, so a budget of any size costs nothing."""

    sizes: tuple[int, ...]
    steps: tuple[tuple[int, int], ...]
    top: int

    def _last(self, k: int) -> int:
        start, step = self.steps[k]
        end = self.steps[k + 1][0] - 1 if k + 1 < len(self.steps) else self.top
        end = min(end, self.top)
        return start + (end - start) // step * step

    @property
    def largest(self) -> int:
        """The largest count captured."""
        return self._last(len(self.steps) - 1) if self.steps else self.sizes[-1]

    def padded(self, tokens: float) -> int | None:
        """The smallest count captured at or above ``tokens``; None above the largest."""
        t = math.ceil(tokens)
        i = bisect.bisect_left(self.sizes, t)
        if i < len(self.sizes):
            return self.sizes[i]
        for k, (start, step) in enumerate(self.steps):
            if t <= self._last(k):
                return start if t <= start else start + -(-(t - start) // step) * step
        return None

    def segments(self) -> tuple[tuple[int, int, int], ...]:
        """(start, step, last count) of each step range."""
        return tuple((a, b, self._last(k)) for k, (a, b) in enumerate(self.steps))


def prefill_graph_counts(rule: tuple, budget_tokens: int, *, mla: bool = False,
                         max_tokens: int | None = None, context_tokens: int | None = None,
                         model_name: str = "") -> PrefillCounts | None:
    """The token counts ``Engine.prefill_graph_rule`` (sizes, steps, MLA's largest, caps by
    model name, whether a server's context length caps them) captures for a step budget of
    ``budget_tokens`` (the chunked-prefill size): up to ``max_tokens`` where the server
    gives it, else MLA's largest for an MLA model, else the budget, a model name's cap
    below either; no more than a server's own ``context_tokens`` where the rule says so.
    None where none is captured."""
    sizes, steps, mla_max, name_caps, context_cap = rule
    if max_tokens is not None:
        top = max_tokens
    else:
        top = mla_max if mla and mla_max is not None else budget_tokens
        for key, cap in name_caps:
            if key in model_name.lower():
                top = min(top, cap)
    if context_cap and context_tokens is not None:
        top = min(top, context_tokens)
    own = tuple(x for x in sorted(sizes) if x <= top)
    segs = tuple((a, b) for a, b in steps if a <= top)
    if not own and not segs:
        return None
    return PrefillCounts(own, segs, top)


def graph_cap(rule: tuple, memory_bytes: float | None = None, tp: int = 1) -> int:
    """The largest size ``Engine.graph_rule`` captures on a GPU of ``memory_bytes`` at TP
    ``tp`` (before the scheduler's limits): its memory tier's, or its cap."""
    _, _, cap, _, tiers = rule
    if memory_bytes is not None:
        for below, small, large in tiers:
            if memory_bytes < below:
                return small if tp < 4 or large is None else large
    return cap


def graph_sizes(rule: tuple, max_num_seqs: int,
                max_num_batched_tokens: int | None = None, *,
                memory_bytes: float | None = None, tp: int = 1,
                max_bs: int | None = None) -> tuple[int, ...]:
    """The captured sizes of ``Engine.graph_rule`` (sizes, steps, cap, cap_per_seq, memory
    tiers) for a scheduler of ``max_num_seqs`` sequences and ``max_num_batched_tokens`` a
    step, on a GPU of ``memory_bytes`` at TP ``tp``, ascending. ``max_bs``: the largest
    size the server was told to capture (SGLang's --cuda-graph-max-bs), in place of the
    engine's own choice."""
    sizes, steps, _, per_seq, _ = rule
    cap = max_bs if max_bs is not None else graph_cap(rule, memory_bytes, tp)
    top = cap if per_seq is None else min(cap, int(per_seq * max_num_seqs))
    if max_num_batched_tokens is not None:
        top = min(top, max_num_batched_tokens)
    out = {s for s in sizes if s <= top}
    for i, (start, step) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else top + 1
        out.update(range(start, min(end, top + 1), step))
    return tuple(sorted(out))


# What an engine's memory fraction is a fraction of (``planner.core.memory.kv_budget_bytes``):
# total: all it allocates within f of the GPU's memory (vLLM's gpu_memory_utilization);
# static: its weights and KV pool within f of the memory free once the CUDA context is up,
# activations and CUDA graphs in the rest (SGLang's mem_fraction_static); free: the KV cache
# takes f of what the weights and a profiled forward pass leave (TensorRT-LLM's
# kv_cache_config.free_gpu_memory_fraction); measured: as total, the KV cache sized from the
# memory measured after warm-up and CUDA-graph capture, keeping a margin free (vLLM 0.34's
# extensible KV cache, gpu_memory_utilization 1.0 by default).
MEMORY_BASES = ("total", "static", "free", "measured")


class ReserveTier(_Frozen):
    below_gib: float = Field(gt=0, le=100_000)  # a GPU with less memory than this
    reserve_gib: float = Field(ge=0, le=100_000)


class MemoryFraction(_Sourced):
    """The engine's default memory fraction and what it is a fraction of (``MEMORY_BASES``);
    ``--memory-utilization`` gives another fraction on the same basis. ``reserve_by_memory``:
    an engine that works its default out from the GPU's memory, (memory - reserve) / memory
    with the reserve of the first tier the GPU is below (SGLang); ``value`` is then what that
    gives on an 80 GB GPU, for listings."""

    basis: Literal["total", "static", "free", "measured"]
    value: float = Field(gt=0, le=1, allow_inf_nan=False)
    reserve_by_memory: tuple[ReserveTier, ...] = ()
    # the release ``value`` starts at, and the fraction of the releases before it (vLLM's
    # gpu_memory_utilization: 0.92 from 0.20, 0.9 before): a number on the same basis, or a
    # fraction of its own (its basis, and perhaps a release of its own: vLLM 0.34's measured
    # sizing, before it 0.92 of the total from 0.20); None: every release's
    since: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    before: float | MemoryFraction | None = None
    # the measured basis's margin kept free beyond the activation peak A: max(floor, frac x A),
    # the floor by the GPU's maker (nvidia, amd)
    margin_floor_gib: dict[Literal["nvidia", "amd"], Annotated[float, Field(
        ge=0, le=1024, allow_inf_nan=False)]] | None = None
    margin_of_activations: float | None = Field(None, ge=0, le=10, allow_inf_nan=False)

    @field_validator("margin_floor_gib", mode="before")
    @classmethod
    def _floors_are_numbers(cls, v):
        if isinstance(v, dict) and any(isinstance(x, bool) for x in v.values()):
            raise ValueError("a number of GiB for each maker, not true or false")
        return v

    @field_validator("before", mode="before")
    @classmethod
    def _before_is_one_kind(cls, v):
        """A number, or a fraction of its own read here, so that a bad one says what it lacks
        in one message (not one per kind the union tries)."""
        if v is None or isinstance(v, MemoryFraction):
            return v
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if not 0 < v <= 1:  # NaN too
                raise ValueError("a fraction in (0, 1]")
            return v
        if isinstance(v, dict):
            try:
                return MemoryFraction.model_validate(v)
            except ValidationError as err:
                e = err.errors()[0]
                where = ".".join(str(x) for x in e["loc"])
                msg = e["msg"].removeprefix("Value error, ")
                raise ValueError(f"{where + ': ' if where else ''}{msg}") from None
        raise ValueError("a fraction in (0, 1], or a fraction of its own (basis, value, "
                         "source, ...)")

    @model_validator(mode="after")
    def _pair(self) -> MemoryFraction:
        if (self.since is None) != (self.before is None):
            raise ValueError("give since and before together (the fraction before that "
                             "release)")
        if isinstance(self.before, MemoryFraction) and self.before.since is not None and \
                version_key(self.before.since) >= version_key(self.since):
            raise ValueError(f"before.since: {self.before.since} is not before {self.since}")
        if self.basis == "measured" and self.reserve_by_memory:
            raise ValueError("reserve_by_memory: not with the measured basis")
        given = [x is not None for x in (self.margin_floor_gib, self.margin_of_activations)]
        if any(given) != (self.basis == "measured") or all(given) != any(given):
            raise ValueError("margin_floor_gib and margin_of_activations: both with the "
                             "measured basis, and only with it")
        if self.basis == "measured" and "nvidia" not in self.margin_floor_gib:
            raise ValueError("margin_floor_gib: name nvidia's floor (the default)")
        return self


class ExpertPadding(_Sourced):
    """How the engine stores a routed expert's MXFP4 weights: the hidden size padded up to a
    multiple of ``hidden_multiple`` and each TP rank's share of the intermediate size up to
    one of ``intermediate_multiple`` (the experts' bytes, and the matmuls over them, grow by
    ``Precision.expert_pad_factor``)."""

    hidden_multiple: int = Field(ge=1, le=65536)
    intermediate_multiple: int = Field(ge=1, le=65536)


class Unsupported(_Sourced):
    """Weights the engine does not run on GPUs of some architectures (a hardware file's
    ``architecture``): its support matrix or its own refusal, ``reason`` in its words.
    ``quantized_layers``: only where they cover those layers (None: either)."""

    weights: tuple[Literal["fp8", "int8", "int4", "mxfp4"], ...] = Field(min_length=1)
    architectures: tuple[str, ...] = Field(min_length=1)
    quantized_layers: Literal["all", "experts", "mlp"] | None = None
    reason: str = Field(min_length=1)

    @field_validator("architectures")
    @classmethod
    def _known_architectures(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_architecture(a) for a in v)


class DtypeFallback(_Sourced):
    """The 16-bit type the engine runs a model in, left to it (vLLM's ``--dtype auto``), on
    a GPU without tensor-core support for the checkpoint's type: vLLM serves a bf16
    checkpoint in fp16 on Turing and Volta (a T4, a V100) rather than refusing."""

    value: Literal["fp16"]


class SmallGpuDefaults(_Frozen):
    """Scheduler defaults an engine picks on smaller GPUs (vLLM's OpenAI server: below 70 GiB,
    or any A100), in place of ``ServingDefaults``' own."""

    max_num_seqs: int = Field(ge=1, le=1_000_000)
    max_num_batched_tokens: int = Field(ge=1, le=100_000_000)
    below_memory_gib: float = Field(gt=0, le=100_000)  # a GPU with less memory than this
    names: tuple[str, ...] = ()  # or whose name holds one of these (lower case)
    source: str = Field(min_length=1)
    date: str | None = None
    note: str | None = None


class LargeGpuDefaults(_Frozen):
    """Scheduler defaults an engine picks on GPUs with at least ``from_memory_gib`` of memory,
    from the release ``since`` on (vLLM's OpenAI server from 0.28: 16,384 tokens a step at
    160 GiB or more, the B200's, B300's and MI300X's), in place of ``ServingDefaults``'
    own; ``max_num_seqs`` None: unchanged."""

    max_num_batched_tokens: int = Field(ge=1, le=100_000_000)
    max_num_seqs: int | None = Field(None, ge=1, le=1_000_000)
    from_memory_gib: float = Field(gt=0, le=100_000)
    since: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    source: str = Field(min_length=1)
    date: str | None = None
    note: str | None = None


class ShortContextDefaults(_Frozen):
    """Scheduler defaults that depend on the served context length (vLLM's V0 engine, 0.6-0.7):
    chunked prefill is on by default only where max-model-len exceeds ``max_model_len``; at
    or below it prefill is not chunked, a step that prefills runs no decodes, and a step takes
    max(max-model-len, ``min_batched_tokens``) tokens."""

    max_model_len: int = Field(ge=1, le=100_000_000)
    min_batched_tokens: int = Field(ge=1, le=100_000_000)
    source: str = Field(min_length=1)
    date: str | None = None
    note: str | None = None


PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")


class PerformanceModes(_Frozen):
    """vLLM's --performance-mode (0.17 and later): ``balanced`` keeps the defaults;
    ``throughput`` multiplies the default max_num_seqs and max_num_batched_tokens by
    ``throughput_factor`` (a value the server is given stands); ``interactivity`` captures a
    CUDA graph at every decode batch size from 1 to ``interactivity_graph_sizes_to`` (or the
    largest captured size, if smaller) beside the usual ones, so that small batches pad
    less."""

    since: str = Field(pattern=r"^[0-9]+(\.[0-9]+)*$")  # the first release with the option
    throughput_factor: int = Field(ge=1, le=64)
    interactivity_graph_sizes_to: int = Field(ge=1, le=100_000)
    source: str = Field(min_length=1)
    date: str | None = None
    note: str | None = None


SpecMethod = Literal["draft-model", "mtp", "ngram", "eagle", "eagle3"]


class SpeculativeMethods(_Sourced):
    """Speculative decoding methods, by llmplan's names (draft-model, mtp, ngram, eagle,
    eagle3). ``joined``: ((method, release), ...), a method of ``value`` that joined the list
    only in that release (``EngineSpec.at_version`` leaves it out before)."""

    value: tuple[SpecMethod, ...]
    joined: tuple[tuple[SpecMethod, str], ...] = ()

    @model_validator(mode="after")
    def _joined(self) -> SpeculativeMethods:
        for m, since in self.joined:
            if m not in self.value:
                raise ValueError(f"joined: {m} is not in value")
            version_key(since)  # a release number
        return self


class EarlierDefaults(_Frozen):
    """The scheduler defaults of the releases before ``until`` that a profile covers, where
    they differ (vLLM before 0.8.5: 256 sequences and 2,048 tokens a step on every GPU)."""

    until: str = Field(pattern=r"^[0-9]+(\.[0-9]+)*$")
    max_num_seqs: int = Field(ge=1, le=1_000_000)
    max_num_batched_tokens: int = Field(ge=1, le=100_000_000)
    source: str = Field(min_length=1)
    date: str | None = None
    note: str | None = None


class ServingDefaults(_Frozen):
    """The engine's own scheduler defaults, which ``simulate`` and ``plan`` start from."""

    max_num_seqs: Num  # running requests at most
    max_num_batched_tokens: Num  # tokens per step at most (prefill chunks and decodes)
    block_size: NumSince  # KV tokens per block (page)
    chunked_prefill: Flag
    small_gpu: SmallGpuDefaults | None = None
    large_gpu: LargeGpuDefaults | None = None  # defaults on GPUs with the most memory
    # defaults by the served context length (``ShortContextDefaults``); None: the same at any
    short_context: ShortContextDefaults | None = None
    capacity_policy: Policy | None = None  # None: max-utilization
    # prefill chunks share a step with the running decodes (vLLM, TensorRT-LLM's in-flight
    # batching); False: a step that prefills runs no decodes (SGLang without mixed chunking)
    mixed_batches: Flag | None = None
    # admission holds KV back for the running requests' future tokens (SGLang's); None: a
    # request is admitted when its prompt's first chunk fits (vLLM's)
    decode_reserve: DecodeReserve | None = None
    # new prompt tokens a prefill batch takes at most beside the first request's (SGLang's
    # max_prefill_tokens: ``SchedulerConfig.max_prefill_tokens``); None: the step's budget
    max_prefill_tokens: Num | None = None
    # context requests held back to batch them (TensorRT-LLM's batch waiting: ``BatchWait``);
    # None: the engine has none
    batch_wait: BatchWait | None = None
    # a waiting request is admitted only where its whole prompt (with what it generated
    # before a preemption) fits in the free and evictable KV, not its first chunk alone
    # (vLLM's scheduler_reserve_full_isl, from 0.19); None or False: the first chunk
    full_prompt_admission: FlagSince | Flag | None = None
    cuda_graph_sizes: GraphSizes | None = None  # None: any decode batch replays a graph
    prefix_caching: Flag | None = None  # automatic prefix caching on by default (None: off)
    # a model mixing full and sliding-window layers caches only the window in the latter
    # (vLLM's hybrid KV cache manager, ``planner.serving.kv.HybridPagedKV``), from ``since``
    # on (None: every layer caches the whole context, as the pool counts it)
    hybrid_kv_cache: FlagSince | Flag | None = None
    # prefill passes replayed from piecewise CUDA graphs up to a token count
    # (``PrefillGraphs``, SGLang's); None: every prefill pass runs eagerly
    prefill_graphs: PrefillGraphs | None = None
    # the host's work for the next step (scheduling, input preparation) runs while the GPU
    # runs this one, so a step takes the longer of the two, not their sum (None: off); a
    # ``since`` puts the releases before it the other way
    async_scheduling: FlagSince | Flag | None = None
    # async scheduling stays on under pipeline parallelism (vLLM from 0.15); None or False:
    # a pipeline-parallel step runs without it
    async_pipeline: FlagSince | Flag | None = None
    # the speculative methods (``planner.layouts.speculation.Method``) under which async
    # scheduling stays on; any other turns it off. None: every method keeps it
    async_speculation: SpeculativeMethods | None = None
    # forward steps per scheduler call by default (vLLM V0's --num-scheduler-steps, 0.6-0.7:
    # multi-step scheduling); None: the engine has no such option
    scheduler_steps: Num | None = None
    # multi-step: each step's tokens stream as it ends, from ``since`` on (None: on)
    multi_step_stream: FlagSince | Flag | None = None
    # --performance-mode and what each mode changes (``PerformanceModes``); None: no such
    # option (refused)
    performance_modes: PerformanceModes | None = None
    # a prompt chunk that does not finish its prompt still gets a row of logits, its token
    # thrown away (vLLM's V1 runner, SGLang, TensorRT-LLM's two backends); None or False:
    # only a finishing chunk's
    partial_prefill_logits: Flag | None = None
    earlier: tuple[EarlierDefaults, ...] = ()  # releases before each ``until``, oldest first

    @model_validator(mode="after")
    def _check(self) -> ServingDefaults:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size",
                     "scheduler_steps"):
            if getattr(self, name) is None:
                continue
            v = getattr(self, name).value
            if v < 1 or v != int(v):
                raise ValueError(f"{name}: must be a whole number of at least 1, got {v}")
        return self


def _before_note(release: str, note: str | None) -> str:
    """The note of a default as the releases before ``release`` had it."""
    return f"releases before {release}" + (f": {note}" if note else "")


def _as_before(x: NumSince | MemoryFraction) -> NumSince | MemoryFraction:
    """A release-bound default (``since``, ``before``) as the releases before ``since`` had
    it: ``before``, its note saying so (a fraction of its own as it states itself)."""
    if isinstance(x.before, MemoryFraction):  # its own note says what it is
        return x.before
    return x.model_copy(update={"value": x.before, "since": None, "before": None,
                                "note": _before_note(x.since, x.note)})


def _fallback(mf: MemoryFraction) -> tuple[float, str] | None:
    """(fraction, basis) a measured-basis engine sizes its cache with where it cannot measure
    (a maker's GPU it names no floor for, a KV connector): the fraction of the releases
    before, vLLM's 0.92 of the total (CacheConfig.DEFAULT_GPU_MEMORY_UTILIZATION)."""
    b = mf.before
    return (b.value, b.basis) if isinstance(b, MemoryFraction) and b.basis != "measured" \
        else None


def _pairs(figure: _ByArchitecture | None, scale: float = 1.0) -> tuple[tuple[str, float], ...]:
    """A profile's figure by architecture as ``Engine`` holds it; () where it states none."""
    return () if figure is None else figure.pairs(scale)


class EngineSpec(_Frozen):
    """One engine profile, as engines_db/NAME.yaml states it."""

    name: str = Field(min_length=1)
    display_name: str = Field(min_length=1)
    engine_version: str = Field(min_length=1)
    source: str = Field(min_length=1)
    date: str = Field(min_length=1)
    description: str | None = None
    versions: Versions | None = None  # the releases it covers (``--engine vllm@0.6``)
    # the one release it stands for, set where ``--engine FAMILY@RELEASE`` picked it (never
    # read from a profile file: ``catalog.load_engine_spec`` refuses it there); a label only
    release: str | None = None
    # which ceilings the efficiencies multiply: the datasheet's (ideal only) or the GPU's
    # achievable ones (published measurements, or a calibration when one is given)
    ceilings: Literal["datasheet", "achievable"] = "achievable"
    step_overhead_us: Num  # exposed CPU cost of one decode step
    per_sequence_overhead_us: Num  # and of each sequence in it (sampling, detokenizing)
    prefill_step_overhead_us: Num  # exposed CPU cost of one prefill pass (per chunk)
    cuda_graphs: Flag  # decode steps replayed from CUDA graphs
    # the request path outside the engine's steps, paid once per request before its first
    # token: the API server's HTTP handling, tokenization and hand-off to the engine, and the
    # first token's detokenization and streaming; and tokenization per prompt token
    request_overhead_us: Num | None = None
    prompt_token_overhead_us: Num | None = None
    # the API server's CPU time, serial within its process (``planner.serving.frontend``): per
    # request before the engine sees it, and per output token streamed
    frontend_request_us: Num | None = None
    frontend_token_us: Num | None = None
    # the API server's CPU time per chat request beyond frontend_request_us where the release
    # parses the model's Jinja chat template anew for each (vLLM 0.11.0), serial as that is;
    # paid only at a named release in its span (``ReleaseCost``), by chat requests of a model
    # whose template is rendered from Jinja (``ChatTemplate.renderer``)
    chat_template_parse_us: ReleaseCost | None = None
    # the hand-off of each step to the engine's worker processes where the model spans more
    # than one GPU (vLLM V1's MultiprocExecutor: the scheduler output broadcast to the workers,
    # the sampled tokens back from the first), on the step's path: no async scheduling hides
    # it (None: 0)
    worker_step_overhead_us: Num | None = None
    kernel_gap_us: Num  # device-side fixed cost per kernel
    host_launch_us: Num  # host cost per kernel launched outside a graph
    # host time an eager pass (a prefill outside a CUDA graph) spends on each mixture-of-experts
    # layer beyond its kernels' launches: routing set-up and the fused MoE kernels' launches
    # from Python (None: none)
    moe_layer_host_us: Num | None = None
    kernels: Kernels
    operator_fixed_us: OperatorFixed | None = None  # None: no operator pays more
    # kernels launched to quantize the activations of each W8A8 fp8 GEMM (a dynamic scale's
    # reduction and the cast) beside the GEMM itself, or that GEMM's fixed cost counted in
    # kernels; None: none (fused, or no fp8 path); with ``since``, none before that release
    fp8_quant_kernels: Fp8Kernels | None = None
    gemm_bandwidth_frac: Frac
    # times gemm_bandwidth_frac for the 16-bit GEMMs (not the routed experts' fused kernel)
    # on a GPU architecture: how much less of its copy ceiling the engine's GEMM reaches
    # there than on the architecture the profile was confirmed on (None: 1 on every GPU)
    gemm_bandwidth_arch_frac: ArchFracs | None = None
    gemm_compute_frac: Frac
    # the share of its kernels' compute rate every matmul attains in this release line's
    # served steps, plain and quantized alike: a factor on gemm_compute_frac and on each
    # quantized path's compute_frac (None: 1, the kernels' own rates)
    served_compute_frac: Frac | None = None
    # times the routed experts' matmuls' compute efficiency, by GPU architecture: the
    # engine's fused MoE kernel against its plain GEMMs (None: 1 on every GPU)
    experts_compute_frac: ArchFracs | None = None
    # the same for routed experts in fp8 (fp8 weights, fp8 arithmetic): the engine's fused
    # fp8 MoE kernel against its plain fp8 GEMMs (None: 1 on every GPU)
    experts_fp8_compute_frac: ArchFracs | None = None
    # the GEMM depth K at which the engine's fused MoE kernel reaches half its rate, by GPU
    # architecture: a routed expert's GEMM of depth K computes at K / (K + this) of the
    # rate the two factors above give (each output tile's fixed work, amortized over K;
    # None: no such cost on any GPU). Derived with those factors, it applies to a lane,
    # 16-bit or fp8, whose factor the profile states for the architecture
    experts_k_half: ArchDepths | None = None
    # the fp8 lane's own depth, by GPU architecture, where its kernel's differs (None: the
    # fp8 lane takes experts_k_half, where experts_fp8_compute_frac is stated)
    experts_fp8_k_half: ArchDepths | None = None
    # device time per MoE layer of MXFP4 routed experts beyond what its operators cost, by GPU
    # architecture: the MXFP4 MoE kernel path's own fixed work (routing metadata, gathers,
    # its small kernels), which no byte or FLOP pays for (None: none on any GPU)
    mxfp4_moe_fixed_us: ArchMicros | None = None
    # device time per call of a GQA / MHA attention layer beyond its kernels' own cost, by GPU
    # architecture: what the engine's attention backend takes at a small cache (its KV-cache
    # write, the attention kernel's latency), which no byte or FLOP pays for; not MLA's (its
    # block's, operator_fixed_us.mla_kv_up_proj) (None: none on any GPU)
    attention_fixed_us: ArchMicros | None = None
    # the query heads a GPU's sparse MLA kernel (DeepSeek Sparse Attention's, FlashMLA's) is
    # built for, by GPU architecture: a GPU's heads are padded up to a multiple of this and
    # all of them computed (None: none padded on any GPU)
    sparse_mla_heads: ArchHeads | None = None
    gemm_tile_m: Num
    overlap_frac: Frac  # share of min(compute, memory) time hidden under the max
    attention_bandwidth_frac: Frac
    # times attention_bandwidth_frac on a GPU architecture: how much less of its copy ceiling
    # the engine's decode attention reaches there than on the architecture the profile was
    # confirmed on (None: 1 on every GPU)
    attention_bandwidth_arch_frac: ArchFracs | None = None
    attention_compute_frac: Frac
    # the most bytes a second the engine's attention reads an fp8 KV cache at, by GPU
    # architecture: its kernel converts every cached value, and on some GPUs that, not the
    # memory, sets the pace (None, or an architecture not named: the bandwidth alone)
    fp8_kv_attention_gb_per_s: ArchRates | None = None
    # times attention_compute_frac where attention reads an fp8 KV cache, by architecture:
    # a prefill's attention over an fp8 cache runs slower than over a 16-bit one (None: 1)
    fp8_kv_attention_compute_frac: ArchFracs | None = None
    # the rows a W8A8 fp8 GEMM computes at a time, by the size of M and GPU architecture: its
    # kernel dispatches one configuration per range of M, some far taller than the 16-row
    # tile (None: gemm_tile_m everywhere)
    fp8_gemm_row_tiles: RowTiles | None = None
    # decode attention reads each KV head once for its whole group of query heads (GQA-aware
    # kernels: FlashInfer, FlashAttention, XQA) or once per query head
    gqa_kv_reuse: Flag
    # the KV cache grows by concatenation (HF's DynamicCache: torch.cat), copying the whole
    # cache every step, rather than being written in place (paged or static caches)
    kv_cache_concat: Flag
    elementwise_bandwidth_frac: Frac
    quantized: dict[Literal["int8", "int4", "fp8"], QuantPath]
    allreduce_latency_us: Num
    allreduce_bandwidth_frac: Frac
    lm_head_sharded: Flag
    lm_head_quantized: Flag
    zero_point_bytes_per_group: Num
    serving: ServingDefaults | None = None
    memory_fraction: MemoryFraction | None = None  # None: 0.9 of total memory, as vLLM
    # MXFP4 routed experts as the engine's kernels lay them out (None: as the checkpoint)
    mxfp4_expert_padding: ExpertPadding | None = None
    # the 16-bit type it falls back to where the GPU has none of the checkpoint's (bf16 on a
    # T4) and the type was left to it; None: it refuses, asking for --dtype
    auto_dtype_fallback: DtypeFallback | None = None
    # weights it does not run on some GPU architectures (``Engine.refusal``)
    unsupported: tuple[Unsupported, ...] = ()
    # it refuses to start where its KV cache cannot hold one request of its max-model-len
    startup_kv_check: Flag | None = None

    @model_validator(mode="after")
    def _check(self) -> EngineSpec:
        missing = {"int8", "int4", "fp8"} - set(self.quantized)
        if missing:
            raise ValueError(f"quantized: missing {', '.join(sorted(missing))}")
        if self.gemm_tile_m.value < 1:
            raise ValueError("gemm_tile_m: must be at least 1")
        return self

    @property
    def family(self) -> str | None:
        """The engine whose releases the profile covers (``versions.family``); None: the
        profile names none."""
        return self.versions.family if self.versions is not None else None

    def as_released(self, engine_version: str | None) -> EngineSpec:
        """The profile as the first release of its family that ``engine_version`` (a
        source's or run's text: "vLLM 0.8.2 (...)") names starts (``at_version``); itself
        where the text names none or the profile names no family."""
        if self.versions is None:
            return self
        version = release_in(engine_version, self.versions.family)
        return self if version is None else self.at_version(version)

    def at_version(self, version: str) -> EngineSpec:
        """The profile as the release ``version`` starts: the scheduler defaults of the
        earliest ``serving.earlier`` entry it comes before (every GPU alike), else as it is;
        no capture sizes before the release they start at (``GraphSizes.since``), no
        --performance-mode before its release, a ``FlagSince`` default reversed before
        its release, and no fp8 kernels before theirs (``Fp8Kernels.since``)."""
        v = version_key(version)
        cp = self.chat_template_parse_us
        if cp is not None and not cp.resolved:
            self = self.model_copy(update={"chat_template_parse_us": cp.at(version)})
        q = self.fp8_quant_kernels
        if q is not None and q.since is not None and v < version_key(q.since):
            self = self.model_copy(update={"fp8_quant_kernels": None})
        mf = self.memory_fraction
        while mf is not None and mf.since is not None and v < version_key(mf.since):
            mf = _as_before(mf)  # back through the releases to this one's
        if mf is not self.memory_fraction:
            self = self.model_copy(update={"memory_fraction": mf})
        sv = self.serving
        if sv is None:
            return self
        g = sv.cuda_graph_sizes
        if g is not None and g.since is not None and v < version_key(g.since):
            sv = sv.model_copy(update={"cuda_graph_sizes": None})
        elif g is not None and g.arch_caps_since is not None and \
                v < version_key(g.arch_caps_since):
            sv = sv.model_copy(update={"cuda_graph_sizes": g.model_copy(update={
                "arch_caps": (), "arch_caps_since": None})})
        b = sv.block_size
        if b.since is not None and v < version_key(b.since):
            sv = sv.model_copy(update={"block_size": _as_before(b)})
        lg = sv.large_gpu
        if lg is not None and lg.since is not None and v < version_key(lg.since):
            sv = sv.model_copy(update={"large_gpu": None})
        pm = sv.performance_modes
        if pm is not None and v < version_key(pm.since):
            sv = sv.model_copy(update={"performance_modes": None})
        pg = sv.prefill_graphs
        # each release-bound default, once applied, keeps no release: the profile as a
        # release has it is that release's, and a second call leaves it as it is
        if pg is not None and pg.since is not None and v < version_key(pg.since):
            pg = pg.model_copy(update={
                "value": not pg.value, "since": None,
                "note": _before_note(pg.since, pg.note)})
        if pg is not None and pg.context_cap_since is not None and \
                v < version_key(pg.context_cap_since):
            pg = pg.model_copy(update={"context_cap": False, "context_cap_since": None})
        mo = pg.moe_runner_off if pg is not None else None
        if mo is not None and (mo.since, mo.until) != (None, None):
            inside = (mo.since is None or version_key(mo.since) <= v) and \
                (mo.until is None or v <= version_key(mo.until))
            pg = pg.model_copy(update={"moe_runner_off": mo.model_copy(update={
                "since": None, "until": None}) if inside else None})
        if pg is not sv.prefill_graphs:
            sv = sv.model_copy(update={"prefill_graphs": pg})
        sp = sv.async_speculation
        if sp is not None and sp.joined:
            kept = tuple(m for m in sp.value if not any(
                m == j and v < version_key(since) for j, since in sp.joined))
            if kept != sp.value:
                sv = sv.model_copy(update={"async_speculation": sp.model_copy(update={
                    "value": kept, "joined": ()})})
        for name in ("multi_step_stream", "hybrid_kv_cache", "async_scheduling",
                     "async_pipeline", "full_prompt_admission"):
            fs = getattr(sv, name)
            if isinstance(fs, FlagSince) and v < version_key(fs.since):
                sv = sv.model_copy(update={name: Flag(
                    value=not fs.value, source=fs.source, date=fs.date,
                    estimated=fs.estimated, fitted_on=fs.fitted_on,
                    note=_before_note(fs.since, fs.note))})
        for e in sorted(sv.earlier, key=lambda e: version_key(e.until)):
            if v < version_key(e.until):
                why = _before_note(e.until, e.note)
                def num(x, e=e, why=why):
                    return Num(value=x, source=e.source, date=e.date, note=why)

                sv = sv.model_copy(update={
                    "max_num_seqs": num(e.max_num_seqs),
                    "max_num_batched_tokens": num(e.max_num_batched_tokens),
                    "small_gpu": None, "large_gpu": None, "earlier": ()})
                break
        return self if sv is self.serving else self.model_copy(update={"serving": sv})

    def parameters(self) -> dict[str, _Sourced]:
        """Every sourced number of the profile, by dotted name."""
        out: dict[str, _Sourced] = {}
        for name in type(self).model_fields:
            v = getattr(self, name)
            if isinstance(v, _Sourced):
                out[name] = v
        for q, path in self.quantized.items():
            out[f"quantized.{q}.bandwidth_frac"] = path.bandwidth_frac
            out[f"quantized.{q}.compute_frac"] = path.compute_frac
        if self.serving is not None:
            for name in type(self.serving).model_fields:
                v = getattr(self.serving, name)
                if isinstance(v, _Sourced):
                    out[f"serving.{name}"] = v
        return out

    def fitted_rows(self) -> set[str]:
        return {r for p in self.parameters().values() for r in p.fitted_on}

    def model(self) -> Engine:
        q = {DType(k): (v.bandwidth_frac.value, v.compute_frac.value)
             for k, v in self.quantized.items()}
        k8 = self.fp8_quant_kernels
        return Engine(
            name=self.name, display_name=self.display_name, version=self.engine_version,
            source=self.source, ceilings=self.ceilings,
            family=self.family, release=self.release,
            step_overhead_s=self.step_overhead_us.value / 1e6,
            per_sequence_overhead_s=self.per_sequence_overhead_us.value / 1e6,
            prefill_step_overhead_s=self.prefill_step_overhead_us.value / 1e6,
            cuda_graphs=self.cuda_graphs.value,
            request_overhead_s=(0.0 if self.request_overhead_us is None
                                else self.request_overhead_us.value / 1e6),
            prompt_token_overhead_s=(0.0 if self.prompt_token_overhead_us is None
                                     else self.prompt_token_overhead_us.value / 1e6),
            frontend_request_s=(0.0 if self.frontend_request_us is None
                                else self.frontend_request_us.value / 1e6),
            frontend_token_s=(0.0 if self.frontend_token_us is None
                              else self.frontend_token_us.value / 1e6),
            chat_template_parse_s=(self.chat_template_parse_us.value / 1e6
                                   if self.chat_template_parse_us is not None
                                   and self.chat_template_parse_us.resolved else 0.0),
            worker_step_overhead_s=(0.0 if self.worker_step_overhead_us is None
                                    else self.worker_step_overhead_us.value / 1e6),
            kernel_gap_s=self.kernel_gap_us.value / 1e6,
            host_launch_s=self.host_launch_us.value / 1e6,
            moe_layer_host_s=(0.0 if self.moe_layer_host_us is None
                              else self.moe_layer_host_us.value / 1e6),
            kernels=tuple(sorted(self.kernels.value.items())),
            operator_fixed_s=(() if self.operator_fixed_us is None else tuple(
                sorted((k, v / 1e6) for k, v in self.operator_fixed_us.value.items()))),
            fp8_quant_kernels=0.0 if k8 is None else k8.value,
            fp8_block_quant_kernels=0.0 if k8 is None else k8.block_value,
            fp8_quant_dense_only=k8 is not None and k8.dense_only,
            fp8_input_reads=0.0 if k8 is None else k8.input_reads,
            fp8_dynamic_tensor_reads=(0.0 if k8 is None else k8.input_reads
                                      if k8.dynamic_tensor_reads is None
                                      else k8.dynamic_tensor_reads),
            gemm_bandwidth_frac=self.gemm_bandwidth_frac.value,
            gemm_bandwidth_by_arch=_pairs(self.gemm_bandwidth_arch_frac),
            gemm_compute_frac=self.gemm_compute_frac.value,
            served_compute_frac=(1.0 if self.served_compute_frac is None
                                 else self.served_compute_frac.value),
            experts_compute_by_arch=_pairs(self.experts_compute_frac),
            experts_fp8_compute_by_arch=_pairs(self.experts_fp8_compute_frac),
            experts_k_half_by_arch=_pairs(self.experts_k_half),
            experts_fp8_k_half_by_arch=_pairs(self.experts_fp8_k_half),
            mxfp4_moe_fixed_by_arch=_pairs(self.mxfp4_moe_fixed_us, 1e-6),
            attention_fixed_by_arch=_pairs(self.attention_fixed_us, 1e-6),
            sparse_mla_heads_by_arch=_pairs(self.sparse_mla_heads),
            gemm_tile_m=self.gemm_tile_m.value,
            overlap_frac=self.overlap_frac.value,
            attention_bandwidth_frac=self.attention_bandwidth_frac.value,
            attention_bandwidth_by_arch=_pairs(self.attention_bandwidth_arch_frac),
            attention_compute_frac=self.attention_compute_frac.value,
            fp8_kv_attention_compute_by_arch=_pairs(self.fp8_kv_attention_compute_frac),
            fp8_gemm_row_tiles_by_arch=_pairs(self.fp8_gemm_row_tiles),
            fp8_kv_attention_by_arch=_pairs(self.fp8_kv_attention_gb_per_s, 1e9),
            gqa_kv_reuse=self.gqa_kv_reuse.value,
            kv_cache_concat=self.kv_cache_concat.value,
            elementwise_bandwidth_frac=self.elementwise_bandwidth_frac.value,
            quantized=tuple(sorted(q.items(), key=lambda kv: kv[0].value)),
            allreduce_latency_s=self.allreduce_latency_us.value / 1e6,
            allreduce_bandwidth_frac=self.allreduce_bandwidth_frac.value,
            lm_head_sharded=self.lm_head_sharded.value,
            lm_head_quantized=self.lm_head_quantized.value,
            zero_point_bytes_per_group=self.zero_point_bytes_per_group.value,
            auto_dtype_fallback=(None if self.auto_dtype_fallback is None
                                 else self.auto_dtype_fallback.value),
            mxfp4_expert_pad=(None if self.mxfp4_expert_padding is None else (
                self.mxfp4_expert_padding.hidden_multiple,
                self.mxfp4_expert_padding.intermediate_multiple)),
            startup_kv_check=(self.startup_kv_check is not None
                              and self.startup_kv_check.value),
            unsupported=tuple((u.weights, u.architectures,
                               u.quantized_layers, u.reason, u.source)
                              for u in self.unsupported),
            **({} if self.memory_fraction is None else {
                "memory_utilization_frac": self.memory_fraction.value,
                "memory_basis": self.memory_fraction.basis,
                **({} if self.memory_fraction.margin_floor_gib is None else {
                    "memory_margin_floor_by_vendor": tuple(
                        (k, v * 2**30) for k, v in self.memory_fraction.margin_floor_gib.items()),
                    "memory_margin_frac": self.memory_fraction.margin_of_activations,
                    "memory_fallback": _fallback(self.memory_fraction)}),
                "memory_reserve_tiers": tuple(
                    (t.below_gib * 2**30, t.reserve_gib * 2**30)
                    for t in self.memory_fraction.reserve_by_memory) or None}),
            **({} if self.serving is None else {
                "max_num_seqs": int(self.serving.max_num_seqs.value),
                "max_num_batched_tokens": int(self.serving.max_num_batched_tokens.value),
                "block_size": int(self.serving.block_size.value),
                "chunked_prefill": self.serving.chunked_prefill.value}),
            **self._scheduling(),
            **({} if self.serving is None or self.serving.small_gpu is None else {
                "small_gpu": (self.serving.small_gpu.max_num_seqs,
                              self.serving.small_gpu.max_num_batched_tokens,
                              self.serving.small_gpu.below_memory_gib * 2**30,
                              self.serving.small_gpu.names)}),
            **({} if self.serving is None or self.serving.large_gpu is None else {
                "large_gpu": (self.serving.large_gpu.max_num_seqs,
                              self.serving.large_gpu.max_num_batched_tokens,
                              self.serving.large_gpu.from_memory_gib * 2**30)}),
        )


    def _scheduling(self) -> dict:
        """The scheduling fields a profile states, as ``Engine`` fields."""
        sv = self.serving
        if sv is None:
            return {}
        out: dict = {}
        if sv.capacity_policy is not None:
            out["capacity_policy"] = sv.capacity_policy.value
        if sv.mixed_batches is not None:
            out["mixed_batches"] = sv.mixed_batches.value
        if sv.partial_prefill_logits is not None:
            out["partial_prefill_logits"] = sv.partial_prefill_logits.value
        if sv.decode_reserve is not None:
            out["decode_reserve"] = sv.decode_reserve.rule()
        if sv.max_prefill_tokens is not None:
            out["max_prefill_tokens"] = int(sv.max_prefill_tokens.value)
        if sv.batch_wait is not None:
            out["batch_wait_iters"] = sv.batch_wait.timeout_iters
            out["batch_wait_tokens_ratio"] = sv.batch_wait.max_tokens_ratio
        if sv.prefix_caching is not None:
            out["prefix_caching"] = sv.prefix_caching.value
        if sv.async_scheduling is not None:
            out["async_scheduling"] = sv.async_scheduling.value
        if sv.async_speculation is not None:
            out["async_speculation"] = tuple(sv.async_speculation.value)
        if sv.scheduler_steps is not None:
            out["scheduler_steps"] = int(sv.scheduler_steps.value)
        if sv.multi_step_stream is not None:
            out["multi_step_stream"] = sv.multi_step_stream.value
        if sv.hybrid_kv_cache is not None:
            out["hybrid_kv_cache"] = sv.hybrid_kv_cache.value
        if sv.prefill_graphs is not None:
            pg = sv.prefill_graphs
            out["prefill_graph_rule"] = (pg.sizes, pg.steps, pg.mla_max_tokens,
                                         tuple(sorted(pg.name_caps.items())), pg.context_cap)
            out["prefill_graphs"] = pg.value
            # a rule of some releases alone: for a release within them (``at_version``
            # clears its bounds there); the profile as the newest release has it has none
            mo = pg.moe_runner_off
            if mo is not None and (mo.since, mo.until) == (None, None):
                mo = pg.moe_runner_off
                out["prefill_graphs_moe_off"] = tuple(sorted(mo.model_types.items()))
                out["prefill_graphs_moe_off_archs"] = mo.gpu_architectures
        if sv.performance_modes is not None:
            pm = sv.performance_modes
            out["performance_modes"] = (pm.since, pm.throughput_factor,
                                        pm.interactivity_graph_sizes_to)
        if sv.short_context is not None:
            out["short_context"] = (sv.short_context.max_model_len,
                                    sv.short_context.min_batched_tokens)
        if sv.cuda_graph_sizes is not None:
            g = sv.cuda_graph_sizes
            out["graph_rule"] = (g.sizes, g.steps, g.cap, g.cap_per_seq,
                                 tuple((t.below_gib * 2**30, t.cap, t.cap_tp4)
                                       for t in g.cap_by_memory))
            out["graph_padding"] = g.padding
            out["graph_arch_caps"] = tuple((a.lower(), c) for a, c in g.arch_caps)
        if sv.full_prompt_admission is not None:
            out["full_prompt_admission"] = sv.full_prompt_admission.value
        if sv.async_pipeline is not None:
            out["async_with_pp"] = sv.async_pipeline.value
        return out


# ``Engine.for_gpu``'s answers: (engine id, memory, GPU name, architecture, vendor) ->
# (the engine, its answer); cleared when full
_FOR_GPU: dict[tuple, tuple[Engine, Engine]] = {}
_FOR_GPU_MAX = 256


@dataclass(frozen=True)
class Engine:
    """An engine profile resolved to SI numbers: what the time model reads."""

    name: str
    display_name: str = ""
    version: str = ""
    source: str = ""
    ceilings: str = "datasheet"
    # the engine whose releases the profile covers (vllm, sglang, trtllm); None: unnamed. A
    # GPU's measured all-reduce of this family (hardware_db allreduce_measured) applies to it
    family: str | None = None
    release: str | None = None  # the release ``--engine FAMILY@RELEASE`` named; None: none
    step_overhead_s: float = 0.0
    per_sequence_overhead_s: float = 0.0
    prefill_step_overhead_s: float = 0.0
    cuda_graphs: bool = True
    request_overhead_s: float = 0.0  # per request, on its first token (and so its latency)
    prompt_token_overhead_s: float = 0.0  # per prompt token (tokenization), likewise
    frontend_request_s: float = 0.0  # API-server CPU per request, serial (a queue)
    frontend_token_s: float = 0.0  # API-server CPU per output token streamed, serial
    # API-server CPU per chat request of a Jinja-templated model on top of frontend_request_s:
    # the template parsed anew for each (vLLM 0.11.0; 0 elsewhere), serial likewise
    chat_template_parse_s: float = 0.0
    # per step where the replica runs in several worker processes, not hidden (``worker_s``)
    worker_step_overhead_s: float = 0.0
    api_servers: int = 1  # API-server processes sharing that work (vLLM's --api-server-count)
    kernel_gap_s: float = 0.0
    host_launch_s: float = 0.0
    moe_layer_host_s: float = 0.0  # an eager pass's host time per MoE layer beyond launches
    kernels: tuple[tuple[str, float], ...] = ()
    # device time per instance of the named operators beyond their kernels' (``fixed_for``)
    operator_fixed_s: tuple[tuple[str, float], ...] = ()
    fp8_quant_kernels: float = 0.0  # beside each W8A8 fp8 GEMM: its activations' quantization
    fp8_block_quant_kernels: float = 0.0  # beside a block-scaled one
    fp8_quant_dense_only: bool = False  # the routed experts' fused kernel pays none
    # reads of each 16-bit input element by a W8A8 GEMM's quantization pass: a static scale,
    # or one per token or per block; and one per tensor found at run time
    fp8_input_reads: float = 0.0
    fp8_dynamic_tensor_reads: float = 0.0
    gemm_bandwidth_frac: float = 1.0
    # times gemm_bandwidth_frac for the 16-bit GEMMs on this GPU (``for_gpu`` resolves it
    # from ``gemm_bandwidth_by_arch``: (architecture, factor), ...)
    gemm_bandwidth_arch_frac: float = 1.0
    gemm_bandwidth_by_arch: tuple[tuple[str, float], ...] = ()
    gemm_compute_frac: float = 1.0
    served_compute_frac: float = 1.0  # times every matmul's compute efficiency
    # times the routed experts' matmuls' compute efficiency on this GPU (``for_gpu`` resolves
    # it from ``experts_compute_by_arch``: (architecture, factor), ...)
    experts_compute_frac: float = 1.0
    experts_compute_by_arch: tuple[tuple[str, float], ...] = ()
    # the same for routed experts in fp8 (``experts_fp8_compute_by_arch``)
    experts_fp8_compute_frac: float = 1.0
    experts_fp8_compute_by_arch: tuple[tuple[str, float], ...] = ()
    # the depth at which a routed expert's 16-bit GEMM reaches half the rate those give on
    # this GPU, and an fp8 one's (``for_gpu`` resolves both from ``experts_k_half_by_arch``
    # for the lanes whose factor the profile states for the architecture; 0: none)
    experts_k_half: float = 0.0
    experts_fp8_k_half: float = 0.0
    experts_k_half_by_arch: tuple[tuple[str, float], ...] = ()
    experts_fp8_k_half_by_arch: tuple[tuple[str, float], ...] = ()  # the fp8 lane's own
    # the profile field the fp8 lane's depth came from (for ``--explain``)
    experts_fp8_k_half_field: str = "experts_k_half"
    # device time per MoE layer of MXFP4 routed experts beyond its operators' on this GPU
    # (``for_gpu`` resolves it from ``mxfp4_moe_fixed_by_arch``; 0: none)
    mxfp4_moe_fixed_s: float = 0.0
    mxfp4_moe_fixed_by_arch: tuple[tuple[str, float], ...] = ()
    # device time per call of a GQA / MHA attention layer beyond its kernels' on this GPU
    # (``for_gpu`` resolves it from ``attention_fixed_by_arch``; 0: none)
    attention_fixed_s: float = 0.0
    attention_fixed_by_arch: tuple[tuple[str, float], ...] = ()
    # the head multiple a GPU's sparse MLA kernel pads its query heads to on this GPU
    # (``for_gpu`` resolves it from ``sparse_mla_heads_by_arch``; 0: none)
    sparse_mla_heads: float = 0.0
    sparse_mla_heads_by_arch: tuple[tuple[str, float], ...] = ()
    gemm_tile_m: float = 1.0
    overlap_frac: float = 1.0
    attention_bandwidth_frac: float = 1.0
    # times attention_bandwidth_frac on this GPU (``for_gpu`` resolves it from
    # ``attention_bandwidth_by_arch``: (architecture, factor), ...)
    attention_bandwidth_arch_frac: float = 1.0
    attention_bandwidth_by_arch: tuple[tuple[str, float], ...] = ()
    attention_compute_frac: float = 1.0
    # the most bytes a second attention reads an fp8 KV cache at on this GPU (0: no limit
    # but the bandwidth's; ``for_gpu`` resolves it from ``fp8_kv_attention_by_arch``)
    fp8_kv_attention_bytes_per_s: float = 0.0
    fp8_kv_attention_by_arch: tuple[tuple[str, float], ...] = ()
    # times attention_compute_frac where attention reads an fp8 cache, on this GPU (from
    # ``fp8_kv_attention_compute_by_arch``)
    fp8_kv_attention_compute_frac: float = 1.0
    fp8_kv_attention_compute_by_arch: tuple[tuple[str, float], ...] = ()
    # a W8A8 fp8 GEMM's rows computed at a time on this GPU: ((bound on M, rows), ...), the
    # first bound M is within applies (inf: every larger M); () where the engine's fp8 GEMMs
    # compute in tiles of gemm_tile_m as the others do. ``for_gpu`` resolves it from
    # ``fp8_gemm_row_tiles_by_arch``
    fp8_gemm_row_tiles: tuple[tuple[float, float], ...] = ()
    fp8_gemm_row_tiles_by_arch: tuple[tuple[str, tuple], ...] = ()
    gqa_kv_reuse: bool = True
    kv_cache_concat: bool = False
    elementwise_bandwidth_frac: float = 1.0
    quantized: tuple[tuple[DType, tuple[float, float]], ...] = ()
    # the ideal bound's: just under the fastest small all-reduce timed (engines_db/ideal.yaml)
    allreduce_latency_s: float = 2e-6
    allreduce_bandwidth_frac: float = 1.0
    lm_head_sharded: bool = True
    lm_head_quantized: bool = False
    zero_point_bytes_per_group: float = 0.0
    # (hidden multiple, intermediate multiple) MXFP4 routed experts are padded to
    # (``ExpertPadding``); None: stored as the checkpoint
    mxfp4_expert_pad: tuple[int, int] | None = None
    # the 16-bit type a bf16 model runs in on a GPU without bf16 tensor cores when the type
    # was left to the engine (``DtypeFallback``: vLLM 0.9+ falls back to fp16); None: refused
    auto_dtype_fallback: str | None = None
    # ((weights, ...), (architectures, ...), quantized layers or None, reason, source): what
    # it does not run where (``refusal``)
    unsupported: tuple = ()
    # it refuses to start where its KV cache cannot hold one request of its max-model-len
    # (vLLM's check_enough_kv_cache_memory; ``planner.core.estimate.startup_max_model_len``)
    startup_kv_check: bool = False
    # the memory fraction it sizes its KV cache from by default, and its basis (MEMORY_BASES)
    memory_utilization_frac: float = 0.9
    memory_basis: str = "total"
    # on the measured basis, the margin kept free beyond the activation peak A: max(floor,
    # frac x A) (vLLM 0.34's extensible KV cache); the floor by the GPU's maker until
    # ``for_gpu`` resolves it
    memory_margin_floor_bytes: float = 2**30
    memory_margin_floor_by_vendor: tuple[tuple[str, float], ...] = ()
    memory_margin_frac: float = 0.75
    # (fraction, basis) where the measured sizing is off (``without_measured_kv``); None: none
    memory_fallback: tuple[float, str] | None = None
    # ((below this many bytes of memory, reserve bytes), ...): a default worked out from the
    # GPU's memory, (memory - reserve) / memory (``memory_frac_for``)
    memory_reserve_tiers: tuple | None = None
    # scheduler defaults (vLLM's where a profile states none)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    chunked_prefill: bool = True
    capacity_policy: str = "max-utilization"  # or "guaranteed-no-evict" (``Policy``)
    mixed_batches: bool = True  # prefill chunks and decodes share a step
    # every prompt chunk of a step gets a row of logits, finishing its prompt or not
    # (``ServingDefaults.partial_prefill_logits``); False: only a finishing chunk's
    partial_prefill_logits: bool = False
    # an admission that holds KV back for the running requests' tokens (``DecodeReserve``);
    # None: none
    decode_reserve: ReserveRule | None = None
    # SGLang's max_prefill_tokens (``SchedulerConfig.max_prefill_tokens``); None: none
    max_prefill_tokens: int | None = None
    # TensorRT-LLM's batch waiting, its iterations and token share (``BatchWait``; 0: off);
    # None: the engine has none
    batch_wait_iters: int | None = None
    batch_wait_tokens_ratio: float | None = None
    prefix_caching: bool = False  # automatic prefix caching on by default
    # sliding-window layers cache only their window (vLLM's hybrid KV cache manager)
    hybrid_kv_cache: bool = False
    # the next step's host work overlaps this step's GPU work: a step takes the longer of
    # the two (``planner.core.roofline.with_host``), not their sum
    async_scheduling: bool = False
    # it stays on under pipeline parallelism (``overlaps_host``); False: off there
    async_with_pp: bool = False
    # the speculative methods that keep it on (``for_speculation``); None: every method
    async_speculation: tuple[str, ...] | None = None
    # CUDA-graph capture sizes, (sizes, steps, cap, cap_per_seq, ((below bytes, cap, cap at
    # TP 4+), ...)) as ``GraphSizes`` states them (``graph_sizes``); None: any decode batch
    # replays a graph, unpadded
    graph_rule: tuple | None = None
    # a decode batch between captured sizes pads up to the next (False: it runs without a
    # graph; ``GraphSizes.padding``)
    graph_padding: bool = True
    # (max_model_len, min_batched_tokens): at or below that context length prefill is not
    # chunked, runs in steps of its own of max(max_model_len, min_batched_tokens) tokens
    # (``ShortContextDefaults``, vLLM V0); None: the defaults hold at any length
    short_context: tuple | None = None
    # forward steps per scheduler call (vLLM V0's multi-step scheduling,
    # ``planner.serving.schedulers.MultiStepScheduler``); None: the engine has none
    scheduler_steps: int | None = None
    # multi-step: each step's tokens stream as it ends (vLLM's --multi-step-stream-outputs);
    # False: a block's tokens reach the client at its end
    multi_step_stream: bool = True
    # the server's max-model-len (vLLM's --max-model-len, SGLang's --context-length,
    # trtllm-serve's --max_seq_len); None: the model's context length
    max_model_len: int | None = None
    # the largest decode batch the server was told to capture (SGLang's --cuda-graph-max-bs);
    # None: the engine's own choice
    graph_max_bs: int | None = None
    # prefill passes replayed from piecewise CUDA graphs (``PrefillGraphs``): whether they
    # are, the rule of the token counts captured, (sizes, steps, MLA's largest), where the
    # profile states one (None: the engine has none), and the largest count the server was
    # told to capture (SGLang's --piecewise-cuda-graph-max-tokens; None: the engine's own)
    prefill_graphs: bool = False
    prefill_graph_rule: tuple | None = None
    prefill_graph_max_tokens: int | None = None
    # ((model_type, weight types), ...): the MoE models that run no prefill graphs on the
    # GPU architectures named (``MoeRunnerOff``); for_gpu keeps them for a GPU of those
    # (the architectures then emptied: resolved) and drops them for any other
    prefill_graphs_moe_off: tuple = ()
    prefill_graphs_moe_off_archs: tuple[str, ...] = ()
    # (max_num_seqs, max_num_batched_tokens, below this many bytes of memory, or a GPU name
    # holding one of these): the defaults on smaller GPUs, resolved by ``for_gpu``
    small_gpu: tuple | None = None
    # (max_num_seqs or None, max_num_batched_tokens, from this many bytes of memory): the
    # defaults on the GPUs with the most memory, resolved by ``for_gpu``
    large_gpu: tuple | None = None
    # ((architecture, cap), ...): ``graph_rule``'s cap on GPUs of that architecture, resolved
    # by ``for_gpu``
    graph_arch_caps: tuple = ()
    # a waiting request is admitted only where its whole prompt fits in the free and
    # evictable KV (vLLM's scheduler_reserve_full_isl); False: where its first chunk does
    full_prompt_admission: bool = False
    # (first release, throughput factor, interactivity's finest sizes up to): vLLM's
    # --performance-mode (``PerformanceModes``, ``in_mode``); None: the engine has none
    performance_modes: tuple | None = None

    def refuses_prompt(self, prompt_tokens: float) -> bool:
        """Whether its defaults refuse a prompt on arrival, as the simulator's scheduler does
        (``planner.serving.config.SchedulerConfig.chunks_prompts``): above a step's token
        budget where prompts are not chunked (TensorRT-LLM's 8,192, chunked prefill off).
        vLLM V0's unchunked short-context steps take the whole context, and SGLang prefills
        a step's first prompt whole at any length (``SchedulerConfig.takes_whole_prompts``),
        so refuse none."""
        chunks = self.chunked_prefill and (self.scheduler_steps or 1) == 1
        return (self.short_context is None and not chunks and self.max_prefill_tokens is None
                and prompt_tokens > self.max_num_batched_tokens)

    def refusal(self, weights: str, quantized_layers: str,
                architecture: str | None) -> str | None:
        """Why the engine does not run these weights on a GPU of this architecture (its
        reason and source), or None where it does."""
        arch = (architecture or "").lower()
        for ws, archs, layers, reason, source in self.unsupported:
            if weights in ws and arch in archs and layers in (None, quantized_layers):
                return f"{reason} ({source})"
        return None

    def for_gpu(self, memory_bytes: float, gpu_name: str,
                architecture: str | None = None, vendor: str | None = None) -> Engine:
        """The engine with its scheduler defaults for this GPU (vLLM picks smaller ones below
        70 GiB and on A100s) and its figures by architecture (the experts' compute, the GEMMs'
        and attention's bandwidth factors, the fp8 cache's pace, the fp8 GEMMs' row tiles) for
        the GPU's ``architecture``; resolved once, so later overrides (a server's flags)
        stand. ``vendor``: the GPU's maker; prefill graphs (``PrefillGraphs``) are CUDA's,
        off by default on any other's GPU (SGLang turns them off on AMD's and Intel's).

        Kept per engine object and GPU (both immutable): a plan or sweep prepares the same
        engine for the same GPU thousands of times, and each answer takes a dozen copies of
        this large record."""
        key = (id(self), memory_bytes, gpu_name, architecture, vendor)
        hit = _FOR_GPU.get(key)
        if hit is not None and hit[0] is self:
            return hit[1]
        e = self._for_gpu(memory_bytes, gpu_name, architecture, vendor)
        if len(_FOR_GPU) >= _FOR_GPU_MAX:
            _FOR_GPU.clear()
        _FOR_GPU[key] = (self, e)  # the engine kept, so its id is not reused while here
        return e

    def _for_gpu(self, memory_bytes: float, gpu_name: str, architecture: str | None,
                 vendor: str | None) -> Engine:
        e = self
        if e.prefill_graphs and vendor is not None and vendor.lower() != "nvidia":
            e = replace(e, prefill_graphs=False)
        if e.prefill_graphs_moe_off_archs:
            on_it = (architecture or "").lower() in e.prefill_graphs_moe_off_archs
            e = replace(e, prefill_graphs_moe_off_archs=(),
                        prefill_graphs_moe_off=e.prefill_graphs_moe_off if on_it else ())
        if e.memory_margin_floor_by_vendor:
            floors = dict(e.memory_margin_floor_by_vendor)
            maker = (vendor or "nvidia").lower()
            e = replace(e, memory_margin_floor_by_vendor=(),
                        memory_margin_floor_bytes=floors.get(maker, floors["nvidia"]))
            if maker not in floors:  # vLLM measures on CUDA and ROCm alone
                e = e.without_measured_kv()
        arch = (architecture or "").lower()
        if e.experts_k_half_by_arch or e.experts_fp8_k_half_by_arch:
            # the kernel's depth was derived with each lane's factor: it applies to a lane
            # whose factor the profile states for this architecture, and to no other; the
            # fp8 lane takes its own where the profile states one
            k_half = dict(e.experts_k_half_by_arch).get(arch, 0.0)
            own = arch in dict(e.experts_fp8_k_half_by_arch)
            fp8_k_half = dict(e.experts_fp8_k_half_by_arch).get(arch, k_half)
            e = replace(e, experts_k_half_by_arch=(), experts_fp8_k_half_by_arch=(),
                        experts_fp8_k_half_field=(
                            "experts_fp8_k_half" if own else "experts_k_half"),
                        experts_k_half=(
                            k_half if arch in dict(e.experts_compute_by_arch) else 0.0),
                        experts_fp8_k_half=(
                            fp8_k_half if arch in dict(e.experts_fp8_compute_by_arch) else 0.0))
        for by_arch, field, unnamed in _BY_ARCHITECTURE:
            pairs = getattr(e, by_arch)
            if pairs:
                e = replace(e, **{by_arch: (), field: dict(pairs).get(arch, unnamed)})
        if e.graph_arch_caps:
            cap = dict(e.graph_arch_caps).get(arch)
            e = replace(e, graph_arch_caps=(), graph_rule=(
                e.graph_rule if cap is None or e.graph_rule is None
                else (*e.graph_rule[:2], cap, *e.graph_rule[3:])))
        if e.large_gpu is not None:
            seqs, tokens, at_least = e.large_gpu
            e = replace(e, large_gpu=None)
            if memory_bytes >= at_least:  # vLLM asks the largest tier first
                return replace(e, small_gpu=None, max_num_batched_tokens=tokens,
                               max_num_seqs=e.max_num_seqs if seqs is None else seqs)
        if e.small_gpu is None:
            return e
        seqs, tokens, below, names = e.small_gpu
        small = memory_bytes < below or any(n in gpu_name.lower() for n in names)
        if not small:
            return replace(e, small_gpu=None)
        return replace(e, small_gpu=None, max_num_seqs=seqs, max_num_batched_tokens=tokens)

    def in_mode(self, mode: str | None) -> Engine:
        """The engine under vLLM's --performance-mode ``mode`` (None: not given): its
        scheduler defaults multiplied (throughput) or its CUDA graphs captured at every small
        decode batch (interactivity), as ``PerformanceModes`` says. Applied to the defaults
        for the GPU (after ``for_gpu``), before any limit the server is given, which stands.
        A ``UsageError`` for an engine or release without the option."""
        if mode is None:
            return self
        if mode not in PERFORMANCE_MODES:
            raise UsageError(f"--performance-mode: {mode!r} is not one of "
                             f"{', '.join(PERFORMANCE_MODES)}")
        if self.performance_modes is None:
            which = ", a release before 0.17" if self.family == "vllm" else ""
            raise UsageError(f"--performance-mode {mode}: an option of vLLM 0.17 and later; "
                             f"the engine here ({self.name}{which}) has none")
        _, factor, finest = self.performance_modes
        if mode == "throughput":
            return replace(self, max_num_seqs=self.max_num_seqs * factor,
                           max_num_batched_tokens=self.max_num_batched_tokens * factor)
        if mode == "interactivity" and self.graph_rule is not None:
            sizes, *rest = self.graph_rule
            return replace(self, graph_rule=(
                tuple(sorted(set(sizes) | set(range(1, finest + 1)))), *rest))
        return self

    def memory_frac_for(self, memory_bytes: float) -> float:
        """The engine's default memory fraction on a GPU of ``memory_bytes``: its stated one,
        or (memory - reserve) / memory by its reserve tiers, rounded to 0.001 as SGLang's
        ServerArgs rounds it."""
        for below, reserve in self.memory_reserve_tiers or ():
            if memory_bytes < below:
                return round((memory_bytes - reserve) / memory_bytes, 3)
        return self.memory_utilization_frac

    def request_path_s(self, prompt_tokens: float, *, admitted: bool = False) -> float:
        """The request path's cost outside the engine's steps, added to a request's TTFT: the
        fixed path, tokenization, and the API server's own handling of the request as an idle
        server gives it (``admitted``: left out, where the simulator queues it)."""
        return (self.request_overhead_s + self.prompt_token_overhead_s * prompt_tokens
                + (0.0 if admitted else self.frontend_request_s))

    def overlaps_host(self, pp: int = 1) -> bool:
        """Whether a served step's host work runs beside the GPU work of the step before it,
        graphed or not (async scheduling: the engine core prepares step N + 1 while the GPU
        runs step N, the forward's kernels once launched); under pipeline parallelism only
        where the engine keeps it there (``async_with_pp``: vLLM 0.15 and later; 0.14 turned
        it off). An eager step's launches stay on the host's path
        (``planner.serving.cost.StepCoster.launch_s``)."""
        return self.async_scheduling and (pp == 1 or self.async_with_pp)

    def for_speculation(self, method: str) -> Engine:
        """The engine as it serves with speculative decoding by ``method``: without async
        scheduling where the engine turns it off for that method (``async_speculation``:
        vLLM keeps it for EAGLE and MTP, for a draft model from 0.28 and n-gram lookup from
        0.34; SGLang's overlap scheduler for none)."""
        if not self.async_scheduling or self.async_speculation is None or \
                method in self.async_speculation:
            return self
        return replace(self, async_scheduling=False)

    def hides_host(self, graphed: bool, pp: int = 1) -> bool:
        """Whether a step's host work runs beside its GPU work (``roofline.with_host``): with
        async scheduling, under a step replayed from a CUDA graph (an eager step keeps the
        host busy launching its kernels), and under pipeline parallelism only where the engine
        keeps async scheduling there (``overlaps_host``)."""
        return graphed and self.overlaps_host(pp)

    def kernels_for(self, name: str, kind: str) -> float:
        km = dict(self.kernels)
        return km.get(name, km.get(kind, 1.0))

    def fixed_for(self, name: str) -> float:
        """Seconds of device time an instance of operator ``name`` takes beyond its kernels'
        (``EngineSpec.operator_fixed_us``); 0 for the rest."""
        for n, s in self.operator_fixed_s:
            if n == name:
                return s
        return 0.0

    def quant_fracs(self, weight_dtype: DType | None) -> tuple[float, float] | None:
        """(bandwidth, compute) efficiency of the GEMM path for weights stored in
        ``weight_dtype``; None for 16-bit weights (the plain GEMM efficiencies apply). MXFP4
        takes the int4 path's: both are 4-bit weights dequantized in the GEMM (on Hopper vLLM runs
        MXFP4 experts weight-only, through its Triton or Marlin MoE kernels)."""
        if weight_dtype == DType.mxfp4:
            weight_dtype = DType.int4
        for dt, fr in self.quantized:
            if dt == weight_dtype:
                return fr
        return None

    def without_measured_kv(self) -> Engine:
        """The engine with its KV cache sized as before the measured basis (vLLM 0.34 turns
        its extensible KV cache off off CUDA and ROCm, and for a KV connector that cannot
        share driver-mapped memory, NIXL without an IMEX channel among them: vllm/config/
        vllm.py of 0.34.0 lines 3190-3254); itself where it has no measured basis."""
        if self.memory_basis != "measured" or self.memory_fallback is None:
            return self
        frac, basis = self.memory_fallback
        return replace(self, memory_utilization_frac=frac, memory_basis=basis)

    def prefill_graphs_for(self, model_type: str, weights: str) -> bool:
        """Whether the engine's prefill graphs (``prefill_graphs``) hold for this model
        (its HF model_type) in these weights on the GPU ``for_gpu`` resolved: not where that
        GPU's default MoE runner takes them away (``MoeRunnerOff``)."""
        if not self.prefill_graphs:
            return False
        if self.prefill_graphs_moe_off_archs:  # not resolved for a GPU: no such rule
            return True
        return weights not in dict(self.prefill_graphs_moe_off).get(model_type, ())

    @property
    def label(self) -> str:
        """The profile's name, with the release it was picked for where one was named
        (``vllm@0.15``)."""
        return f"{self.name}@{self.release}" if self.release else self.name

    @property
    def is_ideal(self) -> bool:
        return self.time_model_key() == IDEAL.time_model_key()

    def worker_s(self, gpus: int) -> float:
        """The hand-off of a step to the worker processes of a replica of ``gpus`` GPUs
        (``worker_step_overhead_s``): none on one GPU, where the engine runs the model in its
        own process."""
        return self.worker_step_overhead_s if gpus > 1 else 0.0

    def time_model_key(self) -> tuple:
        """Everything that sets speed (not byte accounting)."""
        return (self.ceilings, self.step_overhead_s, self.per_sequence_overhead_s,
                self.prefill_step_overhead_s, self.kernel_gap_s, self.host_launch_s,
                self.moe_layer_host_s, self.operator_fixed_s, self.fp8_quant_kernels,
                self.fp8_block_quant_kernels, self.fp8_quant_dense_only,
                self.fp8_input_reads, self.fp8_dynamic_tensor_reads,
                self.gemm_bandwidth_frac, self.gemm_bandwidth_arch_frac,
                self.gemm_bandwidth_by_arch, self.gemm_compute_frac,
                self.served_compute_frac, self.experts_compute_frac,
                self.experts_compute_by_arch, self.experts_fp8_compute_frac,
                self.experts_fp8_compute_by_arch, self.experts_k_half,
                self.experts_fp8_k_half, self.experts_k_half_by_arch,
                self.experts_fp8_k_half_by_arch, self.mxfp4_moe_fixed_s,
                self.mxfp4_moe_fixed_by_arch, self.attention_fixed_s,
                self.attention_fixed_by_arch, self.sparse_mla_heads,
                self.sparse_mla_heads_by_arch, self.gemm_tile_m, self.overlap_frac,
                self.attention_bandwidth_frac, self.attention_bandwidth_arch_frac,
                self.attention_bandwidth_by_arch, self.attention_compute_frac,
                self.fp8_kv_attention_bytes_per_s, self.fp8_kv_attention_by_arch,
                self.fp8_kv_attention_compute_frac, self.fp8_kv_attention_compute_by_arch,
                self.fp8_gemm_row_tiles, self.fp8_gemm_row_tiles_by_arch,
                self.gqa_kv_reuse, self.kv_cache_concat, self.elementwise_bandwidth_frac,
                tuple(fr for _, fr in self.quantized if fr != (1.0, 1.0)),
                self.allreduce_latency_s, self.allreduce_bandwidth_frac, self.family)

    def ideal_bound(self) -> Engine:
        """The ideal time model with this engine's byte accounting: the roofline bound of the
        very deployment this engine runs (same weights and memory fraction, no inefficiency)."""
        return Engine(name="ideal", display_name="ideal roofline", version="-",
                      source=IDEAL.source, lm_head_sharded=self.lm_head_sharded,
                      lm_head_quantized=self.lm_head_quantized,
                      zero_point_bytes_per_group=self.zero_point_bytes_per_group,
                      mxfp4_expert_pad=self.mxfp4_expert_pad,
                      memory_utilization_frac=self.memory_utilization_frac,
                      memory_basis=self.memory_basis,
                      memory_margin_floor_bytes=self.memory_margin_floor_bytes,
                      memory_margin_floor_by_vendor=self.memory_margin_floor_by_vendor,
                      memory_margin_frac=self.memory_margin_frac,
                      memory_fallback=self.memory_fallback,
                      memory_reserve_tiers=self.memory_reserve_tiers)


# (Engine's field of pairs by architecture, the field for_gpu resolves it into, the value of an
# architecture the pairs do not name)
_BY_ARCHITECTURE = (("experts_compute_by_arch", "experts_compute_frac", 1.0),
                    ("experts_fp8_compute_by_arch", "experts_fp8_compute_frac", 1.0),
                    ("gemm_bandwidth_by_arch", "gemm_bandwidth_arch_frac", 1.0),
                    ("attention_bandwidth_by_arch", "attention_bandwidth_arch_frac", 1.0),
                    ("fp8_kv_attention_by_arch", "fp8_kv_attention_bytes_per_s", 0.0),
                    ("fp8_kv_attention_compute_by_arch", "fp8_kv_attention_compute_frac", 1.0),
                    ("fp8_gemm_row_tiles_by_arch", "fp8_gemm_row_tiles", ()),
                    ("mxfp4_moe_fixed_by_arch", "mxfp4_moe_fixed_s", 0.0),
                    ("attention_fixed_by_arch", "attention_fixed_s", 0.0),
                    ("sparse_mla_heads_by_arch", "sparse_mla_heads", 0.0))

# The pure roofline (background notes): datasheet peaks, every efficiency 1, no fixed costs.
# engines_db/ideal.yaml states the same numbers with their sources; a test keeps them equal.
IDEAL = Engine(name="ideal", display_name="ideal roofline", version="-",
               source="Williams, Waterman & Patterson, Roofline, CACM 52(4), 2009")
