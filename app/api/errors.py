"""One JSON shape for every 4xx (and the 503 of a database outage):
``{"error": {"field", "message"}, "detail": [...]}``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc

from app.api.body import BodyError
from app.lifecycle.outage import RETRY_AFTER_SECONDS, DatabaseUnavailable, unreachable
from app.requests import RequestError
from app.tenancy.limits import LimitExceeded


class ApiError(Exception):
    """An error answered with ``status`` and a body naming ``field``."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message


def error_body(field: str, message: str) -> dict[str, Any]:
    """The JSON body of a refused request."""
    return {
        "error": {"field": field, "message": message},
        "detail": [{"loc": [field], "msg": message}],
    }


def _field_of(loc: Any) -> str:
    # FastAPI prefixes the location with "body", "query", "header" or "path".
    parts = [str(p) for p in loc if p not in ("body", "query", "header", "path")]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    """Register the handlers that turn validation and API errors into the shared JSON shape."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(
            error_body(exc.field, exc.message), status_code=exc.status, headers=headers
        )

    @app.exception_handler(BodyError)
    async def body_error(_: Request, exc: BodyError) -> JSONResponse:
        return JSONResponse(error_body(exc.field, exc.message), status_code=exc.status_code)

    @app.exception_handler(RequestError)
    async def request_error(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_body(exc.field, exc.message), status_code=422)

    @app.exception_handler(LimitExceeded)
    async def limit_exceeded(_: Request, exc: LimitExceeded) -> JSONResponse:
        return JSONResponse(
            error_body(exc.field, exc.message),
            status_code=exc.status,
            headers={"Retry-After": str(exc.retry_after)},
        )

    async def database_away(_: Request, exc: Exception) -> JSONResponse:
        if not unreachable(exc):
            raise exc  # a real fault: the server error it is
        body = error_body("database", "the database is unreachable; retry later")
        return JSONResponse(
            body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
        )

    # While the database is away a request is not wrong, only early: 503 with Retry-After,
    # which app/client.py retries (a plain 500 it would not).
    for kind in (
        sa_exc.OperationalError,
        sa_exc.InterfaceError,
        sa_exc.TimeoutError,
        sa_exc.DisconnectionError,
        DatabaseUnavailable,
    ):
        app.add_exception_handler(kind, database_away)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ["body"], "msg": "invalid request"}
        body = error_body(_field_of(first.get("loc", ["body"])), str(first.get("msg")))
        body["detail"] = [{"loc": list(e.get("loc", [])), "msg": e.get("msg")} for e in errors]
        return JSONResponse(body, status_code=422)
