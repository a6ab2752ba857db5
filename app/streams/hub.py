"""One blocking XREAD per API process for every open answer stream, instead of one per client.

An open stream holds no thread and no Redis connection of its own: it registers a subscription
(an asyncio queue) here, and a single task reads all subscribed streams with one
``XREAD BLOCK`` and hands each batch of entries to the subscribers of that stream. A new
subscription must join a read already blocked on the other keys, so the hub also reads a private
"wake" stream that ``subscribe`` appends to; the blocked XREAD returns at once and the next one
includes the new key. Handing entries over never waits for a client: a slow reader's queue holds
at most its query's stream (bounded by MAXLEN), and a vanished one is unsubscribed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from typing import Any

log = logging.getLogger(__name__)

Entry = tuple[str, dict[str, str]]
"""A stream entry: its id ("ms-seq") and its fields."""


_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")
_U64 = 2**64 - 1  # Redis keeps both halves of a stream id as unsigned 64-bit integers


def parse_id(entry_id: str) -> tuple[int, int]:
    """A stream id as a comparable pair; ValueError unless it is an ``MS-SEQ`` Redis accepts.

    ASCII digits only (``str.isdigit`` also takes other scripts' digits) and both halves within
    64 bits: an id Redis refuses would make the shared XREAD fail for every stream in it.
    """
    match = _ID.fullmatch(entry_id)
    if match is None:
        raise ValueError(f"not a stream id: {entry_id!r}")
    ms, seq = int(match[1]), int(match[2])
    if ms > _U64 or seq > _U64:
        raise ValueError(f"stream id out of range: {entry_id!r}")
    return ms, seq


def normal_id(entry_id: str) -> str:
    """``entry_id`` in the canonical ``MS-SEQ`` form (no leading zeros); ValueError as parse_id."""
    ms, seq = parse_id(entry_id)
    return f"{ms}-{seq}"


class Subscription:
    """One reader of one stream: batches of entries arrive on ``queue``."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.queue: asyncio.Queue[list[Entry]] = asyncio.Queue()
        self.failed = False
        """Set (and an empty batch queued) when Redis refused to read this stream: the hub
        no longer reads it, and the reader falls back to the database."""


class StreamHub:
    """Reads every subscribed stream with one XREAD loop; ``close`` stops it."""

    def __init__(self, url: str, block_ms: int = 10_000) -> None:
        import redis.asyncio as aioredis  # optional: embedded broker

        # The reader's socket waits longer than its XREAD blocks; the pool serves XRANGE and pokes.
        self._reader = aioredis.Redis.from_url(
            url, decode_responses=True, socket_timeout=block_ms / 1000 + 10
        )
        # A bounded pool: hundreds of streams opening at once queue for a connection instead of
        # opening hundreds of them.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            decode_responses=True,
            max_connections=32,
            timeout=30,
            socket_timeout=10,
            socket_connect_timeout=5,
        )
        self.redis = aioredis.Redis(connection_pool=pool)
        self._block_ms = block_ms
        self._subs: dict[str, set[Subscription]] = {}
        self._cursors: dict[str, str] = {}
        self._wake_key = f"specrag:stream-hub:{uuid.uuid4().hex}"
        self._wake_cursor = "0-0"
        self._task: asyncio.Task[None] | None = None
        self._pokes: set[asyncio.Task[Any]] = set()

    def subscribe(self, key: str, after: str | None) -> Subscription:
        """Start receiving entries of ``key`` newer than ``after`` (None: from the start)."""
        sub = Subscription(key)
        self._subs.setdefault(key, set()).add(sub)
        self._cursors.setdefault(key, normal_id(after) if after else "0-0")
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="stream-hub")
        else:
            poke = asyncio.get_running_loop().create_task(self._poke())
            self._pokes.add(poke)
            poke.add_done_callback(self._pokes.discard)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop delivering to ``sub``; the stream is no longer read once nobody reads it."""
        subs = self._subs.get(sub.key)
        if subs is None:
            return
        subs.discard(sub)
        if not subs:
            del self._subs[sub.key]
            self._cursors.pop(sub.key, None)

    async def after(self, key: str, after: str | None) -> list[Entry]:
        """Entries of ``key`` newer than ``after`` that are in Redis now."""
        start = f"({after}" if after else "-"
        rows: Any = await self.redis.xrange(key, min=start, max="+")
        return [(str(i), dict(f)) for i, f in rows or []]

    @property
    def open_streams(self) -> int:
        """How many subscriptions are open."""
        return sum(len(s) for s in self._subs.values())

    async def close(self) -> None:
        """Stop the reading task and close the connections."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for poke in list(self._pokes):
            poke.cancel()
        await self._reader.aclose()
        await self.redis.aclose()

    async def _poke(self) -> None:
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(self._wake_key, {"w": "1"}, maxlen=1, approximate=False)
                pipe.expire(self._wake_key, 600)
                await pipe.execute()
        except Exception:  # the read loop picks the key up at its next turn anyway
            log.debug("stream hub poke failed", exc_info=True)

    async def _run(self) -> None:
        from redis.exceptions import ResponseError

        while self._subs:
            streams: Any = {self._wake_key: self._wake_cursor, **self._cursors}
            try:
                reply = await self._reader.xread(streams, count=1024, block=self._block_ms)
            except asyncio.CancelledError:
                raise
            except ResponseError:
                # Redis refused one of the keys (say, not a stream): find it and stop reading
                # it, so that one bad stream cannot stall every other reader of this process.
                if not await self._drop_refused():
                    log.warning("stream hub: XREAD refused; retrying", exc_info=True)
                    await asyncio.sleep(0.5)
                continue
            except Exception:
                # Redis restarting: readers wait (their keep-alive re-checks the database).
                log.warning("stream hub: XREAD failed; retrying", exc_info=True)
                await asyncio.sleep(0.5)
                continue
            for key, rows in _items(reply):
                entries = [(str(i), dict(f)) for i, f in rows]
                if not entries:
                    continue
                if key == self._wake_key:
                    self._wake_cursor = entries[-1][0]
                    continue
                if key not in self._subs:
                    continue  # the last reader left while the read was in flight
                self._cursors[key] = entries[-1][0]
                for sub in self._subs[key]:
                    sub.queue.put_nowait(entries)
        self._task = None

    async def _drop_refused(self) -> bool:
        """Stop reading the streams Redis refuses to read on their own; whether there were any."""
        from redis.exceptions import ResponseError

        dropped = False
        for key, cursor in list(self._cursors.items()):
            try:
                await self.redis.xread({key: cursor}, count=1)
            except ResponseError as exc:
                log.warning(
                    "stream hub: Redis refuses %s at %s (%s); not reading it", key, cursor, exc
                )
                dropped = True
                self._cursors.pop(key, None)
                for sub in self._subs.pop(key, set()):
                    sub.failed = True
                    sub.queue.put_nowait([])
            except Exception:
                return dropped  # Redis unreachable: the next turn retries
        return dropped


def _items(reply: Any) -> list[tuple[str, list[Any]]]:
    # RESP2 answers a list of [key, entries]; RESP3 a mapping.
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(str(k), list(v)) for k, v in reply.items()]
    return [(str(k), list(v)) for k, v in reply]
