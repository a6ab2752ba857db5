"""Thin tasks: ids in, the pipeline does the work, ids (and small summaries) out."""

from __future__ import annotations

import logging
import socket
from typing import Any

from celery import Celery, Task
from celery.exceptions import Reject

import workers.runtime as runtime
from app.dispatch import TaskName
from app.documents.deadline import time_limit
from app.documents.ingest import delete_uploaded, ingest_uploaded
from app.lifecycle.lease import await_hand_back
from app.lifecycle.outage import DatabaseUnavailable, backoff
from app.lifecycle.outbox import admit
from app.pipeline import answer_query as run
from app.pipeline import loop_step
from app.requests import QueryStatus
from workers.audit_tasks import send_shadow_if_sampled
from workers.dispatcher import send_query

log = logging.getLogger(__name__)


def _admit_next(app: Celery, resources: Any) -> None:
    """A slot freed: send the next held queries in tenant round-robin (app/lifecycle/outbox.py admit)."""
    try:
        admit(resources.session_factory, resources.settings, lambda q, qu: send_query(app, q, qu))
    except Exception:  # the sweeper admits on its next round
        log.exception("admission after an answer failed")


def register(app: Celery) -> None:
    """Register the specrag tasks on ``app`` under their stable names."""

    @app.task(name=TaskName.ANSWER.value, bind=True, shared=False)
    def answer_query(self: Task, query_id: str) -> dict[str, str]:
        """Answer the stored query ``query_id``; returns its id and what happened to it."""
        resources = runtime.resources(self.app)
        if resources.engine_dead():
            # This worker is on its way out (workers/engine_guard.py): nothing is claimed, and the
            # message, never acknowledged, is sent again by the sweepers (workers/unclaimed.py).
            await_hand_back()
            raise Reject("the engine died; this worker takes no more queries", requeue=True)
        hostname = self.request.hostname or socket.gethostname()
        try:
            # Generation joins the process's one engine loop with the other queries in flight.
            outcome = run(resources, query_id, host=hostname, generate_step=loop_step(resources))
        except DatabaseUnavailable as exc:
            # Never acked as done: the message comes back, later, until the database does.
            retries = int(self.request.retries or 0)
            log.warning("query %s: %s; retry %d", query_id, exc, retries + 1)
            delay = backoff(retries, first=2.0, cap=30.0)
            raise self.retry(countdown=delay, max_retries=None) from exc
        if outcome in (QueryStatus.SUCCEEDED, QueryStatus.FAILED):
            _admit_next(self.app, resources)
        if outcome == QueryStatus.SUCCEEDED:
            send_shadow_if_sampled(self.app, query_id)  # no-op unless shadow sampling is on
        return {"id": query_id, "outcome": outcome}

    @app.task(name=TaskName.INGEST.value, bind=True, shared=False)
    def ingest(
        self: Task, paths: list[str], collection: str, tenant: str = "default"
    ) -> dict[str, Any]:
        """Ingest files or folders into the tenant's collection; returns the ingest report."""
        resources = runtime.resources(self.app)
        with time_limit(resources.settings.ingest_time_limit):
            report = resources.retrieval.ingest(paths, collection=collection, tenant=tenant)
        return dict(report.to_dict())

    @app.task(name=TaskName.INGEST_UPLOADS.value, bind=True, shared=False)
    def ingest_uploads(
        self: Task,
        files: list[dict[str, str]],
        collection: str,
        tenant: str,
        max_chars: int = 0,
    ) -> dict[str, Any]:
        """Ingest files uploaded over the API under their own names; records each file's state."""
        return ingest_uploaded(runtime.resources(self.app), files, collection, tenant, max_chars)

    @app.task(name=TaskName.DELETE_DOCUMENT.value, bind=True, shared=False)
    def delete_document(self: Task, source: str, collection: str, tenant: str) -> bool:
        """Remove one document from the tenant's collection (database and index together)."""
        return delete_uploaded(runtime.resources(self.app), source, collection, tenant)
