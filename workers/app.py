"""The Celery app: queues, routing and delivery guarantees, built from Settings by a factory.

Queues: ``answer`` (interactive questions, GPU workers), ``batch`` (the same task at lower
priority), ``ingest`` (CPU work). Delivery is at-least-once: ``acks_late`` plus
``reject_on_worker_lost`` put a task back when its worker dies, prefetch 1 per task slot keeps a
slow answer from holding queued work hostage (a threads-pool worker with N slots holds at most N
unacknowledged messages, each a query in its engine loop), and the pipeline's claim and unique keys make a second delivery
harmless.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from app.settings import Settings

ANSWER_TASK = "specrag.answer_query"
INGEST_TASK = "specrag.ingest"
INGEST_UPLOADS_TASK = "specrag.ingest_uploads"
DELETE_DOCUMENT_TASK = "specrag.delete_document"
BATCH_TASK = "specrag.batch_chunk"  # workers/batch_tasks.py
SHADOW_TASK = "specrag.audit.shadow"  # workers/audit_tasks.py
QUEUES = ("answer", "batch", "ingest")


class SpecragCelery(Celery):
    """A Celery app that carries the process's Settings for its tasks and signal handlers."""

    settings: Settings
    warm: dict[str, bool]


def create_celery(settings: Settings) -> SpecragCelery:
    """A configured Celery app for ``settings`` with the specrag tasks registered."""
    from workers import audit_tasks, batch_tasks, runtime, tasks

    app = SpecragCelery("specrag", set_as_current=False)
    app.settings = settings
    app.warm = {"answer": True, "ingest": True}
    broker = settings.resolved_broker_url
    if broker.startswith("sqla+sqlite"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    app.conf.update(
        broker_url=broker,
        result_backend=settings.result_backend,
        task_ignore_result=settings.result_backend is None,
        task_serializer="json",
        accept_content=["json"],
        # Each queue on its own direct exchange and key: a bare Queue(name) takes the default
        # exchange and key ("answer"), which binds all three queues to one key on Redis.
        task_queues=[
            Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUES
        ],
        task_default_queue="answer",
        task_routes={
            ANSWER_TASK: {"queue": "answer"},
            INGEST_TASK: {"queue": "ingest"},
            INGEST_UPLOADS_TASK: {"queue": "ingest"},
            DELETE_DOCUMENT_TASK: {"queue": "ingest"},
            BATCH_TASK: {"queue": "batch"},
            SHADOW_TASK: {"queue": "batch"},
        },
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.task_soft_time_limit,
        task_time_limit=settings.task_time_limit,
        broker_connection_timeout=settings.broker_timeout_seconds,
        broker_connection_retry_on_startup=True,
        broker_transport_options=_transport_options(broker, settings),
        worker_pool=settings.worker_pool,
        worker_hijack_root_logger=False,
        # Task events cost Redis round trips on every task; Flower switches them on while it runs.
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    tasks.register(app)
    batch_tasks.register(app)
    audit_tasks.register(app)
    runtime.connect_signals(app)
    return app


def _transport_options(broker: str, settings: Settings) -> dict[str, Any]:
    if broker.startswith("redis"):
        return {
            # Consume the worker's queues in the order given (answer before batch), not round-robin.
            "queue_order_strategy": "priority",
            "visibility_timeout": max(3600, 2 * settings.task_time_limit),
            "socket_connect_timeout": settings.broker_timeout_seconds,
        }
    if broker.startswith("sqla+sqlite"):
        # kombu hands these to create_engine: wait for SQLite's lock instead of failing at once.
        # kombu polls this transport (1 s by default: most of a lone query's queue wait in
        # `make demo`); a poll is one indexed SELECT per queue on a local file.
        return {
            "connect_args": {"timeout": 30},
            "polling_interval": settings.broker_polling_interval,
        }
    return {}


def send_query(app: Celery, query_id: Any, queue: str = "answer") -> None:
    """Put one query id on ``queue``; raises at once (no retry loop) when the broker is down."""
    priority = 0 if queue == "answer" else 5
    app.send_task(ANSWER_TASK, args=[str(query_id)], queue=queue, priority=priority, retry=False)
    if queue == "answer":
        from workers.wakeup import announce

        announce(str(app.conf.broker_url or ""))  # batch workers preempt now, not at their poll
