"""Sampling at a temperature: the one rule every draw of the engine follows.

Temperature 0 is greedy (argmax, ties to the lowest id); above it a token is drawn from
``softmax(logits / temperature)`` with the request's own generator, so a seeded request draws
the same numbers in any company. The target's first token, the draft model's sampled drafts and
the rejection sampler's target law all come from here.
"""

from __future__ import annotations

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


def sample_from_logits(
    logits: torch.Tensor,  # [vocab_size]
    temperature: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Return the next token [1]: argmax at temperature 0, else a draw from softmax(logits / T)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    return sample_with_probs(logits, temperature, generator)[0]
