"""Whether the Redis broker lost its data: a marker key that disappears with everything else.

A Redis that restarts without persistence (or is flushed) comes back empty: every message of a
query that was sent and not yet taken is gone, while the database still says ``queued``. Each
process that sweeps (the API, every worker) reads one marker key in the broker's database. The
first to find it missing writes a new one (``SET NX``) holding when it did; a process that had
seen another marker before then knows the broker's data is not what it was, and reports the
marker's time: messages sent before it may be lost. app/lifecycle/outbox.py turns those sent-but-queued
queries back into unsent ones for the sweep to send again. Every process reports the same time,
so a second report changes nothing the first did not.

Times are the processes' wall clocks: keep hosts in sync (NTP), as for the rate windows.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from workers.wakeup import is_redis, redis_client

log = logging.getLogger(__name__)
MARKER = "specrag:broker-epoch"


class BrokerEpoch:
    """``lost()``: when the broker last lost its data, once per loss this process lived through."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._seen: bytes | None = None

    def lost(self) -> datetime | None:
        """The time before which sends may be lost, when the broker lost its data since the last
        call; None otherwise (also when the broker cannot be read)."""
        if not is_redis(self.url):
            return None
        client: Any = redis_client(self.url)
        try:
            current = client.get(MARKER)
            if current is None:
                mine = f"{uuid.uuid4().hex}:{time.time():.6f}".encode()
                current = mine if client.set(MARKER, mine, nx=True) else client.get(MARKER)
        except Exception as exc:  # the broker is down: nothing to tell until it is back
            log.debug("broker epoch unreadable: %s", exc)
            return None
        before, self._seen = self._seen, current
        # A first look (a new deployment, a process started after the loss) is no loss.
        if before is None or current is None or current == before:
            return None
        when = datetime.fromtimestamp(float(current.split(b":")[1]), UTC)
        log.warning("the broker at %s lost its data at about %s", self.url, when.isoformat())
        return when
