"""Runner bookkeeping on real PostgreSQL without a worker: claim order, exactly-once counters,
orphans, the watchdog's epoch bump, the rate limit's schedule, cancel."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from tests.batch.conftest import batch_row, submit_questions


def new_batch(session_factory: Any, settings: Any, n: int) -> uuid.UUID:
    return submit_questions(session_factory, settings, None, n, dispatch=False)


def set_query(session_factory: Any, query_id: uuid.UUID, **values: Any) -> None:
    from app.db import Query

    with session_factory() as session:
        session.execute(update(Query).where(Query.id == query_id).values(**values))
        session.commit()


def test_items_are_claimed_in_order_and_counted_once(
    session_factory: Any, settings: Any, ingested: str
) -> None:
    from app.batch import runner

    batch_id = new_batch(session_factory, settings, 3)
    assert runner.start(session_factory, batch_id, 0)
    claims = [runner.claim_item(session_factory, batch_id, settings) for _ in range(3)]
    assert all(c is not None for c in claims)
    assert runner.claim_item(session_factory, batch_id, settings) is None
    item_id, query_id = claims[0]  # type: ignore[misc]
    # Still queued: a claimed item is not final until its query is.
    assert runner.finish_item(session_factory, item_id) == "running"
    set_query(session_factory, query_id, status="succeeded")
    assert runner.finish_item(session_factory, item_id) == "succeeded"
    assert runner.finish_item(session_factory, item_id) == "succeeded"
    assert batch_row(session_factory, batch_id).succeeded == 1
    # The other two end outside any chunk task (e.g. answered after a reap): sync closes them.
    for _, qid in claims[1:]:  # type: ignore[misc]
        set_query(session_factory, qid, status="failed")
    assert runner.sync_items(session_factory, batch_id) == 2
    assert runner.sync_items(session_factory, batch_id) == 0
    assert runner.maybe_finish(session_factory, batch_id) == "succeeded"
    batch = batch_row(session_factory, batch_id)
    assert (batch.succeeded, batch.failed, batch.finished_at is not None) == (1, 2, True)


def test_orphans_are_reclaimed_and_stalled_batches_move_to_a_new_epoch(
    session_factory: Any, settings: Any, ingested: str
) -> None:
    from app.batch import Batch, runner
    from app.db import utcnow

    batch_id = new_batch(session_factory, settings, 2)
    assert runner.start(session_factory, batch_id, 0)
    first = runner.claim_item(session_factory, batch_id, settings)
    second = runner.claim_item(session_factory, batch_id, settings)
    assert first and second
    # Its worker died and the reaper put the query back (queued, not sent): an orphan.
    set_query(session_factory, first[1], enqueued_at=None)
    assert runner.claim_item(session_factory, batch_id, settings) == first
    assert runner.claim_item(session_factory, batch_id, settings) is None
    assert runner.stalled(session_factory, settings) == []  # heartbeat is fresh
    old = utcnow() - timedelta(seconds=settings.batch_stale_after_seconds + 1)
    with session_factory() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(heartbeat_at=old))
        session.commit()
    revived = [r for r in runner.stalled(session_factory, settings) if r[0] == batch_id]
    assert revived == [(batch_id, 1, batch_row(session_factory, batch_id).lanes)]
    assert not runner.start(session_factory, batch_id, 0), "an old epoch's chunk must stop"
    assert runner.start(session_factory, batch_id, 1)


def test_rate_limit_spaces_item_starts(session_factory: Any, settings: Any, ingested: str) -> None:
    from app.batch import runner

    batch_id = new_batch(session_factory, settings, 1)
    assert runner.reserve_start(session_factory, batch_id, 0) == 0.0
    delays, planned = [], []
    for _ in range(4):
        delays.append(runner.reserve_start(session_factory, batch_id, 0.1))
        planned.append(batch_row(session_factory, batch_id).next_item_at)
    # Each start is planned 1/rate (10 s) after the previous one, however soon it was asked for:
    # the schedule is read back from the row, so a slow host cannot blur the arithmetic.
    gaps = [
        (later - earlier).total_seconds()
        for earlier, later in zip(planned, planned[1:], strict=False)
    ]
    assert gaps == [10.0, 10.0, 10.0], gaps
    assert delays[0] == 0.0
    # Each wait is the previous one plus 10 s less the time that passed between the two asks.
    assert all(
        5.0 < later - earlier <= 10.0 for earlier, later in zip(delays, delays[1:], strict=False)
    ), delays


def test_cancel_deletes_never_run_queries_and_keeps_in_flight_ones(
    session_factory: Any, settings: Any, ingested: str
) -> None:
    from app.batch import BatchItem, runner
    from app.db import Query

    batch_id = new_batch(session_factory, settings, 5)
    assert runner.start(session_factory, batch_id, 0)
    item_id, query_id = runner.claim_item(session_factory, batch_id, settings)  # type: ignore[misc]
    set_query(session_factory, query_id, status="running")  # in flight
    assert runner.cancel(session_factory, batch_id) == "cancelled"
    batch = batch_row(session_factory, batch_id)
    assert (batch.status, batch.cancelled, batch.finished_at) == ("cancelled", 4, None)
    with session_factory() as session:
        items = session.execute(
            select(BatchItem.status, BatchItem.query_id).where(BatchItem.batch_id == batch_id)
        ).all()
        assert sorted(s for s, _ in items) == ["cancelled"] * 4 + ["running"]
        assert all(q is None for s, q in items if s == "cancelled")
        assert session.get(Query, query_id) is not None
    assert not runner.start(session_factory, batch_id, 0)
    set_query(session_factory, query_id, status="succeeded")
    assert runner.finish_item(session_factory, item_id) == "succeeded"
    assert runner.maybe_finish(session_factory, batch_id) == "cancelled"
    assert batch_row(session_factory, batch_id).finished_at is not None


def test_cancel_never_cancels_an_item_whose_query_a_worker_claims_meanwhile(
    session_factory: Any, settings: Any, ingested: str
) -> None:
    """The race behind test_cancel_stops_the_batch_and_in_flight_items_finish's rare failure.

    A chunk task has claimed the item (running) but its worker has not yet claimed the query
    (still queued) when cancel runs; the worker's claim commits while cancel is under way. Made
    deterministic here: the claim's transaction holds the query row until cancel waits on it.
    """
    import threading

    from sqlalchemy import text

    from app.batch import BatchItem, runner
    from app.db import Query

    batch_id = new_batch(session_factory, settings, 2)
    assert runner.start(session_factory, batch_id, 0)
    item_id, query_id = runner.claim_item(session_factory, batch_id, settings)  # type: ignore[misc]
    outcome: list[Any] = []
    with session_factory() as worker:
        worker.execute(  # the pipeline's claim, not committed yet
            update(Query)
            .where(Query.id == query_id, Query.status == "queued")
            .values(status="running")
        )
        canceller = threading.Thread(
            target=lambda: outcome.append(runner.cancel(session_factory, batch_id))
        )
        canceller.start()
        with session_factory() as observer:
            waiting = text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            deadline = time.monotonic() + 60
            while not observer.scalar(waiting) and canceller.is_alive():
                assert time.monotonic() < deadline, "cancel never reached the claimed query"
                time.sleep(0.02)
                observer.rollback()  # a fresh snapshot of pg_stat_activity
        worker.commit()
    canceller.join(timeout=60)
    assert outcome == ["cancelled"]
    with session_factory() as session:
        item = session.get(BatchItem, item_id)
        query = session.get(Query, query_id)
        assert item is not None and query is not None and query.status == "running"
        assert item.status == "running", "an item whose query went on to run was cancelled"
        assert item.query_id == query_id
    assert batch_row(session_factory, batch_id).cancelled == 1  # the other, never-claimed item


def test_the_outbox_never_resends_waiting_batch_items_one_by_one(
    session_factory: Any, settings: Any, ingested: str
) -> None:
    from app.batch import BatchItem
    from app.db import Query, utcnow
    from app.lifecycle.outbox import sweep

    batch_id = new_batch(session_factory, settings, 3)
    long_ago = utcnow() - timedelta(seconds=settings.resend_after_seconds + 60)
    with session_factory() as session:
        qids = session.scalars(
            select(BatchItem.query_id).where(BatchItem.batch_id == batch_id)
        ).all()
        session.execute(
            update(Query).where(Query.id.in_(qids)).values(queued_at=long_ago, enqueued_at=long_ago)
        )
        session.commit()
    sent: list[uuid.UUID] = []
    sweep(session_factory, settings, lambda qid, queue: sent.append(qid))
    assert not set(sent) & set(qids), "waiting batch items were re-sent as single messages"
