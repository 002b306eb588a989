"""Finished requests' figures, in columns: what a run keeps of each request once it is done.

A ``RequestResult`` object with its floats takes a few hundred bytes; a million requests of a
long run held as objects took most of a gigabyte (issue 27). Here each request is a row of
machine numbers (``array``: 8 bytes a figure, 72 a request) written when it finishes or is
refused, so the simulator can let go of its objects then (memory: the requests in flight, plus
these rows). Rows keep the order the requests were given in, so every figure summed or sorted
over them is computed as it was over the objects, to the bit. Reading a row gives a
``RequestResult`` again, made on the spot. Pure: no I/O.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Sequence

from planner.serving.requests import RequestResult

_INTS = ("id", "prompt_tokens", "output_tokens", "preemptions", "cached_tokens")
_FLOATS = ("arrival_s", "first_token_s", "finish_s")


class RequestRecords(Sequence):
    """``n`` requests' figures by position; a row not yet written reads as a request that has
    not run (times nan). ``failed`` holds the reasons of the refused ones, by position."""

    __slots__ = (*(f"_{c}" for c in _INTS + _FLOATS), "failed", "_n")

    def __init__(self, n: int):
        self._n = n
        zeros, nans = bytes(8 * n), array("d", [math.nan]) * n
        for c in _INTS:
            setattr(self, f"_{c}", array("q", zeros))
        for c in _FLOATS:
            setattr(self, f"_{c}", array("d", nans))
        self.failed: dict[int, str] = {}

    @classmethod
    def of(cls, results: Iterable[RequestResult]) -> RequestRecords:
        results = list(results)
        out = cls(len(results))
        for i, r in enumerate(results):
            out.put(i, r)
        return out

    def put(self, i: int, r: RequestResult) -> None:
        """Row ``i`` from ``r``'s figures (final: the request is done or refused)."""
        self._id[i], self._prompt_tokens[i], self._output_tokens[i] = \
            r.id, r.prompt_tokens, r.output_tokens
        self._preemptions[i], self._cached_tokens[i] = r.preemptions, r.cached_tokens
        self._arrival_s[i], self._first_token_s[i], self._finish_s[i] = \
            r.arrival_s, r.first_token_s, r.finish_s
        if r.failed:
            self.failed[i] = r.failed

    def column(self, name: str) -> array:
        """One figure of every row (``id``, ``arrival_s``, ``finish_s``, ...), by position."""
        if name not in _INTS + _FLOATS:
            raise KeyError(name)
        return getattr(self, f"_{name}")

    def first_failure(self) -> str | None:
        """The reason the first refused request (by position) was refused."""
        return self.failed[min(self.failed)] if self.failed else None

    def __len__(self) -> int:
        return self._n

    def _row(self, i: int) -> RequestResult:
        return RequestResult(self._id[i], self._arrival_s[i], self._prompt_tokens[i],
                             self._output_tokens[i], self._first_token_s[i],
                             self._finish_s[i], self._preemptions[i],
                             self.failed.get(i, ""), self._cached_tokens[i])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._row(k) for k in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("request row out of range")
        return self._row(i)

    def __iter__(self) -> Iterator[RequestResult]:
        return (self._row(i) for i in range(self._n))
