"""``CeleryDispatcher``: app/dispatch.py's ``Dispatcher`` on a Celery app (queues, priorities).

Interactive answers go out at priority 0 and are announced to batch workers (workers/wakeup.py),
so that a batch item in flight is preempted at once; batch work goes out at the lowest step.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from celery import Celery, group
from celery.canvas import Signature

import workers.priority as priority
from app.dispatch import TaskName
from app.requests import QueueName
from workers.broker_epoch import BrokerEpoch
from workers.queue_depth import queue_depths
from workers.wakeup import announce

BATCH_PRIORITY = 9
"""Lowest of the Redis transport's priority steps (0 is served first)."""


def chunk_signature(app: Celery, batch_id: uuid.UUID | str, epoch: int) -> Signature:
    """The signature of one chunk task of the batch, routed to the batch queue."""
    return app.signature(
        TaskName.BATCH_CHUNK.value,
        args=[str(batch_id), int(epoch)],
        queue=QueueName.BATCH.value,
        priority=BATCH_PRIORITY,
        immutable=True,
    )


def send_query(app: Celery, query_id: Any, queue: str = QueueName.ANSWER) -> None:
    """Put one query id on ``queue``; raises at once (no retry loop) when the broker is down."""
    interactive = queue == QueueName.ANSWER
    app.send_task(
        TaskName.ANSWER.value,
        args=[str(query_id)],
        queue=str(queue),
        priority=0 if interactive else 5,
        retry=False,
    )
    if interactive:
        announce(str(app.conf.broker_url or ""))  # batch workers preempt now, not at their poll


def dispatch_batch(app: Celery, batch_id: uuid.UUID | str, epoch: int, lanes: int) -> None:
    """Send the batch's ``lanes`` chunk tasks as one group; raises when the broker is down."""
    group(chunk_signature(app, batch_id, epoch) for _ in range(max(1, lanes))).apply_async()


class CeleryDispatcher:
    """A ``Dispatcher`` on a Celery app, built on first send when given a factory.

    The API and the CLI hold one from start-up but may never send (a read-only API, ``ask
    --local``), so the Celery app is built lazily; a worker passes its own app.
    """

    def __init__(self, app: Celery | Callable[[], Celery]) -> None:
        self._app = app if isinstance(app, Celery) else None
        self._make = None if isinstance(app, Celery) else app
        self._lock = threading.Lock()
        self._epoch: BrokerEpoch | None = None

    def broker_lost(self) -> datetime | None:
        """Once per loss of the broker's data, when it was lost (workers/broker_epoch.py)."""
        if self._epoch is None:
            self._epoch = BrokerEpoch(str(self.app.conf.broker_url or ""))
        return self._epoch.lost()

    @property
    def app(self) -> Celery:
        """The Celery app (built now if it was not yet)."""
        with self._lock:
            if self._app is None:
                assert self._make is not None
                self._app = self._make()
            return self._app

    def send_query(self, query_id: uuid.UUID, queue: str = QueueName.ANSWER) -> None:
        """Put one stored query's id on ``queue``."""
        send_query(self.app, query_id, queue)

    def _send(self, task: str, args: list[Any]) -> None:
        self.app.send_task(task, args=args, retry=False)

    def send_ingest(self, paths: list[str], collection: str, tenant: str) -> None:
        """Queue the ingest of files or folders."""
        self._send(TaskName.INGEST.value, [list(paths), collection, tenant])

    def send_uploads(
        self, files: list[dict[str, str]], collection: str, tenant: str, max_chars: int = 0
    ) -> None:
        """Queue uploaded files for ingest (with the tenant's extracted-characters limit)."""
        self._send(TaskName.INGEST_UPLOADS.value, [files, collection, tenant, max_chars])

    def ping(self) -> None:
        """Raise unless the broker answers within the broker timeout (for ``/healthz``)."""
        timeout = float(self.app.conf.broker_connection_timeout or 2.0)
        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)

    def send_delete(self, source: str, collection: str, tenant: str) -> None:
        """Queue the removal of one document."""
        self._send(TaskName.DELETE_DOCUMENT.value, [source, collection, tenant])

    def dispatch_batch(self, batch_id: uuid.UUID, epoch: int, lanes: int) -> None:
        """Start the batch's chunk tasks."""
        dispatch_batch(self.app, batch_id, epoch, lanes)

    def send_tune(self, job: dict[str, Any]) -> None:
        """Queue a draft tune on the ``train`` queue."""
        self.app.send_task(
            TaskName.DRAFT_TUNE.value, args=[job], queue=QueueName.TRAIN.value, retry=False
        )

    def answer_waiting(self) -> bool:
        """Whether interactive answer messages wait in the broker."""
        return priority.waiting(self.app, QueueName.ANSWER)

    def queue_depths(self, queues: Sequence[str]) -> dict[str, int]:
        """Messages waiting per queue in the broker (all priority lists on Redis)."""
        return queue_depths(self.app, queues)
