"""API response bodies (pydantic), kept apart from the database tables.

The request body of ``POST /v1/queries`` is the one request model, ``app.requests.QueryRequest``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


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
