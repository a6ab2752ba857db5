"""Numbers as an admin reads them: plain units, thousands separators, never scientific notation.

``ms(3412.7)`` -> "3.41 s", ``ms(84.2)`` -> "84 ms", ``count(104233)`` -> "104,233",
``share(0.6831)`` -> "68.3 %", ``times(2.847)`` -> "2.85x". None prints as "n/a".
"""

from __future__ import annotations

NA = "n/a"


def ms(value: float | None) -> str:
    """A duration given in milliseconds: "840 ms" under a second, "3.41 s" / "1,234 s" above."""
    if value is None:
        return NA
    if abs(value) < 1000:
        return f"{value:,.0f} ms" if abs(value) >= 10 else f"{value:,.1f} ms"
    seconds = value / 1000
    return f"{seconds:,.2f} s" if abs(seconds) < 100 else f"{seconds:,.0f} s"


def count(value: int | float | None) -> str:
    """An integer count with thousands separators."""
    return NA if value is None else f"{round(value):,}"


def share(value: float | None) -> str:
    """A fraction as a percentage with one decimal."""
    return NA if value is None else f"{value * 100:,.1f} %"


def times(value: float | None) -> str:
    """A ratio (speedup) as "2.85x"."""
    return NA if value is None else f"{value:,.2f}x"


def number(value: float | None, digits: int = 2) -> str:
    """A plain decimal number with thousands separators (no exponent, whatever its size)."""
    if value is None:
        return NA
    if value != 0 and abs(value) < 10 ** (-digits):
        return f"{value:,.{digits + 4}f}".rstrip("0")
    return f"{value:,.{digits}f}"


def interval(lo: float | None, hi: float | None, fmt: str = "ms") -> str:
    """A 95 % interval in the unit ``fmt`` ("ms", "times"); open ends show as "?"."""
    f = {"ms": ms, "times": times, "share": share}[fmt]
    if lo is None and hi is None:
        return "CI n/a"
    return f"95 % CI {f(lo) if lo is not None else '?'} - {f(hi) if hi is not None else '?'}"
