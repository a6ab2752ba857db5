"""``GET /v1/admin/audit``: the audit report over a time window (admin keys only).

The report itself is app/audit's: this route expects ``app.audit.render_report(session, since=,
until=, fmt=) -> (media_type, body)`` and answers 501 until that exists.
"""

from __future__ import annotations

import logging
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response

from app.api.deps import AdminDep, SessionDep
from app.api.errors import ApiError

router = APIRouter(prefix="/v1/admin", tags=["admin"])
log = logging.getLogger(__name__)


@router.get("/audit")
def audit(
    caller: AdminDep,
    session: SessionDep,
    since: str | None = Query(default=None, description="ISO 8601 start of the window."),
    until: str | None = Query(default=None, description="ISO 8601 end of the window."),
    format: Literal["json", "csv", "html"] = Query(default="json"),
) -> Response:
    """The audit report for [since, until) as JSON, CSV or HTML."""
    log.info("audit report requested by tenant %s (since=%s until=%s)", caller.tenant, since, until)
    try:
        from app.audit import render_report  # type: ignore[attr-defined]
    except ImportError:
        raise ApiError(501, "format", "audit reports are not available in this build") from None
    try:
        media_type, body = render_report(session, since=since, until=until, fmt=format)
    except ValueError as exc:
        field = str(exc).split(":", 1)[0] if ":" in str(exc) else "since"
        raise ApiError(422, field, str(exc)) from None
    return Response(content=body, media_type=media_type)
