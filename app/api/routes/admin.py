"""``GET /v1/admin/audit``: the audit report over a time window (admin keys only).

Every access is logged (logger ``app.api.routes.admin``): who asked, for which window and format,
and what they got -- including refused requests, so that reading the audit is itself audited.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Query
from fastapi.responses import Response

from app.api.deps import AdminDep, SessionDep, SettingsDep
from app.api.errors import ApiError
from app.audit import render_report

router = APIRouter(prefix="/v1/admin", tags=["admin"])
log = logging.getLogger(__name__)


@router.get("/audit")
def audit(
    caller: AdminDep,
    session: SessionDep,
    settings: SettingsDep,
    since: str | None = Query(default=None, description="ISO 8601 start (default: until - 1 day)."),
    until: str | None = Query(
        default=None, description="ISO 8601 end of the window (default: now)."
    ),
    format: str = Query(default="json", description="json, csv or html."),
    group_by: str | None = Query(
        default=None, description="Comma-separated: tenant, collection, method, model_pair, ..."
    ),
) -> Response:
    """The audit report for [since, until) as JSON (schema in docs/audit.md), CSV or HTML."""

    asked = f"since={since} until={until} format={format} group_by={group_by}"
    try:
        media_type, body = render_report(
            session, since=since, until=until, fmt=format, group_by=group_by, settings=settings
        )
    except ValueError as exc:
        field = str(exc).split(":", 1)[0] if ":" in str(exc) else "since"
        log.info("audit access by tenant %s refused (%s): %s", caller.tenant, asked, exc)
        raise ApiError(422, field, str(exc)) from None
    log.info("audit access by tenant %s (%s): %d bytes", caller.tenant, asked, len(body))
    return Response(content=body, media_type=media_type)
