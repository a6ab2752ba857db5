"""The worker's side of answer streaming: token bursts of a running query onto a Redis Stream.

Each query has one stream, ``specrag:stream:{query_id}``, with entries of three types:

- ``token``: ``text`` (new text, incrementally detokenised), ``ids`` (JSON list of the burst's
  token ids) and ``t`` (wall-clock time the burst was handed over, for the latency benchmark);
- ``reset``: ``attempt``; a re-run of the query (its first worker was lost or its batch item was
  preempted) starts over, so readers drop the text they have;
- ``end``: ``status``; the answer or the failure is committed to the database, which readers
  consult for the final ``done`` / ``error`` event.

Entries are fenced by the attempt (the query's lease epoch, app/lifecycle/lease.py): a small script writes
each one only if no newer attempt of the query has written to the stream (``specrag:stream-owner:
{query_id}`` holds the newest), so a stalled worker that resumes after the reaper gave its query
to another can no longer stream; readers drop what came before the newer attempt's ``reset``.

Nothing here may slow the engine: ``on_delta`` only appends to an in-process queue, and one
publisher thread per process detokenises and writes, many entries per round trip. Every XADD
trims the stream (MAXLEN ~) and renews its expiry, so a stream holds at most ``stream_maxlen``
entries and disappears ``stream_ttl_seconds`` after its last one. When Redis is unreachable,
entries are dropped with a warning; the answer itself is unaffected and readers fall back to
the database.
"""

from __future__ import annotations

import atexit
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from app.streams.detok import IncrementalDetokenizer

log = logging.getLogger(__name__)

KEY_PREFIX = "specrag:stream:"
OWNER_PREFIX = "specrag:stream-owner:"

# KEYS: stream, owner. ARGV: attempt, maxlen, ttl, field, value, ... Returns 1 if written.
_FENCED_XADD = """
local owner = tonumber(redis.call('GET', KEYS[2]) or '0')
local attempt = tonumber(ARGV[1])
if attempt < owner then return 0 end
if attempt > owner then redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3]) end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"""
MAX_PENDING = 100_000
"""Entries waiting for Redis beyond this are dropped (Redis hung): the worker's memory stays flat."""


def stream_key(query_id: uuid.UUID | str) -> str:
    """The Redis key of a query's stream."""
    return f"{KEY_PREFIX}{query_id}"


class QueryStream:
    """One query's stream as the worker writes it; every method returns at once."""

    def __init__(
        self,
        publisher: Publisher | None,
        query_id: uuid.UUID,
        decode: Callable[[list[int]], str],
        attempt: int = 1,
    ) -> None:
        self.key = stream_key(query_id)
        self.owner_key = f"{OWNER_PREFIX}{query_id}"
        self.attempt = attempt
        self._publisher = publisher
        self._detok = IncrementalDetokenizer(decode)
        self._seen = 0  # token ids handed to on_delta (read on the caller's thread only)
        self._lock = threading.Lock()

    def on_delta(self, token_ids: list[int]) -> None:
        """A burst of newly verified token ids (the engine loop's ``DeltaCallback``)."""
        if not token_ids:
            return
        with self._lock:
            self._seen += len(token_ids)
        self._put("token", (list(token_ids), time.time()))

    def chain(self, other: Callable[[list[int]], None] | None) -> Callable[[list[int]], None]:
        """A delta callback that feeds this stream, then ``other`` (the caller's own, if any)."""
        if other is None:
            return self.on_delta

        def both(token_ids: list[int]) -> None:
            self.on_delta(token_ids)
            other(token_ids)

        return both

    def finish(self, text: str, token_ids: list[int]) -> None:
        """The generation's whole output and the answer text that will be stored.

        Ids the loop never delivered as deltas (an engine without them: all of them) go out as
        one last burst; the text still held back (trailing characters) follows, so that the
        token texts add up exactly to ``text``.
        """
        with self._lock:
            missing = list(token_ids[self._seen :])
            self._seen = len(token_ids)
        if missing:
            self._put("token", (missing, time.time()))
        self._put("final", text)

    def reset(self, attempt: int) -> None:
        """Announce that attempt ``attempt`` starts the answer over."""
        self._put("reset", attempt)

    def end(self, status: str) -> None:
        """Announce that the query's final state is committed (call after the commit)."""
        self._put("end", status)

    def _put(self, kind: str, payload: Any) -> None:
        if self._publisher is not None:
            self._publisher.put(self, kind, payload)

    def entries(self, kind: str, payload: Any) -> list[dict[str, str]]:
        """The stream entries for one queued item (on the publisher thread; detokenises)."""
        if kind == "token":
            ids, at = payload
            text = self._detok.push(ids)
            return [{"type": "token", "text": text, "ids": json.dumps(ids), "t": f"{at:.6f}"}]
        if kind == "final":
            rest = self._detok.finish(payload)
            if rest is None:
                log.warning(
                    "stream %s: streamed text is not a prefix of the answer; reset", self.key
                )
                return [
                    {"type": "reset", "attempt": "0"},
                    {"type": "token", "text": payload, "ids": "[]", "t": f"{time.time():.6f}"},
                ]
            if not rest:
                return []
            return [{"type": "token", "text": rest, "ids": "[]", "t": f"{time.time():.6f}"}]
        if kind == "reset":
            return [{"type": "reset", "attempt": str(payload)}]
        return [{"type": "end", "status": str(payload)}]


