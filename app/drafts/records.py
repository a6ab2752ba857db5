"""The exact token ids of an answered query, kept for draft tuning (migration 0016).

Why stored and not rebuilt: the answer's text is decoded with special tokens skipped and
stripped, so re-encoding it does not give back the target's output ids (its EOS, leading
spaces and byte-fallback pieces are lost); and the prompt depends on the collection's system
prompt and the tokenizer at answer time, both of which can change afterwards. The stored
sources and ``answers.prompt_tokens`` still let a reader check the prompt's length.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import JSON, DateTime, ForeignKey, Integer
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import Base, utcnow


class AnswerTokens(Base):
    """Prompt and output token ids of one succeeded answer (unique per query)."""

    __tablename__ = "answer_token_ids"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    query_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("queries.id", ondelete="CASCADE"), unique=True
    )
    prompt_token_ids: Mapped[list[int]] = mapped_column(JSON)
    output_token_ids: Mapped[list[int]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
