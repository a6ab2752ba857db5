"""Prometheus metrics against the real service: a live ``specrag worker`` with SPECRAG_METRICS_PORT
on Redis and PostgreSQL, and the API's ``/metrics``.

Both tests use a private redis-server, so the session's shared worker cannot answer (and count)
their queries, and the worker process is fresh, so its counters start at zero.
"""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from app.client import SpecragClient
from app.db import Answer, GenerationStatsRecord, Query, make_engine, make_session_factory
from app.metrics import STAGES
from app.settings import Settings
from tests.integration.conftest import Deployment
from tests.integration.helpers import ApiServer, RedisServer, WorkerProcess, free_port

pytestmark = pytest.mark.integration

Samples = list[tuple[str, dict[str, str], float]]


def _scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _sum(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for n, ls, v in samples if n == name and labels.items() <= ls.items())


def _stored(settings: Settings, worker: str) -> tuple[list[tuple[GenerationStatsRecord, int]], int]:
    """The stored stats and prompt tokens of every answer ``worker`` recorded, and its failures.

    By worker rather than by the test's ids: should a sweeper hand this worker some other test's
    query, the counters must still equal what the database holds for this worker.
    """
    engine = make_engine(settings)
    mine = Query.worker_host.startswith(f"{worker}@")
    with make_session_factory(engine)() as session:
        rows = session.execute(
            select(GenerationStatsRecord, Answer.prompt_tokens)
            .join(Answer, Answer.query_id == GenerationStatsRecord.query_id)
            .join(Query, Query.id == Answer.query_id)
            .where(mine)
        ).all()
        failed = session.scalars(select(Query.id).where(mine, Query.status == "failed")).all()
        session.expunge_all()
    engine.dispose()
    return [(stats, int(prompt)) for stats, prompt in rows], len(failed)


def _fail_one(settings: Settings, template_id: str) -> str:
    """Store a copy of a query whose collection does not exist and send it: it fails in the worker."""
    from workers import create_celery, send_query

    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        template = session.get(Query, uuid.UUID(template_id))
        assert template is not None
        query = Query(
            tenant_id=template.tenant_id,
            collection="never-ingested",
            question="Will this fail?",
            params=dict(template.params),
        )
        session.add(query)
        session.commit()
        query_id = str(query.id)
    engine.dispose()
    send_query(create_celery(settings), query_id, "answer")
    return query_id


def _forget(settings: Settings, query_id: str) -> None:
    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        query = session.get(Query, uuid.UUID(query_id))
        if query is not None:
            session.delete(query)
            session.commit()
    engine.dispose()


