"""k by goodput: how many tokens each step of the batch drafts (0 = no speculation).

Each step takes the k that maximises expected emitted tokens per second of the whole batch (a
lone request is a batch of one: the same rule is its per-request policy),

    goodput(k) = sum over rows of E(alpha_row, min(k, cap_row)) / T(B, k),

with E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha) the expected tokens of a round (Leviathan et
al. 2023), alpha_row the row's running acceptance (``Acceptance``), cap_row its remaining budget
and T(B, k) the seconds of a step of B rows drafting k. Rows that asked for a fixed k draft
exactly that k; only ``"auto"`` rows follow the batch. As the batch grows, T(B, k) climbs with k
and the chosen k falls, down to 0.

T(B, k) is a table per batch-size bucket (powers of two) and kind of step (with draft-model
passes, EAGLE-head passes, suffix-tree lookups, or the target alone), measured when first needed
and refined from the engine's timed steps. A table, not a line: on a CPU a pass's cost is a
staircase in its width. A suffix step runs the same passes as a target-alone step, so its table
starts from that measurement and follows its own steps (their tree lookups) from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from generation.spec_decode.cost_cache import StepCostCache


def expected_tokens(alpha: float, k: int) -> float:
    """Return E(k): expected tokens of a round when each draft is accepted with prob ``alpha``."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class Acceptance:
    """One request's running alpha: accepted / (accepted + rejections), a Bernoulli trial per
    draft position until the first rejection; counts decay per position, so a request moving
    between free text and quoting its passages is followed within a few rounds."""

    prior_alpha: float = 0.6
    """Starting estimate (recent requests of the same method, or a neutral 0.6)."""
    prior_weight: float = 2.0
    """How many draft positions' worth of evidence the prior counts for."""
    decay: float = 0.9
    """Decay of the counts per observed draft position (about the last 10 matter)."""
    accepted: float = 0.0
    rejected: float = 0.0
    total_accepted: int = 0
    total_rejected: int = 0

    @property
    def alpha(self) -> float:
        """Current estimate of the per-token acceptance probability."""
        a = self.accepted + self.prior_weight * self.prior_alpha
        return a / (self.accepted + self.rejected + self.prior_weight)

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """Record a round: ``num_accepted`` leading drafts of ``num_draft_tokens`` were kept."""
        if num_draft_tokens == 0:
            return
        rejection = 1 if num_accepted < num_draft_tokens else 0
        forget = self.decay ** (num_accepted + rejection)
        self.accepted = forget * self.accepted + num_accepted
        self.rejected = forget * self.rejected + rejection
        self.total_accepted += num_accepted
        self.total_rejected += rejection

    def request_alpha(self) -> float | None:
        """Return alpha as seen over the whole request (undecayed), or None without evidence."""
        seen = self.total_accepted + self.total_rejected
        return self.total_accepted / seen if seen else None


@dataclass
class RecentAcceptance:
    """What recent requests of one method saw: an exponential average of their alpha."""

    alpha: float = 0.6
    weight: float = 0.3
    """Share of the newest request in the average."""

    def update(self, request_alpha: float | None) -> None:
        """Fold in a finished request's alpha (ignored when it drafted nothing)."""
        if request_alpha is not None:
            self.alpha = (1.0 - self.weight) * self.alpha + self.weight * request_alpha


@dataclass
class CostModel:
    """Seconds of a step by k (``measured[k]``, k = 0 .. k_max), following the observed steps.

    Each k's estimate blends the decayed mean of its own steps with the measurement scaled by
    the load (observed / measured over every k seen): a busy machine scales the whole table, a k
    never tried keeps its measured shape, a k tried often is known from its own steps."""

    measured: list[float]
    prior_weight: float = 4.0
    """How many observed steps of a k the measurement counts for."""
    decay: float = 0.99
    """Per-step decay of observed steps (about the last 100 matter)."""
    _count: list[float] = field(default_factory=list, init=False, repr=False)
    _total: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.measured or any(t <= 0 for t in self.measured):
            raise ValueError(f"measured: need positive step costs, got {self.measured}")
        self._count = [0.0] * len(self.measured)
        self._total = [0.0] * len(self.measured)

    def observe(self, k: int, seconds: float) -> None:
        """Record the wall time of a step that drafted up to ``k`` tokens."""
        if not 0 <= k < len(self.measured):
            return
        self._count = [self.decay * n for n in self._count]
        self._total = [self.decay * t for t in self._total]
        self._count[k] += 1.0
        self._total[k] += seconds

    def _estimate(self, k: int) -> float:
        seen = sum(n * m for n, m in zip(self._count, self.measured, strict=True))
        load = sum(self._total) / seen if seen > 0 else 1.0
        prior = self.measured[k] * load
        return (self._total[k] + self.prior_weight * prior) / (self._count[k] + self.prior_weight)

    def relative(self, k: int) -> float:
        """Return the cost of a step drafting ``k`` relative to a step drafting none."""
        return self._estimate(k) / self._estimate(0)


def bucket(batch_size: int) -> int:
    """Return the power of two at or above ``batch_size``: the cost table's batch sizes."""
    return 1 << (batch_size - 1).bit_length()


