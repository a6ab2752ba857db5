"""Measured costs of the speculative decoding model: r_k and c, for the adaptive policy."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from generation.adaptive import CostModel
from generation.forward import Forward, HFForward
from generation.model_runner import ModelRunner


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


def time_batch_steps(
    target: Forward,
    draft: Forward | None,
    batch_size: int,
    ks: list[int],
    context_len: int = 64,
    repeats: int = 2,
) -> dict[int, float]:
    """Return the median seconds of a batch step of ``batch_size`` rows for each k in ``ks``.

    A step is one target pass over ``[batch_size, k + 1]`` and, with a draft model, ``k``
    draft passes over ``[batch_size, 1]``, on scratch slots that hold ``context_len`` tokens.
    """
    runners = [ModelRunner(m, "timing") for m in (target, draft) if m is not None]
    device = target.device
    vocab = int(target.config.vocab_size)
    context = [i % vocab for i in range(context_len)]
    slots = list(range(batch_size))
    times: dict[int, list[float]] = {k: [] for k in ks}
    with torch.inference_mode():
        for runner in runners:
            for slot in slots:
                runner.prefill(slot, context)
        for attempt in range(repeats + 1):  # the first round warms up allocators and kernels
            for k in ks:
                _synchronize(device)
                start = time.perf_counter()
                if draft is not None and k:
                    ids = torch.ones((batch_size, 1), dtype=torch.long, device=device)
                    for _ in range(k):
                        runners[1].run(slots, ids, [1] * batch_size, last_only=True)
                ids = torch.ones((batch_size, k + 1), dtype=torch.long, device=device)
                runners[0].run(slots, ids, [k + 1] * batch_size).argmax(dim=-1).tolist()
                _synchronize(device)
                if attempt:
                    times[k].append(time.perf_counter() - start)
                for runner in runners:
                    for slot in slots:
                        runner.set_length(slot, context_len)
    return {k: statistics.median(t) for k, t in times.items()}
