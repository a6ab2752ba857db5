"""One request's state in the step loop (``Sequence``), and the handle its caller holds."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from generation.goodput import Acceptance
from generation.interface import Cancelled, DeltaCallback, GenerationResult
from generation.ngram import NgramProposer
from generation.params import SamplingParams
from generation.stats import GenerationStats

_END = object()
log = logging.getLogger(__name__)


class LoopHandle:
    """A request in flight (``generation.interface.RequestHandle``); the loop's side emits,
    finishes or fails it."""

    def __init__(self, on_delta: DeltaCallback | None = None) -> None:
        self._on_delta = on_delta
        self._deltas: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._done = threading.Event()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self.cancel_requested = False
        """Set by ``cancel``; the loop drops the request at its next step boundary."""

    def deltas(self) -> Iterator[list[int]]:
        while True:
            item = self._deltas.get()
            if item is _END:
                self._deltas.put(_END)  # a second iterator ends at once too
                return
            assert isinstance(item, list)
            yield item

    def result(self, timeout: float | None = None) -> GenerationResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        self.cancel_requested = True

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def emit(self, token_ids: list[int]) -> None:
        if not token_ids:
            return
        self._deltas.put(list(token_ids))
        if self._on_delta is not None:
            try:
                self._on_delta(list(token_ids))
            except Exception:  # the caller's bug stops its own request, not the batch
                log.exception("on_delta raised; the request is cancelled")
                self.cancel_requested = True

    def finish(self, result: GenerationResult | None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._deltas.put(_END)
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self.finish(None, error)


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
    acceptance: Acceptance | None = None
    """The row's running alpha (None for method ``none``)."""
    finished: bool = False
    background: bool = False
    """A batch job's request (generation/scheduler.py)."""
    last_step: float = field(default_factory=time.perf_counter)
    """When the request last took part in a step (or joined): how long a paused background
    request has waited."""
    batch_size_sum: int = 0
    chosen_k_sum: int = 0

    @property
    def temperature(self) -> float:
        return float(self.params.temperature)

    @property
    def fixed_k(self) -> int | None:
        """The k the request asked for, 0 for method ``none``, or None for ``"auto"``."""
        k = self.params.num_speculative_tokens
        if self.params.method == "none":
            return 0
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
