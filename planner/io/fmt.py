"""Human formatting of SI quantities, for the CLI and reports only (the core stays in SI)."""

from __future__ import annotations

GIB = 1024**3


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:,.2f} GiB"


def si(value: float | None, unit: str, *, digits: int = 3) -> str:
    """1.23e12, "FLOP/s" -> "1.23 TFLOP/s" (decimal prefixes)."""
    if value is None:
        return "n/a"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


def seconds(t: float | None) -> str:
    if t is None:
        return "n/a"
    if t >= 1:
        return f"{t:,.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


def pct(frac: float | None) -> str:
    return "n/a" if frac is None else f"{frac * 100:.1f}%"


def count(n: float) -> str:
    """Parameter-style counts: 8.03B, 124M."""
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= factor:
            return f"{n / factor:.3g}{suffix}"
    return f"{n:g}"


def tokens_short(n: int) -> str:
    """A context length as model cards write it: 131072 -> 128K, 163840 -> 160K."""
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def usd(x: float | None) -> str:
    return "n/a" if x is None else f"${x:,.3f}"
