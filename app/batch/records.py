"""Batch tables: a batch job and its items, each item one stored query on the ``batch`` queue.

They live on the service's shared metadata (``app.db.models.Base``) so that Alembic sees one
schema. Every item's query is created when the batch is submitted (one transaction: a refused
batch stores nothing) with ``enqueued_at`` set, because the batch's own chunk tasks carry it to a
worker, not one broker message per query. An item's query id is unique, and the pipeline's claim
and unique ``answers.query_id`` make each item answered exactly once however often a chunk runs.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    Uuid,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import Base, utcnow

BATCH_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
ITEM_STATUSES = ("pending", "running", "succeeded", "failed", "cancelled")
FINAL_BATCH = ("succeeded", "failed", "cancelled")
FINAL_ITEM = ("succeeded", "failed", "cancelled")


class Batch(Base):
    """One batch job: who asked, where its questions came from, and how far it has got.

    The counters are bumped in the same transaction that moves an item to a final status (a
    guarded update), so they are exact even when two workers race to finish the same item.
    ``epoch`` numbers the current set of chunk tasks: the watchdog re-dispatches a stalled batch
    under a new epoch, and chunk tasks of an older epoch stop at once (no more than the
    concurrency cap of chunk tasks ever work on one batch).
    """

    __tablename__ = "batches"
    __table_args__ = (
        CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name="status_valid",
        ),
        Index("ix_batches_status_heartbeat_at", "status", "heartbeat_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    # "jsonl" | "filter" | "golden", and what it was: file name, filter fields, line count.
    source: Mapped[str] = mapped_column(String(16))
    source_detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # The decoding overrides asked for (method, num_speculative_tokens, max_tokens).
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    total: Mapped[int] = mapped_column(Integer, default=0)
    succeeded: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    cancelled: Mapped[int] = mapped_column(Integer, default=0)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    lanes: Mapped[int] = mapped_column(Integer, default=1)
    error: Mapped[str | None] = mapped_column(Text)

    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Refreshed by chunk tasks as items finish; a stale one tells the watchdog to re-dispatch.
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The rate limit's schedule: the earliest start of the batch's next item.
    next_item_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class BatchItem(Base):
    """One question of a batch: its position, the query that answers it, the query it re-runs."""

    __tablename__ = "batch_items"
    __table_args__ = (
        UniqueConstraint("batch_id", "position", name="uq_batch_items_batch_position"),
        CheckConstraint(
            "status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')",
            name="status_valid",
        ),
        Index("ix_batch_items_batch_status", "batch_id", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    batch_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    # NULL only once a cancelled item's never-run query has been deleted.
    query_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("queries.id", ondelete="SET NULL"), unique=True
    )
    original_query_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("queries.id", ondelete="SET NULL"), index=True
    )
    # Golden sets name the document the answer should come from.
    expected_source: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    done_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
