"""A daemon thread that runs one round of background work every few seconds until stopped.

The outbox sweeper and the batch watchdog are both such loops; a failed round (database or broker
briefly away) is logged and retried next round, never allowed to kill the thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Self

log = logging.getLogger(__name__)


class Periodic:
    """Calls ``tick`` every ``interval`` seconds on a daemon thread named ``name``."""

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def tick(self) -> object:
        """One round of work (subclasses define it)."""
        raise NotImplementedError

    def start(self) -> Self:
        """Start the thread; returns self."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to stop and wait for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception:  # never kill the thread: the next round retries
                log.exception("%s: round failed; retrying next round", self._thread.name)
