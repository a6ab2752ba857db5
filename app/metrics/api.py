"""The API's ``GET /metrics``: request counts and durations, queue depth and pending queries.

Nothing here is per tenant: routes are templates, queues are the service's own three, and the
pending counts are totals. ``/metrics`` needs no API key (like ``/healthz``), because a scraper
holds no tenant's key and the page holds no tenant's data.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy.orm import Session, sessionmaker

from app.dispatch import Dispatcher
from app.metrics.http import HttpMetrics, MetricsMiddleware
from app.metrics.queues import QueueCollector
from app.requests import QueueName


@dataclass
class ApiMetrics:
    """The API's metrics registry and its request metrics."""

    registry: CollectorRegistry
    http: HttpMetrics

    def render(self) -> bytes:
        """The registry as Prometheus text (reads broker and database now)."""
        return bytes(generate_latest(self.registry))


def install(
    app: FastAPI, session_factory: sessionmaker[Session], dispatcher: Dispatcher
) -> ApiMetrics:
    """Count every request of ``app`` and serve ``GET /metrics``; queue depth via ``dispatcher``."""
    registry = CollectorRegistry(auto_describe=True)
    http = HttpMetrics(registry)
    queues = [str(q) for q in QueueName]
    registry.register(QueueCollector(dispatcher.queue_depths, session_factory, queues))
    metrics = ApiMetrics(registry, http)
    app.add_middleware(MetricsMiddleware, metrics=http)

    # A plain def: FastAPI runs it in its thread pool, so the broker and database reads of a
    # scrape never block the event loop that serves submits and streams.
    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return metrics
