"""Request validation, storing queries (idempotency), tenant-scoped reads and the outbox."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.db import Query, utcnow
from app.lifecycle.outbox import sweep
from app.lifecycle.queries import (
    RequestError,
    create_query,
    get_or_create_tenant,
    get_query,
    query_view,
    validate_request,
)
from app.lifecycle.reaper import reap_stale
from app.settings import Settings


def test_defaults_are_filled_from_settings(sqlite_settings: Settings) -> None:
    req = validate_request(sqlite_settings, {"question": " Why? ", "collection": "docs"})
    assert req.method == sqlite_settings.default_method
    assert req.max_tokens == sqlite_settings.default_max_tokens
    assert (req.temperature, req.seed, req.num_speculative_tokens) == (0.0, None, 4)
    assert (
        validate_request(
            sqlite_settings, {"question": "q", "collection": "c", "num_speculative_tokens": "auto"}
        ).num_speculative_tokens
        == "auto"
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"question": None}, "question"),
        ({"question": "   "}, "question"),
        ({"question": "x" * 2001}, "question"),
        ({"collection": ""}, "collection"),
        ({"method": "beam"}, "method"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 99}, "num_speculative_tokens"),
        ({"num_speculative_tokens": True}, "num_speculative_tokens"),
        ({"max_tokens": 513}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"seed": -1}, "seed"),
        ({"top_p": 0.9}, "top_p"),
    ],
)
def test_bad_fields_are_named(
    sqlite_settings: Settings, change: dict[str, Any], field: str
) -> None:
    body = {"question": "What is pass?", "collection": "docs", **change}
    with pytest.raises(RequestError) as err:
        validate_request(sqlite_settings, body)
    assert err.value.field == field and str(err.value).startswith(f"{field}: ")


def test_idempotency_key_returns_the_first_query(
    session_factory: sessionmaker[Session], sqlite_settings: Settings
) -> None:
    req = validate_request(sqlite_settings, {"question": "q", "collection": "docs"})
    with session_factory() as session:
        acme, globex = (
            get_or_create_tenant(session, "acme"),
            get_or_create_tenant(session, "globex"),
        )
        first, created = create_query(session, acme, req, idempotency_key="k")
        again, created_again = create_query(session, acme, req, idempotency_key="k")
        other, other_created = create_query(session, globex, req, idempotency_key="k")
        assert created and not created_again and other_created
        assert first.id == again.id != other.id
        assert session.scalar(select(func.count()).select_from(Query)) == 2
        assert get_query(session, first.id, globex.id) is None
        assert get_query(session, "not-a-uuid", acme.id) is None
        assert query_view(get_query(session, first.id, acme.id)) == {
            "id": str(first.id),
            "status": "queued",
        }  # type: ignore[arg-type]


def _stored(session_factory: sessionmaker[Session], settings: Settings, n: int) -> list[Any]:
    req = validate_request(settings, {"question": "q", "collection": "docs"})
    with session_factory() as session:
        tenant = get_or_create_tenant(session, "acme")
        ids = [create_query(session, tenant, req)[0].id for _ in range(n)]
        # Old enough for the sweep's grace period.
        session.execute(update(Query).values(queued_at=utcnow() - timedelta(minutes=1)))
        session.commit()
    return ids


def test_sweep_sends_unsent_queries_and_stops_while_the_broker_is_down(
    session_factory: sessionmaker[Session], sqlite_settings: Settings
) -> None:
    ids = _stored(session_factory, sqlite_settings, 3)

    def down(*_: Any) -> None:
        raise ConnectionError("broker down")

    assert sweep(session_factory, sqlite_settings, down) == 0
    sent: list[Any] = []
    assert (
        sweep(session_factory, sqlite_settings, lambda qid, queue: sent.append((qid, queue))) == 3
    )
    assert sorted(sent) == sorted((i, "answer") for i in ids)
    assert sweep(session_factory, sqlite_settings, lambda *a: sent.append(a)) == 0  # all marked


def test_reaper_requeues_silent_running_queries_and_fails_exhausted_ones(
    session_factory: sessionmaker[Session], sqlite_settings: Settings
) -> None:
    dead, exhausted, alive = _stored(session_factory, sqlite_settings, 3)
    old = utcnow() - timedelta(seconds=60)
    with session_factory() as session:
        session.execute(
            update(Query).values(
                status="running",
                enqueued_at=utcnow(),
                heartbeat_at=old,
                attempts=1,
                worker_host="w",
            )
        )
        session.execute(
            update(Query).where(Query.id == exhausted).values(attempts=sqlite_settings.max_attempts)
        )
        session.execute(update(Query).where(Query.id == alive).values(heartbeat_at=utcnow()))
        session.commit()
    assert sorted(reap_stale(session_factory, sqlite_settings)) == sorted([dead, exhausted])
    with session_factory() as session:
        rows = {q.id: q for q in session.scalars(select(Query))}
    assert (rows[dead].status, rows[dead].enqueued_at, rows[dead].worker_host) == (
        "queued",
        None,
        None,
    )
    from app.lifecycle.failures import WORKER_LOST

    assert rows[exhausted].status == "failed" and rows[exhausted].error == WORKER_LOST
    assert rows[alive].status == "running"
    assert reap_stale(session_factory, sqlite_settings) == []


def test_sweep_resends_a_query_whose_message_was_lost_long_ago(
    session_factory: sessionmaker[Session], sqlite_settings: Settings
) -> None:
    fresh, lost = _stored(session_factory, sqlite_settings, 2)
    with session_factory() as session:
        session.execute(update(Query).where(Query.id == fresh).values(enqueued_at=utcnow()))
        old = utcnow() - timedelta(seconds=sqlite_settings.resend_after_seconds + 60)
        session.execute(update(Query).where(Query.id == lost).values(enqueued_at=old))
        session.commit()
    sent: list[Any] = []
    assert sweep(session_factory, sqlite_settings, lambda qid, queue: sent.append(qid)) == 1
    assert sent == [lost]
    assert sweep(session_factory, sqlite_settings, lambda qid, queue: sent.append(qid)) == 0
