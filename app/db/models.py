"""The service's tables: tenants and keys, queries, answers with sources, generation stats.

They are declared on retrieval's shared ``metadata`` so that Alembic sees one schema (documents,
chunks and index versions come from ``retrieval.records``). A query's id is the idempotency key of
everything a worker writes for it: ``answers.query_id`` and ``generation_stats.query_id`` are
unique, so a task delivered twice can never record a second answer.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    Uuid,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from retrieval.records import metadata

QUERY_STATUSES = ("queued", "running", "succeeded", "failed")
QUERY_SOURCES = ("api", "cli", "batch", "local", "golden", "benchmark")
"""Who stored a query; the first three are traffic (``TRAFFIC_SOURCES``), the rest are checks."""
TRAFFIC_SOURCES = ("api", "cli", "batch")


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (every timestamp column stores UTC)."""
    return datetime.now(UTC)


def as_utc(when: datetime) -> datetime:
    """``when`` with its zone: SQLite hands timestamps back naive, and every stored one is UTC."""
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def rowcount(result: object) -> int:
    """The rows an UPDATE or DELETE touched (a CursorResult's ``rowcount``; the generic Result
    type does not declare it)."""
    return int(getattr(result, "rowcount", 0))


class Base(DeclarativeBase):
    """Declarative base of the service's tables, on the metadata shared with retrieval."""

    metadata = metadata


class Tenant(Base):
    """A customer of the service; its name is the ``tenant`` string retrieval records carry."""

    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    api_keys: Mapped[list[ApiKey]] = relationship(back_populates="tenant")


