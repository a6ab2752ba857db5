"""Every way a query becomes final stores its question as ``store_questions`` says."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from app.db import Query, utcnow
from app.lifecycle.finish import finish_query
from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
from app.lifecycle.reaper import reap_stale
from app.privacy import hash_question
from app.requests import QueryStatus
from app.settings import Settings

QUESTION = "Call me at 555-123-4567: how do I rotate keys?"


def _running(session_factory: sessionmaker[Session], settings: Settings, attempts: int) -> object:
    request = validate_request(settings, {"question": QUESTION, "collection": "docs"})
    with session_factory() as session:
        query, _ = create_query(session, get_or_create_tenant(session, "acme"), request)
        session.execute(
            update(Query)
            .where(Query.id == query.id)
            .values(
                status=QueryStatus.RUNNING,
                attempts=attempts,
                heartbeat_at=utcnow() - timedelta(minutes=5),
            )
        )
        session.commit()
        return query.id


def _stored(session_factory: sessionmaker[Session], query_id: object) -> tuple[str, str]:
    with session_factory() as session:
        row = session.execute(
            select(Query.status, Query.question).where(Query.id == query_id)
        ).one()
        return row[0], row[1]


@pytest.mark.parametrize(
    ("mode", "kept"),
    [
        ("hashed", hash_question(QUESTION)),
        ("redacted", "Call me at [number]: how do I rotate keys?"),
        ("clear", QUESTION),
    ],
)
def test_the_reaper_s_failed_path_keeps_only_the_stored_form(
    session_factory: sessionmaker[Session], sqlite_settings: Settings, mode: str, kept: str
) -> None:
    settings = sqlite_settings.model_copy(update={"store_questions": mode})
    qid = _running(session_factory, settings, attempts=settings.max_attempts)
    assert reap_stale(session_factory, settings) == [qid]
    assert _stored(session_factory, qid) == ("failed", kept)


def test_a_requeued_query_keeps_its_question_in_clear(
    session_factory: sessionmaker[Session], sqlite_settings: Settings
) -> None:
    settings = sqlite_settings.model_copy(update={"store_questions": "hashed"})
    qid = _running(session_factory, settings, attempts=1)
    assert reap_stale(session_factory, settings) == [qid]
    assert _stored(session_factory, qid) == ("queued", QUESTION)  # the worker still needs it


def test_only_the_first_finisher_moves_the_query(
    session_factory: sessionmaker[Session], sqlite_settings: Settings
) -> None:
    settings = sqlite_settings.model_copy(update={"store_questions": "hashed"})
    qid = _running(session_factory, settings, attempts=1)
    with session_factory() as session:
        assert finish_query(session, settings, qid, QueryStatus.FAILED, error="boom")
        assert not finish_query(session, settings, qid, QueryStatus.SUCCEEDED)
        session.commit()
    assert _stored(session_factory, qid) == ("failed", hash_question(QUESTION))
    with session_factory() as session, pytest.raises(ValueError, match="not final"):
        finish_query(session, settings, qid, QueryStatus.RUNNING)
