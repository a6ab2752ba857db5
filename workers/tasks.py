"""Thin tasks: ids in, the pipeline does the work, ids (and small summaries) out."""

from __future__ import annotations

import socket
from typing import Any

from celery import Celery, Task

from app.dispatch import TaskName
from app.documents import upload_dir, write_uploads
from app.pipeline import answer_query as run
from app.requests import QueryStatus
from workers import runtime
from workers.audit_tasks import send_shadow_if_sampled


def register(app: Celery) -> None:
    """Register the specrag tasks on ``app`` under their stable names."""

    @app.task(name=TaskName.ANSWER, bind=True, shared=False)
    def answer_query(self: Task, query_id: str) -> dict[str, str]:
        """Answer the stored query ``query_id``; returns its id and what happened to it."""
        resources = runtime.resources(self.app)
        hostname = self.request.hostname or socket.gethostname()
        outcome = run(resources, query_id, host=hostname)
        if outcome == QueryStatus.SUCCEEDED:
            send_shadow_if_sampled(self.app, query_id)  # no-op unless shadow sampling is on
        return {"id": query_id, "outcome": outcome}

    @app.task(name=TaskName.INGEST, bind=True, shared=False)
    def ingest(
        self: Task, paths: list[str], collection: str, tenant: str = "default"
    ) -> dict[str, Any]:
        """Ingest files or folders into the tenant's collection; returns the ingest report."""
        report = runtime.resources(self.app).retrieval.ingest(
            paths, collection=collection, tenant=tenant
        )
        return dict(report.to_dict())

    @app.task(name=TaskName.INGEST_UPLOADS, bind=True, shared=False)
    def ingest_uploads(
        self: Task, files: list[dict[str, str]], collection: str, tenant: str
    ) -> dict[str, Any]:
        """Write files uploaded over the API under the data dir and ingest them."""
        resources = runtime.resources(self.app)
        folder = upload_dir(resources.settings.data_dir, tenant, collection)
        paths = write_uploads(folder, files)
        report = resources.retrieval.ingest(paths, collection=collection, tenant=tenant)
        return dict(report.to_dict())

    @app.task(name=TaskName.DELETE_DOCUMENT, bind=True, shared=False)
    def delete_document(self: Task, source: str, collection: str, tenant: str) -> bool:
        """Remove one document from the tenant's collection (database and index together)."""
        return bool(
            runtime.resources(self.app).retrieval.delete(
                source, collection=collection, tenant=tenant
            )
        )
