"""Property-based API test: whatever a client sends, no 5xx, and a refused request stores nothing.

Hypothesis builds request bodies from the request models' fields with values of every JSON type
(strings with NUL bytes, lone surrogates, formulas, huge numbers, booleans, nesting) plus unknown
fields, and posts them to the real app on PostgreSQL.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.batch.records import Batch
from app.db import Query
from app.tenancy.records import DocumentUpload
from tests.tenancy.conftest import Api, make_api

SPECIAL = ["", " ", "docs", "\x00", "a\ud800", "\udfff", "=cmd()", "auto", "-1", "draft_model"]
texts = st.one_of(
    st.sampled_from(SPECIAL),
    st.text(max_size=40),
    st.text(alphabet=st.characters(exclude_categories=()), max_size=10),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(texts, inner, max_size=3), max_leaves=6)  # fmt: skip


def bodies(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts with any subset of ``fields`` (each a model-shaped value or any JSON), plus extras."""
    known = st.fixed_dictionaries({}, optional={k: st.one_of(v, values) for k, v in fields.items()})
    extra = st.dictionaries(texts, values, max_size=2)
    return st.tuples(known, extra, st.booleans()).map(lambda t: {**t[0], **t[1]} if t[2] else t[0])


QUERY = {
    "question": texts,
    "collection": st.just("docs"),
    "method": st.sampled_from(["draft_model", "ngram", "none", "x"]),
    "num_speculative_tokens": st.one_of(st.integers(-2, 12), st.just("auto")),
    "max_tokens": st.integers(-2, 1000),
    "temperature": st.floats(-1, 3),
    "seed": st.integers(-1, 2**64),
}
DOCUMENT = {
    "name": st.one_of(texts, st.sampled_from(["a.txt", "b.md", "c.pdf", "../x.md"])),
    "content": texts,
    "encoding": st.sampled_from(["text", "base64", "hex"]),
}
UPLOAD = {"collection": texts, "documents": st.lists(bodies(DOCUMENT), max_size=2)}
BATCH = {
    "questions": st.lists(bodies(QUERY), max_size=2),
    "filter": bodies({"since": texts, "until": texts, "collection": texts, "method": texts}),
    "collection": texts,
    "max_tokens": st.integers(-2, 1000),
}


@pytest.fixture(scope="module")
def prop_api(tenancy_pg: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One app for every example (a fresh tenant), rates off so that examples are not 429s."""
    with make_api(
        tenancy_pg, tmp_path_factory.mktemp("props"), tenant_submissions_per_second=0
    ) as api:
        yield api


def _state(api: Api) -> tuple[int, ...]:
    with Session(api.engine) as session:
        counts = tuple(
            int(session.scalar(select(func.count()).select_from(t)) or 0)
            for t in (Query, Batch, DocumentUpload)
        )
    return (*counts, len(api.sent), len(api.tasks))


def _check(api: Api, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    before = _state(api)
    response = api.post(path, body, headers)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        assert "field" in response.json()["error"], response.text
        assert _state(api) == before, f"refused {body!r} but stored or queued something"


PROPS = settings(max_examples=60, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture,
                                        HealthCheck.too_slow])  # fmt: skip


@pytest.fixture(scope="module")
def headers(prop_api: Api) -> dict[str, str]:
    """A key of a tenant made for this module."""
    return prop_api.key(f"prop-{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="module")
def admin_headers(prop_api: Api) -> dict[str, str]:
    """An admin key made for this module."""
    return prop_api.key(f"admin-{uuid.uuid4().hex[:8]}", admin=True)


@PROPS
@given(body=bodies(QUERY))
def test_queries_never_5xx_and_refusals_store_nothing(
    prop_api: Api, headers: dict[str, str], body: dict[str, Any]
) -> None:
    _check(prop_api, "/v1/queries", body, headers)


@PROPS
@given(body=bodies(UPLOAD))
def test_uploads_never_5xx_and_refusals_store_nothing(
    prop_api: Api, headers: dict[str, str], body: dict[str, Any]
) -> None:
    _check(prop_api, "/v1/documents", body, headers)


@PROPS
@given(body=bodies(BATCH))
def test_batches_never_5xx_and_refusals_store_nothing(
    prop_api: Api, headers: dict[str, str], body: dict[str, Any]
) -> None:
    _check(prop_api, "/v1/batches", body, headers)


def test_the_strategies_reach_both_outcomes(prop_api: Api, headers: dict[str, str]) -> None:
    """The property tests are not vacuous: the same model shapes produce accepted requests."""
    _check(prop_api, "/v1/queries", {"question": "What?", "collection": "docs"}, headers)
    assert prop_api.sent, "a well-formed query was not accepted"


@PROPS
@given(since=texts, until=st.one_of(st.none(), texts), fmt=st.sampled_from(["json", "csv", "x"]))
def test_the_admin_audit_never_5xx(
    prop_api: Api, admin_headers: dict[str, str], since: str, until: str | None, fmt: str
) -> None:
    if "\x00" in since or any(0xD800 <= ord(c) <= 0xDFFF for c in since + (until or "")):
        since = since.replace("\x00", "")  # a query string carries neither (the guard: NUL 422)
        since = "".join(c for c in since if not 0xD800 <= ord(c) <= 0xDFFF)
        until = None
    params = {"since": since, "format": fmt, **({"until": until} if until is not None else {})}
    response = prop_api.client.get("/v1/admin/audit", params=params, headers=admin_headers)
    assert response.status_code < 500, (params, response.text)
