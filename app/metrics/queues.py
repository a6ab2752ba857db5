"""Queue depth and pending queries, read at scrape time: what waits in the broker, what is in flight.

``specrag_queue_depth{queue}`` counts the messages waiting in the broker. On Redis kombu keeps one
list per priority step (``answer``, ``answer\\x06\\x163``, ...; batch work is sent at priority 5),
so the depth is the sum of the queue's lists. With the embedded broker (kombu's SQLAlchemy
transport) it is the count of visible messages in the broker's database.
``specrag_queries_pending{queue,status}`` counts the queries the database holds as queued or running.
A broker that cannot be read drops the depth series and sets ``specrag_broker_up`` to 0, so the
scrape itself never fails and the alert on ``specrag_broker_up`` says why the depth went missing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

PENDING_STATUSES = ("queued", "running")


class BrokerDepth:
    """Reads how many messages wait in each queue of one broker URL (redis:// or sqla+...)."""

    def __init__(self, broker_url: str, timeout: float = 2.0) -> None:
        self.url = broker_url
        self.timeout = timeout
        self._client: Any = None

    def depths(self, queues: Sequence[str]) -> dict[str, int]:
        """Messages waiting per queue; raises when the broker cannot be read."""
        if self.url.startswith(("redis://", "rediss://", "unix://")):
            return self._redis(queues)
        if self.url.startswith("sqla+"):
            return self._sqla(queues)
        raise ValueError(
            f"queue depth: unsupported broker URL scheme in {self.url.split(':', 1)[0]}"
        )

    def _redis(self, queues: Sequence[str]) -> dict[str, int]:
        from kombu.transport.redis import PRIORITY_STEPS, Channel

        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(
                self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
            )
        pipe = self._client.pipeline(transaction=False)
        keys = {q: redis_priority_keys(q, PRIORITY_STEPS, Channel.sep) for q in queues}
        for names in keys.values():
            for key in names:
                pipe.llen(key)
        lengths = iter(pipe.execute())
        return {q: sum(next(lengths) for _ in names) for q, names in keys.items()}

    def _sqla(self, queues: Sequence[str]) -> dict[str, int]:
        from sqlalchemy import create_engine, inspect, text

        if self._client is None:
            self._client = create_engine(self.url.removeprefix("sqla+"), pool_pre_ping=True)
        counts = dict.fromkeys(queues, 0)
        with self._client.connect() as conn:
            # kombu creates its tables on first use: before that, nothing can be waiting.
            if not inspect(conn).has_table("kombu_message"):
                return counts
            rows = conn.execute(
                text(
                    "SELECT q.name, COUNT(m.id) FROM kombu_queue q "
                    "JOIN kombu_message m ON m.queue_id = q.id AND m.visible "
                    "GROUP BY q.name"
                )
            )
            for name, count in rows:
                if name in counts:
                    counts[name] = int(count)
        return counts

    def close(self) -> None:
        """Release the broker connection."""
        if self._client is not None:
            (self._client.dispose if hasattr(self._client, "dispose") else self._client.close)()
            self._client = None


def redis_priority_keys(queue: str, steps: Iterable[int], sep: str) -> list[str]:
    """The Redis list names kombu uses for ``queue``: the plain name for step 0, then one per step."""
    return [queue if step == 0 else f"{queue}{sep}{step}" for step in sorted(set(steps) | {0})]


class QueueCollector(Collector):
    """Collects ``specrag_queue_depth``, ``specrag_broker_up`` and ``specrag_queries_pending``."""

    def __init__(
        self,
        broker: BrokerDepth,
        session_factory: sessionmaker[Session],
        queues: Sequence[str],
    ) -> None:
        self.broker = broker
        self.session_factory = session_factory
        self.queues = tuple(queues)

    def describe(self) -> Iterator[Any]:
        """The families without reading broker or database (registration must not do I/O)."""
        yield GaugeMetricFamily("specrag_queue_depth", "", labels=["queue"])
        yield GaugeMetricFamily("specrag_broker_up", "")
        yield GaugeMetricFamily("specrag_queries_pending", "", labels=["queue", "status"])

    def collect(self) -> Iterator[Any]:
        """Read the broker and the database now."""
        depth = GaugeMetricFamily(
            "specrag_queue_depth",
            "Messages waiting in the broker per queue (all priority lists).",
            labels=["queue"],
        )
        up = GaugeMetricFamily("specrag_broker_up", "1 when the broker answered this scrape.")
        try:
            for queue, count in self.broker.depths(self.queues).items():
                depth.add_metric([queue], count)
            up.add_metric([], 1)
        except Exception as exc:  # a dead broker must not fail the scrape of everything else
            log.warning("queue depth unavailable: %s", exc)
            up.add_metric([], 0)
        yield depth
        yield up
        yield self._pending()

    def _pending(self) -> GaugeMetricFamily:
        pending = GaugeMetricFamily(
            "specrag_queries_pending",
            "Queries the database holds as queued or running, per queue.",
            labels=["queue", "status"],
        )
        from app.db import Query

        counts = {(q, s): 0 for q in self.queues for s in PENDING_STATUSES}
        try:
            with self.session_factory() as session:
                rows = session.execute(
                    select(Query.queue, Query.status, func.count())
                    .where(Query.status.in_(PENDING_STATUSES))
                    .group_by(Query.queue, Query.status)
                ).all()
        except (
            Exception
        ) as exc:  # no numbers rather than zeros that look true, and no failed scrape
            log.warning("pending queries unavailable: %s", exc)
            return pending
        for queue, status, count in rows:
            counts[(queue, status)] = int(count)
        for (queue, status), count in sorted(counts.items()):
            pending.add_metric([queue, status], count)
        return pending
