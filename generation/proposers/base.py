"""The proposer interface: whatever drafts tokens for the target to verify."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Draft:
    """Draft tokens of one round and the distribution each was drawn from."""

    token_ids: torch.Tensor
    """[num_draft_tokens] int64 on the engine's device; may be shorter than k, or empty."""
    probs: torch.Tensor | None
    """[num_draft_tokens, vocab_size] draft probabilities; None means one-hot on the tokens."""


class Proposer(Protocol):
    """Drafts up to k tokens that continue the sequence; one instance serves one request.

    The engine owns the sequence (``tokens``: prompt plus emitted tokens, host side) and tells
    the proposer when it grew, so a proposer with state (a draft KV cache) can roll it back.
    """

    def begin(self, tokens: list[int]) -> None:
        """Start a request whose sequence so far is ``tokens`` (the prompt, maybe one more)."""
        ...

    def propose(
        self, tokens: list[int], k: int, temperature: float, generator: torch.Generator | None
    ) -> Draft:
        """Return at most ``k`` draft tokens continuing ``tokens``."""
        ...

    def rollback(self, tokens: list[int], num_draft_tokens: int, num_accepted: int) -> None:
        """The round ended: ``tokens`` now holds the accepted drafts and the target's token."""
        ...
