"""Database tables owned by retrieval (documents, chunks, index versions) and the shared metadata.

The service's own tables (app/db) are declared on the same ``metadata`` so that Alembic sees one
schema, while retrieval still imports nothing from ``app``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
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
    # The chunk's unit vector as little-endian float32 bytes (retrieval.vectors): any host builds
    # or updates its index from these without the embedding model. NULL only for chunks ingested
    # before migration 0004 until they are backfilled (docs/scaleout.md).
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)
    # The chunk's lexical terms, space-separated (retrieval.terms): any host builds its BM25 index
    # from these without analysing text again. NULL only for chunks ingested before migration
    # 0008 until they are backfilled (then a host analyses those chunks' text itself).
    lexical_terms: Mapped[str | None] = mapped_column(Text, nullable=True, deferred=True)
    # What the grounding scorer needs of the chunk's text (retrieval.grounding.passages: its
    # vector and its sentences', float32 rows) under ``grounding_layout``: stored at ingest when
    # grounding is on, else by ``specrag grounding backfill`` or the first answer citing it.
    grounding_vectors: Mapped[bytes | None] = mapped_column(
        LargeBinary, nullable=True, deferred=True
    )
    grounding_layout: Mapped[int | None] = mapped_column(Integer, nullable=True)

    document: Mapped[Document] = relationship(back_populates="chunks")


class CollectionIndex(RecordBase):
    """The current FAISS index version of one tenant's collection.

    Writers bump ``version`` in the same transaction that changes the chunks and logs the change
    (``IndexChange``); readers on any host compare it with the version they hold and apply the
    logged changes since then. ``layout_version`` is the version whose write last chose the
    index kind (and, for IVF, trained ``centroids``): a host whose index predates it rebuilds.
    ``log_floor``: the change log is complete for versions above it (older entries are pruned).
    """

    __tablename__ = "collection_indexes"
    __table_args__ = (UniqueConstraint("tenant", "collection"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    collection: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))  # "flat" (exact) or "ivf" (approximate)
    num_vectors: Mapped[int] = mapped_column(Integer)
    dim: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=_utcnow, onupdate=_utcnow
    )
    layout_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    log_floor: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # IVF only: the trained centroids, [nlist, dim] float32 bytes, so every host builds the same
    # lists (identical approximate results); deferred: searches read only the version.
    centroids: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)


class IndexChange(RecordBase):
    """One chunk added to or removed from a collection's index by the write of ``version``.

    The log a lagging host replays: the adds and removals with ``version`` above the one it holds
    (vectors of the adds come from ``chunks.embedding``; an added chunk since removed is gone).
    """

    __tablename__ = "index_changes"
    __table_args__ = (
        Index("ix_index_changes_collection_version", "collection_index_id", "version"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    collection_index_id: Mapped[int] = mapped_column(
        ForeignKey("collection_indexes.id", ondelete="CASCADE")
    )
    version: Mapped[int] = mapped_column(Integer)
    chunk_id: Mapped[int] = mapped_column(Integer)  # no foreign key: removed chunks are gone
    added: Mapped[bool] = mapped_column(Boolean)
