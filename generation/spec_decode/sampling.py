"""Sampling at a temperature: the one rule every draw of the engine follows.

Temperature 0 is greedy (argmax, ties to the lowest id); above it a token is drawn from
``softmax(logits / temperature)`` with the request's own generator, so a seeded request draws
the same numbers in any company. The target's first token, the draft model's sampled drafts and
the rejection sampler's target law all come from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def temperature_probs(
    logits: torch.Tensor,  # [..., vocab_size]
    temperature: float,
) -> torch.Tensor:
    """Return ``softmax(logits / temperature)`` [..., vocab_size] in float32 (temperature > 0)."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample_with_probs(
    logits: torch.Tensor,  # [vocab_size]
    temperature: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (a token [1] drawn at ``temperature`` > 0, the distribution it came from [vocab])."""
    probs = temperature_probs(logits, temperature)
    return torch.multinomial(probs, 1, generator=generator), probs


def draft_position(
    logits: torch.Tensor,  # [R, vocab_size]: each row's logits at this draft position
    rows: Sequence[Any],
    ks: list[int],
    position: int,
    drafted: list[list[torch.Tensor]],
    probs: list[list[torch.Tensor]],
) -> torch.Tensor:
    """Append each row's draft token at ``position`` to ``drafted`` (and, for a sampled row
    still within its own k, the distribution it came from to ``probs``); return the tokens as
    the next draft pass's input ids [R, 1].

    Greedy rows, and rows past their k (their extra tokens are cut off later), take the argmax;
    the others sample at their temperature with their own generator. One rule for every
    proposer that drafts with a model (generation/spec_decode/proposers.py, generation/spec_decode/eagle.py).
    """
    greedy = logits.argmax(dim=-1, keepdim=True)  # [R, 1]
    for i, seq in enumerate(rows):
        if position >= ks[i] or seq.temperature == 0.0:
            drafted[i].append(greedy[i])
            continue
        token, p = sample_with_probs(logits[i], seq.temperature, seq.generator)
        drafted[i].append(token)
        probs[i].append(p)  # [vocab]
    return torch.stack([t[-1] for t in drafted])  # [R, 1]


def sample_from_logits(
    logits: torch.Tensor,  # [vocab_size]
    temperature: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Return the next token [1]: argmax at temperature 0, else a draw from softmax(logits / T)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    return sample_with_probs(logits, temperature, generator)[0]
