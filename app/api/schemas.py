"""API request and response bodies (pydantic), kept apart from the database tables."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class QueryCreate(BaseModel):
    """``POST /v1/queries``: a question and optional decoding parameters (limits from settings)."""

    # strict: `max_tokens: true` or `"temperature": "0.5"` is refused, not coerced.
    model_config = ConfigDict(extra="forbid", strict=True)

    question: str = Field(description="The question, in natural language.")
    collection: str = Field(description="Collection of the caller's documents to search.")
    method: str | None = Field(default=None, description="draft_model | ngram | none.")
    num_speculative_tokens: int | Literal["auto"] | None = Field(
        default=None, description="k >= 1, or 'auto'."
    )
    max_tokens: int | None = Field(default=None, description="Most tokens to generate.")
    temperature: float | None = Field(default=None, description="0 = greedy.")
    seed: int | None = Field(default=None, description="Seed for reproducible sampling.")


class QueryAccepted(BaseModel):
    """``202``: the query's id and its status (``queued`` for a new one)."""

    id: str
    status: str


class QueryOut(BaseModel):
    """``GET /v1/queries/{id}``: the status, and the answer, sources and stats once known."""

    id: str
    status: Literal["queued", "running", "succeeded", "failed"]
    answer: str | None = None
    sources: list[dict[str, Any]] | None = None
    stats: dict[str, Any] | None = None
    error: str | None = None
    model_pair: str | None = None
    index_version: int | None = None


class ErrorOut(BaseModel):
    """Every 4xx body: which field is wrong and why."""

    error: dict[str, str]
    detail: list[dict[str, Any]] = []
