"""A worker's hold on one query while it answers: the claim, the heartbeat, the release.

``claim`` moves a query from queued to running atomically, so a duplicate message finds nothing
to do. While a query runs, a heartbeat thread refreshes ``queries.heartbeat_at``; when the worker
dies the heartbeat stops and the reaper (app/outbox.py) re-queues the query. ``release`` hands a
query back to the outbox when its work was interrupted through no fault of its own.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from app.db import Query, utcnow
from app.db.session import skip_fsync
from app.requests import QueryStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claimed:
    """What a worker needs of a query it has just claimed."""

    attempt: int
    tenant_id: int
    question: str
    collection: str
    params: dict[str, Any]
    queued_at: datetime
    started_at: datetime
    queue: str
    """The queue it was answered from (``answer`` or ``batch``)."""


def claim(sf: sessionmaker[Session], query_id: uuid.UUID, host: str) -> Claimed | None:
    """Mark a queued query running on ``host`` and return it; None if it is not queued.

    One UPDATE ... RETURNING: the status check and the read are a single round trip.
    """
    now = utcnow()
    with sf() as session:
        skip_fsync(session)
        row = session.execute(
            update(Query)
            .where(Query.id == query_id, Query.status == QueryStatus.QUEUED)
            .values(
                status=QueryStatus.RUNNING,
                started_at=now,
                heartbeat_at=now,
                worker_host=host,
                attempts=Query.attempts + 1,
            )
            .returning(
                Query.attempts,
                Query.tenant_id,
                Query.question,
                Query.collection,
                Query.params,
                Query.queued_at,
                Query.queue,
            )
        ).one_or_none()
        session.commit()
    if row is None:
        return None
    return Claimed(row[0], row[1], row[2], row[3], dict(row[4]), row[5], now, row[6])


@contextmanager
def heartbeat(
    session_factory: sessionmaker[Session],
    query_id: uuid.UUID,
    attempt: int,
    interval: float,
    deadline: float,
) -> Iterator[None]:
    """Refresh the query's heartbeat every ``interval`` seconds until the block ends.

    After ``deadline`` seconds the heartbeat stops on purpose: a hung generation then looks like a
    dead worker to the reaper, which enforces the hard time limit even on pools that cannot.
    """
    stop = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not stop.wait(interval):
            if time.monotonic() - started > deadline:
                log.error("query %s passed its time limit; heartbeat stopped", query_id)
                return
            try:
                with session_factory() as session:
                    skip_fsync(session)
                    session.execute(
                        update(Query)
                        .where(
                            Query.id == query_id,
                            Query.status == QueryStatus.RUNNING,
                            Query.attempts == attempt,
                        )
                        .values(heartbeat_at=utcnow())
                    )
                    session.commit()
            except Exception:  # a missed beat is not fatal; the next one may succeed
                log.exception("heartbeat of query %s failed", query_id)

    thread = threading.Thread(target=beat, name=f"heartbeat-{query_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def release(sf: sessionmaker[Session], qid: uuid.UUID) -> None:
    """Put a running query back to queued and unsent (the outbox sends it again)."""
    with sf() as session:
        # Lost in a database crash, the query stays running with a stale heartbeat and the reaper
        # queues it again: no fsync, so that a preempted batch item hands its worker over sooner.
        skip_fsync(session)
        session.execute(
            update(Query)
            .where(Query.id == qid, Query.status == QueryStatus.RUNNING)
            .values(
                status=QueryStatus.QUEUED, enqueued_at=None, heartbeat_at=None, worker_host=None
            )
        )
        session.commit()
