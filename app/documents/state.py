"""Uploaded documents' state: pending when queued, indexed or failed (with the reason) after ingest.

The API writes ``pending`` before it sends the ingest task and gives the previous state back when
the send fails; the ingest worker records each file's outcome. ``GET /v1/documents`` shows these
beside the indexed documents, so a bad file is visible instead of failing silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from app.db.models import utcnow
from app.tenancy.records import DocumentUpload

Snapshot = list[tuple[str, tuple[str, str | None, int] | None]]


def mark_pending(
    session: Session, tenant: str, collection: str, uploads: Sequence[Any]
) -> Snapshot:
    """Mark each upload (``.name``, ``.content``) pending; returns the states it replaced.

    One UPSERT per file (PostgreSQL and SQLite both have ``ON CONFLICT``): concurrent first
    uploads of one new name all land on the one row instead of racing to insert it.
    """
    rows = _rows(session, tenant, collection, [u.name for u in uploads])
    before: Snapshot = []
    now = utcnow()
    insert = _insert_for(session)
    for upload in uploads:
        row = rows.get(upload.name)
        before.append((upload.name, (row.status, row.reason, row.size_bytes) if row else None))
        values = {"status": "pending", "reason": None, "size_bytes": len(upload.content),
                  "uploaded_at": now, "updated_at": now}  # fmt: skip
        statement = insert(DocumentUpload).values(
            tenant=tenant, collection=collection, name=upload.name, **values
        )
        session.execute(
            statement.on_conflict_do_update(
                index_elements=["tenant", "collection", "name"], set_=values
            )
        )
    session.commit()
    return before


def _insert_for(session: Session) -> Any:
    bind = session.get_bind()
    if bind.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert


def restore(session: Session, tenant: str, collection: str, snapshot: Snapshot) -> None:
    """Put back the states ``mark_pending`` replaced (the ingest task was never sent)."""
    rows = _rows(session, tenant, collection, [name for name, _ in snapshot])
    for name, old in snapshot:
        row = rows.get(name)
        if row is None:
            continue
        if old is None:
            session.delete(row)
        else:
            row.status, row.reason, row.size_bytes = old
    session.commit()


def record_results(
    session_factory: sessionmaker[Session],
    tenant: str,
    collection: str,
    results: Iterable[tuple[str, str, str | None]],
) -> None:
    """Store each file's outcome: ``(name, "indexed" | "failed", reason)``."""
    results = list(results)
    with session_factory() as session:
        rows = _rows(session, tenant, collection, [name for name, _, _ in results])
        for name, status, reason in results:
            row = rows.get(name)
            if row is None:
                row = DocumentUpload(tenant=tenant, collection=collection, name=name, size_bytes=0)
                session.add(row)
            row.status, row.reason, row.updated_at = status, reason, utcnow()
        session.commit()


def forget(session_factory: sessionmaker[Session], tenant: str, collection: str, name: str) -> None:
    """Drop the upload record of a deleted document."""
    with session_factory() as session:
        session.execute(
            delete(DocumentUpload).where(
                DocumentUpload.tenant == tenant,
                DocumentUpload.collection == collection,
                DocumentUpload.name == name,
            )
        )
        session.commit()


def upload_states(session: Session, tenant: str, collection: str) -> dict[str, DocumentUpload]:
    """The tenant's upload records in ``collection`` by name."""
    return {
        row.name: row
        for row in session.scalars(
            select(DocumentUpload).where(
                DocumentUpload.tenant == tenant, DocumentUpload.collection == collection
            )
        )
    }


def _rows(session: Session, tenant: str, collection: str, names: list[str]) -> dict[str, Any]:
    if not names:
        return {}
    found = session.scalars(
        select(DocumentUpload).where(
            DocumentUpload.tenant == tenant,
            DocumentUpload.collection == collection,
            DocumentUpload.name.in_(names),
        )
    )
    return {row.name: row for row in found}
