"""``GET /healthz``: ok or unavailable for each component the API needs (no key needed).

It says nothing more: no error text, hosts or versions, since anyone can call it. The reason a
component is down goes to the log (logger ``app.api.routes.health``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from app.api.deps import SessionDep

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)


@router.get("/healthz")
def healthz(session: SessionDep, request: Request) -> Any:
    """``{"status": "ok", "components": {"database": "ok", "broker": "ok"}}``; 503 when one is down."""
    components = {"database": _state("database", lambda: session.execute(text("SELECT 1")))}
    check_broker = getattr(request.app.state, "check_broker", None)
    if check_broker is not None:
        components["broker"] = _state("broker", check_broker)
    ok = all(state == "ok" for state in components.values())
    body = {"status": "ok" if ok else "unavailable", "components": components}
    return body if ok else JSONResponse(body, status_code=503)


def _state(name: str, check: Any) -> str:
    try:
        check()
    except Exception as exc:  # any failure means unavailable; the reason is for the log only
        log.warning("healthz: %s unavailable: %s", name, exc)
        return "unavailable"
    return "ok"
