"""``specrag ask --stream``: print a query's answer as its token bursts arrive, then the rest."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.settings import Settings
from app.streams import OPENED, StreamSource


def follow(
    settings: Settings,
    session_factory: sessionmaker[Session],
    query_id: uuid.UUID,
    *,
    timeout: float,
    as_json: bool,
) -> dict[str, Any]:
    """Print the query's stream (text, or one JSON line per event) and return its final view.

    The events are the API's (app/streams/events.py), read straight from the stream Redis, or
    from the database on the embedded broker. TimeoutError after ``timeout`` seconds.
    """
    return asyncio.run(_follow(settings, session_factory, query_id, timeout, as_json))


async def _follow(
    settings: Settings,
    session_factory: sessionmaker[Session],
    query_id: uuid.UUID,
    timeout: float,
    as_json: bool,
) -> dict[str, Any]:
    source = StreamSource(settings, session_factory)
    try:
        async with asyncio.timeout(timeout):
            async for event in source.events(query_id, None):
                if event is None or event is OPENED:
                    continue
                if event.event in ("done", "error"):
                    if not as_json:
                        sys.stdout.write("\n")
                    return event.data
                if as_json:
                    line = {"event": event.event, "id": event.id, "data": event.data}
                    sys.stdout.write(json.dumps(line) + "\n")
                elif event.event == "token":
                    sys.stdout.write(event.data["text"])
                else:
                    sys.stdout.write("\n[the answer started over]\n")
                sys.stdout.flush()
    except TimeoutError:
        raise TimeoutError(
            f"query {query_id} not finished after {timeout:.0f} s"
            " (is a worker running on this broker?)"
        ) from None
    finally:
        await source.close()
    raise LookupError(f"query {query_id}: the stream ended without a final event")
