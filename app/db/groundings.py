"""The stored grounding of an answer: per query, computed after the answer is recorded.

One row per answered query (``query_id`` unique): the answer's groundedness and citation shares,
or the reason it has none, the scorer that judged it, and per sentence the supporting passages
with spans (``sentences``: the JSON of ``retrieval.grounding.SentenceGrounding``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, backref, mapped_column, relationship

from app.db.models import Base, Query, utcnow


class AnswerGrounding(Base):
    """How well one answer stands on its sources (docs/grounding.md)."""

    __tablename__ = "answer_groundings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    query_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("queries.id", ondelete="CASCADE"), unique=True
    )
    groundedness: Mapped[float | None] = mapped_column(Float)
    citation_precision: Mapped[float | None] = mapped_column(Float)
    citation_recall: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(String(200))
    """Why there is no groundedness (empty answer, no sentences, no passages); else NULL."""
    scorer: Mapped[str] = mapped_column(String(200))
    threshold: Mapped[float] = mapped_column(Float)
    num_sentences: Mapped[int] = mapped_column(Integer, default=0)
    sentences: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    grounding_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    # ``Query.grounding`` comes from here, so that app.db.models need not import this module.
    query: Mapped[Query] = relationship(
        backref=backref("grounding", uselist=False, passive_deletes=True)
    )

    def to_dict(self) -> dict[str, Any]:
        """The ``grounding`` of ``GET /v1/queries/{id}``: ``specrag grounding check``'s line
        plus citation shares, the scorer and its threshold (null shares with a reason)."""
        return {
            "groundedness": self.groundedness,
            "sentences": list(self.sentences or []),
            "citation_precision": self.citation_precision,
            "citation_recall": self.citation_recall,
            "reason": self.reason,
            "scorer": self.scorer,
            "threshold": self.threshold,
            "grounding_ms": self.grounding_ms,
        }
