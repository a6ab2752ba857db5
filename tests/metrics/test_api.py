"""The API's /metrics on the embedded database: route templates, codes, queue depth via the
dispatcher, and no broker at all (``NoQueue``) reported as ``specrag_broker_up 0``."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.api import create_app
from app.settings import Settings
from tests.fakes import RecordingDispatcher


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _get(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(v for n, ls, v in samples if n == name and labels.items() <= ls.items())


def test_requests_are_counted_by_route_template(sqlite_settings: Settings) -> None:
    dispatcher = RecordingDispatcher(depths={"answer": 3, "batch": 1})
    app = create_app(sqlite_settings, dispatcher, sweeper=False)
    with TestClient(app) as client:
        assert client.get("/healthz").status_code in (200, 503)
        secret = uuid.uuid4()
        assert client.get(f"/v1/queries/{secret}").status_code == 401  # no key
        assert client.get(f"/no/such/{secret}").status_code == 404
        text = client.get("/metrics").text
    samples = _samples(text)
    assert str(secret) not in text
    assert _get(samples, "specrag_http_requests_total", route="/v1/queries/{query_id}",
                method="GET", code="401") == 1  # fmt: skip
    assert _get(samples, "specrag_http_requests_total", route="unmatched", code="404") == 1
    assert _get(samples, "specrag_http_request_duration_seconds_count", route="/healthz") == 1
    assert _get(samples, "specrag_queue_depth", queue="answer") == 3
    assert _get(samples, "specrag_queue_depth", queue="batch") == 1
    assert _get(samples, "specrag_queue_depth", queue="ingest") == 0
    assert _get(samples, "specrag_broker_up") == 1
    assert _get(samples, "specrag_queries_pending", queue="answer", status="queued") == 0


def test_an_api_without_a_queue_reports_the_broker_down(sqlite_settings: Settings) -> None:
    with TestClient(create_app(sqlite_settings, None, sweeper=False)) as client:
        reply = client.get("/metrics")
    assert reply.status_code == 200
    samples = _samples(reply.text)
    assert _get(samples, "specrag_broker_up") == 0
    assert not [s for s in samples if s[0] == "specrag_queue_depth"]
