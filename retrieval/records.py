"""Database tables owned by retrieval (documents, chunks, index versions) and the shared metadata.

The service's own tables (app/db) are declared on the same ``metadata`` so that Alembic sees one
schema, while retrieval still imports nothing from ``app``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import DateTime, ForeignKey, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Stable constraint names so that migrations can drop what they create, on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RecordBase(DeclarativeBase):
    """Declarative base for retrieval's tables."""

    metadata = metadata


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Document(RecordBase):
    """One ingested source (file path as given) in one tenant's collection."""

    __tablename__ = "documents"
    # AUTOINCREMENT: SQLite would otherwise reuse the largest deleted id.
    __table_args__ = (
        UniqueConstraint("tenant", "collection", "source"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    collection: Mapped[str] = mapped_column(String(128))
    # The path exactly as the caller gave it: search results name it, eval matches its suffix.
    source: Mapped[str] = mapped_column(String(1024))
    title: Mapped[str] = mapped_column(String(512))
    # sha256 of the file's bytes: unchanged content makes a re-ingest a no-op.
    content_hash: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(Integer)
    num_chunks: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=_utcnow, onupdate=_utcnow
    )

    chunks: Mapped[list[Chunk]] = relationship(
        back_populates="document",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="Chunk.position",
    )


class Chunk(RecordBase):
    """One passage of a document; its id is the vector's id in the collection's FAISS index."""

    __tablename__ = "chunks"
    # AUTOINCREMENT: a chunk id, once a FAISS id, is never handed to another chunk.
    __table_args__ = (
        UniqueConstraint("document_id", "position"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    document_id: Mapped[int] = mapped_column(
        ForeignKey("documents.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(String(512))
    heading: Mapped[str | None] = mapped_column(String(512), nullable=True)
    text: Mapped[str] = mapped_column(Text)
    token_count: Mapped[int] = mapped_column(Integer)

    document: Mapped[Document] = relationship(back_populates="chunks")


class CollectionIndex(RecordBase):
    """The current FAISS index version of one tenant's collection.

    Writers bump ``version`` in the same transaction that changes the chunks, after the new
    index file is on disk; readers in any process compare it with the version they hold.
    """

    __tablename__ = "collection_indexes"
    __table_args__ = (UniqueConstraint("tenant", "collection"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    collection: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))  # "flat" (exact) or "hnsw" (approximate)
    num_vectors: Mapped[int] = mapped_column(Integer)
    dim: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=_utcnow, onupdate=_utcnow
    )
