"""Interactive before batch: batch requests leave a full engine loop when interactive work waits.

A worker process holds ``capacity`` tasks in flight (its engine loop's batch); with all of them
taken it fetches nothing more, so an interactive query waits in the broker until one ends. When
that happens while batch items are generating, the ``Preemptor`` cancels the newest batch item's
request in the loop (``RequestHandle.cancel``: it leaves at the next step boundary, its slot is
freed, nothing is thrown into the engine). The pipeline then puts the query back to queued with
nothing recorded, the chunk task re-queues the item and itself and returns, and the freed task
slot takes the interactive message (the worker consumes ``answer`` before ``batch``).

``waiting()`` (is interactive work queued?) is asked every ``poll`` seconds while the worker is
full with a batch request in flight, and at once when a wake-up source announces interactive
work (workers/wakeup.py), so the interactive query waits for one step, not for a poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


class WakeupSource(Protocol):
    """Sets registered events when interactive work is announced (workers.wakeup.Wakeup)."""

    def register(self, event: threading.Event) -> None: ...

    def unregister(self, event: threading.Event) -> None: ...


@dataclass(eq=False)
class Slot:
    """One task in flight on this worker: its kind and, for batch items, the request it runs."""

    preemptible: bool
    handle: Any = None
    """The current item's ``RequestHandle`` (batch slots only)."""
    preempted: bool = False
    """Cancelled by the preemptor: its task is on its way out, its place counts as free."""
    order: int = field(default=0)


class Preemptor:
    """Counts this worker's tasks in flight and cancels batch requests for waiting interactive work."""

    def __init__(
        self,
        capacity: int,
        waiting: Callable[[], bool],
        *,
        poll: float = 0.02,
        wakeup: WakeupSource | None = None,
    ) -> None:
        self.capacity = capacity
        self._waiting = waiting
        self._poll = poll
        self._wakeup = wakeup
        self._lock = threading.Lock()
        self._slots: dict[int, Slot] = {}  # by thread id: a task runs in one thread
        self._counter = 0
        self._signal = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.preemptions = 0
        """Batch requests cancelled so far."""

    def enter(self, preemptible: bool) -> None:
        """The calling thread starts a task (``preemptible``: a batch chunk)."""
        with self._lock:
            self._counter += 1
            self._slots[threading.get_ident()] = Slot(preemptible, order=self._counter)
        self._signal.set()

    def exit(self) -> None:
        """The calling thread's task ended."""
        with self._lock:
            self._slots.pop(threading.get_ident(), None)

    def track(self, handle: Any) -> None:
        """Make ``handle`` (submitted by the calling thread's batch task) the one to cancel."""
        with self._lock:
            slot = self._slots.get(threading.get_ident())
            if slot is not None and slot.preemptible:
                slot.handle, slot.preempted = handle, False
        self._signal.set()

    def full(self) -> bool:
        """Whether every task slot is taken by a task that is not already leaving."""
        with self._lock:
            return sum(not s.preempted for s in self._slots.values()) >= self.capacity

    def should_yield(self) -> bool:
        """Between batch items: whether to stop because interactive work waits for a full worker.

        A task whose request was cancelled but ended anyway (the cancel landed after its last
        step: a short answer is often one step) is still asked to leave. Its slot counts as free
        in ``full()``, so without this it would claim item after item, each finishing before the
        next cancel, while the interactive query waited for the slot.
        """
        with self._lock:
            own = self._slots.get(threading.get_ident())
            asked_to_leave = own is not None and own.preempted
        return (asked_to_leave or self.full()) and self._waiting()

    def _victim(self) -> Slot | None:
        with self._lock:
            live = [s for s in self._slots.values() if not s.preempted]
            if len(live) < self.capacity:
                return None
            running = [s for s in live if s.preemptible and s.handle is not None]
            running = [s for s in running if not s.handle.done]
            # The newest batch request has done the least work: cancelling it wastes the least.
            return max(running, key=lambda s: s.order) if running else None

    def check(self) -> bool:
        """Cancel one batch request if the worker is full and interactive work waits; whether it did."""
        victim = self._victim()
        if victim is None or not self._waiting():
            return False
        with self._lock:
            if victim.preempted or victim.handle is None:
                return False
            victim.preempted = True
            handle = victim.handle
        handle.cancel()
        self.preemptions += 1
        log.info("interactive work waits on a full worker: a batch request was cancelled")
        return True

    def start(self) -> Preemptor:
        """Run the watcher thread; returns self."""
        if self._wakeup is not None:
            self._wakeup.register(self._signal)
        self._thread = threading.Thread(target=self._run, name="specrag-preemptor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the watcher thread."""
        self._stop.set()
        self._signal.set()
        if self._wakeup is not None:
            self._wakeup.unregister(self._signal)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._signal.wait(self._poll)
            self._signal.clear()
            if self._stop.is_set():
                return
            try:
                self.check()
            except Exception:  # a broker hiccup must not end the watcher
                log.exception("preemption check failed")
