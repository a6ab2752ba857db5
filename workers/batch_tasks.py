"""Batch chunk tasks on the ``batch`` queue, their dispatch as a Celery group, and the watchdog.

A batch runs as ``lanes`` (at most ``batch_max_concurrency``) chunk tasks sent as one ``group``.
Each answers up to ``batch_chunk_size`` items through ``app.batch.runner`` and then re-sends
itself to the back of the batch queue, so a long batch is many short tasks (time limits hold,
other batches interleave) without one message per item.

Interactive work first: the worker consumes ``answer`` before ``batch`` (Redis transport,
``queue_order_strategy="priority"``; chunk messages also carry the lowest priority step), but that
order only matters between tasks. So on a worker that also serves ``answer``, a process-wide
``Preemptor`` (app/batch/preempt.py) counts the tasks in flight (task_prerun/task_postrun) and,
when every slot is taken and interactive work waits, cancels the newest batch item's request in
the engine loop at a step boundary; the chunk task re-queues that item and itself and returns.
Between items a chunk task also stops when interactive work waits for a full worker.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Callable
from typing import Any

from celery import Celery, Task
from celery.signals import task_postrun, task_prerun, worker_ready, worker_shutdown

import workers.priority as priority
import workers.runtime as runtime
from app.batch.preempt import Preemptor
from app.batch.runner import run_chunk
from app.batch.watchdog import Watchdog
from app.dispatch import TaskName
from app.pipeline import loop_step
from app.requests import QueueName
from app.serving import worker_concurrency
from workers.dispatcher import chunk_signature, dispatch_batch
from workers.wakeup import listener

log = logging.getLogger(__name__)

_watchdogs: dict[int, Any] = {}
_preemptors: dict[int, Preemptor] = {}  # by app id: this process's preemptor


def consumes(app: Celery, queue: str) -> bool:
    """Whether this worker process consumes ``queue`` (all queues when none were selected)."""
    selected = app.amqp.queues.consume_from
    return not selected or queue in selected


def answer_waiting(app: Celery) -> bool:
    """Whether interactive ``answer`` messages wait in the broker (False when it cannot tell)."""
    return priority.waiting(app, QueueName.ANSWER)


def register(app: Celery) -> None:
    """Register the chunk task on ``app`` and run the batch watchdog beside its workers."""

    @app.task(name=TaskName.BATCH_CHUNK.value, bind=True, acks_late=True, shared=False)
    def batch_chunk(self: Task, batch_id: str, epoch: int) -> dict[str, Any]:
        """Answer up to one chunk of the batch's items; re-queue itself while items remain."""
        resources = runtime.resources(self.app)
        settings = resources.settings
        polite = settings.batch_yield_to_interactive and consumes(self.app, QueueName.ANSWER)
        preemptor = _preemptors.get(id(self.app))
        if not polite:
            should_yield: Callable[[], bool] = lambda: False  # noqa: E731
        elif preemptor is not None:
            should_yield = preemptor.should_yield
        else:
            should_yield = lambda: answer_waiting(self.app)  # noqa: E731
        outcome = run_chunk(
            resources,
            uuid.UUID(batch_id),
            int(epoch),
            max_items=settings.batch_chunk_size,
            should_yield=should_yield,
            host=self.request.hostname or socket.gethostname(),
            generate_step=loop_step(
                resources,
                on_submit=preemptor.track if polite and preemptor is not None else None,
                background=polite,
            ),
        )
        if outcome in ("more", "yield"):
            # Sent before this message is acknowledged: a crash in between duplicates the lane,
            # which is harmless (items are claimed one by one) and the next epoch retires.
            chunk_signature(self.app, batch_id, epoch).apply_async()
        return {"batch_id": batch_id, "epoch": epoch, "outcome": outcome}

    def mine(sender: Any) -> bool:
        return getattr(sender, "app", None) is app

    @worker_ready.connect(weak=False)
    def start_watchdog(sender: Any = None, **_: Any) -> None:
        if not mine(sender) or not consumes(app, QueueName.BATCH):
            return
        res = runtime.resources(app)
        _watchdogs[id(app)] = Watchdog(
            res.session_factory,
            res.settings,
            lambda batch_id, epoch, lanes: dispatch_batch(app, batch_id, epoch, lanes),
        ).start()

    @worker_ready.connect(weak=False)
    def start_preemptor(sender: Any = None, **_: Any) -> None:
        settings = app.settings  # type: ignore[attr-defined]
        if not mine(sender) or not (
            consumes(app, QueueName.BATCH) and consumes(app, QueueName.ANSWER)
        ):
            return
        if not (settings.batch_yield_to_interactive and settings.batch_preempt):
            return
        capacity = 1 if app.conf.worker_pool != "threads" else worker_concurrency(settings)
        _preemptors[id(app)] = Preemptor(
            capacity,
            lambda: answer_waiting(app),
            wakeup=listener(str(app.conf.broker_url or "")),
        ).start()

    @task_prerun.connect(weak=False)
    def slot_taken(sender: Any = None, **_: Any) -> None:
        preemptor = _preemptors.get(id(app))
        if preemptor is not None and getattr(sender, "app", None) is app:
            preemptor.enter(preemptible=getattr(sender, "name", None) == TaskName.BATCH_CHUNK)

    @task_postrun.connect(weak=False)
    def slot_freed(sender: Any = None, **_: Any) -> None:
        preemptor = _preemptors.get(id(app))
        if preemptor is not None and getattr(sender, "app", None) is app:
            preemptor.exit()

    @worker_shutdown.connect(weak=False)
    def stop_watchdog(sender: Any = None, **_: Any) -> None:
        watchdog = _watchdogs.pop(id(app), None)
        if watchdog is not None:
            watchdog.stop()
        preemptor = _preemptors.pop(id(app), None)
        if preemptor is not None:
            preemptor.stop()
