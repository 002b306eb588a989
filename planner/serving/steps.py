"""A step's shape and its time: the decode pool's share, each prefill chunk's, the layout's
step coster (``planner.serving.cost``, ``planner.serving.costers``) and any drafter.

A prefill chunk of c tokens after ``computed`` adds c x computed + c (c + 1) / 2 attended
pairs (``planner.core.ops.StepShape``); its sliding-window attention is costed exactly
(``window_pairs``). The decoders' share comes from the pool (``planner.serving.decoding``),
summed over them in aggregate. Pure: no I/O.
"""

from __future__ import annotations

from planner.core.ops import StepShape, window_pairs
from planner.serving.decoding import DecodePool


class StepPricer:
    """Seconds a step takes, given its prefill chunks beside the decode pool's requests."""

    __slots__ = ("coster", "batch", "window", "split_parts")

    def __init__(self, coster, batch: DecodePool):
        self.coster, self.batch = coster, batch
        self.window = coster.model.sliding_window
        # a layout that places the decodes apart from the prefill chunks (expert
        # parallelism's data-parallel ranks) prices the two parts
        self.split_parts = getattr(coster, "splits_parts", False)

    def time_s(self, chunks: list) -> tuple[float, int]:
        """The step's seconds, and the KV tokens its decoders have cached."""
        batch, window = self.batch, self.window
        n_dec = batch.n
        dec, dl, past = batch.shape(window)
        shape = _with_chunks(dec, dl, chunks, window)
        if chunks and n_dec and self.split_parts:
            parts = (StepShape(*dec, None if dl is None else StepShape(*dl)), len(chunks))
            dt = self.coster.step_time(shape, sequences=n_dec + len(chunks), prefill=True,
                                       decodes=True, parts=parts)
        else:
            dt = self.coster.step_time(shape, sequences=n_dec + len(chunks),
                                       prefill=bool(chunks), decodes=bool(n_dec))
        return dt + batch.draft_s(past, chunks), past


def _with_chunks(dec: list[float], dl: list[float] | None, chunks: list,
                 window: int | None) -> StepShape:
    """The decoders' share ``dec`` (``dl`` in the sliding-window layers) plus the chunks'."""
    if not chunks:  # the pool's amounts are floats already
        return StepShape(*dec, None if window is None else StepShape(*dl))
    tokens, pairs, kv_read, held, score, rows = dec
    for q, c in chunks:
        tokens += c
        pairs += c * q.computed + c * (c + 1) / 2
        kv_read += q.computed + c
        held += q.computed
        score += c * (q.computed + c)
        rows += 1 if q.computed + c >= q.target else 0
    local = None
    if window is not None:
        _, l_pairs, l_read, l_held, l_score, _ = dl
        for q, c in chunks:
            span = min(q.computed + c, window + c - 1)
            l_pairs += window_pairs(q.computed + c, window) - window_pairs(q.computed, window)
            l_read += span
            l_held += min(q.computed, window)
            l_score += c * span
        local = StepShape(float(tokens), float(l_pairs), float(l_read), float(l_held),
                          float(l_score), float(rows))
    return StepShape(float(tokens), float(pairs), float(kv_read), float(held), float(score),
                     float(rows), local)
