"""JSON request bodies parsed once, in a worker thread, within a depth bound.

The guard (app/api/guard.py) parses every JSON body before any route sees it: in a thread, so that
a large body never holds the event loop (and with it ``/healthz`` and every open stream), and with
a nesting bound, so that ``[[[[...]]]]`` is a 422 rather than a RecursionError. The parsed value
rides in the ASGI scope; ``ParsedRoute`` hands it to FastAPI so that the body is not parsed a
second time, on the event loop, by ``Request.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, MutableMapping
from typing import Any

import anyio
from fastapi import HTTPException
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from app.validation import find_bad_text

SCOPE_KEY = "specrag"
"""The scope entry where the guard leaves what it learnt: ``json``, ``caller``, ``rate_counted``."""


class BodyError(HTTPException):
    """A body refused before any route ran: 4xx naming ``field`` (an HTTPException, so that
    FastAPI's body reader lets it through rather than turning it into a plain 400)."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(status_code=status, detail=message)
        self.field = field
        self.message = message


def parse_json(body: bytes, max_depth: int) -> Any:
    """The JSON value of ``body``; BodyError (422 naming the field) when it is not storable JSON.

    Refused: bytes that are not UTF-8, text that is not JSON (with the parser's line and column),
    nesting deeper than ``max_depth``, and any string with a NUL byte or a lone surrogate.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(422, "body", f"not valid UTF-8 at byte {exc.start}") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise BodyError(422, "body", f"JSON nested more than {max_depth} levels deep") from None
    except ValueError as exc:  # JSONDecodeError, and int() over sys.get_int_max_str_digits()
        raise BodyError(422, "body", f"not valid JSON: {_reason(exc)}") from None
    if _depth_over(value, max_depth):
        raise BodyError(422, "body", f"JSON nested more than {max_depth} levels deep")
    found = find_bad_text(value)
    if found is not None:
        raise BodyError(422, *found)
    return value


async def parse_json_off_loop(body: bytes, max_depth: int) -> Any:
    """``parse_json`` in a worker thread."""
    return await anyio.to_thread.run_sync(parse_json, body, max_depth)


def _reason(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    # Python refuses to convert integers of more than 4300 digits; say so without its advice.
    if "digits" in str(exc):
        return "a number has too many digits"
    return "cannot be decoded"


def _depth_over(value: Any, max_depth: int) -> bool:
    # Iterative: a value that json.loads could build may still be too deep to walk recursively.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def guard_state(scope: MutableMapping[str, Any]) -> dict[str, Any]:
    """The guard's entry of ``scope`` (made empty when absent)."""
    state: dict[str, Any] = scope.setdefault(SCOPE_KEY, {})
    return state


class _ParsedRequest(Request):
    async def json(self) -> Any:
        state = self.scope.get(SCOPE_KEY, {})
        if "json" in state:
            return state["json"]
        # Not parsed by the guard (no JSON content type): the same bounds, off the loop.
        return await parse_json_off_loop(await self.body(), state.get("max_depth", 64))


class ParsedRoute(APIRoute):
    """An APIRoute whose body is the guard's parse (FastAPI's "custom Request class" pattern)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed_handler(request: Request) -> Response:
            return await handler(_ParsedRequest(request.scope, request.receive))

        return parsed_handler
