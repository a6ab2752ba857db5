"""Grounding in the audit on PostgreSQL: groundedness and citation precision beside latency and
acceptance, grouped (index_version too), and an alert when groundedness falls."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker

from app.audit import build_report
from app.audit.alerts import Thresholds
from app.audit.window import Window
from app.db import Answer, AnswerGrounding, GenerationStatsRecord, Query, Tenant

NOW = datetime(2031, 3, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def session(migrated_pg_url: str) -> Iterator[Session]:
    engine = create_engine(migrated_pg_url)
    with sessionmaker(engine)() as s:
        yield s
    engine.dispose()


def _answer(
    s: Session, tenant: Tenant, at: datetime, version: int, g: float | None, p: float | None
) -> None:
    qid = uuid.uuid4()
    s.add(Query(id=qid, tenant_id=tenant.id, collection="docs", question="q", status="succeeded",
                params={"method": "draft_model"}, queued_at=at, source="api"))  # fmt: skip
    s.flush()
    s.add(Answer(query_id=qid, text="A.", model_pair="pair", engine="torch", index_version=version))
    s.add(GenerationStatsRecord(query_id=qid, method="draft_model", num_output_tokens=4,
                                num_target_forwards=2, num_drafts=2, num_draft_tokens=8,
                                num_accepted_tokens=4, generation_ms=100.0, total_ms=120.0))  # fmt: skip
    s.add(AnswerGrounding(query_id=qid, groundedness=g, citation_precision=p,
                          reason=None if g is not None else "no passages", scorer="fused",
                          threshold=0.5, num_sentences=1, sentences=[], grounding_ms=3.0))  # fmt: skip


def test_report_shows_groundedness_by_group_and_alerts_when_it_falls(session: Session) -> None:
    tenant = Tenant(name=f"audit-g-{uuid.uuid4().hex[:8]}")
    session.add(tenant)
    session.flush()
    window = Window(NOW - timedelta(hours=1), NOW)
    before = window.previous()
    for i in range(20):
        _answer(session, tenant, before.since + timedelta(minutes=1 + i), 1, 0.9, 1.0)
    for i in range(20):  # a re-index: version 2 stands less on its sources
        _answer(
            session, tenant, window.since + timedelta(minutes=1 + i), 2, 0.4 if i % 2 else 0.6, 0.5
        )
    _answer(session, tenant, window.since + timedelta(minutes=30), 2, None, None)
    session.commit()
    try:
        report = build_report(
            session, window, ("tenant", "index_version"), Thresholds(min_samples=10)
        )
        mine = [g for g in report["groups"] if g["tenant"] == tenant.name]
        assert [(g["index_version"], g["grounded_answers"]) for g in mine] == [(2, 20)]
        assert mine[0]["groundedness"] == pytest.approx(0.5)
        assert mine[0]["citation_precision"] == pytest.approx(0.5)
        assert "groundedness" in report["headline"] and "citation_precision" in report["headline"]
        # Version 2's group has no previous window to compare with; the tenant's has.
        by_tenant = build_report(session, window, ("tenant",), Thresholds(min_samples=10))
        falling = [a for a in by_tenant["alerts"] if a["kind"] == "groundedness_falling"]
        assert any(a["group"].get("tenant") == tenant.name for a in falling), by_tenant["alerts"]
        steady = build_report(session, before, ("tenant",), Thresholds(min_samples=10))
        assert not [a for a in steady["alerts"] if a["kind"] == "groundedness_falling"
                    and a["group"].get("tenant") == tenant.name]  # fmt: skip
    finally:
        session.query(Query).filter(Query.tenant_id == tenant.id).delete()
        session.delete(tenant)
        session.commit()
