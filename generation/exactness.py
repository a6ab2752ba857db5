"""Greedy exactness where rounding is not bit-exact (bfloat16): which divergences are near-ties.

In float32 the engine's greedy output is the target's own, token for token. In bfloat16 the same
logits computed in another shape (a verification pass of k + 1 tokens, a batch of other rows)
round differently, so where the target's top two logits are within that rounding, two exact
computations may pick different tokens. A divergence is *excused* only there: at the first
position where an output differs from the reference (``none``) run, the reference's top-2 gap
must be within ``tolerance``, a multiple of the rounding measured on this very run (the
reference's logits against the same tokens recomputed in one pass; or, comparing two dtypes,
recomputed in the other dtype), and the token the other output chose there must be within it of
the top too (one of the tied tokens, not any token). A divergence at a clear margin is a bug,
whatever the dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from generation.model.forward import Forward
from generation.model.model_runner import ModelRunner

SLACK = 4.0
"""Tolerance in multiples of the rounding measured between two shapes of the same pass."""


@dataclass(frozen=True)
class Divergence:
    """Where an output first leaves the reference run, and how close the reference was there."""

    position: int
    """Index in the output of the first differing token."""
    gap: float
    """Reference run's top-1 minus top-2 logit at ``position``."""
    tolerance: float
    """Largest gap excused as rounding (``SLACK`` x the rounding measured on the run)."""
    lag: float | None = None
    """Reference run's top-1 logit minus the logit of the token ``other`` chose at ``position``
    (None where ``other`` ended there)."""

    @property
    def excused(self) -> bool:
        """Whether the reference was a near-tie there (within bf16 rounding) and ``other`` chose
        one of the tied tokens: a token far below the top is a bug even at a near-tie."""
        near = self.gap <= self.tolerance
        return near and (self.lag is None or self.lag <= self.tolerance)


def first_divergence(reference: list[int], other: list[int]) -> int | None:
    """Index of the first token where the outputs differ (a length difference counts)."""
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


def _logits(fwd: Forward, prompt: list[int], tokens: list[int], one_by_one: bool) -> torch.Tensor:
    """Logits [len(tokens), vocab] (float32) that chose each of ``tokens`` after ``prompt``."""
    runner = ModelRunner(fwd, 1, len(prompt) + len(tokens) + 1)
    device = fwd.device
    with torch.inference_mode():
        out = [runner.prefill(0, prompt)]
        if one_by_one:  # as a lone request decodes: one token per pass
            for t in tokens[:-1]:
                ids = torch.tensor([[t]], dtype=torch.long, device=device)
                out.append(runner.run([0], ids, [1], last_only=True)[0])
        elif len(tokens) > 1:  # the same positions in one pass, as a verification computes them
            ids = torch.tensor([tokens[:-1]], dtype=torch.long, device=device)
            out.extend(runner.run([0], ids, [len(tokens) - 1])[0])
    return torch.stack(out)


def check_greedy(
    fwd: Forward,
    prompt: list[int],
    reference: list[int],
    other: list[int],
    slack: float = SLACK,
    other_fwd: Forward | None = None,
) -> Divergence | None:
    """Return where ``other`` first leaves ``reference`` (the ``none`` run's greedy tokens after
    ``prompt`` on the target ``fwd``), with the reference's top-2 gap there; None if identical.

    ``other_fwd``: ``other`` came from these numerics (the same target in another dtype); the
    rounding is then measured between the two on the reference's tokens, not between shapes."""
    position = first_divergence(reference, other)
    if position is None or position >= len(reference):
        return None if position is None else Divergence(position, float("inf"), 0.0)
    tokens = reference[: position + 1]
    sequential = _logits(fwd, prompt, tokens, one_by_one=True)
    if other_fwd is not None:
        chunked = _logits(other_fwd, prompt, tokens, one_by_one=True)
    else:
        chunked = _logits(fwd, prompt, tokens, one_by_one=False)
    top2 = sequential[position].topk(2).values
    rounding = (sequential - chunked).abs().max().item()
    ulp = 2.0**-8 * top2[0].abs().item()  # one bf16 rounding of the top logit itself
    lag = None
    if position < len(other):  # how far below the top the token ``other`` chose there was
        lag = (top2[0] - sequential[position, other[position]]).item()
    return Divergence(position, (top2[0] - top2[1]).item(), slack * max(rounding, ulp), lag)
