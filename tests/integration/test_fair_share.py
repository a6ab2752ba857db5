"""Fair share on one live worker: a tenant's flood of 500 queries does not queue another tenant's
5 queries behind it. Real PostgreSQL, Redis, worker, retrieval and the tiny model pair.

The check is on order, not on time (timings are quoted in docs/results.md): once the small
tenant's queries are all on the broker, at most ``tenant_max_in_flight`` of the flood's are
answered before the last of them, because admission keeps no more than that on the broker.
Without admission all 500 would be (the flood's messages all lie ahead in the FIFO queue).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from app.db import Query, make_engine, make_session_factory, utcnow
from app.lifecycle.outbox import admit
from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
from app.settings import Settings

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_a_flood_of_500_does_not_queue_another_tenants_queries_behind_it(
    service_settings: Settings, live_worker: Any, ingested: str
) -> None:
    from app.resources import Resources
    from workers import create_celery
    from workers.dispatcher import send_query

    engine = make_engine(service_settings)
    sf = make_session_factory(engine)
    small_name = f"small-{uuid.uuid4().hex[:6]}"
    report = Resources(service_settings, sf).retrieval.ingest(
        [ROOT / "demo" / "corpus" / "assert.md"], collection=ingested, tenant=small_name
    )
    assert report.ok
    celery = create_celery(service_settings)

    def send(qid: uuid.UUID, queue: str) -> None:
        send_query(celery, qid, queue)

    request = validate_request(
        service_settings, {"question": "What does assert do?", "collection": ingested}
    )

    def submit(tenant_name: str, n: int) -> list[uuid.UUID]:
        ids = []
        for _ in range(n):  # as the API does: store, then admit for the tenant
            with sf() as session:
                tenant = get_or_create_tenant(session, tenant_name)
                ids.append(create_query(session, tenant, request)[0].id)
            admit(sf, service_settings, send, tenant_id=tenant.id)
        return ids

    flood = submit("acme", 500)
    small = submit(small_name, 5)
    # From here every small query is on the broker. The flood's queries ahead of them are the ones
    # in flight now (at most the cap); any admitted later lines up behind. (Flood queries answered
    # while the small ones were being submitted were admitted before them: not counted.)
    started = utcnow()
    try:
        deadline = time.monotonic() + 300
        while True:
            with sf() as session:
                done = session.scalars(
                    select(Query.done_at).where(
                        Query.id.in_(small), Query.status.in_(("succeeded", "failed"))
                    )
                ).all()
            if len(done) == len(small):
                break
            assert time.monotonic() < deadline, "the small tenant's queries were not answered"
            time.sleep(0.2)
        with sf() as session:
            statuses = session.scalars(select(Query.status).where(Query.id.in_(small))).all()
            last = max(done)
            ahead = session.scalar(
                select(func.count())
                .select_from(Query)
                .where(Query.id.in_(flood), Query.done_at > started, Query.done_at <= last)
            )
            waiting = session.scalar(
                select(func.count())
                .select_from(Query)
                .where(Query.id.in_(flood), Query.status == "queued")
            )
        assert set(statuses) == {"succeeded"}
        assert ahead is not None and ahead <= service_settings.tenant_max_in_flight, ahead
        assert waiting and waiting > 400  # the flood was still there: the test had a flood
    finally:
        # The flood's remaining queries are not this test's subject: fail them so the session's
        # worker skips their (at most tenant_max_in_flight) messages instead of answering 500.
        with sf() as session:
            session.execute(
                update(Query)
                .where(Query.id.in_(flood), Query.status == "queued")
                .values(status="failed", error="test cleanup", done_at=utcnow())
            )
            session.commit()
        engine.dispose()
