"""The statistics behind the headline: percentiles with confidence intervals, paired tests.

- **Percentile CI** (``quantile_ci``): the distribution-free order-statistic interval. The number
  of observations below the true p-quantile is Binomial(n, p) whatever the latency distribution,
  so the sorted values at the binomial's 2.5 % and 97.5 % ranks bracket it with at least 95 %
  coverage. Exact, no resampling (a bootstrap of a P95 over 100k rows would resample 100M
  values), and honest for small n: too few values for a P95's upper bound give none.
- **Speedup CI** (``ratio_ci``): a ratio of sums, by the delta method on the log scale, from
  sums the database computes (Σx, Σy, Σx², Σy², Σxy); pairs stay pairs (shadow samples keep each
  answer with its own baseline). ``bootstrap_ratio_ci`` checks it in the tests.
- **Paired tests** of a golden run (each item answered with speculation and without): exact
  McNemar for exact match (a binary outcome per pair: only the discordant pairs carry
  information, and their split is Binomial(b + c, 1/2) under no difference), and a sign-flip
  permutation test of the mean difference for F1 and faithfulness (bounded, skewed scores with
  many ties and zero differences, tens of items: no normality to assume, exact enumeration up to
  16 non-zero pairs, seeded Monte Carlo above).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from itertools import product

Z95 = 1.959963984540054
EXACT_BINOMIAL_MAX_N = 2000
EXACT_PERMUTATION_MAX_N = 16
PERMUTATIONS = 20_000
BOOTSTRAP = 1000


def quantile(values: Iterable[float], p: float) -> float | None:
    """The p-quantile of ``values`` (0 <= p <= 1; p = 0.95 is the P95), None for no values.

    The project's one percentile rule, used by the audit report, batch reports and the
    benchmarks: sort the n values as x[0] <= ... <= x[n-1], take h = (n - 1) p, and interpolate
    linearly between the order statistics around it: x[floor(h)] + (h - floor(h)) (x[floor(h) + 1]
    - x[floor(h)]). It is PostgreSQL's ``percentile_cont`` (what the audit report's SQL computes,
    app/audit/sql.py) and numpy's default ``percentile``; a P50 of an even count is the mean of
    the middle two, a P100 the maximum.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"quantile: p must be between 0 and 1 (0.95 for a P95), not {p!r}")
    ordered = sorted(values)
    if not ordered:
        return None
    h = (len(ordered) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])


def _binomial_cdf(n: int, p: float) -> list[float]:
    """P(B <= j) for j = 0 .. n, B ~ Binomial(n, p), summed in log space (no underflow)."""
    logs = [
        math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
        + j * math.log(p) + (n - j) * math.log1p(-p)
        for j in range(n + 1)
    ]  # fmt: skip
    out, acc = [], 0.0
    for lp in logs:
        acc += math.exp(lp)
        out.append(min(acc, 1.0))
    return out


def quantile_ci(
    values: Sequence[float], p: float, level: float = 0.95
) -> tuple[float | None, float | None]:
    """(lower, upper) bounds of the p-quantile from sorted ``values`` (order statistics).

    A bound is None when there are too few values to give it at ``level`` (e.g. a P95's upper
    bound needs about 60 values).
    """
    lo, hi = quantile_ci_ranks(len(values), p, level)
    return (values[lo - 1] if lo else None), (values[hi - 1] if hi else None)


def quantile_ci_ranks(n: int, p: float, level: float = 0.95) -> tuple[int | None, int | None]:
    """1-based ranks of the order statistics bounding the p-quantile of n values (None: none)."""
    if n == 0:
        return None, None
    alpha = (1.0 - level) / 2.0
    if n <= EXACT_BINOMIAL_MAX_N:
        cdf = _binomial_cdf(n, p)
        # x_(l) (1-based) is below the quantile unless fewer than l values are: P(B <= l-1).
        lows = [j for j in range(1, n + 1) if cdf[j - 1] <= alpha]
        highs = [j for j in range(1, n + 1) if cdf[j - 1] >= 1.0 - alpha]
        lo = max(lows) if lows else None
        hi = min(highs) if highs else None
    else:
        spread = Z95 * math.sqrt(n * p * (1.0 - p))
        lo = max(1, math.floor(n * p - spread))
        hi = min(n, math.ceil(n * p + spread) + 1)
    return lo, hi


