"""Running a batch: the chunk loop, item bookkeeping, cancel. Knows no Celery.

A chunk task (workers/batch_tasks.py) calls ``run_chunk``: it claims the batch's next item (or an
orphan a dead worker left behind), answers its query through the normal pipeline and records the
outcome, until it has done ``max_items``, the batch has nothing left, the batch was cancelled or
re-dispatched under a newer epoch, or ``should_yield`` says interactive work is waiting.

Exactly once: an item's query is answered by ``app.pipeline.answer_query``, whose claim (queued →
running) and unique ``answers.query_id`` let only one run record an answer however many chunk
tasks (or reaped-query messages) reach it. Items move to a final status with a guarded update in
the same transaction as the batch's counter, so counters never double count.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.batch.records import FINAL_BATCH, FINAL_ITEM, Batch, BatchItem
from app.db.models import Query, as_utc, rowcount, utcnow
from app.db.session import skip_fsync
from app.pipeline import answer_query
from app.resources import Resources
from app.settings import Settings
from app.tracing import current_traceparent, links_to, span

if TYPE_CHECKING:
    from app.pipeline import GenerateStep

ChunkOutcome = Literal["done", "more", "yield", "stopped"]
SessionFactory = sessionmaker[Session]


def start(sf: SessionFactory, batch_id: uuid.UUID, epoch: int) -> bool:
    """Mark the batch running; False when this epoch's chunk tasks should not run any more."""
    with sf() as session:
        row = session.execute(
            select(Batch.status, Batch.epoch).where(Batch.id == batch_id)
        ).one_or_none()
        if row is None or row.status in FINAL_BATCH or row.epoch != epoch:
            return False
        now = utcnow()
        session.execute(
            update(Batch)
            .where(Batch.id == batch_id, Batch.status == "queued")
            .values(status="running", started_at=now, heartbeat_at=now)
        )
        session.commit()
    return True


def claim_item(
    sf: SessionFactory, batch_id: uuid.UUID, settings: Settings
) -> tuple[int, uuid.UUID] | None:
    """(item id, query id) of the next item to answer, now marked running; None when none is left.

    The lowest pending position comes first; then orphans: running items whose query is queued
    again (reaped after its worker died) or was never claimed by the chunk that took the item.
    """
    now = utcnow()
    with sf() as session:
        # Losing a claim in a database crash is harmless: the item is pending (or orphaned) again.
        skip_fsync(session)
        row = session.execute(
            select(BatchItem.id, BatchItem.query_id)
            .where(BatchItem.batch_id == batch_id, BatchItem.status == "pending")
            .order_by(BatchItem.position)
            .limit(1)
            # Two chunk tasks of one batch take different items instead of waiting on each other.
            .with_for_update(skip_locked=True)
        ).one_or_none()
        if row is not None and row.query_id is not None:
            session.execute(
                update(BatchItem)
                .where(BatchItem.id == row.id, BatchItem.status == "pending")
                .values(status="running", claimed_at=now)
            )
            session.commit()
            return row.id, row.query_id
        cutoff = now - timedelta(seconds=settings.stale_after_seconds)
        orphan = session.execute(
            select(BatchItem.id, BatchItem.query_id, BatchItem.claimed_at)
            .join(Query, Query.id == BatchItem.query_id)
            .where(
                BatchItem.batch_id == batch_id,
                BatchItem.status == "running",
                Query.status == "queued",
                or_(Query.enqueued_at.is_(None), BatchItem.claimed_at < cutoff),
            )
            .order_by(BatchItem.position)
            .limit(1)
            .with_for_update(skip_locked=True, of=BatchItem)
        ).one_or_none()
        if orphan is None or orphan.query_id is None:
            return None
        session.execute(update(BatchItem).where(BatchItem.id == orphan.id).values(claimed_at=now))
        # Marked sent: neither the outbox nor another chunk task takes it up again meanwhile.
        session.execute(
            update(Query)
            .where(Query.id == orphan.query_id, Query.status == "queued")
            .values(enqueued_at=now)
        )
        session.commit()
        return orphan.id, orphan.query_id


def finish_item(sf: SessionFactory, item_id: int) -> str | None:
    """Move the item to its query's final status (bumping the batch's counter once); the status."""
    with sf() as session:
        row = session.execute(
            select(BatchItem.batch_id, BatchItem.status, Query.status.label("query_status"))
            .outerjoin(Query, Query.id == BatchItem.query_id)
            .where(BatchItem.id == item_id)
        ).one()
        if row.status in FINAL_ITEM:
            return str(row.status)
        # A lost finish heals itself: the watchdog's sync closes items from their queries.
        skip_fsync(session)
        if row.query_status is None:
            new = "cancelled"  # its never-run query was deleted by a cancel
        elif row.query_status in ("succeeded", "failed"):
            new = row.query_status
        else:
            return str(row.status)  # another worker is still answering it
        moved = session.execute(
            update(BatchItem)
            .where(BatchItem.id == item_id, BatchItem.status.not_in(FINAL_ITEM))
            .values(status=new, done_at=utcnow())
        )
        if rowcount(moved):
            counter = getattr(Batch, new)
            session.execute(
                update(Batch)
                .where(Batch.id == row.batch_id)
                .values({counter: counter + 1, Batch.heartbeat_at: utcnow()})
            )
        session.commit()
        return new