def buckets_up_to(batch_size: int) -> tuple[int, ...]:
    """Every cost-table batch size a batch of at most ``batch_size`` rows can fall in."""
    return tuple(1 << i for i in range(bucket(batch_size).bit_length()))


StepTimer = Callable[[int, list[int], bool], dict[int, float]]
"""(batch_size, ks, with_draft_model) -> seconds of one step for each k."""

DENSE_KS = 8
"""Every k up to this one is timed (a line through a few points misses the staircase)."""


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
    tables: dict[tuple[int, bool | str], CostModel] = field(default_factory=dict)
    """(bucket, kind) -> its table; kind: True (draft-model passes), False (the target alone),
    "eagle" or "suffix"."""

    eagle_timer: Callable[[int, list[int]], dict[int, float]] | None = None
    """(batch_size, ks) -> seconds of a step whose drafts are an EAGLE head's passes."""

    cache: StepCostCache | None = None
    """Tables measured earlier for this engine (a one-shot process loads them instead of timing;
    generation/spec_decode/cost_cache.py); None: always measured."""

    def key(
        self,
        batch_size: int,
        with_draft: bool,
        with_eagle: bool = False,
        with_suffix: bool = False,
    ) -> tuple[int, bool | str]:
        """The table of steps of ``batch_size`` rows: (bucket, with_draft), (bucket, "eagle")
        for steps drafting with an EAGLE head, or (bucket, "suffix") for steps with suffix rows
        (a batch with model-drafted rows too is priced by that model's table)."""
        eagle = with_eagle and not with_draft and self.eagle_timer is not None
        if eagle:
            return (bucket(batch_size), "eagle")
        if with_suffix and not with_draft and not with_eagle:
            return (bucket(batch_size), "suffix")
        return (bucket(batch_size), with_draft)

    def table(
        self,
        batch_size: int,
        with_draft: bool,
        with_eagle: bool = False,
        with_suffix: bool = False,
    ) -> CostModel:
        """Return the cost table of the bucket of ``batch_size`` (loaded from ``cache``, else
        measured, the first time)."""
        key = self.key(batch_size, with_draft, with_eagle, with_suffix)
        if key not in self.tables:
            name = f"{key[0]}:{key[1]}"
            measured = self.cache.load(name, self.k_max + 1) if self.cache else None
            if measured is None and key[1] == "suffix":
                # The same passes as the target alone: start from that table's measurement.
                measured = list(self.table(batch_size, False).measured)
            if measured is None:
                if key[1] == "eagle":
                    assert self.eagle_timer is not None
                    points = self.eagle_timer(key[0], measured_ks(self.k_max))
                else:
                    points = self.timer(key[0], measured_ks(self.k_max), with_draft)
                measured = interpolate(points, self.k_max)
                if self.cache is not None:
                    self.cache.save(name, measured)
            self.tables[key] = CostModel(measured)
        return self.tables[key]

    def observe(
        self,
        batch_size: int,
        with_draft: bool,
        with_eagle: bool,
        k: int,
        seconds: float,
        with_suffix: bool = False,
    ) -> None:
        """Record a step's wall time in its table, if that table is in use (a batch of fixed-k
        rows never needs one, and is not made to measure one just to record its steps)."""
        table = self.tables.get(self.key(batch_size, with_draft, with_eagle, with_suffix))
        if table is not None:
            table.observe(k, seconds)


@dataclass
class RowPlan:
    """What the policy needs of one row."""

    alpha: float
    cap: int
    """Most draft tokens the row may take this step (budget; 0 for method ``none``)."""
    fixed_k: int | None
    """The row's own k, or None when it follows the batch (``"auto"``)."""
    uses_draft_model: bool
    uses_eagle: bool = False
    uses_suffix: bool = False


def row_k(row: RowPlan, k: int) -> int:
    """Return the drafts row ``row`` takes when the batch's k is ``k``."""
    own = k if row.fixed_k is None else row.fixed_k
    return max(0, min(own, row.cap))


def choose_k(rows: list[RowPlan], costs: StepCosts) -> int:
    """Return the batch's k in [0, k_max] with the highest expected tokens per second."""
    if not any(r.fixed_k is None and r.cap > 0 for r in rows):
        return 0
    # One table for every k: a batch with draft-model rows prices their passes at every k > 0.
    table = costs.table(
        len(rows),
        any(r.uses_draft_model for r in rows),
        any(r.uses_eagle for r in rows),
        any(r.uses_suffix for r in rows),
    )
    best_k, best = 0, -1.0
    for k in range(costs.k_max + 1):
        ks = [row_k(r, k) for r in rows]
        tokens = sum(
            expected_tokens(min(r.alpha, 0.999), rk) for r, rk in zip(rows, ks, strict=True)
        )
        # A fixed k above k_max (allowed: any k is served) is priced as k_max.
        rate = tokens / table.relative(min(max(ks), costs.k_max))
        if rate > best * 1.0001:  # ties go to the smaller k
            best_k, best = k, rate
    return best_k
