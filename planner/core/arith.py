"""Arithmetic that works on plain numbers and on numpy arrays alike, without importing numpy.

The core's formulas take ``batch``, ``prompt_tokens`` and friends either as numbers (one
estimate) or as broadcastable arrays (a vectorized sweep runs the very same formulas over a
grid). Python's ``max``/``min``/``math.floor`` and ``if`` on a value break on arrays; these do
not. Arrays are recognised by their ``clip`` method, which computes the bound in one pass.
"""

from __future__ import annotations

import math
import typing


def vmax(a, b):
    """Element-wise maximum."""
    if hasattr(a, "clip"):
        return a.clip(min=b)
    if hasattr(b, "clip"):
        return b.clip(min=a)
    return a if a >= b else b


def vmin(a, b):
    """Element-wise minimum."""
    if hasattr(a, "clip"):
        return a.clip(max=b)
    if hasattr(b, "clip"):
        return b.clip(max=a)
    return a if a <= b else b


def vwhere(mask, a, b):
    """``a`` where ``mask`` holds, else ``b``; element-wise where ``mask`` is an array (a
    boolean array times a number is 0 or the number)."""
    if hasattr(mask, "clip"):
        return mask * a + (1 - mask) * b
    return a if mask else b


def floor_nonneg(x):
    """floor(max(x, 0)) for numbers or arrays (float result)."""
    return vmax(x, 0.0) // 1


def no_bool_numbers(cls, v, info):
    """YAML's true / false are not numbers: ``num_layers: true`` must not build a 1-layer
    model. A bool is accepted only where the field itself is a bool."""
    if isinstance(v, bool):
        ann = cls.model_fields[info.field_name].annotation
        if ann is not bool and "bool" not in str(ann).lower():
            raise ValueError(f"expected a number, got {str(v).lower()}")
    elif isinstance(v, dict):  # a table of rates: {fp16: true} is no rate either
        args = typing.get_args(cls.model_fields[info.field_name].annotation)
        if len(args) == 2 and args[1] in (int, float):
            for key, x in v.items():
                if isinstance(x, bool):
                    raise ValueError(f"{key}: expected a number, got {str(x).lower()}")
    return v


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), without numpy."""
    v = sorted(values)
    if not v:
        return math.nan
    pos = (len(v) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def hazen_quantile(values: list[float], weights: list[float], q: float) -> float:
    """The ``q`` quantile of ``values``, each counting for its (positive) weight: the sorted
    values stand at the middles of their weights' shares of the total, linear between them,
    and the smallest and largest hold below and above those (Hazen's plotting positions,
    weighted; with equal weights numpy's ``quantile(method="hazen")``). For real weights
    (``planner.serving.metrics.weighted_quantile`` repeats values by whole counts)."""
    pairs = sorted(zip(values, weights, strict=True))
    if not pairs:
        return math.nan
    total = math.fsum(w for _, w in pairs)
    at, pos = 0.0, []
    for _, w in pairs:
        pos.append((at + w / 2) / total)
        at += w
    if q <= pos[0]:
        return pairs[0][0]
    for i in range(1, len(pairs)):
        if q <= pos[i]:
            (v0, _), (v1, _) = pairs[i - 1], pairs[i]
            return v0 + (v1 - v0) * (q - pos[i - 1]) / (pos[i] - pos[i - 1])
    return pairs[-1][0]
