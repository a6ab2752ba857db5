"""The shadow-baseline task (``batch`` queue): ids in, app.evals.shadow does the work."""

from __future__ import annotations

import logging
import uuid

from celery import Celery, Task

import workers.runtime as runtime
from app.dispatch import TaskName
from app.evals.shadow import is_pending, run_shadow
from app.requests import QueueName

log = logging.getLogger(__name__)


def register(app: Celery) -> None:
    """Register the audit tasks on ``app`` under their stable names."""

    @app.task(name=TaskName.SHADOW.value, bind=True, shared=False)
    def shadow_baseline(self: Task, query_id: str) -> dict[str, str]:
        """Decode a sampled query's prompt without speculation; returns its id and the outcome."""
        resources = runtime.resources(self.app)
        outcome = run_shadow(
            resources.session_factory,
            resources.engine,
            resources.tokenizer,
            query_id,
            resources.settings.shadow_dtype,
        )
        return {"id": query_id, "outcome": outcome}


def send_shadow_if_sampled(app: Celery, query_id: str | uuid.UUID) -> bool:
    """Queue the shadow baseline of an answered query when it was sampled; True if queued.

    Never raises: a broker error leaves the sample pending (the report counts it) rather than
    failing the answer task whose answer is already recorded.
    """
    settings = app.settings  # type: ignore[attr-defined]
    if settings.shadow_sample_rate <= 0:
        return False
    try:
        if not is_pending(runtime.resources(app).session_factory, query_id):
            return False
        app.send_task(
            TaskName.SHADOW.value,
            args=[str(query_id)],
            queue=QueueName.BATCH.value,
            priority=9,
            retry=False,
        )
        return True
    except Exception:
        log.exception("could not queue the shadow baseline of query %s", query_id)
        return False
