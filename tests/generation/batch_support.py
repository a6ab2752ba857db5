"""Helpers of the batching tests: greedy references and the tie rule for divergences."""

from __future__ import annotations

import random
from typing import Any

import torch

from generation import SamplingParams
from tests.generation.tiny_models import reference_greedy

TIE_GAP = 1e-4
"""A greedy divergence is acceptable only where the target's top-2 logits are this close."""

METHOD_KS: list[tuple[str, int | str]] = [
    ("draft_model", 1),
    ("draft_model", 2),
    ("draft_model", 4),
    ("draft_model", "auto"),
    ("ngram", 3),
    ("ngram", "auto"),
    ("none", 1),
]


def top2_gap(model: Any, ids: list[int]) -> float:
    """Return the gap between the target's two largest next-token logits after ``ids``."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def check_greedy(model: Any, prompt: list[int], got: list[int], expected: list[int]) -> str:
    """Assert ``got`` is the target's greedy output; return "" or a note of a numerical tie.

    Only a divergence at a position where the target's top-2 logits are within ``TIE_GAP`` is
    tolerated (batched and single passes round differently), and the note says where.
    """
    if got == expected:
        return ""
    i = next(
        (j for j, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
        min(len(got), len(expected)),
    )
    assert i < min(len(got), len(expected)), f"lengths differ: {len(got)} vs {len(expected)}"
    gap = top2_gap(model, prompt + expected[:i])
    assert gap < TIE_GAP, (
        f"greedy divergence at token {i} (top-2 gap {gap:.2e}): {got} vs {expected}"
    )
    return f"tie at token {i} of prompt {prompt[:4]}... (top-2 gap {gap:.1e})"


def mixed_requests(
    vocab: int, count: int, seed: int, max_new: tuple[int, ...] = (5, 12, 20)
) -> tuple[list[list[int]], list[SamplingParams]]:
    """Return ``count`` prompts of varied length (some repeating a passage) and mixed params."""
    rng = random.Random(seed)
    prompts, params = [], []
    for i in range(count):
        length = rng.choice((3, 8, 17, 30))
        prompt = [rng.randrange(vocab) for _ in range(length)]
        if i % 3 == 0:
            prompt = prompt + prompt[: max(2, length // 2)]
        method, k = METHOD_KS[(i + seed) % len(METHOD_KS)]
        prompts.append(prompt)
        params.append(
            SamplingParams(
                max_new_tokens=rng.choice(max_new), method=method, num_speculative_tokens=k
            )
        )
    return prompts, params


class References:
    """Cached transformers greedy continuations of one target."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def __call__(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        key = (tuple(prompt), max_new_tokens)
        if key not in self._cache:
            self._cache[key] = reference_greedy(self.model, prompt, max_new_tokens)
        return self._cache[key]
