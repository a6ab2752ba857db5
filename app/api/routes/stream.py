"""``GET /v1/queries/{id}/stream``: a query's answer as server-sent events, token bursts as verified.

Async end to end: an open stream holds no thread (the key and the query are checked in the thread
pool once, before the stream starts) and no database connection between its short reads, so one
API process keeps hundreds open. The events and their ids are described in app/streams/events.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials
from sqlalchemy.orm import Session, sessionmaker

from app.api.deps import Caller, bearer, bearer_key, lookup_caller
from app.api.errors import ApiError
from app.api.schemas import ErrorOut
from app.keys import find_key
from app.lifecycle.queries import get_query
from app.streams import END_ID, OPENED, Event, StreamSource, check_last_event_id

router = APIRouter(prefix="/v1/queries", tags=["queries"])
KEEPALIVE = b": keep-alive\n\n"
RETRY = b"retry: 1000\n\n"
"""Sent first, once the stream is subscribed (nothing after it can be missed): a browser's
EventSource reconnects after 1 s (with Last-Event-ID) if cut off."""
KEY_RECHECK_SECONDS = 2.0
"""How often an open stream checks that its key is still live: a revoked key's streams end."""


def _key_live(session_factory: sessionmaker[Session], key: str) -> bool:
    try:
        with session_factory() as session:
            return find_key(session, key) is not None
    except Exception:  # the database away is no revocation: the next check decides
        return True


def revoked_event(query_id: uuid.UUID) -> Event:
    """``error`` that ends a stream whose API key was revoked (or expired) while it was open."""
    message = "the API key of this stream was revoked or expired"
    return Event("error", END_ID, {"id": str(query_id), "status": "revoked", "error": message})


def stream_source(request: Request) -> StreamSource:
    """The app's StreamSource, made on first use (it needs the running event loop's Redis)."""
    state = request.app.state
    source: StreamSource | None = getattr(state, "stream_source", None)
    if source is None:
        source = state.stream_source = StreamSource(state.settings, state.session_factory)
    return source


async def close_stream_source(app: Any) -> None:
    """Close the app's StreamSource, if one was made (at shutdown)."""
    source: StreamSource | None = getattr(app.state, "stream_source", None)
    if source is not None:
        app.state.stream_source = None
        await source.close()


def _authorize(
    session_factory: sessionmaker[Session],
    credentials: HTTPAuthorizationCredentials | None,
    query_id: str,
) -> tuple[Caller, uuid.UUID]:
    # Its own short session, not SessionDep: a dependency's session would stay checked out
    # for as long as the response streams, and the pool would run dry at a few dozen streams.
    with session_factory() as session:
        caller = lookup_caller(session, bearer_key(credentials))
        query = get_query(session, query_id, caller.tenant_id)
        if query is None:
            # Another tenant's query is reported exactly like a missing one.
            raise ApiError(404, "id", f"no query {query_id}")
        return caller, query.id


@router.get(
    "/{query_id}/stream",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "token*, then done or error"},
        204: {"description": "Last-Event-ID was the final event: nothing follows"},
        401: {"model": ErrorOut},
        404: {"model": ErrorOut},
        422: {"model": ErrorOut},
    },
)
async def stream_query(
    query_id: str,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> Response:
    """The query's answer as server-sent events: ``token`` per verified burst, then ``done``.

    ``done`` (or ``error`` when the query failed) carries the JSON of ``GET /v1/queries/{id}``;
    every event has an ``id:``; ``Last-Event-ID`` resumes after that event. A finished query
    gets ``done`` at once; an idle stream gets a keep-alive comment every
    ``SPECRAG_STREAM_KEEPALIVE_SECONDS``.
    """
    caller, qid = await run_in_threadpool(
        _authorize, request.app.state.session_factory, credentials, query_id
    )
    try:
        resume = check_last_event_id(last_event_id)
    except ValueError:
        message = f"not an event id of this stream: {last_event_id!r}"
        raise ApiError(422, "Last-Event-ID", message) from None
    if resume == END_ID:
        # The stream was complete; 204 tells an EventSource to stop reconnecting.
        return Response(status_code=204)
    source = stream_source(request)
    session_factory = request.app.state.session_factory
    key = bearer_key(credentials) or ""

    async def body() -> AsyncIterator[bytes]:
        checked = time.monotonic()
        async for event in source.events(qid, caller.tenant_id, resume):
            if time.monotonic() - checked >= KEY_RECHECK_SECONDS:
                checked = time.monotonic()
                if not await run_in_threadpool(_key_live, session_factory, key):
                    yield revoked_event(qid).sse()
                    return
            if event is None:
                yield KEEPALIVE
            else:
                yield RETRY if event is OPENED else event.sse()

    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
