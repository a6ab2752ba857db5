"""The service end to end on real PostgreSQL and Redis with a live worker and the API over HTTP."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.client import ClientError, SpecragClient
from app.db import Answer, GenerationStatsRecord, Query, make_engine, make_session_factory
from app.settings import Settings

pytestmark = pytest.mark.integration

CONTRACT_STATS = {
    "method",
    "num_speculative_tokens",
    "num_output_tokens",
    "num_target_forwards",
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "accepted_per_position",
    "acceptance_rate",
    "mean_acceptance_length",
    "ttft_ms",
    "generation_ms",
    "queue_ms",
    "retrieval_ms",
    "total_ms",
}


def _count(settings: Settings, model: Any, *where: Any) -> int:
    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        n = session.scalar(select(func.count()).select_from(model).where(*where))
    engine.dispose()
    return int(n or 0)


def _query(settings: Settings, query_id: str) -> Query:
    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        query = session.get(Query, uuid.UUID(query_id))
        assert query is not None
    engine.dispose()
    return query


def test_submit_over_http_is_answered_with_sources_and_stats(
    api: Any, live_worker: Any, keys: dict[str, str], ingested: str, service_settings: Settings
) -> None:
    with SpecragClient(api.url, keys["acme"]) as client:
        query_id = client.submit("What does the assert statement do?", ingested, max_tokens=6)
        done = client.wait(query_id, timeout=120)
    assert done["status"] == "succeeded", done
    assert isinstance(done["answer"], str)
    assert done["sources"], "an answer must cite the passages it was given"
    assert all(s["document"].endswith((".md",)) for s in done["sources"])
    assert "assert.md" in {s["document"].rsplit("/", 1)[-1] for s in done["sources"]}
    stats = done["stats"]
    assert CONTRACT_STATS <= set(stats)
    assert 1 <= stats["num_output_tokens"] <= 6
    assert stats["total_ms"] >= stats["retrieval_ms"] + stats["generation_ms"]
    row = _query(service_settings, query_id)
    assert row.worker_host and row.attempts == 1
    assert row.queued_at <= row.started_at <= row.retrieved_at <= row.done_at  # type: ignore[operator]
    assert row.first_token_at is not None


def test_fifty_concurrent_submissions_are_each_answered_exactly_once(
    api: Any, live_worker: Any, keys: dict[str, str], ingested: str, service_settings: Settings
) -> None:
    def submit(i: int) -> str:
        with SpecragClient(api.url, keys["acme"]) as client:
            return client.submit(f"Question {i}: when is pass used?", ingested, max_tokens=2)

    with ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(submit, range(50)))
    assert len(set(ids)) == 50
    with SpecragClient(api.url, keys["acme"]) as client:
        results = [client.wait(i, timeout=240) for i in ids]
    assert [r["status"] for r in results] == ["succeeded"] * 50
    qids = [uuid.UUID(i) for i in ids]
    assert _count(service_settings, Answer, Answer.query_id.in_(qids)) == 50
    assert (
        _count(service_settings, GenerationStatsRecord, GenerationStatsRecord.query_id.in_(qids))
        == 50
    )
    assert _count(service_settings, Query, Query.id.in_(qids), Query.attempts == 1) == 50


def test_a_redelivered_task_does_not_answer_twice(
    api: Any, live_worker: Any, keys: dict[str, str], ingested: str, service_settings: Settings
) -> None:
    from workers import create_celery, send_query

    with SpecragClient(api.url, keys["acme"]) as client:
        query_id = client.submit("What does del do?", ingested, max_tokens=2)
        first = client.wait(query_id, timeout=120, with_grounding=True)  # the view as final
        # The same message again, as acks_late may deliver it after a crash.
        send_query(create_celery(service_settings), query_id)
        send_query(create_celery(service_settings), query_id)
        marker = client.submit("What does pass do?", ingested, max_tokens=2)
        client.wait(marker, timeout=120)  # FIFO on one worker: the duplicates ran before this one
        again = client.get(query_id)
    assert again == first
    assert _count(service_settings, Answer, Answer.query_id == uuid.UUID(query_id)) == 1
    assert _query(service_settings, query_id).attempts == 1


def test_same_idempotency_key_gives_one_query(
    api: Any, live_worker: Any, keys: dict[str, str], ingested: str, service_settings: Settings
) -> None:
    key = f"order-{uuid.uuid4()}"

    def submit(_: int) -> str:
        with SpecragClient(api.url, keys["acme"]) as client:
            return client.submit(
                "What does assert do?", ingested, max_tokens=2, idempotency_key=key
            )

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(submit, range(8)))
    assert len(ids) == 1
    (query_id,) = ids
    with SpecragClient(api.url, keys["acme"]) as client:
        assert client.wait(query_id, timeout=120)["status"] == "succeeded"
        with pytest.raises(ClientError) as err:
            client.submit("A different question", ingested, idempotency_key=key)
    assert err.value.status == 409 and err.value.field == "Idempotency-Key"
    assert _count(service_settings, Query, Query.idempotency_key == key) == 1
    assert _count(service_settings, Answer, Answer.query_id == uuid.UUID(query_id)) == 1


def test_tenants_see_only_their_own_queries_and_keys_are_required(
    api: Any, keys: dict[str, str], ingested: str
) -> None:
    with SpecragClient(api.url, keys["acme"]) as acme:
        query_id = acme.submit("What does assert do?", ingested, max_tokens=1)
        assert acme.get(query_id)["id"] == query_id
    with SpecragClient(api.url, keys["globex"]) as globex, pytest.raises(ClientError) as err:
        globex.get(query_id)
    assert err.value.status == 404
    no_key = httpx.get(f"{api.url}/v1/queries/{query_id}")
    assert no_key.status_code == 401 and no_key.json()["error"]["field"] == "Authorization"
    bad_key = httpx.post(
        f"{api.url}/v1/queries",
        json={"question": "q", "collection": ingested},
        headers={"Authorization": "Bearer srk_not-a-key"},
    )
    assert bad_key.status_code == 401
    admin = httpx.get(
        f"{api.url}/v1/admin/audit", headers={"Authorization": f"Bearer {keys['acme']}"}
    )
    assert admin.status_code == 403
    assert httpx.get(f"{api.url}/healthz").json() == {
        "status": "ok",
        "components": {"database": "ok", "broker": "ok"},
    }
    assert "/v1/queries" in httpx.get(f"{api.url}/openapi.json").json()["paths"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"collection": "docs"}, "question"),
        ({"question": "", "collection": "docs"}, "question"),
        ({"question": "x" * 5000, "collection": "docs"}, "question"),
        ({"question": "q"}, "collection"),
        ({"question": "q", "collection": "docs", "max_tokens": 100000}, "max_tokens"),
        ({"question": "q", "collection": "docs", "max_tokens": 0}, "max_tokens"),
        ({"question": "q", "collection": "docs", "temperature": -1}, "temperature"),
        ({"question": "q", "collection": "docs", "method": "magic"}, "method"),
        (
            {"question": "q", "collection": "docs", "num_speculative_tokens": 0},
            "num_speculative_tokens",
        ),
        (
            {"question": "q", "collection": "docs", "num_speculative_tokens": "lots"},
            "num_speculative_tokens",
        ),
        ({"question": "q", "collection": "docs", "colour": "red"}, "colour"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_is_stored(
    api: Any, keys: dict[str, str], service_settings: Settings, body: dict[str, Any], field: str
) -> None:
    before = _count(service_settings, Query)
    response = httpx.post(
        f"{api.url}/v1/queries", json=body, headers={"Authorization": f"Bearer {keys['acme']}"}
    )
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["field"].startswith(field), response.json()
    assert _count(service_settings, Query) == before
