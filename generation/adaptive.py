"""Adaptive speculation length: ``num_speculative_tokens="auto"``.

Policy. Each round drafts the k in [1, k_max] that maximises the expected speedup of the
standard model of speculative decoding (Leviathan et al. 2023),

    S(k) = E(k) / (r_k + k * c),   E(k) = (1 - alpha^(k+1)) / (1 - alpha),

where alpha is the per-token acceptance probability, r_k the cost of a target pass over k+1
tokens relative to one token, and c the cost of one proposer step relative to a target pass.
alpha is estimated from the request so far: with acceptance a Bernoulli(alpha) trial per draft
position until the first rejection, the estimate is accepted / (accepted + rejections). Counts
decay by ``decay`` per observed position, so a request that moves between free text (low alpha) and quoting
its passages (high alpha) is followed within a few rounds. Before the request has evidence the
estimate starts from what recent requests of the same method saw (kept on the engine).

Why: the best fixed k depends on alpha, which differs by request (a quoting answer accepts far
more than free text) and by method; a static k is right for one of them and wrong for the rest,
while S(k) with a live alpha picks small k when drafts fail and long drafts when they succeed.
The costs r_k and c depend on hardware and load: measured once per engine for every k (a table:
on a CPU r_k is a staircase, not a line), then refined from the wall time of the engine's own
rounds (``CostModel``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CostModel:
    """Cost of a round with k drafts, r_k + k * c, as a table over k = 1 .. k_max.

    A table, not a line: on a CPU the cost of a target pass over k + 1 tokens is a staircase
    (matrix-vector for 1 token, then matrix-product kernels whose cost jumps at a few widths:
    measured 2 tokens 1.3x a 1-token pass, 3 tokens 1.5x, 5 tokens 1.5x, 9 tokens 1.7x), and a
    line through it made the policy mix k = 2 with k = 4 where k = 3 alone won.

    Starts from a one-time measurement (``measured[k]``: seconds of a target pass over k + 1
    tokens plus k proposer steps) and follows the wall time of the engine's own rounds: each k's
    estimate is the decayed mean of its observed rounds, blended with the measurement scaled by
    the load factor (observed / measured over every k seen), in proportion to how many rounds of
    that k were seen. So a busy machine scales the whole table, a k never tried keeps its
    measured shape, and a k tried often is known from its own rounds.  Rounds are timed anyway
    (the accepted count reaches the host once per round): no extra device synchronisation.
    """

    measured: list[float]
    """measured[k]: seconds of a round with k drafts, k = 1 .. k_max ([0] is not priced)."""
    prior_weight: float = 4.0
    """How many observed rounds of a k the measurement counts for."""
    decay: float = 0.99
    """Per-round decay of observed rounds: about the last 100 rounds matter."""
    _count: list[float] = field(default_factory=list, init=False, repr=False)
    _total: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.measured) < 2 or any(t <= 0 for t in self.measured[1:]):
            raise ValueError(f"measured: need positive round costs for k >= 1, got {self.measured}")
        self._count = [0.0] * len(self.measured)
        self._total = [0.0] * len(self.measured)

    @classmethod
    def linear(
        cls, target_slope: float, proposer_cost: float, k_max: int = 8, **kw: float
    ) -> CostModel:
        """The table of r_k + k c = 1 + (target_slope + proposer_cost) k (a one-token pass = 1)."""
        return cls(
            [0.0] + [1.0 + (target_slope + proposer_cost) * k for k in range(1, k_max + 1)], **kw
        )

    @property
    def k_max(self) -> int:
        """Largest k the table covers."""
        return len(self.measured) - 1

    def observe(self, k: int, seconds: float) -> None:
        """Record the wall time of a round that verified ``k`` draft tokens."""
        if not 1 <= k <= self.k_max:
            return
        self._count = [self.decay * n for n in self._count]
        self._total = [self.decay * t for t in self._total]
        self._count[k] += 1.0
        self._total[k] += seconds

    def _load(self) -> float:
        seen = sum(self._count[k] * self.measured[k] for k in range(1, len(self.measured)))
        return sum(self._total) / seen if seen > 0 else 1.0

    def _estimate(self, k: int) -> float:
        prior = self.measured[k] * self._load()
        return (self._total[k] + self.prior_weight * prior) / (self._count[k] + self.prior_weight)

    def round_cost(self, k: int) -> float:
        """Return the cost of a round with k drafts relative to a round with one draft."""
        if not 1 <= k <= self.k_max:
            raise ValueError(f"k: must be in [1, {self.k_max}], got {k}")
        return self._estimate(k) / self._estimate(1)


def expected_tokens(alpha: float, k: int) -> float:
    """Return E(k): expected tokens per round when each draft is accepted with prob ``alpha``."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_k(alpha: float, cost: CostModel, k_max: int) -> int:
    """Return the k in [1, k_max] with the highest expected speedup E(k) / cost(k)."""
    top = min(k_max, cost.k_max)
    return max(range(1, top + 1), key=lambda k: expected_tokens(alpha, k) / cost.round_cost(k))


@dataclass
class AdaptiveK:
    """Per-request controller: ``next_k()`` before a round, ``observe()`` after it."""

    cost: CostModel | None
    """Round costs (None when only the acceptance estimate is used, as the batch engine does)."""
    k_max: int = 8
    """Longest draft ever asked for."""
    prior_alpha: float = 0.6
    """Starting estimate of alpha (recent requests of the same method, or a neutral 0.6)."""
    prior_weight: float = 2.0
    """How many draft positions' worth of evidence the prior counts for."""
    decay: float = 0.9
    """Decay of the counts per observed draft position: about the last 10 positions matter."""
    accepted: float = field(default=0.0, init=False)
    rejected: float = field(default=0.0, init=False)
    total_accepted: int = field(default=0, init=False)
    total_rejected: int = field(default=0, init=False)

    @property
    def alpha(self) -> float:
        """Current estimate of the per-token acceptance probability."""
        a = self.accepted + self.prior_weight * self.prior_alpha
        return a / (self.accepted + self.rejected + self.prior_weight)

    def next_k(self) -> int:
        """Return the speculation length for the next round."""
        if self.cost is None:
            raise ValueError("AdaptiveK.next_k: no cost model to choose k with")
        return best_k(min(self.alpha, 0.999), self.cost, self.k_max)

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """Record a round: ``num_accepted`` leading drafts of ``num_draft_tokens`` were kept."""
        if num_draft_tokens == 0:
            return
        rejection = 1 if num_accepted < num_draft_tokens else 0
        # Decay per observation, not per round: a long accepted round must not outweigh the
        # next rounds' rejections for long.
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
