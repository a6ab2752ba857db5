"""Measured costs of the speculative decoding model: r_k and c, for the adaptive policy."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache

from generation.adaptive import CostModel


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forward(model: Any, context_len: int, num_tokens: int, repeats: int = 5) -> float:
    """Return the median seconds of a forward pass over ``num_tokens`` after ``context_len``."""
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    ids = torch.arange(context_len + num_tokens, device=device).remainder(vocab).view(1, -1)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=ids[:, :context_len], cache=cache, use_cache=True)
        times = []
        for _ in range(repeats + 1):  # the first pass warms up allocators and kernels
            _synchronize(device)
            start = time.perf_counter()
            model(input_ids=ids[:, context_len:], cache=cache, use_cache=True)
            _synchronize(device)
            times.append(time.perf_counter() - start)
            cache.crop(-num_tokens)
    return statistics.median(times[1:])


def measure_costs(
    target: Any,
    draft: Any | None,
    k_max: int,
    context_len: int = 64,
    timer: Callable[..., float] = time_forward,
) -> CostModel:
    """Return the round-cost line over k >= 1, measured on this hardware (a few dozen passes).

    A pass over one token takes a different kernel path from a pass over several (on CPU a
    matrix-vector product against a matrix product), so the line is fitted between the
    passes a round really makes, k + 1 = 2 and k_max + 1 tokens, not through the one-token
    pass: round(k) = A + B k + k d with A + B = target(2), B = (target(k_max+1) - target(2)) /
    (k_max - 1) and d one draft pass; relative to A that is 1 + (B/A + d/A) k.
    """
    two = timer(target, context_len, 2)
    many = timer(target, context_len, k_max + 1)
    per_token = max(0.0, (many - two) / max(k_max - 1, 1))
    base = max(two - per_token, 1e-9)
    proposer = timer(draft, context_len, 1) if draft is not None else 0.0
    return CostModel(target_slope=per_token / base, proposer_cost=proposer / base)