def requeue_item(sf: SessionFactory, item_id: int, query_id: uuid.UUID) -> None:
    """Put a preempted item back to pending (its query stays queued, marked sent)."""
    with sf() as session:
        # Interactive work waits for this commit. Lost in a crash, the item stays running and its
        # query unsent: the outbox sends it, and sync_items settles the item once it is answered.
        skip_fsync(session)
        session.execute(
            update(BatchItem)
            .where(BatchItem.id == item_id, BatchItem.status == "running")
            .values(status="pending", claimed_at=None)
        )
        # The chunk tasks carry it again: the outbox must not send it as a query of its own.
        session.execute(
            update(Query)
            .where(Query.id == query_id, Query.status == "queued")
            .values(enqueued_at=utcnow())
        )
        session.commit()


def sync_items(sf: SessionFactory, batch_id: uuid.UUID) -> int:
    """Finish every item whose query ended outside a chunk task (e.g. re-sent after a reap)."""
    with sf() as session:
        ids = session.scalars(
            select(BatchItem.id)
            .outerjoin(Query, Query.id == BatchItem.query_id)
            .where(
                BatchItem.batch_id == batch_id,
                BatchItem.status.not_in(FINAL_ITEM),
                or_(Query.id.is_(None), Query.status.in_(("succeeded", "failed"))),
            )
        ).all()
    return sum(1 for item_id in ids if finish_item(sf, item_id) is not None)


def maybe_finish(sf: SessionFactory, batch_id: uuid.UUID) -> str | None:
    """The batch's status after closing it when every item is final (None if it is missing)."""
    with sf() as session:
        batch = session.get(Batch, batch_id)
        if batch is None:
            return None
        settled = batch.succeeded + batch.failed + batch.cancelled >= batch.total
        if settled and batch.finished_at is None:
            values: dict[str, object] = {"finished_at": utcnow()}
            if batch.status in ("queued", "running"):
                # Failed only when nothing could be answered: a batch with some failed items
                # succeeded as a job; its counters and report say which items failed.
                nothing = batch.succeeded == 0 and batch.failed > 0
                values["status"] = "failed" if nothing else "succeeded"
            session.execute(update(Batch).where(Batch.id == batch_id).values(**values))
            session.commit()
            return str(values.get("status", batch.status))
        return batch.status


def heartbeat(sf: SessionFactory, batch_id: uuid.UUID) -> None:
    """Record that the batch made progress (the watchdog leaves it alone)."""
    with sf() as session:
        skip_fsync(session)
        session.execute(update(Batch).where(Batch.id == batch_id).values(heartbeat_at=utcnow()))
        session.commit()


def reserve_start(sf: SessionFactory, batch_id: uuid.UUID, rate: float) -> float:
    """Seconds to wait before starting the batch's next item under ``rate`` items per second."""
    if rate <= 0:
        return 0.0
    now = utcnow()
    with sf() as session:
        # The row lock orders concurrent chunk tasks of one batch on one schedule.
        planned = session.scalar(
            select(Batch.next_item_at).where(Batch.id == batch_id).with_for_update()
        )
        begin = max(as_utc(planned), now) if planned is not None else now
        session.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(next_item_at=begin + timedelta(seconds=1.0 / rate))
        )
        session.commit()
    return (begin - now).total_seconds()


def run_chunk(
    resources: Resources,
    batch_id: uuid.UUID,
    epoch: int,
    *,
    max_items: int,
    should_yield: Callable[[], bool] = lambda: False,
    host: str | None = None,
    generate_step: GenerateStep | None = None,
) -> ChunkOutcome:
    """Answer up to ``max_items`` of the batch's items; says why it stopped.

    "more": items remain (re-queue the chunk); "yield": interactive work is waiting (re-queue);
    "done": nothing left to claim; "stopped": cancelled, finished, or superseded epoch.
    ``generate_step`` is the pipeline's (a worker's: ``loop_step``, whose handles a preemptor
    may cancel when interactive work needs the slot; the item is then re-queued).
    """

    sf, settings = resources.session_factory, resources.settings
    if not start(sf, batch_id, epoch):
        return "stopped"
    for _ in range(max_items):
        if not _current(sf, batch_id, epoch):
            maybe_finish(sf, batch_id)
            return "stopped"
        if should_yield():
            return "yield"
        wait = reserve_start(sf, batch_id, settings.batch_rate_limit)
        while wait > 0:
            if should_yield():
                return "yield"
            time.sleep(min(wait, 0.2))
            wait -= 0.2
        claimed = claim_item(sf, batch_id, settings)
        if claimed is None:
            sync_items(sf, batch_id)
            maybe_finish(sf, batch_id)
            return "done"
        item_id, query_id = claimed
        # Each item a trace of its own, linked to the job's (the chunk task's span): one trace
        # per item keeps a ten-thousand-item job's trace readable.
        with span(
            "batch item",
            {"specrag.batch.id": str(batch_id), "specrag.query.id": str(query_id)},
            root=True,
            links=links_to([current_traceparent()]),
        ):
            outcome = answer_query(resources, query_id, host=host, generate_step=generate_step)
        if outcome == "released":
            # Cancelled in the loop for interactive work: the pipeline put the query back to
            # queued with nothing recorded; the item waits for its turn.
            requeue_item(sf, item_id, query_id)
            return "yield"
        if finish_item(sf, item_id) not in FINAL_ITEM:
            heartbeat(sf, batch_id)  # answered elsewhere meanwhile: still progress to report
    maybe_finish(sf, batch_id)
    return "more"


