"""A step's shape and its time: the decode pool's share, each prefill chunk's, the layout's
step coster (``planner.serving.cost``, ``planner.serving.costers``) and any drafter.

A prefill chunk of c tokens after ``computed`` adds c x computed + c (c + 1) / 2 attended
pairs (``planner.core.ops.StepShape``); its sliding-window attention is costed exactly
(``window_pairs``). The decoders' share comes from the pool (``planner.serving.decoding``),
summed over them in aggregate. A step that runs no decodes (SGLang's prefill batches) leaves
the decoders' share out.

CUDA graphs (``SchedulerConfig.graph_sizes``, vLLM's capture sizes): a decode-only step of T
tokens replays the graph of the smallest captured size >= T, so its linear layers and its
sampling run over that many rows (the padding's attention is empty); a decode step above the
largest captured size runs without a graph, paying each kernel's host launch, as does one
whose request count is not a captured size where the engine does not pad
(``SchedulerConfig.graph_padding``, TensorRT-LLM's PyTorch backend). Applied to a replica of
one tensor-parallel group; pipeline and expert-parallel layouts keep the unpadded, graphed
decode step, for every engine. Pure: no I/O.
"""

from __future__ import annotations

import bisect
import math

from planner.core.ops import StepShape
from planner.serving.decoding import DecodePool, with_chunks


class SlowedCoster:
    """A replica whose every step takes ``factor`` times what ``coster`` prices it at: a
    server as slow as the slow end of an error band (``plan --size-at high``). Everything else
    (the model, the engine, the KV capacity) is the coster's."""

    def __init__(self, coster, factor: float):
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"a step time factor must be a positive number, not {factor!r}")
        self._coster = coster
        self.time_scale = factor * getattr(coster, "time_scale", 1.0)

    def with_engine(self, engine):
        """The coster's ``with_engine``, as slow."""
        return SlowedCoster(self._coster.with_engine(engine),
                            self.time_scale / getattr(self._coster, "time_scale", 1.0))

    def __getattr__(self, name: str):
        # only what the instance lacks reaches here; "_coster" itself is missing only while a
        # copy or an unpickling builds the instance, which must not recurse
        if name == "_coster":
            raise AttributeError(name)
        return getattr(self._coster, name)


