"""Grounding beside the worker's tasks: one thread, a bounded backlog, one future per answer.

It exists so that grounding never holds a task: the task that recorded an answer hands the
grounding here and takes its next query at once. One thread grounds the answers in the order
they were recorded (the scorer's encoder takes one call at a time anyway). The backlog holds at
most ``BACKLOG`` answers; a task that finds it full waits for a place, so a worker that grounds
slower than it answers slows down rather than dropping groundings. Closing waits up to its
timeout for the backlog to drain; what is left is cancelled (those answers keep no grounding,
and their futures' callbacks still run, so their streams still end).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

log = logging.getLogger(__name__)

BACKLOG = 64
"""Answers waiting for grounding at most, beyond the one being grounded."""


class GroundingBacklog:
    """A daemon thread running submitted groundings in order; ``submit`` gives a future."""

    def __init__(self, maxsize: int = BACKLOG) -> None:
        self._queue: queue.Queue[tuple[Future[Any], Callable[[], Any]] | None] = queue.Queue(
            maxsize
        )
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="specrag-grounding", daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], Any]) -> Future[Any]:
        """Queue ``work`` (waiting while the backlog is full); its future resolves once it ran."""
        future: Future[Any] = Future()
        if self._closed:
            future.cancel()
            return future
        self._queue.put((future, work))
        return future

    def pending(self) -> int:
        """Answers waiting for grounding now (not counting the one being grounded)."""
        return self._queue.qsize()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, work = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work())
            except BaseException as exc:  # the future carries it; the thread goes on
                future.set_exception(exc)

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking work, ground what is queued for up to ``timeout`` seconds, cancel the rest."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        left = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None and item[0].cancel():
                left += 1
        if left:
            log.warning("grounding: %d answers left ungrounded at shutdown", left)
