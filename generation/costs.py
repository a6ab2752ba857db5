"""Measured costs of the speculative decoding model: r_k and c, for the adaptive policy."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from generation.adaptive import CostModel
from generation.forward import Forward, HFForward


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forward(model: Any, context_len: int, num_tokens: int, repeats: int = 5) -> float:
    """Return the median seconds of a forward pass over ``num_tokens`` after ``context_len``.

    ``model`` is a ``Forward`` (as the engine runs it) or a transformers model (its own forward).
    """
    fwd: Forward = model if hasattr(model, "new_cache") else HFForward(model)
    device = fwd.device
    vocab = int(fwd.config.vocab_size)
    ids = torch.arange(context_len + num_tokens, device=device).remainder(vocab).view(1, -1)
    cache = fwd.new_cache()
    with torch.inference_mode():
        fwd(ids[:, :context_len], cache)
        times = []
        for _ in range(repeats + 1):  # the first pass warms up allocators and kernels
            _synchronize(device)
            start = time.perf_counter()
            fwd(ids[:, context_len:], cache)
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
    """Return the cost of a round for every k in [1, k_max], measured here (a few dozen passes).

    A round with k drafts is one target pass over k + 1 tokens plus k proposer steps (a draft
    model's one-token passes; n-gram lookup costs nothing measurable).
    """
    proposer = timer(draft, context_len, 1) if draft is not None else 0.0
    rounds = [timer(target, context_len, k + 1) + k * proposer for k in range(1, k_max + 1)]
    return CostModel([0.0, *rounds])
