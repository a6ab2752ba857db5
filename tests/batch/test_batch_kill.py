"""A batch survives SIGKILL of its only worker: a fresh worker finishes it, each item once.

The killed worker's chunk message stays unacknowledged in Redis (given back only after the
visibility timeout, an hour); the in-flight query keeps a stale heartbeat. The new worker's reaper
re-queues that query and its batch watchdog re-dispatches the stalled batch under a new epoch.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from tests.batch.conftest import batch_row, submit_questions, wait_until

pytestmark = pytest.mark.timeout(600)


def test_batch_finishes_exactly_once_after_its_worker_is_killed(
    start_worker: Any, session_factory: Any, settings: Any, celery_app: Any, ingested: str
) -> None:
    from app.batch import BatchItem
    from app.db import Answer, GenerationStatsRecord, Query

    first = start_worker()
    # One chunk task in flight: killing its worker loses the batch's only message, so only the
    # watchdog can finish the batch (with two, the queued one would carry on by itself).
    one_lane = settings.model_copy(update={"batch_max_concurrency": 1})
    batch_id = submit_questions(session_factory, one_lane, celery_app, 60)
    wait_until(
        lambda: batch_row(session_factory, batch_id).succeeded >= 5,
        240,
        "the first worker to answer 5 items",
        explain=first.tail,
    )
    first.kill()
    at_kill = batch_row(session_factory, batch_id)
    assert at_kill.succeeded < 60, "the batch finished before the kill; make it longer"

    second = start_worker()
    wait_until(
        lambda: batch_row(session_factory, batch_id).finished_at is not None,
        240,
        "the second worker to finish the batch",
        poll=0.5,
        explain=second.tail,
    )
    second.stop()  # later tests use this broker without a worker
    batch = batch_row(session_factory, batch_id)
    assert (batch.status, batch.succeeded, batch.failed) == ("succeeded", 60, 0), second.tail()
    assert batch.epoch >= 1, "the watchdog should have re-dispatched the stalled batch"
    with session_factory() as session:
        qids = session.scalars(
            select(BatchItem.query_id).where(BatchItem.batch_id == batch_id)
        ).all()
        assert len(set(qids)) == 60
        statuses = session.scalars(select(Query.status).where(Query.id.in_(qids))).all()
        assert set(statuses) == {"succeeded"}
        for table in (Answer, GenerationStatsRecord):
            n = session.scalar(
                select(func.count()).select_from(table).where(table.query_id.in_(qids))
            )
            assert n == 60, f"{n} {table.__tablename__} rows for 60 items"