def _current(sf: SessionFactory, batch_id: uuid.UUID, epoch: int) -> bool:
    with sf() as session:
        row = session.execute(
            select(Batch.status, Batch.epoch).where(Batch.id == batch_id)
        ).one_or_none()
    return row is not None and row.status == "running" and row.epoch == epoch


def cancel(sf: SessionFactory, batch_id: uuid.UUID) -> str | None:
    """Cancel the batch: items not started are cancelled, in-flight ones finish. Its status."""
    with sf() as session:
        moved = session.execute(
            update(Batch)
            .where(Batch.id == batch_id, Batch.status.in_(("queued", "running")))
            .values(status="cancelled")
        )
        if not rowcount(moved):
            session.rollback()
            return session.scalar(select(Batch.status).where(Batch.id == batch_id))
        # Open items whose query never ran are cancelled, and their queries deleted (not left
        # queued, nor recorded as failures that never were). The DELETE decides which: it and a
        # worker's claim (queued -> running) lock the same query row, so for each query exactly
        # one of them wins (a condition on the status, read from an earlier snapshot, would race
        # a claim).
        open_items = session.execute(
            select(BatchItem.id, BatchItem.query_id).where(
                BatchItem.batch_id == batch_id, BatchItem.status.in_(("pending", "running"))
            )
        ).all()
        asked = [q for _, q in open_items if q is not None]
        deleted = (
            set(
                session.scalars(
                    delete(Query)
                    .where(Query.id.in_(asked), Query.status == "queued")
                    .returning(Query.id)
                ).all()
            )
            if asked
            else set()
        )
        never_ran = [i for i, q in open_items if q is None or q in deleted]
        cancelled = (
            session.scalars(
                update(BatchItem)
                .where(
                    BatchItem.id.in_(never_ran),
                    BatchItem.status.in_(("pending", "running")),
                )
                .values(status="cancelled", done_at=utcnow(), query_id=None)
                .returning(BatchItem.id)
            ).all()
            if never_ran
            else []
        )
        session.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(cancelled=Batch.cancelled + len(cancelled))
        )
        session.commit()
    maybe_finish(sf, batch_id)
    return "cancelled"


def stalled(sf: SessionFactory, settings: Settings) -> list[tuple[uuid.UUID, int, int]]:
    """Active batches nobody works on, each moved to a new epoch: (id, epoch, lanes) to dispatch.

    A batch is stalled when its heartbeat is older than ``batch_stale_after_seconds`` and none of
    its queries is running with a fresh heartbeat (a long answer is progress too).
    """
    now = utcnow()
    cutoff = now - timedelta(seconds=settings.batch_stale_after_seconds)
    fresh = now - timedelta(seconds=settings.stale_after_seconds)
    live = (
        select(func.count())
        .select_from(BatchItem)
        .join(Query, Query.id == BatchItem.query_id)
        .where(
            BatchItem.batch_id == Batch.id,
            Query.status == "running",
            Query.heartbeat_at >= fresh,
        )
        .scalar_subquery()
    )
    out = []
    with sf() as session:
        rows = session.execute(
            select(Batch.id, Batch.epoch, Batch.lanes).where(
                Batch.status.in_(("queued", "running")),
                or_(Batch.heartbeat_at.is_(None), Batch.heartbeat_at < cutoff),
                live == 0,
            )
        ).all()
        for batch_id, epoch, lanes in rows:
            bumped = session.execute(
                update(Batch)
                .where(Batch.id == batch_id, Batch.epoch == epoch)
                .values(epoch=epoch + 1, heartbeat_at=now)
            )
            if rowcount(bumped):
                out.append((batch_id, epoch + 1, lanes))
        session.commit()
    return out


def unsettled(sf: SessionFactory) -> list[uuid.UUID]:
    """Ids of batches with items still open (active ones, and cancelled ones still finishing)."""
    with sf() as session:
        return list(session.scalars(select(Batch.id).where(Batch.finished_at.is_(None))).all())