def ratio_ci(
    n: int, sx: float, sy: float, sxx: float, syy: float, sxy: float
) -> tuple[float | None, float | None, float]:
    """(lower, upper, variance of log r) of r = Σx / Σy from sums (delta method, 95 %).

    Var(r) ≈ n / (n - 1) · Σ(x - r·y)² / (Σy)², taken on the log scale so the interval stays
    positive. Needs only sums, so the database computes them over any number of rows.
    """
    if n < 2 or sx <= 0 or sy <= 0:
        return None, None, math.inf
    r = sx / sy
    resid = max(sxx - 2 * r * sxy + r * r * syy, 0.0)
    var_log = (n / (n - 1)) * resid / (sy * sy) / (r * r)
    half = Z95 * math.sqrt(var_log)
    return r * math.exp(-half), r * math.exp(half), var_log


def bootstrap_ratio_ci(
    num: Sequence[float],
    den: Sequence[float],
    *,
    other: tuple[Sequence[float], Sequence[float]] | None = None,
    resamples: int = BOOTSTRAP,
    seed: int = 0,
) -> tuple[float | None, float | None]:
    """95 % percentile-bootstrap interval of ``Σnum / Σden`` (pairs resampled together).

    With ``other`` = (num2, den2), the interval of ``(Σnum/Σden) / (Σnum2/Σden2)``, the two
    samples resampled independently (unpaired populations).
    """
    import numpy as np  # heavy enough to import only when a report needs it

    if len(num) < 2 or (other is not None and len(other[0]) < 2):
        return None, None
    rng = np.random.default_rng(seed)
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)

    def resampled(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        out = np.empty(resamples)
        step = max(1, 4_000_000 // len(x))  # rows of indices per chunk: bounded memory
        for s in range(0, resamples, step):
            idx = rng.integers(0, len(x), size=(min(step, resamples - s), len(x)))
            out[s : s + len(idx)] = x[idx].sum(axis=1) / np.maximum(y[idx].sum(axis=1), 1e-12)
        return out

    ratios = resampled(a, b)
    if other is not None:
        c, d = np.asarray(other[0], dtype=float), np.asarray(other[1], dtype=float)
        ratios = ratios / np.maximum(resampled(c, d), 1e-12)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def mcnemar_exact(pairs: Sequence[tuple[bool, bool]]) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes (1.0 with no discordance)."""
    b = sum(1 for x, y in pairs if x and not y)
    c = sum(1 for x, y in pairs if y and not x)
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, j) for j in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def sign_flip_p(diffs: Sequence[float], seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of mean(diffs) = 0."""
    nonzero = [d for d in diffs if d != 0]
    if not nonzero:
        return 1.0
    observed = abs(sum(nonzero)) - 1e-12  # a tolerance: equal sums count as "as extreme"
    if len(nonzero) <= EXACT_PERMUTATION_MAX_N:
        hits = total = 0
        for signs in product((1, -1), repeat=len(nonzero)):
            total += 1
            hits += abs(sum(s * d for s, d in zip(signs, nonzero, strict=True))) >= observed
        return hits / total
    rng = random.Random(seed)
    hits = sum(
        abs(sum(d if rng.random() < 0.5 else -d for d in nonzero)) >= observed
        for _ in range(PERMUTATIONS)
    )
    return (hits + 1) / (PERMUTATIONS + 1)


def cohen_kappa(pairs: Sequence[tuple[str, str]]) -> float | None:
    """Cohen's kappa of two raters' labels (None for no pairs, 1.0 when both agree trivially)."""
    n = len(pairs)
    if n == 0:
        return None
    labels = sorted({x for pair in pairs for x in pair})
    observed = sum(x == y for x, y in pairs) / n
    expected = sum(
        (sum(x == lab for x, _ in pairs) / n) * (sum(y == lab for _, y in pairs) / n)
        for lab in labels
    )
    if expected >= 1.0:
        return 1.0
    return (observed - expected) / (1.0 - expected)


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0  # ties share their mean rank
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (None under 3 pairs or when either side is constant)."""
    if len(x) < 3:
        return None
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    if sx == 0 or sy == 0:
        return None
    return sxy / (sx * sy)
