"""Getting stored queries onto the queue: admission, the sweep, and the loop that runs them.

A query is committed before it is sent to the broker, and ``queries.enqueued_at`` records the
send. Two situations leave a query without a live message: the broker was down at submit time
(``enqueued_at`` stays NULL), or its worker died mid-answer (the Redis broker only redelivers an
unacknowledged message after its visibility timeout, an hour by default). The reaper
(app/lifecycle/reaper.py) turns a running query whose heartbeat stopped back into a queued,
unsent one, and the sweep here sends every unsent query. A duplicate message is harmless: a
worker claims a query only while it is queued, and the unique ``answers.query_id`` lets only one
answer be recorded.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from app.db import Query, utcnow
from app.db.session import skip_fsync
from app.lifecycle.reaper import forget_lost_sends, reap_stale, rescue_unclaimed
from app.periodic import Periodic
from app.settings import Settings
from app.tracing import resumed

log = logging.getLogger(__name__)

# An arbitrary constant that names the admission lock among PostgreSQL advisory locks.
ADMISSION_LOCK = 0x5EC_4A6_01

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
            .values(enqueued_at=utcnow(), sends=Query.sends + 1)
        )
        session.commit()
    return True


def sweep(
    session_factory: sessionmaker[Session], settings: Settings, send: Send, *, limit: int = 500
) -> int:
    """Send queued queries that have no live message; returns how many were sent.

    Three kinds, each claimed (``enqueued_at`` set, ``sends`` counted) before its send, so that
    the API's and every worker's sweepers never send the same query together:

    - interactive queries held back by admission, in tenant round-robin (``admit``);
    - unsent batch items older than ``outbox_grace_seconds`` (a released item; their batch's
      chunk tasks carry the others);
    - interactive queries sent more than ``resend_after_seconds`` ago and still queued (their
      message may have died with a broker that lost its data), at most ``max_resends`` times each,
      so that an outage with no worker never multiplies the queue.
    """
    sent = admit(session_factory, settings, send, limit=limit)
    now = utcnow()
    grace = now - timedelta(seconds=settings.outbox_grace_seconds)
    resend = now - timedelta(seconds=settings.resend_after_seconds)
    due = or_(
        and_(Query.enqueued_at.is_(None), Query.queued_at < grace, Query.queue == "batch"),
        # Batch items wait their turn for long, queued: their batch's chunk tasks and watchdog
        # (app/batch) carry them, and a re-send would turn every item into a message of its own.
        and_(
            Query.enqueued_at < resend,
            # Only interactive ones: golden-evaluation queries (queue "eval") run in the process
            # that made them and have no queue to be sent to.
            Query.queue == "answer",
            Query.sends <= settings.max_resends,
        ),
    )
    with session_factory() as session:
        ids = session.scalars(
            select(Query.id).where(Query.status == "queued", due).order_by(Query.queued_at)
            .limit(limit)
        ).all()  # fmt: skip
    return sent + _claim_and_send(session_factory, list(ids), due, send)


def in_flight(
    session: Session, tenant_ids: list[int] | None = None, *, sent_after: datetime | None = None
) -> dict[int, int]:
    """Per tenant: interactive queries on the broker or running (what admission counts).

    With ``sent_after``, a query sent before it no longer counts: its re-sends are spent and its
    message may be lost for good, so it must not hold its tenant's slot for ever.
    """
    sent: ColumnElement[bool] = Query.enqueued_at.is_not(None)
    if sent_after is not None:
        sent = and_(sent, Query.enqueued_at >= sent_after)
    stmt = (
        select(Query.tenant_id, func.count())
        .where(
            Query.queue == "answer",
            or_(Query.status == "running", and_(Query.status == "queued", sent)),
        )
        .group_by(Query.tenant_id)
    )
    if tenant_ids is not None:
        stmt = stmt.where(Query.tenant_id.in_(tenant_ids))
    return {tenant: int(n) for tenant, n in session.execute(stmt).tuples().all()}


def admit(
    session_factory: sessionmaker[Session],
    settings: Settings,
    send: Send,
    *,
    tenant_id: int | None = None,
    limit: int = 500,
) -> int:
    """Send held interactive queries while their tenant has free slots; returns how many.

    Fair share at dispatch: a tenant has at most ``tenant_max_in_flight`` interactive queries on
    the broker or running; the rest stay stored with ``enqueued_at`` NULL. Free slots are filled
    oldest first within a tenant and in round-robin across tenants (every tenant's first waiting
    query, then every tenant's second, ...), so a new tenant's query goes on the broker behind at
    most a few of a flooding tenant's, never behind all of them. Called by the submitter (for its
    tenant), after each answer and by the sweeper. Returns the number sent.
    """
    cap = settings.tenant_max_in_flight
    unsent = and_(Query.enqueued_at.is_(None), Query.queue == "answer")
    with session_factory() as session:
        skip_fsync(session)
        if session.get_bind().dialect.name == "postgresql":
            # One admitter at a time (API submits, after-answer, sweepers): the count it reads
            # stays true until its claim commits, so a tenant never passes its cap. Held for
            # milliseconds: the sends happen after the commit.
            session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADMISSION_LOCK})
        held = select(
            Query.id,
            Query.tenant_id,
            func.row_number()
            .over(partition_by=Query.tenant_id, order_by=(Query.queued_at, Query.id))
            .label("turn"),
        ).where(Query.status == "queued", unsent)
        if tenant_id is not None:
            held = held.where(Query.tenant_id == tenant_id)
        sub = held.subquery()
        rows = session.execute(
            select(sub.c.id, sub.c.tenant_id, sub.c.turn)
            .where(sub.c.turn <= cap)
            .order_by(sub.c.turn, sub.c.tenant_id)
        ).all()
        # A query sent once and re-sent max_resends times, resend_after_seconds apart, and still
        # queued after all that has had every chance: it stops holding a slot (the broker grows
        # by at most tenant_max_in_flight messages per such period, never doubling).
        spent = settings.resend_after_seconds * (settings.max_resends + 1)
        sent_after = utcnow() - timedelta(seconds=spent)
        tenants = sorted({t for _, t, _ in rows})
        busy = in_flight(session, tenants, sent_after=sent_after) if rows else {}
        chosen = [qid for qid, tenant, turn in rows if turn <= cap - busy.get(tenant, 0)][:limit]
        claimed = _claim(session, chosen, unsent)
        session.commit()
    return _send_claimed(session_factory, chosen, claimed, send)


def _claim_and_send(
    session_factory: sessionmaker[Session], ids: list[uuid.UUID], due: Any, send: Send
) -> int:
    """Claim the still-due queries among ``ids``, then send them in order; how many were sent."""
    if not ids:
        return 0
    with session_factory() as session:
        skip_fsync(session)
        claimed = _claim(session, ids, due)
        session.commit()
    return _send_claimed(session_factory, ids, claimed, send)


def _claim(
    session: Session, ids: list[uuid.UUID], due: Any
) -> dict[uuid.UUID, tuple[str, str | None]]:
    """Mark the still-due queries among ``ids`` as sent (uncommitted); ``{id: (queue, traceparent)}``.

    One ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING`` on PostgreSQL:
    concurrent sweepers skip each other's rows instead of waiting or sending twice.
    """
    if not ids:
        return {}
    lockable = (
        select(Query.id)
        .where(Query.id.in_(ids), Query.status == "queued", due)
        .with_for_update(skip_locked=True)
    )
    rows = session.execute(
        update(Query)
        .where(Query.id.in_(lockable.scalar_subquery()))
        .values(enqueued_at=utcnow(), sends=Query.sends + 1)
        .returning(Query.id, Query.queue, Query.traceparent)
        .execution_options(synchronize_session=False)
    ).tuples()
    return {qid: (queue, traceparent) for qid, queue, traceparent in rows}


def _send_claimed(
    session_factory: sessionmaker[Session],
    ids: list[uuid.UUID],
    claimed: dict[uuid.UUID, tuple[str, str | None]],
    send: Send,
) -> int:
    """Send the claimed queries in ``ids`` order; a failed send gives back it and the rest.

    Each is sent inside the trace that stored it, whichever process sends it and whatever that
    process was doing (an answer of another query, a sweep).
    """
    order = [qid for qid in ids if qid in claimed]
    for n, query_id in enumerate(order):
        queue, traceparent = claimed[query_id]
        try:
            with resumed(traceparent):
                send(query_id, queue)
        except Exception as exc:  # the broker is down: give these back, try next round
            log.warning("sweep: enqueue of query %s failed: %s", query_id, exc)
            with session_factory() as session:
                session.execute(
                    update(Query)
                    .where(Query.id.in_(order[n:]))
                    .values(enqueued_at=None, sends=Query.sends - 1)
                )
                session.commit()
            return n
    return len(order)


class Sweeper(Periodic):
    """A daemon thread that reaps and sweeps every ``sweep_interval_seconds`` (API and workers).

    With ``broker_lost`` (once per loss of the broker's data, the time before which sends may be
    lost; workers/broker_epoch.py) a round first forgets the sends the broker no longer holds.
    With ``unclaimed`` (age → deliveries a worker took that long ago and never acknowledged;
    workers/unclaimed.py) it sends again the queries nobody claimed after
    ``unclaimed_resend_seconds``.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        settings: Settings,
        send: Send,
        broker_lost: Callable[[], datetime | None] | None = None,
        unclaimed: Callable[[float], dict[uuid.UUID, datetime]] | None = None,
    ) -> None:
        super().__init__(settings.sweep_interval_seconds, "specrag-sweeper")
        self.session_factory = session_factory
        self.settings = settings
        self.send = send
        self.broker_lost = broker_lost
        self.unclaimed = unclaimed

    def run_once(self) -> tuple[int, int]:
        """One round: (queries reaped, queries sent)."""
        lost_before = self.broker_lost() if self.broker_lost is not None else None
        if lost_before is not None:
            forget_lost_sends(self.session_factory, lost_before)
        if self.unclaimed is not None:
            deliveries = self.unclaimed(self.settings.unclaimed_resend_seconds)
            if deliveries:
                rescue_unclaimed(self.session_factory, deliveries)
        reaped = reap_stale(self.session_factory, self.settings)
        sent = sweep(self.session_factory, self.settings, self.send)
        return len(reaped), sent

    def tick(self) -> object:
        """One round of the loop."""
        return self.run_once()