def test_worker_counters_equal_the_stored_stats_of_its_answers(
    private_deployment: Deployment,
    private_redis: RedisServer,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    keys, ingested = private_deployment.keys, private_deployment.collection
    port = free_port()
    settings = private_deployment.settings.model_copy(
        update={
            "broker_url": private_redis.url(3),
            "metrics_port": port,
            "metrics_host": "127.0.0.1",
        }
    )
    name = f"metrics-{uuid.uuid4().hex[:6]}"
    worker = worker_process(settings, name)
    worker.wait_ready()
    url = f"http://127.0.0.1:{port}/metrics"
    assert _sum(_scrape(url), "specrag_queries_total") == 0  # warm-up is not an answer
    requests: list[dict[str, Any]] = [
        {"method": "draft_model", "num_speculative_tokens": 2, "max_tokens": 12},
        {"method": "draft_model", "num_speculative_tokens": 4, "max_tokens": 9},
        {"method": "draft_model", "num_speculative_tokens": 3, "max_tokens": 10,
         "temperature": 0.8, "seed": 7},
        {"method": "ngram", "num_speculative_tokens": 3, "max_tokens": 12},
        {"method": "none", "max_tokens": 6},
    ]  # fmt: skip
    with ApiServer(settings) as api, SpecragClient(api.url, keys["acme"]) as client:
        ids = [client.submit("What does assert do?", ingested, **r) for r in requests]
        done = [client.wait(i, timeout=120) for i in ids]
        assert [d["status"] for d in done] == ["succeeded"] * len(ids), done
        failed = client.wait(_fail_one(settings, ids[0]), timeout=120)
        assert failed["status"] == "failed", failed
        api_samples = _scrape(f"{api.url}/metrics")
    samples = _scrape(url)
    stored, failures = _stored(settings, name)
    answered = {str(s.query_id) for s, _ in stored}
    assert set(ids) <= answered and failures >= 1

    # Every counter equals the sum of the stored stats, per method and over all of them.
    for method in ("draft_model", "ngram", "none", None):
        mine = [(s, p) for s, p in stored if method is None or s.method == method]
        labels = {} if method is None else {"method": method}
        for name, field in (
            ("specrag_generation_tokens_total", "num_output_tokens"),
            ("specrag_target_forwards_total", "num_target_forwards"),
            ("specrag_spec_decode_num_drafts_total", "num_drafts"),
            ("specrag_spec_decode_num_draft_tokens_total", "num_draft_tokens"),
            ("specrag_spec_decode_num_accepted_tokens_total", "num_accepted_tokens"),
        ):
            expected = sum(getattr(s, field) for s, _ in mine)
            assert _sum(samples, name, **labels) == expected, (name, method)
        assert _sum(samples, "specrag_prompt_tokens_total", **labels) == sum(p for _, p in mine)
    assert sum(s.num_drafts for s, _ in stored) > 0, "no speculation happened: a weak test"
    longest = max(len(s.accepted_per_position) for s, _ in stored)
    for position in range(longest):
        expected = sum(
            s.accepted_per_position[position]
            for s, _ in stored
            if position < len(s.accepted_per_position)
        )
        name = "specrag_spec_decode_num_accepted_tokens_per_pos_total"
        assert _sum(samples, name, position=str(position)) == expected, position

    # The latency histogram counted each answer once per stage, with the stored timings.
    for stage in STAGES:
        timings = [getattr(s, f"{stage}_ms") for s, _ in stored]
        timings = [t for t in timings if t is not None]
        assert len(timings) == len(stored) or stage == "ttft"
        count = _sum(samples, "specrag_request_latency_seconds_count", stage=stage)
        assert count == len(timings), stage
        total = _sum(samples, "specrag_request_latency_seconds_sum", stage=stage)
        assert total == pytest.approx(sum(timings) / 1000.0, rel=1e-9, abs=1e-9), stage
        inf = _sum(samples, "specrag_request_latency_seconds_bucket", stage=stage, le="+Inf")
        assert inf == count, stage
    assert _sum(samples, "specrag_queries_total", status="succeeded") == len(stored)
    assert _sum(samples, "specrag_queries_total", status="failed") == failures
    assert _sum(samples, "specrag_queries_total", queue="answer", status="failed") >= 1
    assert _sum(samples, "specrag_engine_batch_size_count") == len(stored)

    # The API counted its own requests by route template, and read the broker.
    assert _sum(api_samples, "specrag_http_requests_total", route="/v1/queries", method="POST",
                code="202") == len(ids)  # fmt: skip
    polls = _sum(api_samples, "specrag_http_requests_total", route="/v1/queries/{query_id}")
    assert polls >= len(ids) + 1
    assert _sum(api_samples, "specrag_broker_up") == 1
    assert _sum(api_samples, "specrag_queue_depth", queue="answer") == 0  # all answered
    assert ("specrag_queue_depth", {"queue": "batch"}, 0.0) in api_samples


def test_api_metrics_reveal_no_tenant_data(
    service_settings: Settings, private_redis: RedisServer, keys: dict[str, str], ingested: str
) -> None:
    settings = service_settings.model_copy(update={"broker_url": private_redis.url(4)})
    secrets = ["SECRET-QUESTION-41", "SECRET-IDEMPOTENCY-42", "SECRET-PATH-43", "SECRET-ARG-44"]
    with ApiServer(settings) as api, httpx.Client(base_url=api.url, timeout=30) as http:
        auth = {"Authorization": f"Bearer {keys['acme']}"}
        made = http.post(
            "/v1/queries",
            json={"question": f"{secrets[0]}: what does assert do?", "collection": ingested},
            headers=auth | {"Idempotency-Key": secrets[1]},
        )
        assert made.status_code == 202, made.text
        query_id = made.json()["id"]
        assert (
            http.get(f"/v1/queries/{query_id}?note={secrets[3]}", headers=auth).status_code == 200
        )
        other = {"Authorization": f"Bearer {keys['globex']}"}
        assert http.get(f"/v1/queries/{query_id}", headers=other).status_code == 404
        assert http.get(f"/v1/{secrets[2]}/{query_id}", headers=auth).status_code == 404
        bad = http.post("/v1/queries", json={"question": secrets[0]}, headers=auth)
        assert bad.status_code == 422
        assert (
            http.get("/v1/queries/x", headers={"Authorization": "Bearer nope"}).status_code == 401
        )
        scraped = http.get("/metrics")  # a scraper holds no tenant's key
        assert scraped.status_code == 200
        text = scraped.text
    _forget(settings, query_id)  # its message died with the private broker: leave no orphan
    for leaked in [*secrets, query_id, keys["acme"], keys["globex"], "acme", "globex"]:
        assert leaked not in text, f"/metrics shows {leaked!r}"
    assert 'route="/v1/queries/{query_id}"' in text
    assert 'route="unmatched"' in text
    assert 'specrag_queue_depth{queue="answer"} 1.0' in text  # the query nobody consumed
    assert 'specrag_queries_pending{queue="answer",status="queued"}' in text
