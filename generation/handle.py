"""The handle a caller holds for one request in flight, the same for both engines.

The engine's side ``emit``s each burst of verified token ids and ``finish``es or ``fail``s the
request once; the caller reads ``deltas``, waits on ``result`` or ``cancel``s. Two behaviours
are the same on every engine (tests/generation/test_engine_loop.py, tests/vllm/test_demo_pair.py):

- an ``on_delta`` that raises fails its own request with that error, logged: the request stops
  at its next step boundary (vLLM: it is aborted) and ``result`` raises the callback's error,
  even when the request had already ended; the other requests go on;
- ``deltas`` is meant to be iterated once: bursts go to whichever iterator reads them, and once
  the request ended every iterator, a second one included, ends at once.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator

from generation.interface import DeltaCallback, GenerationResult

_END = object()
log = logging.getLogger(__name__)


class LoopHandle:
    """A request in flight (``generation.interface.RequestHandle``); the loop's side emits,
    finishes or fails it."""

    request_id: str | None = None
    """The engine's name for the request, where it has one (vLLM's request id)."""

    def __init__(self, on_delta: DeltaCallback | None = None) -> None:
        self._on_delta = on_delta
        self._deltas: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._done = threading.Event()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._callback_error: BaseException | None = None
        self.cancel_requested = False
        """Set by ``cancel``; the loop drops the request at its next step boundary."""

    def deltas(self) -> Iterator[list[int]]:
        """Newly verified token ids as they land; ends when the request finished or was cancelled."""
        while True:
            item = self._deltas.get()
            if item is _END:
                self._deltas.put(_END)  # a second iterator ends at once too
                return
            assert isinstance(item, list)
            yield item

    def result(self, timeout: float | None = None) -> GenerationResult:
        """The whole result; raises ``Cancelled``, the request's own error, or TimeoutError."""
        if not self._done.wait(timeout):
            name = "request" if self.request_id is None else f"request {self.request_id}:"
            raise TimeoutError(f"{name} not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Stop the request at the next step boundary; its slot is freed, nothing else disturbed."""
        self.cancel_requested = True

    @property
    def done(self) -> bool:
        """Whether the request finished, failed or was cancelled."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the request ended (at most ``timeout`` s); return whether it has."""
        return self._done.wait(timeout)

    # -- called by the engine's side ----------------------------------------------------------
    def emit(self, token_ids: list[int]) -> None:
        """Hand a burst of verified token ids to ``deltas`` and ``on_delta``."""
        if not token_ids:
            return
        self._deltas.put(list(token_ids))
        if self._on_delta is not None and self._callback_error is None:
            try:
                self._on_delta(list(token_ids))
            except Exception as exc:  # the caller's bug stops its own request, not the batch
                log.exception("on_delta raised; the request fails with its error")
                self._callback_error = exc
                self.cancel()

    def finish(self, result: GenerationResult | None, error: BaseException | None = None) -> None:
        """End the request with ``result`` or ``error`` (an ``on_delta`` error wins over both)."""
        if self._callback_error is not None:
            result, error = None, self._callback_error
        self._result, self._error = result, error
        self._deltas.put(_END)
        self._done.set()

    def fail(self, error: BaseException) -> None:
        """End the request with ``error``."""
        self.finish(None, error)