class Publisher:
    """One thread per process writing queued stream entries to Redis, in order."""

    def __init__(self, url: str, maxlen: int, ttl_seconds: float) -> None:
        import redis  # optional: embedded broker

        self._client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._maxlen = maxlen
        self._ttl = max(1, int(ttl_seconds))
        self._queue: queue.SimpleQueue[tuple[Any, str, Any]] = queue.SimpleQueue()
        self._warned_at = 0.0
        self._fenced_xadd = self._client.register_script(_FENCED_XADD)
        self._thread = threading.Thread(target=self._run, name="specrag-stream-pub", daemon=True)
        self._thread.start()

    def put(self, stream: QueryStream, kind: str, payload: Any) -> None:
        """Queue one item for the publisher thread (never blocks)."""
        if self._queue.qsize() >= MAX_PENDING:
            self._warn("stream publisher backlog full; entry dropped")
            return
        self._queue.put((stream, kind, payload))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued before this call is written; False on timeout."""
        done = threading.Event()
        self._queue.put((None, "flush", done))
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < 512:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._write(items)

    def _write(self, items: list[tuple[Any, str, Any]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        flushes: list[threading.Event] = []
        written = 0
        for stream, kind, payload in items:
            if stream is None:
                flushes.append(payload)
                continue
            try:
                entries = stream.entries(kind, payload)
            except Exception:  # a tokenizer error must not stop the thread for every query
                log.exception("stream %s: cannot build entry %s", stream.key, kind)
                continue
            for fields in entries:
                pairs = [part for item in fields.items() for part in item]
                args = [stream.attempt, self._maxlen, self._ttl, *pairs]
                self._fenced_xadd(keys=[stream.key, stream.owner_key], args=args, client=pipe)
                written += 1
        try:
            if written:
                pipe.execute()
        except Exception as exc:  # Redis down: readers fall back to the database
            self._warn(f"stream entries dropped: {exc}")
        finally:
            for event in flushes:
                event.set()

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._warned_at > 10:
            self._warned_at = now
            log.warning(message)


_publishers: dict[str, Publisher] = {}
_lock = threading.Lock()


def publisher(url: str, maxlen: int, ttl_seconds: float) -> Publisher:
    """This process's publisher for the Redis at ``url`` (started on first use)."""
    with _lock:
        found = _publishers.get(url)
        if found is None:
            found = _publishers[url] = Publisher(url, maxlen, ttl_seconds)
            # A worker's warm shutdown writes its last ``end`` before the process exits.
            atexit.register(found.flush, 2.0)
        return found


def open_stream(resources: Any, query_id: uuid.UUID, attempt: int) -> QueryStream:
    """The stream a worker writes for ``query_id`` (a no-op one when no stream Redis is set)."""
    settings = resources.settings
    url = settings.resolved_stream_url
    pub = publisher(url, settings.stream_maxlen, settings.stream_ttl_seconds) if url else None
    tokenizer: Any = resources.tokenizer if pub is not None else None

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    stream = QueryStream(pub, query_id, decode, attempt)
    if attempt > 1:
        stream.reset(attempt)
    return stream
