"""The engine's death is the worker's death: stop taking work, hand queries back, exit non-zero.

A worker whose engine died (vLLM's EngineCore process killed or crashed, the torch engine's loop
thread ended) would otherwise stay up, answer ``celery inspect ping`` and fail every query it
takes within milliseconds. The guard polls the engine every ``INTERVAL`` seconds; once it is
dead, the answer tasks stop (a new message is neither claimed nor acknowledged: the sweepers
send it again, workers/unclaimed.py), the guard cancels this node's consumers, waits for a
blocking pop in flight to return, releases every query this process holds (app/lifecycle/lease.py
``held``, fenced by attempt: they did nothing wrong; the sweepers send them to another worker)
and exits with ``EXIT_ENGINE_DEAD``, so that its supervisor (the compose file's restart policy,
systemd, Kubernetes) starts a new one. Only ``specrag worker`` processes run a guard.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

from app.lifecycle.lease import guard_engine, held, release
from app.lifecycle.outage import DatabaseUnavailable, with_database
from app.periodic import Periodic
from app.resources import Resources

log = logging.getLogger(__name__)

EXIT_ENGINE_DEAD = 70
"""The worker's exit status when its engine died (EX_SOFTWARE)."""
INTERVAL = 0.2
"""Seconds between two looks at the engine."""
DRAIN_SECONDS = 1.5
"""Wait after cancelling the consumers: a blocking pop already sent to Redis (kombu's BRPOP
times out after 1 s) could otherwise take a re-sent message into a process about to exit."""
RELEASE_SECONDS = 30.0
"""How long the dying worker retries its releases while the database is away (then the reaper)."""


class EngineGuard(Periodic):
    """Watches ``resources``' engine; on its death calls ``stop_consuming`` and ends the process."""

    def __init__(
        self,
        resources: Resources,
        stop_consuming: Callable[[], None],
        exit: Callable[[int], None] = os._exit,
        drain_seconds: float = DRAIN_SECONDS,
    ) -> None:
        super().__init__(INTERVAL, "specrag-engine-guard")
        self.resources = resources
        self.stop_consuming = stop_consuming
        self._exit = exit
        self.drain_seconds = drain_seconds

    def start(self) -> EngineGuard:
        """Start watching; from now on the process's tasks leave the hand-back to the guard."""
        guard_engine()
        super().start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching (a warm shutdown closes the engine on purpose)."""
        guard_engine(False)
        super().stop(timeout)

    def tick(self) -> object:
        """One look at the engine; never returns once it is dead."""
        if self.resources.engine_dead():
            self.die()
        return None

    def die(self) -> None:
        """Stop consuming, hand back what this process holds, and exit ``EXIT_ENGINE_DEAD``."""
        started = time.monotonic()
        log.critical("the engine died: this worker stops taking queries and exits")
        try:
            self.stop_consuming()
        except Exception:  # exiting is what matters; the tasks reject what still arrives
            log.exception("cancelling the consumers failed")
        time.sleep(self.drain_seconds)
        released = self.release_held()
        log.critical(
            "engine dead: %d queries handed back in %.2f s; exiting with status %d",
            released,
            time.monotonic() - started,
            EXIT_ENGINE_DEAD,
        )
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for handler in logging.getLogger().handlers:
            handler.flush()
        self._exit(EXIT_ENGINE_DEAD)

    def release_held(self) -> int:
        """Release every query this process holds (only the attempts it holds); how many moved."""
        sf = self.resources.session_factory
        moved = 0
        for qid, attempt in held().items():
            try:
                if with_database(
                    lambda q=qid, a=attempt: release(sf, q, a),  # type: ignore[misc]
                    seconds=RELEASE_SECONDS,
                    what=f"release of query {qid}",
                ):
                    moved += 1
            except DatabaseUnavailable:
                log.error("query %s: not released; the reaper re-queues it", qid)
        return moved
