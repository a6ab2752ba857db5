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
The costs r_k and c depend on hardware and load: measured once per engine, then refined from the
wall time of the engine's own rounds (``CostModel``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CostModel:
    """Cost of a round with k >= 1 drafts, r_k + k * c, on a line 1 + slope * k.

    Only ratios between k >= 1 matter to the policy, so the line's unit is its own intercept
    (about a one-token target pass on a GPU; more on a CPU, where passes over several tokens
    take a slower kernel path).

    Starts from a one-time measurement (``target_slope``, ``proposer_cost``) and then follows
    the wall time of the engine's own rounds: a least-squares line ``seconds = a + b * k`` over
    recent rounds gives the slope b / a, blended with the measured one in proportion to how much
    the observed k varied (a policy that always picks the same k says nothing about the slope).
    Rounds are timed anyway (the accepted count reaches the host once per round), so this costs
    no device synchronisation, and it tracks a machine whose load changes.
    """

    target_slope: float = 0.12
    """Measured extra cost of each verified token, relative to the line's intercept."""
    proposer_cost: float = 0.0
    """Measured cost of one proposer step, relative to the intercept (0 for n-gram lookup)."""
    prior_weight: float = 4.0
    """How much evidence (rounds x variance of k) the one-time measurement counts for."""
    decay: float = 0.99
    """Per-round decay of observed rounds: about the last 100 rounds matter."""
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5, init=False, repr=False)
    """Decayed sums over observed rounds: weight, k, k^2, seconds, k * seconds."""

    def observe(self, k: int, seconds: float) -> None:
        """Record the wall time of a round that verified ``k`` draft tokens."""
        w, sk, skk, st, skt = (self.decay * v for v in self._sums)
        self._sums = [w + 1.0, sk + k, skk + k * k, st + seconds, skt + k * seconds]

    @property
    def slope(self) -> float:
        """Return (r_k + k c - 1) / k: the relative cost of each extra drafted token."""
        prior = self.target_slope + self.proposer_cost
        w, sk, skk, st, skt = self._sums
        if w < 2.0:
            return prior
        mean_k, mean_t = sk / w, st / w
        var_k = skk / w - mean_k**2
        if var_k <= 1e-9:
            return prior
        b = (skt / w - mean_k * mean_t) / var_k
        a = mean_t - b * mean_k
        if a <= 0.0:
            return prior
        evidence = w * var_k
        observed = max(0.0, b / a)
        return (evidence * observed + self.prior_weight * prior) / (evidence + self.prior_weight)

    def round_cost(self, k: int) -> float:
        """Return r_k + k * c, the cost of a round with k drafts in one-token target passes."""
        return 1.0 + self.slope * k


def expected_tokens(alpha: float, k: int) -> float:
    """Return E(k): expected tokens per round when each draft is accepted with prob ``alpha``."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_k(alpha: float, cost: CostModel, k_max: int) -> int:
    """Return the k in [1, k_max] with the highest expected speedup E(k) / cost(k)."""
    return max(range(1, k_max + 1), key=lambda k: expected_tokens(alpha, k) / cost.round_cost(k))


@dataclass
class AdaptiveK:
    """Per-request controller: ``next_k()`` before a round, ``observe()`` after it."""

    cost: CostModel
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
