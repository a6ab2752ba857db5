"""Per-process worker state: resources loaded once per process, and the sweeper thread.

The engine is loaded in the process that runs tasks: at worker start for the solo and threads
pools, after the fork for prefork (so CUDA is never initialised before a fork).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_process_init, worker_ready, worker_shutdown

from app.db import prepare
from app.heap import freeze_startup_heap
from app.lifecycle.outbox import Sweeper
from app.requests import QueueName
from app.resources import Resources, apply_torch_threads
from workers.broker_epoch import BrokerEpoch
from workers.dispatcher import send_query
from workers.engine_guard import EngineGuard
from workers.unclaimed import UnclaimedDeliveries

log = logging.getLogger(__name__)

_resources: dict[tuple[int, int], Resources] = {}
_sweepers: dict[int, Sweeper] = {}
_guards: dict[int, EngineGuard] = {}
_warmed: set[tuple[int, int]] = set()


def resources(app: Celery) -> Resources:
    """This process's Resources for ``app`` (database prepared; models load on first use)."""
    key = (os.getpid(), id(app))
    found = _resources.get(key)
    if found is None:
        settings = app.settings  # type: ignore[attr-defined]
        _, session_factory = prepare(settings)
        found = _resources[key] = Resources(settings, session_factory)
    return found


def warm(app: Celery) -> None:
    """Load what this worker's queues need, once per process (engine loop started and checked)."""
    key = (os.getpid(), id(app))
    if key in _warmed:
        return
    _warmed.add(key)
    apply_torch_threads(app.settings)  # type: ignore[attr-defined]
    kinds = getattr(app, "warm", {QueueName.ANSWER: True, QueueName.INGEST: True})
    log.info("loading worker resources (%s)", ", ".join(k for k, v in kinds.items() if v))
    res = resources(app)
    res.warm(answer=kinds.get(QueueName.ANSWER, True), ingest=kinds.get(QueueName.INGEST, True))
    if kinds.get(QueueName.ANSWER, True) and res.settings.grounding:
        # Grounding runs beside the tasks, never in them (app/grounding/background.py).
        from app.grounding.background import GroundingBacklog

        res.grounding_backlog = GroundingBacklog()
    if getattr(app, "freeze_heap", False):
        freeze_startup_heap()  # models and modules out of the collector's scans (app/heap.py)


def connect_signals(app: Celery) -> None:
    """Warm resources at worker start and run the sweeper beside the worker, for ``app`` only."""

    def mine(sender: Any) -> bool:
        return getattr(sender, "app", None) is app

    @worker_init.connect(weak=False)
    def on_init(sender: Any = None, **_: Any) -> None:
        if mine(sender) and app.conf.worker_pool in (None, "solo", "threads"):
            warm(app)

    @worker_process_init.connect(weak=False)
    def on_process_init(**_: Any) -> None:
        if app.conf.worker_pool == "prefork":
            warm(app)

    @worker_ready.connect(weak=False)
    def on_ready(sender: Any = None, **_: Any) -> None:
        if not mine(sender):
            return
        res = resources(app)
        _sweepers[id(app)] = Sweeper(
            res.session_factory,
            res.settings,
            lambda qid, queue: send_query(app, qid, queue),
            BrokerEpoch(str(app.conf.broker_url or "")).lost,
            UnclaimedDeliveries(str(app.conf.broker_url or "")),
        ).start()
        kinds = getattr(app, "warm", {})
        if (
            getattr(app, "exit_on_engine_death", False)
            and kinds.get(QueueName.ANSWER, True)
            and app.conf.worker_pool != "prefork"
        ):
            # A `specrag worker` process lives and dies with its engine (workers/engine_guard.py);
            # never one in a test's process or any other host of a Celery app.
            node = getattr(sender, "hostname", None)
            queues = list(app.amqp.queues.consume_from or app.amqp.queues)

            def stop_consuming() -> None:
                for queue in queues:
                    app.control.cancel_consumer(queue, destination=[node], reply=False)

            _guards[id(app)] = EngineGuard(res, stop_consuming).start()

    @worker_shutdown.connect(weak=False)
    def on_shutdown(sender: Any = None, **_: Any) -> None:
        sweeper = _sweepers.pop(id(app), None)
        if sweeper is not None:
            sweeper.stop()
        guard = _guards.pop(id(app), None)
        if guard is not None:
            guard.stop()  # a warm shutdown closes the engine: no death to act on
        found = _resources.get((os.getpid(), id(app)))
        if found is not None:
            found.close()  # the loop cancels what it holds; their tasks release their queries
