"""The reader's side of answer streaming: a query's events, from Redis or from the database.

Events (``Event``), as ``GET /v1/queries/{id}/stream`` sends them and ``specrag ask --stream``
prints them:

- ``token`` ``{"text", "token_ids"}`` per verified burst; the texts add up to the answer;
- ``reset`` ``{"attempt"}`` (an extension): the query started over on another attempt, drop the
  text so far;
- ``done`` (succeeded) or ``error`` (failed): exactly the JSON of ``GET /v1/queries/{id}``, id
  ``end``; nothing follows. A query deleted while its stream is open (a cancelled batch's item)
  ends with ``error`` ``{"id", "status": "cancelled", "error"}``.

With a stream Redis the token events carry the stream entry ids, so ``Last-Event-ID`` resumes
right after the last one received. Without one (embedded broker) the database is polled: when the
query finishes while the stream is open, its whole answer comes as one token event (id
``answer``, ``token_ids`` empty: the database keeps no token ids), then ``done``. Either way a
query already finished when the stream opens gets ``done`` at once, and a keep-alive tick
(``None``) comes every ``stream_keepalive_seconds`` of silence.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from sqlalchemy.orm import Session, sessionmaker

from app.lifecycle.queries import get_query, query_json
from app.settings import Settings
from app.streams.hub import StreamHub, normal_id, parse_id
from app.streams.publish import stream_key

log = logging.getLogger(__name__)

END_ID = "end"
ANSWER_ID = "answer"
FINAL = ("succeeded", "failed")


@dataclass(frozen=True)
class Event:
    """One server-sent event: its name, its id and its JSON data."""

    event: str
    id: str
    data: dict[str, Any]

    def sse(self) -> bytes:
        """The event in text/event-stream framing."""
        data = json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))
        return f"id: {self.id}\nevent: {self.event}\ndata: {data}\n\n".encode()


OPENED = Event("open", "", {})
"""Yielded once the stream will miss nothing that follows (subscribed, or the first poll done);
the API answers it with the ``retry:`` line, so a client that has read bytes can rely on that."""


def check_last_event_id(value: str | None) -> str | None:
    """``value`` in canonical form when it is an id this service sends; ValueError otherwise."""
    if value is None or value in (END_ID, ANSWER_ID):
        return value
    return normal_id(value)


def view_json(query: Any) -> dict[str, Any]:
    """The JSON of ``GET /v1/queries/{id}`` for ``query`` (same model, same exclusions)."""
    return query_json(query)


def gone_event(query_id: uuid.UUID) -> Event:
    """``error`` for a query deleted while its stream was open (its batch item was cancelled,
    or its tenant deleted): the stream still ends with a final event, never a bare close."""
    message = "the query no longer exists: its batch was cancelled or it was deleted"
    return Event("error", END_ID, {"id": str(query_id), "status": "cancelled", "error": message})


def final_event(view: dict[str, Any]) -> Event:
    """``done`` for a succeeded query, ``error`` for a failed one."""
    return Event("done" if view["status"] == "succeeded" else "error", END_ID, view)


class StreamSource:
    """Events of queries for one process (API or CLI): Redis when configured, else the database."""

    def __init__(self, settings: Settings, session_factory: sessionmaker[Session]) -> None:
        self.settings = settings
        self.session_factory = session_factory
        url = settings.resolved_stream_url
        self.hub: StreamHub | None = StreamHub(url) if url else None

    async def close(self) -> None:
        """Release the Redis connections."""
        if self.hub is not None:
            await self.hub.close()

    async def view(self, query_id: uuid.UUID, tenant_id: int | None) -> dict[str, Any] | None:
        """The query's JSON view, read in a worker thread (None when absent or not the tenant's)."""
        return await anyio.to_thread.run_sync(self._view, query_id, tenant_id)

    def _view(self, query_id: uuid.UUID, tenant_id: int | None) -> dict[str, Any] | None:
        with self.session_factory() as session:
            query = get_query(session, query_id, tenant_id)
            return None if query is None else view_json(query)

    async def events(
        self, query_id: uuid.UUID, tenant_id: int | None, last_event_id: str | None = None
    ) -> AsyncIterator[Event | None]:
        """The query's events after ``last_event_id``: ``OPENED`` first, None as keep-alive tick."""
        if last_event_id == END_ID:
            return
        view = await self.view(query_id, tenant_id)
        if view is None:
            raise LookupError(f"no query {query_id}")
        if view["status"] in FINAL and last_event_id in (None, ANSWER_ID):
            yield OPENED
            yield final_event(view)
            return
        if self.hub is None or last_event_id == ANSWER_ID:
            async for event in self._from_database(query_id, tenant_id, view, last_event_id):
                yield event
            return
        async for event in self._from_redis(query_id, tenant_id, view, last_event_id):
            yield event

    async def _from_database(
        self,
        query_id: uuid.UUID,
        tenant_id: int | None,
        view: dict[str, Any],
        last_event_id: str | None,
    ) -> AsyncIterator[Event | None]:
        s = self.settings
        quiet = 0.0
        yield OPENED
        while view["status"] not in FINAL:
            await asyncio.sleep(s.stream_poll_seconds)
            quiet += s.stream_poll_seconds
            if quiet >= s.stream_keepalive_seconds:
                quiet = 0.0
                yield None
            found = await self.view(query_id, tenant_id)
            if found is None:
                yield gone_event(query_id)  # deleted while streaming: say so, then end
                return
            view = found
        if view["status"] == "succeeded" and last_event_id is None and view.get("answer"):
            yield Event("token", ANSWER_ID, {"text": view["answer"], "token_ids": []})
        yield final_event(view)

    async def _from_redis(
        self,
        query_id: uuid.UUID,
        tenant_id: int | None,
        view: dict[str, Any],
        last_event_id: str | None,
    ) -> AsyncIterator[Event | None]:
        assert self.hub is not None
        hub, key = self.hub, stream_key(query_id)
        last = parse_id(last_event_id) if last_event_id else (0, 0)
        sub = hub.subscribe(key, last_event_id)
        try:
            try:
                # Subscribed first, then the backlog: every entry comes one way or the other;
                # ids already passed are skipped, so nothing repeats.
                batch = await hub.after(key, last_event_id)
            except Exception:
                log.warning("stream %s: Redis unreachable; reading the database", key)
                async for event in self._from_database(query_id, tenant_id, view, last_event_id):
                    yield event
                return
            yield OPENED
            finishing = view["status"] in FINAL
            while True:
                for entry_id, fields in batch:
                    pos = parse_id(entry_id)
                    if pos <= last:
                        continue
                    last = pos
                    kind = fields.get("type")
                    if kind == "token":
                        data = {
                            "text": fields.get("text", ""),
                            "token_ids": json.loads(fields["ids"]),
                        }
                        yield Event("token", entry_id, data)
                    elif kind == "reset":
                        yield Event("reset", entry_id, {"attempt": int(fields.get("attempt", 0))})
                    elif kind == "end":
                        found = await self.view(query_id, tenant_id)
                        if found is None:
                            yield gone_event(query_id)
                            return
                        view = found
                        finishing = view["status"] in FINAL
                if finishing:
                    yield final_event(view)
                    return
                if sub.failed:
                    # Redis refuses to read this stream: the database still gives the outcome.
                    log.warning("stream %s: Redis refused to read it; reading the database", key)
                    async for event in self._from_database(query_id, tenant_id, view, "0-0"):
                        if event is not OPENED:
                            yield event
                    return
                try:
                    if not sub.queue.empty():
                        batch = sub.queue.get_nowait()
                    else:
                        # asyncio.timeout, not wait_for: no extra task per wait.
                        async with asyncio.timeout(self.settings.stream_keepalive_seconds):
                            batch = await sub.queue.get()
                except TimeoutError:
                    yield None
                    # An ``end`` lost with its worker (or with Redis): the database still knows.
                    found = await self.view(query_id, tenant_id)
                    if found is None:
                        yield gone_event(query_id)
                        return
                    view = found
                    if view["status"] in FINAL:
                        finishing = True
                        batch = await _after_or_nothing(hub, key, last)
        finally:
            hub.unsubscribe(sub)


async def _after_or_nothing(hub: StreamHub, key: str, last: tuple[int, int]) -> list[Any]:
    try:
        return await hub.after(key, f"{last[0]}-{last[1]}")
    except Exception:
        return []
