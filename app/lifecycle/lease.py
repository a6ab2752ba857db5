"""A worker's hold on one query while it answers: the claim, the heartbeat, the release.

``claim`` moves a query from queued to running atomically, so a duplicate message finds nothing
to do. While a query runs, a heartbeat thread refreshes ``queries.heartbeat_at``; when the worker
dies the heartbeat stops and the reaper (app/lifecycle/outbox.py) re-queues the query. ``release`` hands a
query back to the outbox when its work was interrupted through no fault of its own.

The attempt number (``queries.attempts`` after the claim) is the query's lease epoch: the
heartbeat, the release, the recording of the answer and the stream publisher only act for the
attempt that holds the query now, so a stalled worker that resumes after the reaper re-queued its
query can no longer write. ``held()`` lists what this process holds, for a worker that must hand
everything back at once (its engine died: workers/engine_guard.py).
"""

from __future__ import annotations

import contextvars
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
    with _held_lock:  # held from here: a dying worker hands back even what it just claimed
        _held[query_id] = row[0]
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
    with _held_lock:
        _held[query_id] = attempt

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

    # The beats run in the caller's context: traced, their UPDATEs are the query's (SQL spans).
    thread = threading.Thread(
        target=contextvars.copy_context().run, args=(beat,), name=f"heartbeat-{query_id}",
        daemon=True,
    )  # fmt: skip
    thread.start()
    try:
        yield
    finally:
        with _held_lock:
            if _held.get(query_id) == attempt:
                del _held[query_id]
        stop.set()
        thread.join(timeout=5)


_held: dict[uuid.UUID, int] = {}
_held_lock = threading.Lock()
_guarded = threading.Event()


def guard_engine(on: bool = True) -> None:
    """Say whether this process hands back what it holds and exits when its engine dies."""
    if on:
        _guarded.set()
    else:
        _guarded.clear()


def await_hand_back(timeout: float = 120.0) -> None:
    """With an engine guard, block (up to ``timeout``) while it hands the held queries back and
    ends the process; without one, return at once (the caller releases the query itself).

    Released from a process whose broker connection may still have a blocking pop in flight, a
    re-sent message could be swallowed by the dying worker, so the guard releases only once it
    stopped consuming.
    """
    if _guarded.is_set():
        threading.Event().wait(timeout)


def held() -> dict[uuid.UUID, int]:
    """The queries this process is answering now, with the attempt that holds each."""
    with _held_lock:
        return dict(_held)


def release(sf: sessionmaker[Session], qid: uuid.UUID, attempt: int | None = None) -> bool:
    """Put a running query back to queued and unsent (the outbox sends it again); True if moved.

    With ``attempt``, only while that attempt still holds it (a newer one is left alone).
    """
    fence = () if attempt is None else (Query.attempts == attempt,)
    with sf() as session:
        # Lost in a database crash, the query stays running with a stale heartbeat and the reaper
        # queues it again: no fsync, so that a preempted batch item hands its worker over sooner.
        skip_fsync(session)
        result = session.execute(
            update(Query)
            .where(Query.id == qid, Query.status == QueryStatus.RUNNING, *fence)
            .values(
                status=QueryStatus.QUEUED, enqueued_at=None, heartbeat_at=None, worker_host=None
            )
        )
        session.commit()
    return bool(getattr(result, "rowcount", 0))
