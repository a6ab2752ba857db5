"""Queries whose worker or message was lost: marked queued and unsent again, so the sweep resends.

A running query whose heartbeat stopped (its worker died) goes back to queued (or fails once out
of attempts); a queued query whose message a broker lost, or that a worker took and never
claimed, is marked unsent. The outbox sweep (app/lifecycle/outbox.py) then sends them again; a
duplicate message is harmless, since a worker claims a query only while it is queued.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.db import Query, utcnow
from app.db.models import rowcount
from app.lifecycle.failures import WORKER_LOST
from app.lifecycle.finish import finish_query
from app.requests import QueryStatus
from app.settings import Settings

log = logging.getLogger(__name__)


def _requeue(session: Session, query_id: uuid.UUID, stopped: ColumnElement[bool]) -> bool:
    # Back to queued and unsent: the sweep sends it again.
    result = session.execute(
        update(Query)
        .where(Query.id == query_id, Query.status == QueryStatus.RUNNING, stopped)
        .values(status=QueryStatus.QUEUED, enqueued_at=None, heartbeat_at=None, worker_host=None)
    )
    return bool(rowcount(result))


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
                    error=WORKER_LOST,
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


def forget_lost_sends(session_factory: sessionmaker[Session], before: datetime) -> int:
    """Mark interactive queries sent before ``before`` and still queued as unsent; how many.

    For a broker that lost its data: their messages are gone, so they must neither wait for
    ``resend_after_seconds`` nor hold their tenant's fair-share slots. ``admit`` sends them again
    (oldest first, tenant round-robin); a message that did survive makes a duplicate, which the
    worker's claim of a queued query makes harmless.
    """
    with session_factory() as session:
        result = session.execute(
            update(Query)
            .where(
                Query.status == QueryStatus.QUEUED,
                Query.queue == "answer",
                Query.enqueued_at.is_not(None),
                Query.enqueued_at < before,
            )
            .values(enqueued_at=None)
        )
        session.commit()
    forgotten = rowcount(result)
    if forgotten:
        log.warning("broker lost its data: %d queued queries will be sent again", forgotten)
    return forgotten


def rescue_unclaimed(
    session_factory: sessionmaker[Session], deliveries: dict[uuid.UUID, datetime]
) -> int:
    """Mark as unsent the queries among ``deliveries`` still queued since a worker took them.

    ``deliveries``: per query id, when a worker took its message and never acknowledged it (nor
    claimed the query). Only a query whose last send is not newer than that delivery moves, so a
    query is sent again once per lost delivery; ``admit`` sends it (a late duplicate is a no-op).
    """
    moved = 0
    with session_factory() as session:
        for query_id, delivered_at in deliveries.items():
            result = session.execute(
                update(Query)
                .where(
                    Query.id == query_id,
                    Query.status == QueryStatus.QUEUED,
                    Query.queue == "answer",
                    Query.enqueued_at.is_not(None),
                    Query.enqueued_at <= delivered_at,
                )
                .values(enqueued_at=None)
            )
            moved += rowcount(result)
        session.commit()
    if moved:
        log.warning("%d queries taken by a worker and never claimed: sending them again", moved)
    return moved
