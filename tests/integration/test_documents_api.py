"""``/v1/documents``: upload over HTTP → indexed by a live ingest worker → listed → deleted.

Real PostgreSQL, Redis, MiniLM and FAISS; the ingest worker is a ``specrag worker`` subprocess.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from app.settings import Settings
from tests.integration.helpers import ApiServer, WorkerProcess

pytestmark = pytest.mark.integration
TEXT = "# Rotating keys\n\nTo rotate an API key, create a new key, deploy it, then revoke the old key.\n"


@pytest.fixture(scope="module")
def api(service_settings: Settings) -> Iterator[ApiServer]:
    """An API server for this module only.

    Not the session's: every API runs an outbox sweeper over the shared database, and one left
    running would send the queries that test_recovery keeps away from the broker on purpose.
    """
    with ApiServer(service_settings) as server:
        yield server


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _wait_for(predicate: Callable[[], Any], what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)
    return found


def test_upload_list_and_delete_through_a_live_ingest_worker(
    service_settings: Settings,
    api: ApiServer,
    keys: dict[str, str],
    worker_process: Callable[..., WorkerProcess],
) -> None:
    worker_process(service_settings, "uploads", queues="ingest").wait_ready()
    body = {
        "collection": "handbook",
        "documents": [
            {"name": "keys.md", "content": TEXT},
            {
                "name": "faq.txt",
                "content": base64.b64encode(b"Q: Who rotates keys?\nA: Admins.\n").decode(),
                "encoding": "base64",
            },
        ],
    }
    sent = httpx.post(f"{api.url}/v1/documents", json=body, headers=_auth(keys["acme"]))
    assert sent.status_code == 202, sent.text
    assert sent.json()["documents"] == ["keys.md", "faq.txt"]

    def listed() -> list[dict[str, Any]]:
        r = httpx.get(
            f"{api.url}/v1/documents",
            params={"collection": "handbook"},
            headers=_auth(keys["acme"]),
        )
        assert r.status_code == 200, r.text
        docs = r.json()["documents"]
        return docs if len(docs) == 2 and all(d["status"] == "indexed" for d in docs) else []

    docs = _wait_for(listed, "both uploads to be indexed")
    assert all(d["chunks"] >= 1 for d in docs)
    source = next(d["document"] for d in docs if d["document"].endswith("keys.md"))

    # Another tenant sees nothing of it, even under the same collection name.
    other = httpx.get(
        f"{api.url}/v1/documents", params={"collection": "handbook"}, headers=_auth(keys["globex"])
    )
    assert other.status_code == 200 and other.json()["documents"] == []
    refused = httpx.delete(
        f"{api.url}/v1/documents",
        params={"collection": "handbook", "document": source},
        headers=_auth(keys["globex"]),
    )
    assert refused.status_code == 404 and refused.json()["error"]["field"] == "document"

    # The new collection is now one its tenant may ask about (unknown collections are refused).
    asked = httpx.post(
        f"{api.url}/v1/queries",
        json={"question": "How do I rotate a key?", "collection": "handbook"},
        headers=_auth(keys["acme"]),
    )
    assert asked.status_code == 202, asked.text

    gone = httpx.delete(
        f"{api.url}/v1/documents",
        params={"collection": "handbook", "document": source},
        headers=_auth(keys["acme"]),
    )
    assert gone.status_code == 202, gone.text
    _wait_for(lambda: all(d["document"] != source for d in listed_all(api, keys)), "the deletion")
    assert [d["document"] for d in listed_all(api, keys)] == [
        d["document"] for d in docs if d["document"] != source
    ]


def listed_all(api: ApiServer, keys: dict[str, str]) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{api.url}/v1/documents", params={"collection": "handbook"}, headers=_auth(keys["acme"])
    )
    docs: list[dict[str, Any]] = r.json()["documents"]
    return docs


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"name": "notes.docx", "content": "x"}, "documents[0].name"),
        ({"name": "../escape.md", "content": "x"}, "documents[0].name"),
        ({"name": "empty.md", "content": "   "}, "documents[0].content"),
        (
            {"name": "scan.pdf", "content": "not base64 at all!", "encoding": "base64"},
            "documents[0].content",
        ),
        ({"name": "scan.pdf", "content": "%PDF-1.4"}, "documents[0].encoding"),
    ],
)
def test_bad_uploads_are_refused_naming_the_field(
    api: ApiServer, keys: dict[str, str], document: dict[str, str], field: str
) -> None:
    r = httpx.post(
        f"{api.url}/v1/documents",
        json={"collection": "bad-input", "documents": [document]},
        headers=_auth(keys["acme"]),
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field
    assert listed_bad(api, keys) == []


def listed_bad(api: ApiServer, keys: dict[str, str]) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{api.url}/v1/documents", params={"collection": "bad-input"}, headers=_auth(keys["acme"])
    )
    docs: list[dict[str, Any]] = r.json()["documents"]
    return docs


def test_documents_need_a_key(api: ApiServer) -> None:
    assert httpx.get(f"{api.url}/v1/documents", params={"collection": "x"}).status_code == 401
