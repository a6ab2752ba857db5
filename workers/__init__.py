"""Celery only: the app and its settings, queue routing, thin tasks, per-process resources."""

from workers.app import (
    ANSWER_TASK,
    DELETE_DOCUMENT_TASK,
    INGEST_TASK,
    INGEST_UPLOADS_TASK,
    QUEUES,
    SpecragCelery,
    create_celery,
    send_query,
)

__all__ = [
    "ANSWER_TASK",
    "DELETE_DOCUMENT_TASK",
    "INGEST_TASK",
    "INGEST_UPLOADS_TASK",
    "QUEUES",
    "SpecragCelery",
    "create_celery",
    "send_query",
]
