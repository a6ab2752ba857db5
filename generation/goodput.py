"""k by goodput: how many tokens each step of the batch drafts (0 = no speculation).

Each step the batch engine picks the k that maximises expected emitted tokens per second of
the whole batch,

    goodput(k) = sum over rows of E(alpha_row, min(k, cap_row)) / T(B, k),

with E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha) (generation/adaptive.py), each row's alpha
its own running estimate (seeded by recent requests of its method), cap_row its remaining
budget, and T(B, k) the seconds of a step of B rows that drafts k tokens (a target pass over
k + 1 tokens per row plus k draft-model passes when a row drafts with the model). Rows that
asked for a fixed k draft exactly that k (so their output and stats are what they get alone);
only ``"auto"`` rows follow the batch's choice. As the batch grows the target pass turns from
per-call overhead into arithmetic, T(B, k) climbs with k, and the chosen k falls, down to 0.

T(B, k) is a table per batch-size bucket (powers of two) and per kind of step (with or
without draft-model passes), measured once when first needed (or at warm-up) and refined from
the engine's own timed steps: it is ``adaptive.CostModel`` with its index shifted by one
(entry k + 1 prices k drafts), which blends the measurement with observed steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from generation.adaptive import CostModel, expected_tokens


def bucket(batch_size: int) -> int:
    """Return the power of two at or above ``batch_size``: the cost table's batch sizes."""
    size = 1
    while size < batch_size:
        size *= 2
    return size


StepTimer = Callable[[int, list[int], bool], dict[int, float]]
"""(batch_size, ks, with_draft_model) -> seconds of one step for each k."""

DENSE_KS = 8
"""Every k up to this one is timed: a step's cost is a staircase in k (on this CPU a 16-row
step costs 34, 44, 46, 64 and 108-157 ms at k = 1, 2, 3, 4, 6), and a line between k = 4 and 8
priced k = 6 at 1.55x k = 3 where it cost 2.3-3.4x, so goodput chose it."""


def measured_ks(k_max: int) -> list[int]:
    """Return the k whose steps are timed: every k up to ``DENSE_KS``, then powers of two and
    ``k_max`` (the others are interpolated)."""
    sparse = [2**i for i in range(4, 8) if DENSE_KS < 2**i < k_max]
    return sorted({*range(min(k_max, DENSE_KS) + 1), *sparse, k_max})


def interpolate(points: dict[int, float], k_max: int) -> list[float]:
    """Return values for k = 0 .. k_max, linear between the measured ``points``."""
    known = sorted(points)
    values = []
    for k in range(k_max + 1):
        lo = max((p for p in known if p <= k), default=known[0])
        hi = min((p for p in known if p >= k), default=known[-1])
        if hi == lo:
            values.append(points[lo])
        else:
            values.append(points[lo] + (points[hi] - points[lo]) * (k - lo) / (hi - lo))
    return values


@dataclass
class StepCosts:
    """T(B, k): seconds of a batch step, per batch-size bucket, measured when first needed."""

    timer: StepTimer
    k_max: int
    tables: dict[tuple[int, bool], CostModel] = field(default_factory=dict)

    def table(self, batch_size: int, with_draft: bool) -> CostModel:
        """Return the cost table of the bucket of ``batch_size`` (measuring it the first time)."""
        key = (bucket(batch_size), with_draft)
        if key not in self.tables:
            points = self.timer(key[0], measured_ks(self.k_max), with_draft)
            self.tables[key] = CostModel([0.0, *interpolate(points, self.k_max)])
        return self.tables[key]

    def cost(self, batch_size: int, k: int, with_draft: bool) -> float:
        """Return T(B, k) relative to T(B, 0) of the same bucket."""
        return self.table(batch_size, with_draft).round_cost(k + 1)

    def observe(self, batch_size: int, k: int, with_draft: bool, seconds: float) -> None:
        """Record the wall time of a step of ``batch_size`` rows that drafted up to ``k``."""
        self.table(batch_size, with_draft).observe(k + 1, seconds)


@dataclass
class RowPlan:
    """What the policy needs of one row."""

    alpha: float
    """Estimated per-token acceptance probability."""
    cap: int
    """Most draft tokens the row may take this step (budget; 0 for method ``none``)."""
    fixed_k: int | None
    """The row's own k, or None when it follows the batch (``"auto"``)."""
    uses_draft_model: bool


def row_k(row: RowPlan, k: int) -> int:
    """Return the drafts row ``row`` takes when the batch's k is ``k``."""
    own = k if row.fixed_k is None else row.fixed_k
    return max(0, min(own, row.cap))


def choose_k(rows: list[RowPlan], costs: StepCosts) -> int:
    """Return the batch's k in [0, k_max] with the highest expected tokens per second."""
    if not any(r.fixed_k is None and r.cap > 0 for r in rows):
        return 0
    # One table for every k: a batch with draft-model rows prices their passes at every k > 0.
    with_draft = any(r.uses_draft_model for r in rows)
    best_k, best = 0, -1.0
    for k in range(costs.k_max + 1):
        ks = [row_k(r, k) for r in rows]
        tokens = sum(
            expected_tokens(min(r.alpha, 0.999), rk) for r, rk in zip(rows, ks, strict=True)
        )
        rate = tokens / costs.cost(len(rows), max(ks), with_draft)
        if rate > best * 1.0001:  # ties go to the smaller k
            best_k, best = k, rate
    return best_k
