"""Tables of per-tenant limits, of rate windows, and of uploaded documents' state.

They are declared on the shared metadata (gathered by ``app.tables``), so Alembic sees one schema.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import Base, utcnow

LIMIT_FIELDS = (
    "submissions_per_second",
    "max_active_queries",
    "max_batch_items",
    "max_upload_bytes",
    "max_upload_bytes_per_day",
    "max_extracted_chars",
    "max_collections",
)
UPLOAD_STATUSES = ("pending", "indexed", "failed")


class TenantLimits(Base):
    """An admin's limits for one tenant; a NULL column means the setting's default applies."""

    __tablename__ = "tenant_limits"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    submissions_per_second: Mapped[float | None] = mapped_column(Float)
    max_active_queries: Mapped[int | None] = mapped_column(Integer)
    max_batch_items: Mapped[int | None] = mapped_column(Integer)
    max_upload_bytes: Mapped[int | None] = mapped_column(BigInteger)
    max_upload_bytes_per_day: Mapped[int | None] = mapped_column(BigInteger)
    max_extracted_chars: Mapped[int | None] = mapped_column(BigInteger)
    max_collections: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RateWindow(Base):
    """One fixed rate window of the embedded default's limiter (app/tenancy/ratestore.py)."""

    __tablename__ = "rate_windows"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    """The ``limits`` key: what is limited, for whom, at which rate."""
    hits: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[float] = mapped_column(Float)
    """When the window ends, in epoch seconds (the API process's clock)."""


class DocumentUpload(Base):
    """The latest upload of one file name into a tenant's collection, and what became of it.

    Written ``pending`` by the API before the ingest task is sent; the ingest worker sets
    ``indexed`` or ``failed`` with the reason, so a client sees a bad file instead of silence.
    """

    __tablename__ = "document_uploads"
    __table_args__ = (
        UniqueConstraint("tenant", "collection", "name", name="uq_document_uploads_name"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(100))
    collection: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    reason: Mapped[str | None] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    uploaded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
