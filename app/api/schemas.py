"""API response bodies (pydantic), kept apart from the database tables.

The request body of ``POST /v1/queries`` is the one request model, ``app.requests.QueryRequest``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.lifecycle.queries import QueryOut  # the stored query's JSON, shared with the event stream


class QueryAccepted(BaseModel):
    """``202``: the query's id and its status (``queued`` for a new one)."""

    id: str
    status: str


class ErrorOut(BaseModel):
    """Every 4xx body: which field is wrong and why."""

    error: dict[str, str]
    detail: list[dict[str, Any]] = []


__all__ = ["ErrorOut", "QueryAccepted", "QueryOut"]
