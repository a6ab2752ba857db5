"""One request's state in the step loop (``Sequence``); its caller holds a ``LoopHandle``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from generation.handle import LoopHandle
from generation.interface import Cancelled, GenerationResult
from generation.params import SamplingParams
from generation.spec_decode.goodput import Acceptance
from generation.spec_decode.ngram import NgramProposer
from generation.spec_decode.suffix import SuffixProposer
from generation.stats import GenerationStats


def new_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """Return the request's private generator (seeded when asked), or None when greedy."""
    if params.temperature <= 0:
        return None
    generator = torch.Generator(device=device)
    if params.seed is None:
        generator.seed()
    else:
        generator.manual_seed(params.seed)
    return generator


@dataclass
class Sequence:
    """One request as the step loop sees it."""

    request_id: int
    prompt: list[int]
    params: SamplingParams
    handle: LoopHandle
    budget: int
    """Tokens this request may still be given in all (max_new_tokens capped by the context)."""
    generator: torch.Generator | None
    stats: GenerationStats
    arrived: float = field(default_factory=time.perf_counter)
    tokens: list[int] = field(default_factory=list)
    """Prompt plus output so far."""
    output: list[int] = field(default_factory=list)
    slot: int = -1
    prefilled: int = 0
    """Prompt tokens already in the target's slot (a long prompt is prefilled in chunks)."""
    last_token: int = -1
    """The newest emitted token: not yet in the target's slot (the next pass feeds it)."""
    ngram: NgramProposer | None = None
    suffix: SuffixProposer | None = None
    acceptance: Acceptance | None = None
    """The row's running alpha (None for method ``none``)."""
    finished: bool = False
    background: bool = False
    """A batch job's request (generation/engine/scheduler.py)."""
    last_step: float = field(default_factory=time.perf_counter)
    """When the request last took part in a step (or joined): how long a paused background
    request has waited."""
    features: torch.Tensor | None = None
    """[m, hidden]: the target's final hidden states of the positions an EAGLE head has not
    yet read (generation/spec_decode/eagle.py); None for other methods, or when it has read them all."""
    head_base: int = 0
    """The target position of the EAGLE head's first slot entry (after a reused prefix, whose
    features were never computed, the head starts where prefill starts)."""
    batch_size_sum: int = 0
    chosen_k_sum: int = 0

    @property
    def temperature(self) -> float:
        return float(self.params.temperature)

    @property
    def fixed_k(self) -> int | None:
        """The k the request asked for, 0 for method ``none``, or None for ``"auto"``; a
        ``suffix`` request's ``"auto"`` is its trees' longest chain (they decide each round's
        length from the match, not the batch's k)."""
        k = self.params.num_speculative_tokens
        if self.params.method == "none":
            return 0
        if k == "auto" and self.suffix is not None:
            return self.suffix.max_tokens
        return k if isinstance(k, int) else None

    @property
    def remaining(self) -> int:
        return self.budget - len(self.output)

    def result(self) -> GenerationResult:
        """The request's result with its stats completed."""
        stats = self.stats
        passes = stats.num_target_forwards
        if passes:
            stats.mean_batch_size = self.batch_size_sum / passes
            stats.mean_chosen_k = self.chosen_k_sum / passes
        stats.generation_ms = (time.perf_counter() - self.arrived) * 1000.0
        return GenerationResult(token_ids=list(self.output), stats=stats)

    def cancelled(self) -> Cancelled:
        return Cancelled(f"request {self.request_id} cancelled after {len(self.output)} tokens")
