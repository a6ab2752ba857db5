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

import workers.audit_tasks as audit_tasks
import workers.batch_tasks as batch_tasks
import workers.runtime as runtime
import workers.tasks as tasks
import workers.train_tasks as train_tasks
from app.dispatch import TaskName
from app.drafts.hooks import install_hooks as install_draft_hooks
from app.evals.hooks import install_hooks
from app.grounding import install_hooks as install_grounding_hooks
from app.requests import QueueName
from app.settings import Settings
from app.suffix.hooks import install_hooks as install_suffix_hooks

QUEUES: tuple[str, ...] = tuple(queue.value for queue in QueueName)
"""Every queue a worker may consume, in the order it serves them (answer before batch)."""


ROUTES: dict[str, str] = {
    TaskName.ANSWER.value: QueueName.ANSWER.value,
    TaskName.INGEST.value: QueueName.INGEST.value,
    TaskName.INGEST_UPLOADS.value: QueueName.INGEST.value,
    TaskName.DELETE_DOCUMENT.value: QueueName.INGEST.value,
    TaskName.BATCH_CHUNK.value: QueueName.BATCH.value,
    TaskName.SHADOW.value: QueueName.BATCH.value,
    TaskName.DRAFT_TUNE.value: QueueName.TRAIN.value,
}
"""Each task's default queue (an answer task sent to ``batch`` names its queue explicitly)."""


class SpecragCelery(Celery):
    """A Celery app that carries the process's Settings for its tasks and signal handlers."""

    settings: Settings
    warm: dict[str, bool]
    exit_on_engine_death: bool = False
    """Set by ``specrag worker``: the process exits when its engine dies (engine_guard.py)."""


def create_celery(settings: Settings) -> SpecragCelery:
    """A configured Celery app for ``settings`` with the specrag tasks registered."""
    app = SpecragCelery("specrag", set_as_current=False)
    app.settings = settings
    app.warm = {QueueName.ANSWER: True, QueueName.INGEST: True}
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
        task_default_queue=QueueName.ANSWER.value,
        task_routes={task: {"queue": queue} for task, queue in ROUTES.items()},
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
    install_hooks()  # audit's after-answer work (shadow samples) in this process's pipeline
    install_draft_hooks()  # answers' token ids for draft tuning (clear questions only)
    install_suffix_hooks()  # after the token ids: the suffix trees learn them from the database
    install_grounding_hooks()  # every succeeded answer grounded and stored (docs/grounding.md)
    tasks.register(app)
    batch_tasks.register(app)
    audit_tasks.register(app)
    train_tasks.register(app)
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
        _embedded_polling(settings.broker_polling_interval)
        return {"connect_args": {"timeout": 30}}
    return {}


def _embedded_polling(interval: float) -> None:
    """Make kombu's SQLAlchemy transport poll every ``interval`` seconds (its default is 1 s).

    A lone query waited for that poll: most of its queue time in ``make demo``. The transport
    reads ``polling_interval`` from the transport options, but its channel hands every option
    on to ``create_engine``, which refuses the unknown keyword; so the class default is set
    here, per process, when a Celery app on the embedded broker is built. A poll is one
    indexed SELECT per queue on a local file.
    """
    from kombu.transport import sqlalchemy as kombu_sqla  # optional: embedded broker

    kombu_sqla.Transport.polling_interval = interval
