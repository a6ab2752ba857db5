"""The API's first line: the cheap checks of a request before its body is read or parsed.

An ASGI middleware (not a FastAPI dependency: FastAPI reads the body before any dependency runs),
so every route -- including ones added later -- gets the same order, cheapest first:

1. the query string's text hygiene (no NUL byte; app/validation.py says why);
2. a request with a body to a path that takes none (anything outside ``/v1/``) goes on unread;
3. ``Content-Length`` against the route's cap (``POST /v1/queries`` has a small one of its own);
4. the bearer key (a database lookup in a worker thread) -- 401 before a byte of the body is read;
5. the tenant's submission rate, for the routes that submit work -- 429 before the body is read;
6. the body, read under the cap, then parsed in a worker thread within a nesting bound, every
   string checked for storable text (app/api/body.py); the parse is handed to the route.

Refusals use the shared 4xx shape. What the guard learnt (the caller, the parsed body, that the
rate was counted) rides in the scope for the route (app/api/deps.py, app/api/body.py).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import anyio

from app.api.body import BodyError, guard_state, parse_json_off_loop
from app.api.errors import ApiError, error_body
from app.lifecycle.outage import RETRY_AFTER_SECONDS, unreachable
from app.tenancy.limits import LimitExceeded
from app.validation import text_problem

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SUBMITTING = {"/v1/queries", "/v1/batches", "/v1/documents"}
"""POST paths that count against the tenant's submission rate."""


class TooLarge(Exception):
    """The body passed the cap while streaming in."""


class RequestGuard:
    """Refuse, cheapest check first: bad query text, oversize (413), no key (401), over the rate
    (429), then bodies that are not bounded, storable JSON (422)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, max_query_bytes: int, max_depth: int = 64
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_query_bytes = max_query_bytes
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        bad = _bad_query(scope.get("query_string", b""))
        if bad is not None:
            await _refuse(send, 422, *bad)
            return
        path: str = scope.get("path", "")
        if scope.get("method") not in ("POST", "PUT", "PATCH") or not path.startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        cap = self.max_query_bytes if path.rstrip("/") == "/v1/queries" else self.max_bytes
        declared = _content_length(scope)
        if declared is not None and declared > cap:
            await _refuse(send, 413, "body", _too_large(cap, declared), unread=True)
            return
        state = guard_state(scope)
        state["max_depth"] = self.max_depth
        try:
            await anyio.to_thread.run_sync(_admit, scope, path.rstrip("/") in SUBMITTING)
        except ApiError as exc:
            await _refuse(send, exc.status, exc.field, exc.message, unread=True)
            return
        except LimitExceeded as exc:
            await _refuse(send, exc.status, exc.field, exc.message, exc.retry_after, unread=True)
            return
        except Exception as exc:
            if not unreachable(exc):
                raise
            # The key cannot be checked while the database is away: early, not wrong (503).
            message = "the database is unreachable; retry later"
            await _refuse(send, 503, "database", message, RETRY_AFTER_SECONDS, unread=True)
            return
        try:
            body = await _read(receive, cap)
        except TooLarge:
            await _refuse(send, 413, "body", _too_large(cap, None), unread=True)
            return
        if body and _is_json(scope):
            try:
                state["json"] = await parse_json_off_loop(body, self.max_depth)
            except BodyError as exc:
                await _refuse(send, exc.status_code, exc.field, exc.message)
                return
        await self.app(scope, _replay(body, receive), send)


def _admit(scope: Scope, submitting: bool) -> None:
    """The caller behind the bearer key, and (when ``submitting``) one hit on its rate."""
    from app.api.deps import lookup_caller  # deps imports this module's neighbours

    app_state = scope["app"].state
    state = guard_state(scope)
    with app_state.session_factory() as session:
        caller = lookup_caller(session, _bearer(scope))
        state["caller"] = caller
        if submitting:
            app_state.enforcer.rate(session, caller.tenant_id)
            state["rate_counted"] = True


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


def _too_large(cap: int, size: int | None) -> str:
    got = f" ({size} bytes)" if size is not None else ""
    return f"request body over the limit of {cap} bytes for this route{got}"


async def _read(receive: Receive, cap: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > cap:
            raise TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect as usual

    return replay


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            return b"json" in value.lower()
    return True  # no content type: FastAPI reads the body as JSON, so the guard does too


def _bad_query(raw: bytes) -> tuple[str, str] | None:
    if not raw:
        return None
    # Decoded as Starlette decodes it, so that the check sees what the route will see.
    for name, value in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):
        problem = text_problem(name)
        if problem is not None:
            return ("query", f"a parameter name {problem}")
        problem = text_problem(value)
        if problem is not None:
            return (name, problem)
    return None


async def _refuse(
    send: Send,
    status: int,
    field: str,
    message: str,
    retry_after: int | None = None,
    *,
    unread: bool = False,
) -> None:
    payload = json.dumps(error_body(field, message)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    if unread:
        # The body was not read: the connection cannot carry another request after this answer.
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
