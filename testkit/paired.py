"""Comparing service variants run on one shared machine: a fair order, paired ratios, an interval.

A shared 2-core machine drifts (other jobs start and stop) by more than the few percent a
variant may cost, so variants are never compared across time. Each round runs every arm twice
in a palindrome (A B C C B A), the rotation changing per round so that every arm takes every
position equally often: a drift linear over the round hits every arm alike. A round yields one
ratio per arm against the reference arm; the figure is the median of the rounds' ratios with a
distribution-free interval for that median (the sign test's: no assumption about the noise's
shape, which on a shared machine is anything but normal).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from math import comb


def palindrome(arms: Sequence[str], round_: int) -> list[str]:
    """Round ``round_``'s order: the arms rotated by the round number, then the same backwards."""
    k = round_ % len(arms)
    rotated = [*arms[k:], *arms[:k]]
    return rotated + rotated[::-1]


def sign_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(low, high, coverage): the order statistics that bracket the median of ``values``' source
    with at least ``confidence`` (the sign test's interval), and their exact coverage.

    With fewer values than the confidence needs (5 for 95%), the whole range, coverage below it.
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("no values")

    def below(k: int) -> float:  # P(Binomial(n, 1/2) < k): the chance the k-th smallest is above
        return sum(comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= n // 2 and 1 - 2 * below(k + 1) >= confidence:
        k += 1
    return xs[k - 1], xs[n - k], 1 - 2 * below(k)


def summary(ratios: Sequence[float], confidence: float = 0.95) -> dict[str, float]:
    """The median of per-round ratios, its sign-test interval and that interval's coverage."""
    low, high, coverage = sign_interval(ratios, confidence)
    return {
        "median": statistics.median(ratios),
        "low": low,
        "high": high,
        "coverage": round(coverage, 4),
        "rounds": len(ratios),
    }
