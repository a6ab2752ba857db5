"""Preempting a batch item's generation when interactive work arrives on the same worker.

Stopping between items still makes an interactive query wait for the item in flight, which is a
whole answer's time: on a worker that serves both queues that roughly doubles interactive p95.
So while a batch item *generates*, a watcher thread checks ``waiting()`` (every ``poll`` seconds,
and at once when a ``Wakeup`` source announces interactive work: workers/wakeup.py) and, when it
says yes,
raises ``Preempted`` in the generating thread (``PyThreadState_SetAsyncExc``: delivered at the
next Python bytecode, i.e. between the engine's forward passes). Only the generate call is armed:
the pipeline's claim and record are never interrupted, so a preempted item leaves nothing
behind. ``Preempted`` is a ``BaseException``: the pipeline treats it like a shutdown and puts the
query back to queued (no failure recorded); the chunk task then re-queues the item and itself.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from app.resources import Resources


class Preempted(BaseException):
    """Raised inside a batch item's generation because interactive work is waiting."""


def _inject(thread_id: int, exc: type[BaseException] | None) -> None:
    # exc None clears an exception set earlier but not delivered yet.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class WakeupSource(Protocol):
    """Sets registered events when interactive work is announced (workers.wakeup.Wakeup)."""

    def register(self, event: threading.Event) -> None: ...

    def unregister(self, event: threading.Event) -> None: ...


@contextmanager
def armed(
    waiting: Callable[[], bool], poll: float, wakeup: WakeupSource | None = None
) -> Iterator[None]:
    """Within the block, ``Preempted`` is raised in this thread soon after ``waiting()`` is true.

    ``waiting()`` is checked every ``poll`` seconds and whenever ``wakeup`` announces work.
    If the block ends before the exception is delivered, it is withdrawn: finished work is kept.
    """
    thread_id = threading.get_ident()
    lock = threading.Lock()
    state = {"armed": True, "fired": False}
    stop = threading.Event()
    signal = threading.Event()  # set by the wake-up source, and by the block's end
    if wakeup is not None:
        wakeup.register(signal)

    def watch() -> None:
        while True:
            signal.wait(poll)
            signal.clear()
            if stop.is_set():
                return
            if waiting():
                with lock:
                    if state["armed"]:
                        state["fired"] = True
                        _inject(thread_id, Preempted)
                return

    watcher = threading.Thread(target=watch, name="specrag-batch-preempt", daemon=True)
    watcher.start()
    delivered = False
    try:
        yield
    except Preempted:
        delivered = True
        raise
    finally:
        with lock:
            state["armed"] = False
            if state["fired"] and not delivered:
                _inject(thread_id, None)
        if wakeup is not None:
            wakeup.unregister(signal)
        stop.set()
        signal.set()
        watcher.join()


class _PreemptibleEngine:
    """The engine, with every ``generate`` call armed for preemption."""

    def __init__(
        self,
        engine: Any,
        waiting: Callable[[], bool],
        poll: float,
        wakeup: WakeupSource | None,
    ) -> None:
        self._engine = engine
        self._waiting = waiting
        self._poll = poll
        self._wakeup = wakeup

    def generate(self, prompt_ids: Any, params: Any) -> Any:
        with armed(self._waiting, self._poll, self._wakeup):
            return self._engine.generate(prompt_ids, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


class PreemptibleResources(Resources):
    """``base``'s loaded models and services, with the engine's generate armed for preemption."""

    def __init__(
        self,
        base: Resources,
        waiting: Callable[[], bool],
        poll: float = 0.02,
        wakeup: WakeupSource | None = None,
    ) -> None:
        super().__init__(base.settings, base.session_factory)
        self._base = base
        self._engine_proxy = _PreemptibleEngine(base.engine, waiting, poll, wakeup)

    @property
    def engine(self) -> Any:
        """The base engine behind a preemptible ``generate``."""
        return self._engine_proxy

    @property
    def tokenizer(self) -> Any:
        """The base resources' tokenizer."""
        return self._base.tokenizer

    @property
    def retrieval(self) -> Any:
        """The base resources' retrieval service."""
        return self._base.retrieval
