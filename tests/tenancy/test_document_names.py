"""Document names and concurrent uploads on PostgreSQL: every bad name is a 422 naming the field
(never a 500 or a document pending for ever), and racing first uploads of one new file all land.
"""

from __future__ import annotations

import base64
import threading
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from app.db import make_session_factory
from app.documents.ingest import ingest_uploaded
from app.documents.state import mark_pending
from app.documents.upload import MAX_NAME_BYTES, list_documents
from app.resources import Resources
from app.settings import Settings
from app.tenancy.records import DocumentUpload
from tests.tenancy.conftest import Api, make_api


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(
    "name,words",
    [
        ("a" * 256 + ".txt", "characters"),
        ("é" * 200 + ".txt", "bytes"),
        ("日本" * 100 + ".txt", "bytes"),
        ("\u202egnp.txt", "U+202E"),
        ("a\u200bb.txt", "U+200B"),
        ("tab\there.txt", "U+0009"),
        ("new\nline.txt", "U+000A"),
        ("bell\x07.txt", "U+0007"),
        (" lead.txt", "plain file name"),
        ("dir/a.txt", "plain file name"),
    ],
    ids=["256-chars", "e-acute", "cjk", "rtl-override", "zero-width", "tab", "newline", "bell",
         "leading-space", "path"],
)  # fmt: skip
def test_bad_document_names_are_422s_naming_the_field(api: Api, name: str, words: str) -> None:
    doc = {"name": name, "content": "hello"}
    response = api.post("/v1/documents", {"collection": "docs", "documents": [doc]},
                        api.key(_tenant()))  # fmt: skip
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "documents[0].name"
    assert words in response.json()["error"]["message"]
    assert api.tasks == []


def test_long_but_legal_names_are_accepted(api: Api) -> None:
    name = "é" * ((MAX_NAME_BYTES - 4) // 2) + ".txt"  # exactly the byte limit
    assert len(name.encode()) == MAX_NAME_BYTES
    response = api.post(
        "/v1/documents",
        {"collection": "docs", "documents": [{"name": name, "content": "hello"}]},
        api.key(_tenant()),
    )
    assert response.status_code == 202, response.text


def test_concurrent_first_uploads_of_one_new_file_all_land(tenancy_pg: str, tmp_path: Path) -> None:
    with make_api(tenancy_pg, tmp_path, tenant_submissions_per_second=0) as api:
        tenant = _tenant()
        headers = api.key(tenant)
        body = {"collection": "docs", "documents": [{"name": "same.txt", "content": "hello"}]}
        barrier = threading.Barrier(20)
        codes: list[int] = []

        def upload() -> None:
            barrier.wait()
            codes.append(api.post("/v1/documents", body, headers).status_code)

        threads = [threading.Thread(target=upload) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert codes == [202] * 20, codes
        with Session(api.engine) as session:
            rows = session.scalars(
                select(DocumentUpload).where(DocumentUpload.tenant == tenant)
            ).all()
        assert [(r.name, r.status) for r in rows] == [("same.txt", "pending")]


def test_a_refused_upload_is_not_charged_to_the_daily_quota(
    tenancy_pg: str, tmp_path: Path
) -> None:
    with make_api(tenancy_pg, tmp_path, tenant_max_upload_bytes_per_day=1500) as api:
        headers = api.key(_tenant())
        doc = {"collection": "docs", "documents": [{"name": "a.txt", "content": "x" * 1000}]}
        sends = api.dispatcher.send_uploads

        def unreachable(*args: object) -> None:
            raise ConnectionError("broker down")

        api.dispatcher.send_uploads = unreachable  # type: ignore[method-assign]
        for _ in range(3):  # the ingest queue is unreachable: 503, nothing stored
            assert api.post("/v1/documents", doc, headers).status_code == 503
        api.dispatcher.send_uploads = sends  # type: ignore[method-assign]
        assert api.post("/v1/documents", doc, headers).status_code == 202
        assert api.post("/v1/documents", doc, headers).status_code == 429  # 2000 > 1500: used


def test_an_upload_the_worker_cannot_write_fails_with_a_reason(
    tenancy_pg: str, tmp_path: Path
) -> None:
    # What an older API let through: a name within 255 characters but not within 255 bytes.
    settings = Settings(data_dir=tmp_path, database_url=tenancy_pg)
    engine = create_engine(tenancy_pg)
    resources = Resources(settings, make_session_factory(engine))
    tenant, name = _tenant(), "é" * 200 + ".txt"

    class Up:
        def __init__(self) -> None:
            self.name, self.content = name, b"hello"

    with Session(engine) as session:
        mark_pending(session, tenant, "docs", [Up()])
    report = ingest_uploaded(
        resources, [{"name": name, "content_b64": base64.b64encode(b"hello").decode()}],
        "docs", tenant,
    )  # fmt: skip
    assert report["status"] == "failed"
    with Session(engine) as session:
        (doc,) = list_documents(session, tenant, "docs")
    assert doc["status"] == "failed" and "could not write" in doc["reason"]
    engine.dispose()