class StepPricer:
    """Seconds a step takes, given its prefill chunks beside the decode pool's requests (times
    the coster's ``time_scale``, where it has one: ``SlowedCoster``)."""

    __slots__ = ("coster", "batch", "window", "split_parts", "graph_sizes", "pads", "direct",
                 "scale", "uniform", "eager", "captured", "prefill_counts",
                 "every_chunk_logits")

    def __init__(self, coster, batch: DecodePool, graph_sizes: tuple[int, ...] = (),
                 pads: bool = True, prefill_counts=None):
        self.coster, self.batch = coster, batch
        self.pads = pads  # False: a batch between captured sizes runs without a graph
        # a step that prefills up to the largest of these token counts
        # (``planner.core.engine.PrefillCounts``) replays piecewise graphs padded to the
        # next (SGLang's), where the coster prices them (one TP group)
        self.prefill_counts = prefill_counts if getattr(coster, "prices_prefill_graphs",
                                                        False) else None
        self.scale = getattr(coster, "time_scale", 1.0)
        # padding to captured sizes, where the coster can take it (one TP group)
        self.graph_sizes = graph_sizes if getattr(coster, "pads_graphs", False) else ()
        self.window = coster.model.attention_window
        # every prompt chunk computes a row of logits, not only a finishing one (the engine's
        # ``partial_prefill_logits``: vLLM's V1 runner, SGLang, both TensorRT-LLM backends)
        self.every_chunk_logits = getattr(getattr(coster, "engine", None),
                                           "partial_prefill_logits", False)
        # a layout that places the decodes apart from the prefill chunks (expert
        # parallelism's data-parallel ranks) prices the two parts
        self.split_parts = getattr(coster, "splits_parts", False)
        # a padded decode step priced from its amounts, not through a StepShape (the same
        # answer, faster), where the coster can
        self.direct = bool(self.graph_sizes) and getattr(coster, "prices_decodes_directly",
                                                         False)
        # the plain pool's decode-only step in one call, no drafter (the coster's
        # ``uniform_decode_pricer``): a TP group's with graphs captured (``decode_pricer``
        # says which sizes replay one), or a pipeline or expert-parallel layout's, which pads
        # to none
        self.uniform = coster.uniform_decode_pricer() if (
            type(batch) is DecodePool and getattr(coster, "prices_uniform_decodes", False)
            and (self.graph_sizes or not getattr(coster, "pads_graphs", False))) else None
        # and its step run without a graph (unpadded): above the largest captured size, or
        # not of a captured size where the engine pads to none
        self.eager = coster.uniform_decode_pricer(False) if (
            self.uniform is not None and self.graph_sizes) else None
        self.captured = frozenset(self.graph_sizes)

    def decode_pricer(self, n: int):
        """(rows, price) for the plain pool's decode-only step of ``n`` requests, priced in
        one call as ``price(rows, attended, n)``: as it is where no size is captured (any
        batch replays a graph, or the layout pads to none); padded up to the captured size
        that holds it (``uniform``); above the largest, or not of a captured size where the
        engine pads to none (TensorRT-LLM's PyTorch backend), run without a graph
        (``eager``). Only where ``uniform`` is offered."""
        if not self.graph_sizes:
            return n, self.uniform
        if self.pads:
            sizes = self.graph_sizes
            i = bisect.bisect_left(sizes, n)
            return (sizes[i], self.uniform) if i < len(sizes) else (n, self.eager)
        return n, (self.uniform if n in self.captured else self.eager)

    @property
    def timer(self):
        """``time_s``, or ``scaled_time_s`` where the coster has a time scale (an unscaled
        step pays no extra call): the event loop's."""
        return self.time_s if self.scale == 1.0 else self.scaled_time_s

    def scaled_time_s(self, chunks: list, decodes: bool = True) -> tuple[float, int]:
        """``time_s`` times the coster's ``time_scale`` (the event loop takes this one where
        the scale is not 1, so an unscaled step pays no extra call)."""
        dt, past = self.time_s(chunks, decodes)
        return dt * self.scale, past

    def time_s(self, chunks: list, decodes: bool = True) -> tuple[float, int]:
        """The step's seconds, and the KV tokens its decoders have cached; ``decodes``:
        the decode pool runs in this step."""
        batch, window = self.batch, self.window
        n_dec = batch.n if decodes else 0
        if n_dec and not chunks and self.uniform is not None:
            # what ``_graphed_decode_s`` (or the layout's ``step_time``) gives this step from
            # the pool's ``shape``, to the bit
            rows, price = self.decode_pricer(n_dec)
            past = batch.sum_c0_minus_G0 + n_dec * batch.G
            return price(rows, past + n_dec, n_dec), past
        dec, dl, past = batch.shape(window)
        if not decodes:
            dec = [0.0] * 6
            dl = None if dl is None else [0.0] * 6
        if n_dec and not chunks and self.graph_sizes:
            return self._graphed_decode_s(dec, dl, n_dec) + batch.draft_s(past, chunks), past
        shape = with_chunks(dec, dl, chunks, window, self.every_chunk_logits)
        if chunks and n_dec and self.split_parts:
            parts = (StepShape(*dec, None if dl is None else StepShape(*dl)), len(chunks))
            dt = self.coster.step_time(shape, sequences=n_dec + len(chunks), prefill=True,
                                       decodes=True, parts=parts)
        else:
            counts = self.prefill_counts
            padded = counts.padded(shape.tokens) if chunks and counts is not None else None
            if padded is None:
                dt = self.coster.step_time(shape, sequences=n_dec + len(chunks),
                                           prefill=bool(chunks), decodes=bool(n_dec))
            else:
                dt = self.coster.step_time(shape, sequences=n_dec + len(chunks), prefill=True,
                                           decodes=bool(n_dec), prefill_graph_tokens=padded)
        return dt + batch.draft_s(past, chunks, decodes), past

    def _graphed_decode_s(self, dec: list[float], dl: list[float] | None,
                          n_dec: int) -> float:
        """A decode-only step of the decoders' share ``dec`` (``dl`` in the sliding-window
        layers): padded to the captured size (its tokens and sampled rows), or eager above
        the largest. An engine that does not pad (TensorRT-LLM's PyTorch backend) replays the
        graph of a decode batch of exactly a captured size, counted in requests as it keys
        them (with speculation a request decodes 1 + k tokens), and runs any other eagerly.
        The shapes are built once here, padded or not: this runs every step."""
        sizes = self.graph_sizes
        key = int(dec[0]) if self.pads else n_dec
        i = bisect.bisect_left(sizes, key)
        if i == len(sizes) or (not self.pads and sizes[i] != key):
            shape = StepShape(*dec, None if dl is None else StepShape(*dl))
            return self.coster.step_time(shape, sequences=n_dec, prefill=False,
                                         graphed=False)
        pad = sizes[i] - key  # 0 where the engine does not pad
        t, pairs, read, held, score, rows = dec
        if self.direct and dl is None:
            return self.coster.decode_step_s(t + pad, pairs, read, score, rows + pad, n_dec)
        local = None if dl is None else StepShape(dl[0] + pad, dl[1], dl[2], dl[3], dl[4],
                                                  dl[5] + pad)
        shape = StepShape(t + pad, pairs, read, held, score, rows + pad, local)
        return self.coster.step_time(shape, sequences=n_dec, prefill=False)


