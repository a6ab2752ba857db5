"""What other workers recorded, heard within a second on any host: one capped Redis stream.

A worker appends ``{"op": "answer", "query_id": ...}`` once an answer and its token ids are
committed, and ``{"op": "sync"}`` asks every worker to compare its trees with the database now
(after deleting a tenant's data, or a retention run). An entry carries only the query id: the
reader takes the tokens, the scope and the privacy decision from the database, so no message can
put into a tree what the database would not. The stream is capped; a reader that falls behind
the cap (or that was disconnected) loses nothing for long, as the periodic sync adds what it
missed.

With the embedded broker there is no Redis: one worker holds what it recorded itself, and the
periodic sync picks up answers any other process stored.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

log = logging.getLogger(__name__)

STREAM_KEY = "specrag:suffix:events"
MAX_EVENTS = 10_000
"""Entries the stream keeps (approximately): minutes of traffic; older ones are the sync's."""


class Feed:
    """The events stream on one Redis: announce events, and read them after a position."""

    def __init__(self, url: str) -> None:
        import redis  # optional: the embedded broker needs none

        self._client: Any = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)

    def position(self) -> str:
        """The id of the newest entry now ("0-0" when there is none): read from here on."""
        newest = self._client.xrevrange(STREAM_KEY, count=1)
        return newest[0][0].decode() if newest else "0-0"

    def announce_answer(self, query_id: uuid.UUID) -> None:
        """Tell every worker that ``query_id``'s answer is stored."""
        self._add({"op": "answer", "query_id": str(query_id)})

    def announce_sync(self) -> None:
        """Ask every worker to compare its trees with the database now."""
        self._add({"op": "sync"})

    def read(self, after: str, block_ms: int) -> tuple[str, list[dict[str, str]]]:
        """The events after ``after`` (waiting up to ``block_ms`` for one) and the new position."""
        found = self._client.xread({STREAM_KEY: after}, count=500, block=block_ms)
        events = []
        for _, entries in found or ():
            for entry_id, fields in entries:
                after = entry_id.decode()
                events.append({k.decode(): v.decode() for k, v in fields.items()})
        return after, events

    def close(self) -> None:
        self._client.close()

    def _add(self, fields: dict[str, str]) -> None:
        self._client.xadd(STREAM_KEY, fields, maxlen=MAX_EVENTS, approximate=True)


def request_sync(url: str | None) -> None:
    """Ask every worker on the Redis at ``url`` to sync its suffix trees now (no Redis: each
    worker's periodic sync, ``suffix_sync_seconds``, does it)."""
    if url is None:
        return
    feed = Feed(url)
    try:
        feed.announce_sync()
    finally:
        feed.close()
