"""The engine's death is the worker's death: stop taking work, hand queries back, exit non-zero.

A worker whose engine died (vLLM's EngineCore process killed or crashed, the torch engine's loop
thread ended) would otherwise stay up, answer ``celery inspect ping`` and fail every query it
takes within milliseconds. The guard polls the engine every ``INTERVAL`` seconds; once it is
dead, the answer task rejects (re-queues) new messages, the guard cancels this node's consumers,
releases every query this process holds (app/lease.py ``held``, fenced by attempt: they did
nothing wrong; the sweepers send them to another worker) and exits with ``EXIT_ENGINE_DEAD``, so
that its supervisor (the compose file's restart policy, systemd, Kubernetes) starts a new one.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

from app.lease import held, release
from app.outage import DatabaseUnavailable, with_database
from app.periodic import Periodic
from app.resources import Resources

log = logging.getLogger(__name__)

EXIT_ENGINE_DEAD = 70
"""The worker's exit status when its engine died (EX_SOFTWARE)."""
INTERVAL = 0.2
"""Seconds between two looks at the engine."""
RELEASE_SECONDS = 30.0
"""How long the dying worker retries its releases while the database is away (then the reaper)."""


class EngineGuard(Periodic):
    """Watches ``resources``' engine; on its death calls ``stop_consuming`` and ends the process."""

    def __init__(
        self,
        resources: Resources,
        stop_consuming: Callable[[], None],
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        super().__init__(INTERVAL, "specrag-engine-guard")
        self.resources = resources
        self.stop_consuming = stop_consuming
        self._exit = exit

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
