"""Audit's own tables: shadow baselines of sampled queries, golden evaluation runs and items.

They live on the service's shared metadata (``app.db.models.Base``) so that Alembic sees one
schema. Nothing here is a query: a shadow baseline hangs off the production query it re-decodes
(``query_id`` unique, so a shadow task delivered twice stores one baseline), and golden items
point at the two queries (speculative and baseline) that answered them.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
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
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import Base, utcnow

SHADOW_STATUSES = ("pending", "running", "done", "failed")
JUDGMENTS = ("excused", "violation", "unjudged")
"""``ShadowRun.judgment`` of a mismatch: a near-tie within the dtype's rounding, a divergence at a
clear margin (or any mismatch in float32, the bit-exact mode), or one no logits could judge."""


class ShadowRun(Base):
    """The greedy, non-speculative re-decoding of one sampled production query.

    The prompt and the speculative output are copied here when the query is sampled, so the
    baseline decodes exactly the prompt the answer was decoded from (a re-ingest in between
    cannot change it) and the two outputs are compared token by token, not as text.
    """

    __tablename__ = "shadow_runs"
    __table_args__ = (Index("ix_shadow_runs_status", "status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    query_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("queries.id", ondelete="CASCADE"), unique=True
    )
    status: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    max_new_tokens: Mapped[int] = mapped_column(Integer)
    prompt_token_ids: Mapped[list[int]] = mapped_column(JSON)
    speculative_token_ids: Mapped[list[int]] = mapped_column(JSON)
    baseline_token_ids: Mapped[list[int] | None] = mapped_column(JSON)
    baseline_text: Mapped[str | None] = mapped_column(Text)
    baseline_generation_ms: Mapped[float | None] = mapped_column(Float)
    baseline_ttft_ms: Mapped[float | None] = mapped_column(Float)
    # Positions where the two outputs differ, counting a length difference as mismatches.
    mismatched_tokens: Mapped[int | None] = mapped_column(Integer)
    first_mismatch: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    # Migration 0017 (null before it). The numerics the baseline ran in (the worker engine's
    # dtype: "float32", "bfloat16"; null where the engine did not say, e.g. vLLM's own choice).
    dtype: Mapped[str | None] = mapped_column(String(16))
    # A mismatch judged (app/evals/shadow.py ``judge``): one of JUDGMENTS; null with no mismatch,
    # and on rows from before 0017 (the report counts those mismatches as violations).
    judgment: Mapped[str | None] = mapped_column(String(16))
    # At the first mismatch: the reference's top-1 minus top-2 logit, the largest gap excused as
    # rounding there (generation/exactness.py), and the dtype those logits were computed in.
    divergence_gap: Mapped[float | None] = mapped_column(Float)
    divergence_tolerance: Mapped[float | None] = mapped_column(Float)
    judged_dtype: Mapped[str | None] = mapped_column(String(16))


class GoldenRun(Base):
    """One ``specrag eval golden`` run: what was evaluated and its summary metrics."""

    __tablename__ = "golden_runs"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    source_file: Mapped[str] = mapped_column(Text)
    tenant: Mapped[str] = mapped_column(String(100))
    model_pair: Mapped[str | None] = mapped_column(String(500))
    method: Mapped[str] = mapped_column(String(32))
    num_speculative_tokens: Mapped[str] = mapped_column(String(16))
    num_items: Mapped[int] = mapped_column(Integer)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class GoldenItem(Base):
    """One golden question's result in a run: both answers, their scores and latencies."""

    __tablename__ = "golden_items"
    __table_args__ = (UniqueConstraint("run_id", "line_no", name="uq_golden_items_run_line"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("golden_runs.id", ondelete="CASCADE"), index=True
    )
    line_no: Mapped[int] = mapped_column(Integer)
    question: Mapped[str] = mapped_column(Text)
    collection: Mapped[str] = mapped_column(String(200))
    reference: Mapped[str] = mapped_column(Text)
    expected_sources: Mapped[list[str]] = mapped_column(JSON, default=list)
    spec_query_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("queries.id", ondelete="SET NULL")
    )
    baseline_query_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("queries.id", ondelete="SET NULL")
    )
    spec_answer: Mapped[str | None] = mapped_column(Text)
    baseline_answer: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    exact_match: Mapped[bool | None] = mapped_column(Boolean)
    token_f1: Mapped[float | None] = mapped_column(Float)
    retrieval_recall: Mapped[float | None] = mapped_column(Float)
    faithfulness: Mapped[float | None] = mapped_column(Float)
    # The baseline answer's scores (null: stored before migration 0012), for the paired tests.
    baseline_exact_match: Mapped[bool | None] = mapped_column(Boolean)
    baseline_token_f1: Mapped[float | None] = mapped_column(Float)
    baseline_faithfulness: Mapped[float | None] = mapped_column(Float)
    identical: Mapped[bool | None] = mapped_column(Boolean)
    spec_total_ms: Mapped[float | None] = mapped_column(Float)
    baseline_total_ms: Mapped[float | None] = mapped_column(Float)
    spec_generation_ms: Mapped[float | None] = mapped_column(Float)
    baseline_generation_ms: Mapped[float | None] = mapped_column(Float)
