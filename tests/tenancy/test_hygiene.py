"""Input hygiene over HTTP on PostgreSQL: every bad input is a 4xx naming the field, nothing stored.

Each case was a 500 (or a silent acceptance) before app/validation.py and app/api/guard.py.
"""

from __future__ import annotations

import base64
import uuid

import pytest

from app.db import Query
from app.tenancy.records import DocumentUpload
from tests.tenancy.conftest import Api

NUL = "a\x00b"
SURROGATE = "a\ud800b"


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
@pytest.mark.parametrize(
    "body,field",
    [
        ({"question": "BAD", "collection": "docs"}, "question"),
        ({"question": "ok?", "collection": "BAD"}, "collection"),
        ({"question": "ok?", "collection": "docs", "method": "BAD"}, "method"),
    ],
)
def test_query_text_that_cannot_be_stored_is_refused(
    api: Api, bad: str, body: dict, field: str
) -> None:
    headers = api.key(_tenant())
    before = api.count(Query)
    sent = {k: (bad if v == "BAD" else v) for k, v in body.items()}
    response = api.post("/v1/queries", sent, headers)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert api.count(Query) == before and api.sent == []


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
def test_batch_filters_and_upload_names_with_bad_text_are_refused(api: Api, bad: str) -> None:
    headers = api.key(_tenant())
    batch = api.post("/v1/batches", {"filter": {"collection": bad}}, headers)
    assert batch.status_code == 422 and batch.json()["error"]["field"] == "filter.collection"
    upload = api.post(
        "/v1/documents",
        {"collection": "docs", "documents": [{"name": f"{bad}.txt", "content": "hi"}]},
        headers,
    )
    assert upload.status_code == 422, upload.text
    assert upload.json()["error"]["field"] == "documents[0].name"
    content = api.post(
        "/v1/documents",
        {"collection": "docs", "documents": [{"name": "a.txt", "content": bad}]},
        headers,
    )
    assert content.status_code == 422 and content.json()["error"]["field"] == "documents[0].content"
    # A query string carries UTF-8, which has no lone surrogates: only the NUL can arrive there.
    listed = api.client.get("/v1/documents", params={"collection": NUL}, headers=headers)
    assert listed.status_code == 422 and listed.json()["error"]["field"] == "collection"
    assert api.tasks == [] and api.count(DocumentUpload) == 0


@pytest.mark.parametrize(
    "doc,problem",
    [
        ({"name": "a.pdf", "content": base64.b64encode(b"not a pdf at all").decode(),
          "encoding": "base64"}, "not a PDF"),
        ({"name": "a.pdf", "content": base64.b64encode(b"%PDF-1.4 broken").decode(),
          "encoding": "base64"}, "not a readable PDF"),
        ({"name": "a.txt", "content": base64.b64encode(b"\x00\x01\x02bin").decode(),
          "encoding": "base64"}, "binary"),
        ({"name": "a.txt", "content": base64.b64encode("caf\u00e9".encode("latin-1")).decode(),
          "encoding": "base64"}, "not valid UTF-8"),
    ],
    ids=["not-pdf", "broken-pdf", "binary", "latin-1"],
)  # fmt: skip
def test_unreadable_uploads_are_refused_at_submit(api: Api, doc: dict, problem: str) -> None:
    headers = api.key(_tenant())
    response = api.post("/v1/documents", {"collection": "docs", "documents": [doc]}, headers)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "documents[0].content"
    assert problem in response.json()["error"]["message"]
    assert api.tasks == []


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/v1/queries", {"question": "q", "collection": "docs", "colour": 1}, "colour"),
        ("/v1/queries", {"question": "q", "collection": "docs", "max_tokens": True}, "max_tokens"),
        ("/v1/queries", {"question": "q", "collection": "docs", "temperature": "0"}, "temperature"),
        ("/v1/batches", {"questions": [{"question": "q"}], "extra": 1}, "extra"),
        ("/v1/batches", {"filter": {"collection": "docs", "colour": 1}}, "filter.colour"),
        ("/v1/documents", {"collection": "docs", "documents": [], "x": 1}, "x"),
        ("/v1/documents", {"collection": "docs", "documents": [{"name": "a.txt",
                           "content": "hi", "mode": 1}]}, "documents.0.mode"),
    ],
)  # fmt: skip
def test_unknown_fields_and_loose_types_are_refused(
    api: Api, path: str, body: dict, field: str
) -> None:
    response = api.client.post(path, json=body, headers=api.key(_tenant()))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert api.sent == [] and api.tasks == []


def test_oversized_body_is_refused_before_parsing(tenancy_pg: str, tmp_path) -> None:
    from tests.tenancy.conftest import make_api

    with make_api(tenancy_pg, tmp_path, max_request_bytes=1000) as api:
        headers = api.key(_tenant())
        big = {"question": "x" * 2000, "collection": "docs"}
        response = api.post("/v1/queries", big, headers)
        assert response.status_code == 413 and response.json()["error"]["field"] == "body"
        # Streamed without a length: the cap holds while reading, too.
        chunks = (b'{"question": "' + b"x" * 500 for _ in range(4))
        streamed = api.client.post(
            "/v1/queries", content=chunks,
            headers={**headers, "Content-Type": "application/json"},
        )  # fmt: skip
        assert streamed.status_code == 413
        assert api.count(Query) == 0


def test_question_limit_in_tokens(tenancy_pg: str, tmp_path, tiny_models) -> None:
    from tests.tenancy.conftest import make_api

    with make_api(tenancy_pg, tmp_path, target_model=tiny_models["target"],
                        max_question_tokens=20) as api:  # fmt: skip
        headers = api.key(_tenant())
        # 119 characters, far under the 2000-character limit, but more than 20 tokens.
        long = " ".join(["\u4e2d\u6587"] * 40)
        response = api.post("/v1/queries", {"question": long, "collection": "docs"}, headers)
        assert response.status_code == 422, response.text
        assert "tokens" in response.json()["error"]["message"]
        ok = api.post("/v1/queries", {"question": "How?", "collection": "docs"}, headers)
        assert ok.status_code == 202
        items = [
            {"question": "How?", "collection": "docs"},
            {"question": long, "collection": "docs"},
        ]
        batch = api.post("/v1/batches", {"questions": items}, headers)
        assert batch.status_code == 422, batch.text
        assert batch.json()["error"]["field"] == "questions"
        assert "item 2" in batch.json()["error"]["message"]


@pytest.mark.parametrize(
    "since", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-05:00", "1000-01-01"]
)
def test_audit_dates_out_of_range_are_422(api: Api, since: str) -> None:
    headers = api.key(_tenant(), admin=True)
    response = api.client.get("/v1/admin/audit", params={"since": since}, headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "since"


def test_healthz_says_ok_or_unavailable_per_component_and_nothing_more(api: Api) -> None:
    assert api.client.get("/healthz").json() == {
        "status": "ok",
        "components": {"database": "ok"},
    }
    api.client.app.state.check_broker = lambda: (_ for _ in ()).throw(OSError("secret host:6379"))
    down = api.client.get("/healthz")
    assert down.status_code == 503
    assert down.json() == {
        "status": "unavailable",
        "components": {"database": "ok", "broker": "unavailable"},
    }
