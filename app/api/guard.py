"""The API's first line: a request body size cap and text hygiene, before any route parses it.

An ASGI middleware (not a FastAPI dependency) so that an oversized body is refused while it
streams in, before it is buffered whole, and so that every route -- including ones added later --
gets the same check: no string anywhere in a JSON body or the query string may hold a NUL byte
or a lone surrogate (app/validation.py says why). Refusals use the shared 4xx shape.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from app.api.errors import error_body
from app.validation import find_bad_text, text_problem

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TooLarge(Exception):
    """The body passed the cap while streaming in."""


class RequestGuard:
    """Refuse bodies over ``max_bytes`` (413) and unstorable text in JSON or the query (422)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        bad = _bad_query(scope.get("query_string", b""))
        if bad is not None:
            await _refuse(send, 422, *bad)
            return
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _refuse(send, 413, "body", self._too_large(declared))
            return
        try:
            body = await self._read(receive)
        except TooLarge:
            await _refuse(send, 413, "body", self._too_large(None))
            return
        if _is_json(scope) and body:
            found = _bad_json_text(body)
            if found is not None:
                await _refuse(send, 422, *found)
                return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self, size: int | None) -> str:
        got = f" ({size} bytes)" if size is not None else ""
        return f"request body over the limit of {self.max_bytes} bytes{got}"

    async def _read(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
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
    return False


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


def _bad_json_text(body: bytes) -> tuple[str, str] | None:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None  # not JSON: the route's own parser answers 422 with its reason
    return find_bad_text(data)


async def _refuse(send: Send, status: int, field: str, message: str) -> None:
    payload = json.dumps(error_body(field, message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
