"""The API's cheap checks come first, on PostgreSQL: no key or no rate left means the body is never
read; bodies are bounded in size and depth, and every refusal is the shared shape naming a field.

Each case was a 500, a 429 that could never succeed, or a body parsed on the event loop before
the key was looked at.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.db import Query
from tests.tenancy.conftest import Api, make_api

DEEP = b"[" * 5000 + b"]" * 5000


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _raw(api: Api, path: str, body: bytes, headers: dict[str, str]) -> Any:
    return api.client.post(
        path, content=body, headers={**headers, "Content-Type": "application/json"}
    )


def _shared_shape(response: Any, field: str) -> None:
    body = response.json()
    assert set(body) == {"error", "detail"}, body
    assert body["error"]["field"] == field, body


@pytest.mark.parametrize("path", ["/v1/queries", "/v1/batches", "/v1/documents"])
def test_deep_nesting_is_a_422_naming_the_body(api: Api, path: str) -> None:
    response = _raw(api, path, DEEP, api.key(_tenant()))
    assert response.status_code == 422, response.text
    _shared_shape(response, "body")
    assert "nested" in response.json()["error"]["message"]
    # Deep, but not deep enough for Python's recursion limit: the depth bound refuses it too.
    medium = b'{"question": ' + b"[" * 500 + b"]" * 500 + b', "collection": "docs"}'
    assert _raw(api, path, medium, api.key(_tenant())).status_code == 422


def test_without_a_key_nothing_is_parsed_and_healthz_never_parses(api: Api) -> None:
    no_key = _raw(api, "/v1/queries", DEEP, {})
    assert no_key.status_code == 401
    _shared_shape(no_key, "Authorization")
    assert api.client.post("/healthz", content=DEEP).status_code == 405


@pytest.mark.parametrize(
    "body,words",
    [
        (b'{"question": "caf\xe9?", "collection": "docs"}', "UTF-8"),
        (b'{"question": "q?", "collection": "do', "line 1 column"),
        (b'{"question": "q?", "collection": "docs", "num_speculative_tokens": '
         + b"9" * 5000 + b"}", "too many digits"),
    ],
    ids=["latin-1", "truncated", "5000-digit-k"],
)  # fmt: skip
def test_undecodable_bodies_name_the_body_in_the_shared_shape(
    api: Api, body: bytes, words: str
) -> None:
    response = _raw(api, "/v1/queries", body, api.key(_tenant()))
    assert response.status_code == 422, response.text
    _shared_shape(response, "body")
    assert words in response.json()["error"]["message"]
    assert "set_int_max_str_digits" not in response.text
    assert api.count(Query) == 0


def test_a_17_mb_question_is_refused_by_its_length_alone(api: Api) -> None:
    big = b'{"question": "' + b"x" * (17 * 1024 * 1024) + b'", "collection": "docs"}'
    for headers in ({}, api.key(_tenant())):
        response = _raw(api, "/v1/queries", big, headers)
        assert response.status_code == 413, response.text
        _shared_shape(response, "body")


class _Probe:
    """An ASGI receive that counts how many body messages the app asked for."""

    def __init__(self, body: bytes) -> None:
        self.body, self.reads = body, 0

    async def __call__(self) -> dict[str, Any]:
        self.reads += 1
        if self.reads == 1:
            return {"type": "http.request", "body": self.body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}


def _call(app: Any, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, int, dict]:
    """Run one request through the app's ASGI stack: (status, body reads, JSON answer)."""
    probe = _Probe(body)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
        "headers": [(b"content-type", b"application/json")]
        + [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }  # fmt: skip
    asyncio.run(app(scope, probe, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], probe.reads, json.loads(payload)


def test_no_key_and_no_rate_left_are_answered_before_the_body_is_read(
    tenancy_pg: str, tmp_path: Path
) -> None:
    # One per thousand seconds: no host admits a second 2,000-line batch however slowly it
    # reads the first (one per ten seconds did, on a loaded 2-core host).
    with make_api(tenancy_pg, tmp_path, tenant_submissions_per_second=0.001,
                  tenant_submission_burst=0) as api:  # fmt: skip
        app = api.client.app
        jsonl = "\n".join(json.dumps({"question": f"q{i}?"}) for i in range(2000))
        body = json.dumps({"jsonl": jsonl, "collection": "docs"}).encode()
        status, reads, _ = _call(app, "/v1/batches", body, {})
        assert (status, reads) == (401, 0)
        headers = api.key(_tenant())
        outcomes = [_call(app, "/v1/batches", body, headers) for _ in range(3)]
        # The first is admitted (its body read once), and
        # whatever is refused is refused before a byte of its body was read.
        assert outcomes[0][:2] == (202, 1), outcomes[0]
        refused = [o for o in outcomes if o[0] == 429]
        assert refused and all(reads == 0 for _, reads, _ in refused), outcomes
        assert refused[0][2]["error"]["field"] == "submissions_per_second"


def test_a_batch_over_the_item_limit_is_a_413_naming_it_not_a_429(api: Api) -> None:
    headers = api.key(_tenant())
    n = api.settings.batch_max_items + 1
    jsonl = "\n".join(json.dumps({"question": f"q{i}?"}) for i in range(n))
    response = api.post("/v1/batches", {"jsonl": jsonl, "collection": "docs"}, headers)
    assert response.status_code == 413, response.text
    _shared_shape(response, "jsonl")
    assert "batch_max_items" in response.json()["error"]["message"]
    assert "Retry-After" not in response.headers


def test_a_batch_over_the_tenants_in_flight_quota_is_a_413(tenancy_pg: str, tmp_path: Path) -> None:
    with make_api(tenancy_pg, tmp_path, tenant_max_batch_items=5) as api:
        questions = [{"question": f"q{i}?"} for i in range(6)]
        response = api.post(
            "/v1/batches", {"questions": questions, "collection": "docs"}, api.key(_tenant())
        )
        assert response.status_code == 413, response.text
        _shared_shape(response, "questions")
        assert "max_batch_items" in response.json()["error"]["message"]


def test_a_deeply_nested_jsonl_line_is_a_422_naming_the_file(api: Api) -> None:
    line = "[" * 5000 + "]" * 5000
    body = {"jsonl": json.dumps({"question": "ok?"}) + "\n" + line, "collection": "docs"}
    response = api.post("/v1/batches", body, api.key(_tenant()))
    assert response.status_code == 422, response.text
    _shared_shape(response, "file")
    assert "line 2" in response.json()["error"]["message"]
