"""Interactive work announces itself to batch workers, so that they preempt at once, not at a poll.

A batch item's generation is preempted when interactive ``answer`` messages wait in the broker
(app/batch/preempt.py).  Polling the queue alone makes an interactive query wait half a poll
interval on average and a whole one at worst (docs/batch.md).  So whoever sends an
``answer`` message on a Redis broker also PUBLISHes on the broker's announcement channel, and
each batch worker keeps one subscriber thread that wakes the preemption watcher the moment a
message arrives.  The queue poll stays as the fallback for
messages nobody announced (the outbox sweeper re-sending after a broker outage, another
producer) and for a subscriber that lost its connection; an announcement only makes the watcher
check the queue now, so a message already taken by an idle worker preempts nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import redis

log = logging.getLogger(__name__)

CHANNEL = "specrag:answer-queued"
"""Prefix of the channel; pub/sub ignores database numbers, so the broker's is appended."""

_clients: dict[str, Any] = {}
_listeners: dict[str, Wakeup] = {}
_lock = threading.Lock()


def is_redis(url: str) -> bool:
    """Whether ``url`` is a Redis broker (the only one with announcements)."""
    return url.startswith(("redis://", "rediss://"))


def channel(url: str) -> str:
    """The announcement channel of the broker at ``url`` (one per Redis database number)."""
    db = urlsplit(url).path.strip("/") or "0"
    return f"{CHANNEL}:{db}"


def redis_client(url: str) -> Any:
    """One redis-py client per broker URL, per process."""
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(url, socket_timeout=2)
    return client


def announce(url: str) -> None:
    """Tell batch workers that an ``answer`` message was just sent (best effort, never raises)."""
    if not is_redis(url):
        return
    try:
        redis_client(url).publish(channel(url), b"1")
    except Exception:  # the message is queued; pollers still find it
        log.debug("announcing interactive work failed", exc_info=True)


class Wakeup:
    """A daemon thread subscribed to the broker's channel; sets every registered event per message."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._events: set[threading.Event] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="specrag-wakeup", daemon=True)
        self._thread.start()

    def register(self, event: threading.Event) -> None:
        """Set ``event`` on every announcement until ``unregister``."""
        with self._lock:
            self._events.add(event)

    def unregister(self, event: threading.Event) -> None:
        """Stop setting ``event``."""
        with self._lock:
            self._events.discard(event)

    def _run(self) -> None:
        while True:
            try:
                client = redis.Redis.from_url(self._url, socket_timeout=None)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(channel(self._url))
                for message in pubsub.listen():
                    if message.get("type") == "message":
                        with self._lock:
                            for event in self._events:
                                event.set()
            except Exception:  # broker restart: the queue poll covers the gap; resubscribe
                log.debug("wake-up subscriber lost its connection", exc_info=True)
                time.sleep(1.0)


def listener(url: str) -> Wakeup | None:
    """This process's subscriber for the broker at ``url`` (started once), or None off Redis."""
    if not is_redis(url):
        return None
    with _lock:
        if url not in _listeners:
            _listeners[url] = Wakeup(url)
        return _listeners[url]
