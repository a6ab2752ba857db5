"""A ``GenerationLoop`` of batch size one over any engine's ``generate`` (the fallback loop).

Engines without a loop of their own (or before the batched loop exists) are served by one thread
that takes submitted requests in order and runs ``engine.generate`` for each; the whole answer is
one delta. The only step boundaries are a request's start and end: a request cancelled before it
starts reports ``Cancelled``, one already generating runs to its end and keeps its result.
Nothing is ever thrown into the engine.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from generation.base import Cancelled, DeltaCallback, Engine, GenerationLoop, GenerationResult
from generation.params import SamplingParams

_END = object()


class SerialHandle:
    """One request of a ``SerialLoop``: its result, its deltas, its cancel flag."""

    def __init__(
        self, prompt_token_ids: list[int], params: SamplingParams, on_delta: DeltaCallback | None
    ) -> None:
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self._on_delta = on_delta
        self._done = threading.Event()
        self._cancel = threading.Event()
        self._deltas: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None

    def deltas(self) -> Iterator[list[int]]:
        """Newly verified token ids (here: the whole answer at once); ends when the request ends."""
        while True:
            item = self._deltas.get()
            if item is _END:
                self._deltas.put(_END)  # a second reader ends too
                return
            assert isinstance(item, list)
            yield item

    def result(self, timeout: float | None = None) -> GenerationResult:
        """The whole result; raises ``Cancelled``, the request's own error, or TimeoutError."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request not finished within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Cancel the request if it has not started; one already generating finishes."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        """Whether ``cancel`` was called."""
        return self._cancel.is_set()

    @property
    def done(self) -> bool:
        """Whether the request finished, failed or was cancelled."""
        return self._done.is_set()

    def _finish(self, result: GenerationResult | None, error: BaseException | None) -> None:
        if error is None and result is None:
            error = Cancelled("cancelled before it started")
        if error is None and result is not None:
            self._result = result
            self._deltas.put(list(result.token_ids))
            if self._on_delta is not None and result.token_ids:
                try:
                    self._on_delta(list(result.token_ids))
                except Exception:  # a subscriber's failure is not the request's
                    pass
        self._error = error
        self._deltas.put(_END)
        self._done.set()


class SerialLoop:
    """One thread answering submitted requests one at a time with ``engine.generate``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.max_batch_size = 1
        self._queue: queue.SimpleQueue[SerialHandle | None] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specrag-serial-loop", daemon=True)
        self._thread.start()

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        on_delta: DeltaCallback | None = None,
    ) -> SerialHandle:
        """Queue one request; it starts when the ones before it are done."""
        handle = SerialHandle(list(prompt_token_ids), params, on_delta)
        if self._closed.is_set():
            handle.cancel()
            handle._finish(None, None)
        else:
            self._queue.put(handle)
        return handle

    def close(self) -> None:
        """Cancel what waits, let the running request end, stop the thread."""
        self._closed.set()
        self._queue.put(None)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while True:
            handle = self._queue.get()
            if handle is None:
                break
            if handle.cancelled or self._closed.is_set():
                handle.cancel()
                handle._finish(None, None)
                continue
            try:
                result = self.engine.generate(handle.prompt_token_ids, handle.params)
            except Exception as exc:  # the request's own error, never the loop's
                handle._finish(None, exc)
            else:
                handle._finish(result, None)
        # Whatever was queued behind the close is cancelled, not left waiting.
        while True:
            try:
                left = self._queue.get_nowait()
            except queue.Empty:
                return
            if left is not None:
                left.cancel()
                left._finish(None, None)


def loop_for(engine: Engine, max_batch_size: int) -> GenerationLoop:
    """The engine's own loop (``engine.start_loop``) when it has one, else a ``SerialLoop``."""
    start = getattr(engine, "start_loop", None)
    if callable(start):
        loop: GenerationLoop = start(max_batch_size)
        return loop
    return SerialLoop(engine)
