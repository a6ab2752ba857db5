"""Queue depth and pending queries, read at scrape time: what waits in the broker, what is in flight.

``specrag_queue_depth{queue}`` counts the messages waiting in the broker, as the dispatcher reads
them (workers/queue_depth.py: on Redis the sum of kombu's priority lists, with the embedded broker
the visible messages in its database). ``specrag_queries_pending{queue,status}`` counts the queries
the database holds as queued or running. A broker that cannot be read drops the depth series and
sets ``specrag_broker_up`` to 0, so the scrape itself never fails and the alert on
``specrag_broker_up`` says why the depth went missing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.db import Query
from app.requests import QueryStatus

log = logging.getLogger(__name__)

PENDING_STATUSES = (QueryStatus.QUEUED, QueryStatus.RUNNING)
Depths = Callable[[Sequence[str]], dict[str, int]]
"""Reads messages waiting per queue (``Dispatcher.queue_depths``); raises when it cannot."""


class QueueCollector(Collector):
    """Collects ``specrag_queue_depth``, ``specrag_broker_up`` and ``specrag_queries_pending``."""

    def __init__(
        self, depths: Depths, session_factory: sessionmaker[Session], queues: Sequence[str]
    ) -> None:
        self.depths = depths
        self.session_factory = session_factory
        self.queues = tuple(str(q) for q in queues)

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
            for queue, count in self.depths(self.queues).items():
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
        counts = {(q, str(s)): 0 for q in self.queues for s in PENDING_STATUSES}
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
            counts[(str(queue), str(status))] = int(count)
        for (queue, status), count in sorted(counts.items()):
            pending.add_metric([queue, status], count)
        return pending
