"""Thin tasks: ids in, the pipeline does the work, ids (and small summaries) out."""

from __future__ import annotations

import socket
from typing import Any

from celery import Celery, Task

from workers import runtime


def register(app: Celery) -> None:
    """Register the specrag tasks on ``app`` under their stable names."""
    from workers.app import ANSWER_TASK, INGEST_TASK

    @app.task(name=ANSWER_TASK, bind=True, shared=False)
    def answer_query(self: Task, query_id: str) -> dict[str, str]:
        """Answer the stored query ``query_id``; returns its id and what happened to it."""
        from app.pipeline import answer_query as run

        resources = runtime.resources(self.app)
        hostname = self.request.hostname or socket.gethostname()
        outcome = run(resources, query_id, host=hostname)
        if outcome == "succeeded":
            from workers.audit_tasks import send_shadow_if_sampled

            send_shadow_if_sampled(self.app, query_id)  # no-op unless shadow sampling is on
        return {"id": query_id, "outcome": outcome}

    @app.task(name=INGEST_TASK, bind=True, shared=False)
    def ingest(
        self: Task, paths: list[str], collection: str, tenant: str = "default"
    ) -> dict[str, Any]:
        """Ingest files or folders into the tenant's collection; returns the ingest report."""
        report = runtime.resources(self.app).retrieval.ingest(
            paths, collection=collection, tenant=tenant
        )
        return dict(report.to_dict())
