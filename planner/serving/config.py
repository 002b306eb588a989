"""The scheduler's settings, named and defaulted as vLLM's engine arguments name them.

``kind`` picks the batching policy (``planner.serving.schedulers``), ``kv_layout`` the KV pool
(``planner.serving.kv``). Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from planner.core.engine import PrefillCounts, ReserveRule, graph_sizes, prefill_graph_counts
from planner.core.errors import UsageError


def check_scheduler_steps(e, steps: int) -> None:
    """Refuse multi-step scheduling (``steps`` > 1) for an engine without it: only vLLM V0
    has it (``Engine.scheduler_steps`` None: none)."""
    if steps != 1 and e.scheduler_steps is None:
        raise UsageError(f"--num-scheduler-steps {steps}: multi-step scheduling is vLLM V0's "
                         f"(engine vllm-v0, releases 0.6-0.7); {e.name} has none")


@dataclass(frozen=True)
class SchedulerConfig:
    kind: Literal["continuous", "static", "dynamic"] = "continuous"
    max_num_seqs: int = 256  # vLLM's default
    max_num_batched_tokens: int = 8192  # vLLM V1's default for serving
    chunked_prefill: bool = True
    kv_layout: Literal["paged", "contiguous"] = "paged"
    block_size: int = 16  # vLLM's default
    max_model_len: int = 131072  # the reservation of a contiguous cache
    max_concurrency: int | None = None  # a closed loop of this many clients
    max_wait_s: float = 0.0  # dynamic batching: how long a batch waits for more requests
    # data-parallel ranks sharing each step (expert parallelism's attention ranks): each has
    # its own max_num_seqs and max_num_batched_tokens, so a step holds ranks times as much,
    # and no prefill chunk exceeds one rank's budget (left at 1, the coster's layout sets it)
    ranks: int = 1
    # how KV is reserved: allocated as tokens arrive, preempting when it runs out
    # ("max-utilization"), or a request's whole length at admission, never preempting
    # ("guaranteed-no-evict", TensorRT-LLM's default)
    capacity_policy: Literal["max-utilization", "guaranteed-no-evict"] = "max-utilization"
    mixed_batches: bool = True  # False: a step that prefills runs no decodes (SGLang's)
    # admission holds KV back for the running requests' future tokens, SGLang's rule
    # (``planner.core.engine.DecodeReserve``); None: none
    decode_reserve: ReserveRule | None = None
    # new prompt tokens one prefill step admits at most, per rank (SGLang's
    # max_prefill_tokens, python/sglang/srt/managers/schedule_policy.py PrefillAdder): a
    # waiting request joins a step already prefilling only where its whole uncached prompt
    # is under what is left of it, and none joins once it is spent; the first request of a
    # step is taken whatever its length (then chunked by the budget); None: no such bound
    max_prefill_tokens: int | None = None
    # the client sends ignore_eos: with its prefix cache off SGLang admits such a request by
    # PrefillAdder.add_one_req_ignore_eos, which does not hold a long prompt back for
    # max_prefill_tokens (it chunks it as the budget allows), and admits it only where every
    # request's whole output fits as they finish shortest first
    # (``planner.serving.schedulers.eos_fits``)
    ignore_eos: bool = False
    # TensorRT-LLM's batch waiting (PyExecutor._waiting_requests, ``Engine.batch_wait_iters``):
    # with both above 0, a step that would prefill beside running decodes holds its prefills
    # back (the decodes run alone) until their whole prompts and the decodes' tokens reach
    # batch_wait_tokens_ratio x max_num_batched_tokens, or it has held them batch_wait_iters
    # steps in a row; not with data-parallel ranks (attention DP), nor on an idle server
    batch_wait_iters: int = 0
    batch_wait_tokens_ratio: float = 0.0
    # the decode batch sizes replayed from CUDA graphs, ascending (a decode step pads up to
    # the next; beyond the largest it runs without a graph); empty: any size, unpadded
    graph_sizes: tuple[int, ...] = ()
    # a decode step between captured sizes pads up to the next; False: only one of exactly a
    # captured size replays a graph, any other runs without one (TensorRT-LLM's PyTorch
    # backend)
    graph_padding: bool = True
    # automatic prefix caching: a request finds its shared prefix's blocks computed (paged KV
    # under continuous batching; ignored otherwise)
    prefix_caching: bool = False
    # a model mixing full and sliding-window layers caches only the window in the latter
    # (vLLM's hybrid KV cache manager: ``planner.serving.kv.HybridPagedKV``; paged KV only)
    hybrid_kv_cache: bool = False
    # API-server processes in front of the engine (vLLM's --api-server-count): they share the
    # per-request and per-token work of the profile's front end (``planner.serving.frontend``)
    api_servers: int = 1
    # the API server's CPU per request beyond the profile's front-end cost, serial with it:
    # chat requests on a release that parses the model's Jinja chat template anew for each
    # (``Engine.chat_template_parse_s``, vLLM 0.11.0; ``planner.serving.run.chat_parse_s``)
    chat_template_parse_s: float = 0.0
    # forward steps per scheduler call (vLLM V0's --num-scheduler-steps): a decode batch runs
    # this many steps before the scheduler admits anything (``MultiStepScheduler``)
    scheduler_steps: int = 1
    # multi-step: each step's tokens stream as it ends (vLLM's multi_step_stream_outputs, on
    # by default since 0.6.3); False: a block's tokens reach the client at its end, a burst
    multi_step_stream: bool = True
    # the prefill token counts replayed from piecewise CUDA graphs (SGLang's,
    # ``planner.core.engine.PrefillGraphs``): a step that prefills up to the largest pads up
    # to the next and replays them, its attention launched eagerly; above it, or None, a
    # prefill step runs eagerly
    prefill_graphs: PrefillCounts | None = None
    # a waiting request is admitted only where its whole prompt fits in the free and
    # evictable KV, not its first chunk alone (vLLM's scheduler_reserve_full_isl, 0.19 on)
    full_prompt_admission: bool = False

    @classmethod
    def for_engine(cls, e, *, memory_bytes: float | None = None, tp: int = 1,
                   context_tokens: int | None = None, mla: bool = False,
                   model_name: str = "", **overrides) -> SchedulerConfig:
        """The engine profile's own scheduler defaults (``planner.core.engine.Engine``) on a GPU
        of ``memory_bytes`` at TP ``tp`` (an engine may size its CUDA graphs by them), with
        any field overridden. ``context_tokens``: the served context length where no
        max_model_len is given (the model's), for defaults that depend on it
        (``Engine.short_context``); a server's own max-model-len (``Engine.max_model_len``)
        stands before it. ``mla``, ``model_name``: the model's attention is MLA, and its
        name, for an engine whose prefill graphs capture fewer tokens for some models
        (``Engine.prefill_graph_rule``)."""
        steps = overrides.get("scheduler_steps", e.scheduler_steps or 1)
        check_scheduler_steps(e, steps)
        kw = {"max_num_seqs": e.max_num_seqs,
              "max_num_batched_tokens": e.max_num_batched_tokens,
              "block_size": e.block_size, "chunked_prefill": e.chunked_prefill,
              "capacity_policy": e.capacity_policy, "mixed_batches": e.mixed_batches,
              "decode_reserve": e.decode_reserve, "max_prefill_tokens": e.max_prefill_tokens,
              "batch_wait_iters": e.batch_wait_iters or 0,
              "batch_wait_tokens_ratio": e.batch_wait_tokens_ratio or 0.0,
              "prefix_caching": e.prefix_caching, "hybrid_kv_cache": e.hybrid_kv_cache,
              "api_servers": e.api_servers,
              "graph_padding": e.graph_padding, "scheduler_steps": e.scheduler_steps or 1,
              "multi_step_stream": e.multi_step_stream,
              "full_prompt_admission": e.full_prompt_admission}
        if e.max_model_len is not None:
            kw["max_model_len"] = context_tokens = e.max_model_len
        if e.short_context is not None and "max_num_batched_tokens" not in overrides:
            # vLLM V0: chunked prefill by default only above 32K of context; unchunked, a
            # prompt is prefilled in a step of its own that takes the whole context. Under
            # multi-step scheduling a chunked step takes the whole context too: it does not
            # chunk prompts (``chunks_prompts``)
            limit, floor = e.short_context
            context = overrides.get("max_model_len") or context_tokens or cls.max_model_len
            if not overrides.get("chunked_prefill", context > limit):
                kw.update(chunked_prefill=False, mixed_batches=False,
                          max_num_batched_tokens=max(context, floor))
            elif steps > 1:
                kw.update(max_num_batched_tokens=max(context, floor))
        kw.update(overrides)
        if "graph_sizes" not in kw and e.cuda_graphs and e.graph_rule is not None:
            kw["graph_sizes"] = graph_sizes(e.graph_rule, kw["max_num_seqs"],
                                            kw["max_num_batched_tokens"],
                                            memory_bytes=memory_bytes, tp=tp,
                                            max_bs=e.graph_max_bs)
        if "prefill_graphs" not in kw and e.cuda_graphs and e.prefill_graphs \
                and e.prefill_graph_rule is not None:
            # a budget that does not chunk (SGLang's --chunked-prefill-size -1) captures no
            # prefill graph but MLA's, whose largest is its own
            budget = kw["max_num_batched_tokens"] if kw["chunked_prefill"] else 0
            kw["prefill_graphs"] = prefill_graph_counts(
                e.prefill_graph_rule, budget, mla=mla, max_tokens=e.prefill_graph_max_tokens,
                context_tokens=e.max_model_len, model_name=model_name)
        return cls(**kw)

    @property
    def chunks_prompts(self) -> bool:
        """Whether a prompt longer than a step's budget is prefilled in chunks: with chunked
        prefill, and not under vLLM V0's multi-step scheduling, which schedules a prompt
        only whole, beside the decodes ("Multi-step Chunked-Prefill doesn't allow
        prompt-chunking", vllm/config.py SchedulerConfig)."""
        return self.chunked_prefill and self.scheduler_steps == 1

    @property
    def takes_whole_prompts(self) -> bool:
        """SGLang with chunked prefill off (--chunked-prefill-size -1): a prompt of any
        length is prefilled whole as its step's first request, the others joining while
        max_prefill_tokens allows (PrefillAdder: rem_chunk_tokens None, 'Non-chunked
        prefill'); no step budget refuses it, as vLLM's does."""
        return not self.chunks_prompts and self.max_prefill_tokens is not None \
            and self.scheduler_steps == 1 and self.kind == "continuous"

    @property
    def unchunked_why(self) -> str:
        """Why prompts are not chunked, as a refusal says it."""
        return "chunked prefill is off" if not self.chunked_prefill else \
            "multi-step scheduling does not chunk prompts"

    def check(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len",
                     "ranks", "api_servers", "scheduler_steps"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{name.replace('_', '-')}: must be positive")
        if self.batch_wait_iters < 0 or not 0 <= self.batch_wait_tokens_ratio <= 1:
            raise UsageError("batch waiting: iterations must be >= 0 and the token share "
                             "within 0-1")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens <= 0:
            raise UsageError("max-prefill-tokens: must be positive")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise UsageError(f"max-num-batched-tokens ({self.max_num_batched_tokens}) is below "
                             f"max-num-seqs ({self.max_num_seqs}): a step could not decode "
                             "every running request")
        if self.capacity_policy not in ("max-utilization", "guaranteed-no-evict"):
            raise UsageError(f"capacity-policy: {self.capacity_policy!r} is not "
                             "max-utilization or guaranteed-no-evict")
        if self.scheduler_steps > 1 and self.kind != "continuous":
            raise UsageError("--num-scheduler-steps: multi-step scheduling is simulated with "
                             "scheduler continuous only")
        if self.max_concurrency is not None and self.max_concurrency <= 0:
            raise UsageError("max-concurrency: must be positive")
        if not (self.chat_template_parse_s >= 0 and math.isfinite(self.chat_template_parse_s)):
            raise UsageError("chat template parse time: must be a finite number >= 0, got "
                             f"{self.chat_template_parse_s}")
        if not (self.max_wait_s >= 0 and math.isfinite(self.max_wait_s)):
            raise UsageError(f"max-wait: must be a finite number >= 0, got {self.max_wait_s}")
