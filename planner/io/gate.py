"""The output gate: every figure that leaves the program is finite and physically possible,
or the output is refused.

Each command's ``--json`` object (``planner.cli.options.json_out``) and the figures behind
its tables (``gate`` called before rendering; ``gate_frame`` for a sweep's or plan's table)
pass through here, so a new code path that computes a NaN, an infinity, a negative time or a
utilisation above 100% is stopped at the edge instead of printed. The rules go by the key's
name, the unit it carries (STYLE.md, "Units"):

- every number is finite (JSON has no NaN or Infinity; a figure that does not apply is null);
- every number is >= 0 (times ``_s`` / ``_ms`` / ``_us``, ``_bytes``, ``_flops``,
  ``_per_s``, counts, prices, ratios), except a *signed* one: an error (a key named
  ``error``, ``*_error``, ``error_*`` or anything under one, ``*_abs_error`` excepted) or a
  margin / headroom, which is negative when a prediction is under its measurement or a
  limit is exceeded;
- a fraction (a ``frac`` word in the key, ``mbu``, ``mfu``, ``prefill_mfu``, ``*hit_rate``,
  ``acceptance_rate``) is at most 1, except those listed in ``MAY_EXCEED_ONE`` with why.

A violation raises ``FigureError``: one line naming the JSON path of the figure and its
value, exit code 2. The built-in databases give no violation (tests/test_output_gate.py
runs every command over them), so one that is reached comes from what the user gave (a
model, GPU, engine or results file, a flag) driving the arithmetic somewhere impossible;
the program refuses rather than print it, and says which figure. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from planner.core.errors import LlmplanError

# Fractions that may legitimately exceed 1, keyed by (parent key or "*", leaf key).
MAY_EXCEED_ONE: dict[tuple[str, str], str] = {
    ("*", "memory_used_frac"): "memory needed over the GPU's memory: above 1 is a deployment "
                               "that does not fit, which the output says (fits: false)",
    ("*", "margin_frac"): "a budget's margin against its limit: a minimum (throughput >= X) "
                          "met twice over is a margin of 1 and more",
    # measured utilisation: from a user's measured time, not the model; a small model that
    # sits in cache reads faster than DRAM (the CPU harness does), and a figure above 1 tells
    # the user the measurement or the datasheet is off: the output reports it, not hides it
    ("measured", "mbu"): "measured MBU (from --measured-tpot or a results file)",
    ("measured", "mfu"): "measured MFU",
    ("measured", "prefill_mfu"): "measured prefill MFU",
    ("utilisation", "mbu"): "measured MBU of a `measure` point",
    ("utilisation", "mfu"): "measured MFU of a `measure` point",
    ("utilisation", "prefill_mfu"): "measured prefill MFU of a `measure` point",
    ("runs", "mbu"): "a served run's measured MBU: `compare` says \"impossible\" above 1 "
                     "(mbu_impossible), a finding about the results file",
    ("runs", "mfu"): "a served run's measured MFU",
}
_FRACTION_NAMES = {"mbu", "mfu", "prefill_mfu", "acceptance_rate"}
_ERROR_WORD = re.compile(r"(^|_)errors?($|_)")
_SIGNED_WORD = re.compile(r"(^|_)(margin|headroom)($|_)")


class FigureError(LlmplanError):
    """A figure about to be printed is NaN, infinite, negative or an impossible fraction."""

    exit_code = 2


def _signed(keys: list[str]) -> bool:
    """An error (or anything under one) or a margin may be negative."""
    leaf = keys[-1] if keys else ""
    if _SIGNED_WORD.search(leaf):
        return True
    return any(_ERROR_WORD.search(k) and "abs_error" not in k for k in keys)


def _fraction(key: str) -> bool:
    return ("frac" in key.split("_") or key in _FRACTION_NAMES or key.endswith("hit_rate")
            or key.startswith("ideal_") and key[len("ideal_"):] in _FRACTION_NAMES)


def _may_exceed_one(keys: list[str]) -> bool:
    leaf = keys[-1]
    return (("*", leaf) in MAY_EXCEED_ONE
            or any((k, leaf) in MAY_EXCEED_ONE for k in keys[:-1]))


def _what(key: str) -> str:
    """The kind of figure, for the message: "a time", "a size in bytes"..."""
    for suffix, what in (("_s", "a time"), ("_ms", "a time"), ("_us", "a time"),
                         ("_bytes", "a size in bytes"), ("_flops", "a FLOP count"),
                         ("_per_s", "a rate")):
        if key.endswith(suffix) or f"{suffix}_" in key:
            return what
    return "a fraction" if _fraction(key) else "this figure"


def violation(keys: list[str], value: float) -> str | None:
    """Why ``value`` under the key path ``keys`` cannot be printed (None when it can)."""
    key = keys[-1] if keys else ""
    if not math.isfinite(value):
        return "not a finite number"
    if value < 0 and not _signed(keys):
        return f"{_what(key)} cannot be negative"
    if value > 1 and _fraction(key) and not _signed(keys) and not _may_exceed_one(keys):
        return "a fraction cannot exceed 1"
    return None


def _path(parts: list[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "(top level)"


def _refuse(parts: list[str | int], value: Any, why: str, where: str) -> FigureError:
    at = f" of {where}" if where else ""
    return FigureError(f"output refused: {_path(parts)}{at} = {value!r}: {why}; the inputs "
                       "lead to an impossible figure, so nothing is printed")


def gate(obj: Any, where: str = "") -> Any:
    """Check every number in ``obj`` (dicts, lists, tuples, numbers, None, strings) and
    return it unchanged; raise FigureError at the first violation. ``where`` names the
    output in the message (a command's table)."""
    stack: list[tuple[Any, list[str | int], list[str]]] = [(obj, [], [])]
    while stack:
        node, parts, keys = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                stack.append((v, [*parts, str(k)], [*keys, str(k)]))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                stack.append((v, [*parts, i], keys))
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            if isinstance(node, int):
                if node >= 0 and not _fraction(keys[-1] if keys else ""):
                    continue  # the common case, a count: nothing to check
                value = float(max(-1e300, min(node, 1e300)))  # float() of 10**400 overflows
            else:
                value = node
            why = violation(keys, value)
            if why:
                raise _refuse(parts, node, why, where)
        elif hasattr(node, "item") and callable(node.item) and not isinstance(node, str):
            stack.append((node.item(), parts, keys))  # a numpy scalar
    return obj


def _number(x: Any) -> float:
    """A cell of a mixed column as a float: NaN where it is not a number (text, None)."""
    import numpy as np

    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.number)):
        return math.nan
    if isinstance(x, (int, np.integer)):
        return float(max(-(10**300), min(int(x), 10**300)))  # float() of 10**400 overflows
    return float(x)


def gate_columns(columns: Mapping[str, Any], where: str = "", *, first_row: int = 0) -> None:
    """The same rules over a table's columns at once (numpy arrays, or one value for every
    row), so a sweep of a million rows is checked without a dict per row. NaN in a numeric
    column is a missing figure (null in JSON, "-" in the table: no price, an unsupported
    row), allowed; +-inf is not. ``first_row`` numbers the rows in the message."""
    import numpy as np

    for col, values in columns.items():
        v = np.asarray(values)
        if v.dtype.kind == "O":  # numbers beside None or text: the numbers, NaN elsewhere
            v = np.array([_number(x) for x in v.reshape(-1)], dtype=float)
        if v.dtype.kind not in "fiu":
            continue
        v = v.astype(float, copy=False).reshape(-1)
        bad = np.isinf(v)
        if not _signed([col]):
            bad |= v < 0
            if _fraction(col) and not _may_exceed_one([col]):
                bad |= v > 1
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            why = violation([col], float(v[i])) or "not a finite number"
            raise _refuse([first_row + (i if v.size > 1 else 0), col], float(v[i]), why,
                          where)


def gate_frame(df, where: str = ""):
    """``gate_columns`` over a pandas DataFrame; returns it unchanged."""
    gate_columns({c: df[c].to_numpy() for c in df.columns}, where)
    return df
