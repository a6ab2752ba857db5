"""Celery only: the app and its settings, queue routing, thin tasks, per-process resources."""

from workers.app import ANSWER_TASK, INGEST_TASK, QUEUES, SpecragCelery, create_celery, send_query

__all__ = ["ANSWER_TASK", "INGEST_TASK", "QUEUES", "SpecragCelery", "create_celery", "send_query"]
