"""Getting stored queries onto the queue: the outbox sweep and the reaper of dead workers' queries.

A query is committed before it is sent to the broker, and ``queries.enqueued_at`` records the
send. Two situations leave a query without a live message: the broker was down at submit time
(``enqueued_at`` stays NULL), or its worker died mid-answer (the Redis broker only redelivers an
unacknowledged message after its visibility timeout, an hour by default). The reaper turns a
running query whose heartbeat stopped back into a queued, unsent one, and the sweep sends every
unsent query. A duplicate message is harmless: a worker claims a query only while it is queued,
and the unique ``answers.query_id`` lets only one answer be recorded.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import ColumnElement, and_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.db import Query, utcnow
from app.db.session import skip_fsync
from app.finish import finish_query
from app.periodic import Periodic
from app.requests import QueryStatus
from app.settings import Settings

log = logging.getLogger(__name__)

Send = Callable[[uuid.UUID, str], None]
"""Puts one query id on the named queue; raises when the broker cannot be reached."""


def send_and_mark(
    session_factory: sessionmaker[Session], query_id: uuid.UUID, queue: str, send: Send
) -> bool:
    """Send one query and record it as enqueued; False (query left for the sweep) if the send fails."""
    try:
        send(query_id, queue)
    except Exception as exc:  # any broker failure: the sweep retries later
        log.warning("enqueue of query %s failed, left for the sweeper: %s", query_id, exc)
        return False
    with session_factory() as session:
        skip_fsync(session)
        session.execute(
            update(Query)
            .where(Query.id == query_id, Query.enqueued_at.is_(None))
            .values(enqueued_at=utcnow())
        )
        session.commit()
    return True


def _rowcount(result: object) -> int:
    # UPDATE results are CursorResults; the generic Result type does not declare rowcount.
    return int(getattr(result, "rowcount", 0))


def _requeue(session: Session, query_id: uuid.UUID, stopped: ColumnElement[bool]) -> bool:
    # Back to queued and unsent: the sweep sends it again.
    result = session.execute(
        update(Query)
        .where(Query.id == query_id, Query.status == QueryStatus.RUNNING, stopped)
        .values(status=QueryStatus.QUEUED, enqueued_at=None, heartbeat_at=None, worker_host=None)
    )
    return bool(_rowcount(result))


def reap_stale(session_factory: sessionmaker[Session], settings: Settings) -> list[uuid.UUID]:
    """Re-queue running queries whose heartbeat stopped; fail those out of attempts. Returns ids."""
    cutoff = utcnow() - timedelta(seconds=settings.stale_after_seconds)
    reaped: list[uuid.UUID] = []
    with session_factory() as session:
        stale = session.execute(
            select(Query.id, Query.attempts).where(
                Query.status == QueryStatus.RUNNING,
                or_(Query.heartbeat_at.is_(None), Query.heartbeat_at < cutoff),
            )
        ).all()
        for query_id, attempts in stale:
            # The same condition again, so that two reapers (or a late heartbeat) cannot both win.
            stopped = or_(Query.heartbeat_at.is_(None), Query.heartbeat_at < cutoff)
            if attempts >= settings.max_attempts:
                moved = finish_query(
                    session,
                    settings,
                    query_id,
                    QueryStatus.FAILED,
                    error=f"worker lost: no heartbeat after {attempts} attempts",
                    where=(stopped,),
                )
            else:
                moved = _requeue(session, query_id, stopped)
            if moved:
                reaped.append(query_id)
        session.commit()
    if reaped:
        log.warning("reaped %d queries whose worker stopped heartbeating: %s", len(reaped), reaped)
    return reaped


def sweep(
    session_factory: sessionmaker[Session], settings: Settings, send: Send, *, limit: int = 500
) -> int:
    """Send queued queries that have no live message (oldest first); returns how many were sent.

    Unsent queries older than ``outbox_grace_seconds`` (a submitter's own send is not raced), and
    queries sent more than ``resend_after_seconds`` ago and still queued (their message may have
    died with a broker that lost its data). Each is claimed by moving ``enqueued_at`` first, so
    that the API's and every worker's sweepers never send the same query together.
    """
    now = utcnow()
    grace = now - timedelta(seconds=settings.outbox_grace_seconds)
    resend = now - timedelta(seconds=settings.resend_after_seconds)
    due = or_(
        and_(Query.enqueued_at.is_(None), Query.queued_at < grace),
        # Batch items wait their turn for long, queued: their batch's chunk tasks and watchdog
        # (app/batch) carry them, and a re-send would turn every item into a message of its own.
        and_(Query.enqueued_at < resend, Query.queue != "batch"),
    )
    with session_factory() as session:
        pending = session.execute(
            select(Query.id, Query.queue)
            .where(Query.status == "queued", due)
            .order_by(Query.queued_at)
            .limit(limit)
        ).all()
    sent = 0
    for query_id, queue in pending:
        with session_factory() as session:
            skip_fsync(session)
            mine = _rowcount(
                session.execute(
                    update(Query)
                    .where(Query.id == query_id, Query.status == "queued", due)
                    .values(enqueued_at=utcnow())
                )
            )
            session.commit()
        if not mine:
            continue  # another sweeper took it
        try:
            send(query_id, queue)
        except Exception as exc:  # the broker is down: give it back and try next round
            log.warning("sweep: enqueue of query %s failed: %s", query_id, exc)
            with session_factory() as session:
                session.execute(update(Query).where(Query.id == query_id).values(enqueued_at=None))
                session.commit()
            break
        sent += 1
    return sent


class Sweeper(Periodic):
    """A daemon thread that reaps and sweeps every ``sweep_interval_seconds`` (API and workers)."""

    def __init__(
        self, session_factory: sessionmaker[Session], settings: Settings, send: Send
    ) -> None:
        super().__init__(settings.sweep_interval_seconds, "specrag-sweeper")
        self.session_factory = session_factory
        self.settings = settings
        self.send = send

    def run_once(self) -> tuple[int, int]:
        """One round: (queries reaped, queries sent)."""
        reaped = reap_stale(self.session_factory, self.settings)
        sent = sweep(self.session_factory, self.settings, self.send)
        return len(reaped), sent

    def tick(self) -> object:
        """One round of the loop."""
        return self.run_once()