class ApiKey(Base):
    """A tenant's API key; only its SHA-256 hash is stored, the key is shown once at creation."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The first characters of the key, so that an admin can tell keys apart without the secret.
    prefix: Mapped[str] = mapped_column(String(16))
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Optional: a key past this time is refused like a revoked one.
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    tenant: Mapped[Tenant] = relationship(back_populates="api_keys")


class Query(Base):
    """One question asked by a tenant, and where it is on its way to an answer.

    ``enqueued_at`` is the outbox: a query stored while the broker was down (or re-queued by the
    reaper after its worker died) has it NULL until a sweeper puts it on the queue.
    """

    __tablename__ = "queries"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_queries_tenant_idempotency_key"),
        CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed')", name="status_valid"
        ),
        Index("ix_queries_status_enqueued_at", "status", "enqueued_at"),
        Index("ix_queries_queued_at", "queued_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    collection: Mapped[str] = mapped_column(String(200))
    question: Mapped[str] = mapped_column(Text)
    # method, num_speculative_tokens, max_tokens, temperature, seed (validated before storing).
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    error: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    # Which queue the query belongs on: "answer" (interactive) or "batch" (lower priority).
    queue: Mapped[str] = mapped_column(String(32), default="answer")
    # Who asked (``QUERY_SOURCES``): traffic ("api", "cli", "batch") or a check ("local" one-shot
    # CLI answers, "golden" evaluations, "benchmark" runs), which traffic statistics leave out.
    source: Mapped[str] = mapped_column(String(16), default="api", server_default="api")

    queued_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    retrieved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    first_token_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    done_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    worker_host: Mapped[str | None] = mapped_column(String(255))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Messages sent for this query (the outbox re-sends a bounded number of times, app/lifecycle/outbox.py).
    sends: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # How ``question`` is kept once final: NULL while in clear, else "hashed" or "redacted".
    question_stored: Mapped[str | None] = mapped_column(String(16))
    # W3C traceparent of the span that stored the query (null: tracing off): whichever process
    # sends it (API, sweeper, an after-answer admission) publishes it inside this trace.
    traceparent: Mapped[str | None] = mapped_column(String(55))

    tenant: Mapped[Tenant] = relationship()
    answer: Mapped[Answer | None] = relationship(back_populates="query", uselist=False)
    stats: Mapped[GenerationStatsRecord | None] = relationship(
        back_populates="query", uselist=False
    )


class Answer(Base):
    """The recorded answer of a query (at most one: ``query_id`` is unique)."""

    __tablename__ = "answers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    query_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("queries.id", ondelete="CASCADE"), unique=True
    )
    text: Mapped[str] = mapped_column(Text)
    model_pair: Mapped[str] = mapped_column(String(500))
    engine: Mapped[str] = mapped_column(String(32))
    index_version: Mapped[int | None] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    query: Mapped[Query] = relationship(back_populates="answer")
    sources: Mapped[list[AnswerSource]] = relationship(
        back_populates="answer", order_by="AnswerSource.rank", cascade="all, delete-orphan"
    )


class AnswerSource(Base):
    """A passage an answer was grounded on, in citation order ([1], [2], ...).

    The passage is copied, not referenced: re-ingesting a document replaces its chunks, and an
    answer must keep showing what it was given.
    """

    __tablename__ = "answer_sources"
    __table_args__ = (UniqueConstraint("answer_id", "rank", name="uq_answer_sources_answer_rank"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    answer_id: Mapped[int] = mapped_column(ForeignKey("answers.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    document: Mapped[str] = mapped_column(Text)
    chunk_id: Mapped[int] = mapped_column(Integer)
    score: Mapped[float] = mapped_column(Float)
    title: Mapped[str | None] = mapped_column(Text)
    text: Mapped[str] = mapped_column(Text)
    # Where the dense and lexical legs ranked the passage (None: not among that leg's candidates,
    # or an answer stored before migration 0008): why it was retrieved.
    dense_rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lexical_rank: Mapped[int | None] = mapped_column(Integer, nullable=True)

    answer: Mapped[Answer] = relationship(back_populates="sources")

    def to_dict(self) -> dict[str, Any]:
        """The source as the API and CLI show it."""
        return {
            "document": self.document,
            "chunk_id": self.chunk_id,
            "score": self.score,
            "title": self.title,
            "text": self.text,
            "dense_rank": self.dense_rank,
            "lexical_rank": self.lexical_rank,
        }


class GenerationStatsRecord(Base):
    """Every contract stats field of one answered query (unique per query)."""

    __tablename__ = "generation_stats"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    query_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("queries.id", ondelete="CASCADE"), unique=True
    )
    method: Mapped[str] = mapped_column(String(32))
    # An int k, or "auto": stored as text so that both round-trip.
    num_speculative_tokens: Mapped[str | None] = mapped_column(String(16))
    num_output_tokens: Mapped[int] = mapped_column(Integer)
    num_target_forwards: Mapped[int] = mapped_column(Integer)
    num_drafts: Mapped[int] = mapped_column(Integer)
    num_draft_tokens: Mapped[int] = mapped_column(Integer)
    num_accepted_tokens: Mapped[int] = mapped_column(Integer)
    accepted_per_position: Mapped[list[int]] = mapped_column(JSON, default=list)
    acceptance_rate: Mapped[float | None] = mapped_column(Float)
    mean_acceptance_length: Mapped[float | None] = mapped_column(Float)
    queue_ms: Mapped[float | None] = mapped_column(Float)
    retrieval_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    generation_ms: Mapped[float | None] = mapped_column(Float)
    total_ms: Mapped[float | None] = mapped_column(Float)
    # Load beside draft quality: how many requests shared this one's target passes, and the k
    # the engine chose per pass (null: recorded before migration 0006, or k not chosen per step).
    mean_batch_size: Mapped[float | None] = mapped_column(Float)
    mean_chosen_k: Mapped[float | None] = mapped_column(Float)
    # Prompt tokens whose KV a prefix cache supplied (null: recorded before migration 0010).
    num_cached_prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    # The numerics the answer was computed in (null: recorded before migration 0015).
    dtype: Mapped[str | None] = mapped_column(String(16))

    # "chat" (the target tokenizer's chat template) or "raw" (null: recorded before 0011).
    prompt_format: Mapped[str | None] = mapped_column(String(8))
    # The query's OpenTelemetry trace id, 32 hex (null: tracing off, or recorded before 0019).
    trace_id: Mapped[str | None] = mapped_column(String(32))

    query: Mapped[Query] = relationship(back_populates="stats")

    STAT_FIELDS = (
        "method",
        "num_speculative_tokens",
        "num_output_tokens",
        "num_target_forwards",
        "num_drafts",
        "num_draft_tokens",
        "num_accepted_tokens",
        "accepted_per_position",
        "acceptance_rate",
        "mean_acceptance_length",
        "ttft_ms",
        "generation_ms",
        "queue_ms",
        "retrieval_ms",
        "total_ms",
        "mean_batch_size",
        "mean_chosen_k",
        "num_cached_prompt_tokens",
        "dtype",
        "prompt_format",
        "trace_id",
    )

    def to_dict(self) -> dict[str, Any]:
        """The stats as CONTRACT.md names them (k back to an int when it was one)."""
        data = {name: getattr(self, name) for name in self.STAT_FIELDS}
        k = data["num_speculative_tokens"]
        if isinstance(k, str) and k.isdigit():
            data["num_speculative_tokens"] = int(k)
        return data


class CollectionSettings(Base):
    """What one tenant's collection overrides of the service's settings: its system prompt.

    A row may exist before the collection holds documents (set first, then ingest).
    """

    __tablename__ = "collection_settings"
    __table_args__ = (
        UniqueConstraint("tenant_id", "collection", name="uq_collection_settings_collection"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    collection: Mapped[str] = mapped_column(String(128))
    # The system message of the chat template for this collection's queries (null: the
    # service's SPECRAG_SYSTEM_PROMPT).
    system_prompt: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )
