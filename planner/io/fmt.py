"""Human formatting of SI quantities, for the CLI and reports only (the core stays in SI)."""

from __future__ import annotations

import math

GIB = 1024**3


def sig(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits, never in exponent form, thousands grouped:
    1,130 (not 1.13e+03), 12.3, 0.0456."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    r = float(f"{x:.{digits}g}")  # rounded first: 999.7 is 1,000, not "1e+03"
    if abs(r) >= 10 ** (digits - 1):
        return f"{r:,.0f}"
    s = f"{r:,.{digits - 1 - math.floor(math.log10(abs(r)))}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def per_s(x: float) -> str:
    """A rate: whole units from 100 up (12,652), three significant digits below (3.45)."""
    return f"{x:,.0f}" if abs(x) >= 100 else sig(x)


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:,.2f} GiB"


def si(value: float | None, unit: str, *, digits: int = 3) -> str:
    """1.23e12, "FLOP/s" -> "1.23 TFLOP/s" (decimal prefixes)."""
    if value is None:
        return "n/a"
    r = float(f"{value:.{digits}g}")  # rounded first: 999.7 k is 1 M
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(r) >= factor:
            return f"{sig(r / factor, digits)} {prefix}{unit}"
    return f"{sig(r, digits)} {unit}"


def seconds(t: float | None) -> str:
    if t is None:
        return "n/a"
    t = float(f"{t:.3g}")  # rounded first: 0.99996 s is 1 s, not "1e+03 ms"
    if t >= 1:
        return f"{sig(t)} s"
    if t >= 1e-3:
        return f"{sig(t * 1e3)} ms"
    return f"{sig(t * 1e6)} µs"


def pct(frac: float | None) -> str:
    return "n/a" if frac is None else f"{frac * 100:.1f}%"


def count(n: float) -> str:
    """Parameter-style counts: 8.03B, 124M."""
    r = float(f"{n:.3g}")
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if r >= factor:
            return f"{sig(r / factor)}{suffix}"
    return f"{n:g}"


def tokens_short(n: int) -> str:
    """A context length as model cards write it: 131072 -> 128K, 163840 -> 160K."""
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def usd(x: float | None) -> str:
    return "n/a" if x is None else f"${x:,.3f}"
