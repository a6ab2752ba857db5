"""Fair share at dispatch and the bounded outbox, on PostgreSQL (SKIP LOCKED) and SQLite."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.db import Query, Tenant, make_session_factory, utcnow
from app.lifecycle.outbox import admit, in_flight, sweep
from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
from app.settings import Settings


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Settings, Any]]:
    """(settings, session factory) on a fresh SQLite file or this module's PostgreSQL database."""
    from app.db.schema import upgrade

    if request.param == "sqlite":
        settings = Settings(data_dir=tmp_path, tenant_max_in_flight=3)
        url = settings.resolved_database_url
    else:
        url = request.getfixturevalue("tenancy_pg")
        settings = Settings(data_dir=tmp_path, database_url=url, tenant_max_in_flight=3)
    engine = create_engine(url)
    upgrade(engine)
    yield settings, make_session_factory(engine)
    with Session(engine) as session:  # the PostgreSQL database is shared by this module's tests
        session.execute(Query.__table__.delete())
        session.commit()
    engine.dispose()


def _submit(sf: sessionmaker[Session], settings: Settings, tenant: str, n: int) -> list[uuid.UUID]:
    req = validate_request(settings, {"question": "q?", "collection": "docs"})
    with sf() as session:
        owner = get_or_create_tenant(session, tenant)
        return [create_query(session, owner, req)[0].id for _ in range(n)]


def _tenant_of(sf: sessionmaker[Session]) -> dict[uuid.UUID, str]:
    with sf() as session:
        rows = session.execute(select(Query.id, Tenant.name).join(Tenant)).tuples().all()
    return dict(rows)


def test_a_flood_holds_only_its_slots_and_a_new_tenant_goes_next(db: Any) -> None:
    settings, sf = db
    sent: list[tuple[uuid.UUID, str]] = []
    send = lambda qid, queue: sent.append((qid, queue))  # noqa: E731
    flood = _submit(sf, settings, "flood", 50)
    assert admit(sf, settings, send) == 3  # the flood gets its 3 slots, the rest stay stored
    assert [q for q, _ in sent] == flood[:3]
    small = _submit(sf, settings, "small", 2)
    assert admit(sf, settings, send, tenant_id=None) == 2  # the new tenant is not behind 47
    assert [q for q, _ in sent[3:]] == small
    with sf() as session:
        assert in_flight(session) == {
            session.scalar(select(Tenant.id).where(Tenant.name == "flood")): 3,
            session.scalar(select(Tenant.id).where(Tenant.name == "small")): 2,
        }
    assert admit(sf, settings, send) == 0  # no slot free, nothing sent


def test_freed_slots_are_filled_in_tenant_round_robin(db: Any) -> None:
    settings, sf = db
    sent: list[tuple[uuid.UUID, str]] = []
    send = lambda qid, queue: sent.append((qid, queue))  # noqa: E731
    _submit(sf, settings, "a", 10)
    _submit(sf, settings, "b", 10)
    admit(sf, settings, send)
    names = _tenant_of(sf)
    assert Counter(names[q] for q, _ in sent) == {"a": 3, "b": 3}
    # Every sent query is answered: each tenant gets three more, alternating a, b, a, b ...
    with sf() as session:
        session.execute(
            update(Query).where(Query.id.in_([q for q, _ in sent])).values(status="succeeded")
        )
        session.commit()
    sent.clear()
    assert admit(sf, settings, send) == 6
    assert [names[q] for q, _ in sent] == ["a", "b", "a", "b", "a", "b"]


def test_a_broker_outage_never_multiplies_the_queue(db: Any) -> None:
    settings, sf = db
    sent: list[uuid.UUID] = []
    _submit(sf, settings, "a", 20)
    for _ in range(5):
        sweep(sf, settings, lambda qid, queue: sent.append(qid))
    assert len(sent) == 3  # admission: 3 on the broker, 17 stored
    # No worker for longer than resend_after_seconds, many times over: each is re-sent at most
    # max_resends times, never doubling per period.
    for _ in range(6):
        with sf() as session:
            long_ago = utcnow() - timedelta(seconds=settings.resend_after_seconds + 1)
            session.execute(
                update(Query).where(Query.enqueued_at.is_not(None)).values(enqueued_at=long_ago)
            )
            session.commit()
        sweep(sf, settings, lambda qid, queue: sent.append(qid))
    assert len(sent) == 3 * (1 + settings.max_resends)
    assert set(Counter(sent).values()) == {1 + settings.max_resends}
    # Re-sends spent and still queued long after: the message may be lost for good, so these
    # stop holding the tenant's slots; the next 3 go out, once each, and the old ones never again.
    with sf() as session:
        spent = settings.resend_after_seconds * (settings.max_resends + 1) + 1
        session.execute(
            update(Query)
            .where(Query.enqueued_at.is_not(None))
            .values(enqueued_at=utcnow() - timedelta(seconds=spent))
        )
        session.commit()
    before = set(sent)
    sweep(sf, settings, lambda qid, queue: sent.append(qid))
    assert len(sent) == 3 * (1 + settings.max_resends) + 3 and not set(sent[-3:]) & before


def test_a_failed_send_gives_the_queries_back(db: Any) -> None:
    settings, sf = db
    ids = _submit(sf, settings, "a", 2)

    def down(*_: Any) -> None:
        raise ConnectionError("broker down")

    assert admit(sf, settings, down) == 0
    with sf() as session:
        rows = session.execute(select(Query.enqueued_at, Query.sends)).all()
    assert rows and all(r == (None, 0) for r in rows)
    sent: list[uuid.UUID] = []
    assert admit(sf, settings, lambda qid, queue: sent.append(qid)) == 2 and sent == ids


def test_concurrent_sweepers_never_send_a_query_twice(db: Any) -> None:
    settings, sf = db
    settings = settings.model_copy(update={"tenant_max_in_flight": 1000})
    _submit(sf, settings, "a", 200)
    sent: list[uuid.UUID] = []
    lock = threading.Lock()

    def send(qid: uuid.UUID, queue: str) -> None:
        with lock:
            sent.append(qid)

    threads = [threading.Thread(target=admit, args=(sf, settings, send)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(sent) == len(set(sent)) == 200
