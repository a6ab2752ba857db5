"""The batch watchdog: finishes batches whose last items ended elsewhere, revives stalled ones.

Celery's Redis transport gives an unacknowledged message back only after its visibility timeout
(an hour), so a chunk task whose worker was killed would stall its batch that long. Instead every
worker serving the ``batch`` queue runs this thread: items whose queries ended outside a chunk
task (re-sent by the outbox after a reap) are closed, and a batch with no progress for
``batch_stale_after_seconds`` is dispatched again under a new epoch. Running it in several
workers at once is safe: the epoch bump is a guarded update only one of them wins.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

import app.batch.runner as runner
from app.periodic import Periodic
from app.settings import Settings

log = logging.getLogger(__name__)

Dispatch = Callable[[uuid.UUID, int, int], None]
"""Sends ``lanes`` chunk tasks of batch ``id`` under ``epoch``; raises when the broker is down."""


def run_once(
    session_factory: sessionmaker[Session], settings: Settings, dispatch: Dispatch
) -> tuple[int, int]:
    """One round: (items closed from their queries, batches re-dispatched)."""
    closed = 0
    for batch_id in runner.unsettled(session_factory):
        closed += runner.sync_items(session_factory, batch_id)
        runner.maybe_finish(session_factory, batch_id)
    revived = runner.stalled(session_factory, settings)
    for batch_id, epoch, lanes in revived:
        log.warning("batch %s made no progress; re-dispatching (epoch %d)", batch_id, epoch)
        # A failed send leaves the fresh heartbeat behind: the next stale round retries.
        dispatch(batch_id, epoch, lanes)
    return closed, len(revived)


class Watchdog(Periodic):
    """A daemon thread running ``run_once`` every ``sweep_interval_seconds``."""

    def __init__(
        self, session_factory: sessionmaker[Session], settings: Settings, dispatch: Dispatch
    ) -> None:
        super().__init__(settings.sweep_interval_seconds, "specrag-batch-watchdog")
        self.session_factory = session_factory
        self.settings = settings
        self.dispatch = dispatch

    def tick(self) -> object:
        """One round of the loop."""
        return run_once(self.session_factory, self.settings, self.dispatch)
