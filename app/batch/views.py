"""Reading batches: one batch (tenant-scoped), its JSON view and its items' statuses."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.batch.records import Batch, BatchItem


def parse_id(batch_id: str | uuid.UUID) -> uuid.UUID | None:
    """The batch id as a UUID, or None when it is not one."""
    if isinstance(batch_id, uuid.UUID):
        return batch_id
    try:
        return uuid.UUID(str(batch_id))
    except ValueError:
        return None


def get_batch(session: Session, batch_id: str | uuid.UUID, tenant_id: int | None) -> Batch | None:
    """The batch, or None when absent or another tenant's (``tenant_id`` None: any tenant's)."""
    bid = parse_id(batch_id)
    if bid is None:
        return None
    stmt = select(Batch).where(Batch.id == bid).execution_options(populate_existing=True)
    if tenant_id is not None:
        stmt = stmt.where(Batch.tenant_id == tenant_id)
    return session.scalar(stmt)


def batch_view(batch: Batch) -> dict[str, Any]:
    """The batch's JSON view: status, counters, source and parameters, timestamps."""
    done = batch.succeeded + batch.failed
    return {
        "id": str(batch.id),
        "status": batch.status,
        "source": batch.source,
        "source_detail": batch.source_detail,
        "params": batch.params,
        "total": batch.total,
        "done": done,
        "succeeded": batch.succeeded,
        "failed": batch.failed,
        "cancelled": batch.cancelled,
        "remaining": batch.total - done - batch.cancelled,
        "progress": round((done + batch.cancelled) / batch.total, 4) if batch.total else 1.0,
        "finished": batch.finished_at is not None,
        "created_at": _iso(batch.created_at),
        "started_at": _iso(batch.started_at),
        "finished_at": _iso(batch.finished_at),
    }


def item_views(session: Session, batch_id: uuid.UUID) -> list[dict[str, Any]]:
    """Every item's position, status, new query id and original query id, in position order."""
    rows = session.execute(
        select(
            BatchItem.position,
            BatchItem.status,
            BatchItem.query_id,
            BatchItem.original_query_id,
        )
        .where(BatchItem.batch_id == batch_id)
        .order_by(BatchItem.position)
    ).all()
    return [
        {
            "position": r.position,
            "status": r.status,
            "query_id": str(r.query_id) if r.query_id else None,
            "original_query_id": str(r.original_query_id) if r.original_query_id else None,
        }
        for r in rows
    ]


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None
