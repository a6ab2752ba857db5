"""Answer messages a worker took and never acknowledged: the deliveries of queries nobody claimed.

A worker that dies between taking a query's message and claiming the query (killed while its
claim waited for an unreachable database, say) leaves the message unacknowledged in the Redis
transport's ``unacked`` hash, where it comes back only after the visibility timeout (an hour),
and the query ``queued`` with ``enqueued_at`` set, which the ordinary re-send reaches only after
``resend_after_seconds``. ``UnclaimedDeliveries`` reads the transport's index of unacknowledged
deliveries (``unacked_index``, scored by delivery time) and reports, per query id, when a worker
took its message; app/lifecycle/outbox.py ``rescue_unclaimed`` sends again those still queued since then.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from app.dispatch import TaskName
from workers.wakeup import is_redis, redis_client

log = logging.getLogger(__name__)

UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"
"""kombu's Redis transport keys (its defaults; no global key prefix is configured)."""
LIMIT = 500


class UnclaimedDeliveries:
    """``(age)`` → ``{query_id: delivered_at}`` for answer messages taken over ``age`` s ago."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, age: float) -> dict[uuid.UUID, datetime]:
        """Unacknowledged answer deliveries older than ``age`` seconds ({} off Redis, or on error)."""
        if not is_redis(self.url):
            return {}
        client: Any = redis_client(self.url)
        try:
            old = client.zrangebyscore(
                UNACKED_INDEX, "-inf", time.time() - age, start=0, num=LIMIT, withscores=True
            )
            if not old:
                return {}
            raws = client.hmget(UNACKED, [tag for tag, _ in old])
        except Exception as exc:  # the broker is away: nothing to tell until it is back
            log.debug("unacknowledged deliveries unreadable: %s", exc)
            return {}
        found: dict[uuid.UUID, datetime] = {}
        for (_, score), raw in zip(old, raws, strict=True):
            qid = _query_id(raw)
            if qid is not None:
                found[qid] = datetime.fromtimestamp(float(score), UTC)
        return found


def _query_id(raw: bytes | None) -> uuid.UUID | None:
    """The query id of one stored delivery when it is an answer task's; None otherwise."""
    if raw is None:
        return None
    try:
        message = json.loads(raw)[0]
        if message.get("headers", {}).get("task") != TaskName.ANSWER.value:
            return None
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return uuid.UUID(str(args[0]))
    except (ValueError, KeyError, IndexError, TypeError):
        return None
