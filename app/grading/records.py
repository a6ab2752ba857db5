"""The ``golden_grades`` table: one grader's grade of one golden item's speculative answer."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    CheckConstraint,
    DateTime,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.audit.records import GoldenItem
from app.db.models import Base, utcnow

FAITHFUL_LABELS = ("faithful", "partly", "not")
"""The faithfulness scale: every claim supported by the cited passages, some, none."""
FAITHFUL_SCORE = {"faithful": 1.0, "partly": 0.5, "not": 0.0}
RELEVANCE = range(1, 6)


class GoldenGrade(Base):
    """A human grade (faithfulness label, relevance 1-5, a note); unique per item and grader."""

    __tablename__ = "golden_grades"
    __table_args__ = (
        UniqueConstraint("item_id", "grader", name="uq_golden_grades_item_grader"),
        CheckConstraint("faithful IN ('faithful', 'partly', 'not')", name="faithful_valid"),
        CheckConstraint("relevance BETWEEN 1 AND 5", name="relevance_valid"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_id: Mapped[int] = mapped_column(ForeignKey(GoldenItem.id, ondelete="CASCADE"))
    grader: Mapped[str] = mapped_column(String(100))
    faithful: Mapped[str] = mapped_column(String(8))
    relevance: Mapped[int] = mapped_column(Integer)
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
