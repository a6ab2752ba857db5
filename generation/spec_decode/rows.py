"""What a proposer reads of a running request: the row protocol the engine's sequences satisfy.

The proposers sit below the engine: they take rows of this shape, and the engine's ``Sequence``
(generation/engine/sequence.py) is one, so spec_decode never imports the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from generation.params import SamplingParams
    from generation.spec_decode.ngram import NgramProposer
    from generation.spec_decode.suffix import SuffixProposer


class DraftRow(Protocol):
    """One running request as the proposers see it."""

    tokens: list[int]
    """Prompt and output so far (the target's tokens)."""
    params: SamplingParams
    """What the request asked for (method, k, temperature, seed)."""
    slot: int
    """The request's KV slot in the draft's (or head's) runner."""
    generator: torch.Generator | None
    """The request's own random generator (seeded requests), else None."""
    ngram: NgramProposer | None
    """Prompt lookup's index over ``tokens`` (method ngram), else None."""
    suffix: SuffixProposer | None
    """The request's suffix trees (method suffix), else None."""
    features: torch.Tensor | None
    """[n, hidden] target features the EAGLE head has not consumed yet, else None."""
    head_base: int
    """Target position of the EAGLE head's first slot entry."""

    @property
    def temperature(self) -> float:
        """0.0 for greedy rows."""
        ...
