"""The API's request metrics: a pure ASGI middleware that counts and times every HTTP request.

Labels are the route *template* (``/v1/queries/{query_id}``, never the id), the method and the
status code, so the series stay few and carry no tenant's data: a path that matches no route is
counted as ``route="unmatched"``, whatever it said.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds; submits and polls take milliseconds, a long event stream lands in +Inf."""
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
UNMATCHED = "unmatched"


class HttpMetrics:
    """``specrag_http_requests_total`` and ``specrag_http_request_duration_seconds`` in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "specrag_http_requests",
            "HTTP requests answered by the API, by route template, method and status code.",
            ["route", "method", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "specrag_http_request_duration_seconds",
            "Time from a request's arrival to the end of its response, by route template and method.",
            ["route", "method"],
            buckets=HTTP_BUCKETS,
            registry=registry,
        )

    def observe(self, route: str, method: str, code: int, seconds: float) -> None:
        """Count one finished request."""
        self.requests.labels(route, method, str(code)).inc()
        self.duration.labels(route, method).observe(seconds)


class MetricsMiddleware:
    """ASGI middleware that feeds ``HttpMetrics`` (pure ASGI: no per-request task, streams pass)."""

    def __init__(self, app: Any, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        code = 500  # an exception that escapes the app becomes ServerErrorMiddleware's 500

        async def send_and_note(message: Any) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            method = scope.get("method", "")
            self.metrics.observe(
                route_template(scope),
                method if method in METHODS else "other",
                code,
                time.perf_counter() - started,
            )


def route_template(scope: Any) -> str:
    """The path template of the route that handled ``scope`` ("unmatched" when none did)."""
    # The router writes the matched route into the (shared) scope dict while dispatching.
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED
