"""Serving a registry as Prometheus text on a port of its own (the worker's ``SPECRAG_METRICS_PORT``).

The port is bound before the worker joins its queues, so a taken port stops the worker at start
with the reason instead of leaving it answering queries nobody can see.
"""

from __future__ import annotations

import errno
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from app.hooks import register_after_answer, register_after_grounding
from app.metrics.worker import WorkerMetrics


class MetricsPortError(ValueError):
    """The metrics port cannot be served (taken, not allowed); the message says why."""


@dataclass
class MetricsServer:
    """A running metrics HTTP server; ``close`` stops it and frees the port."""

    host: str
    port: int
    server: Any
    thread: threading.Thread

    def close(self) -> None:
        """Stop serving and release the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread.

    Raises MetricsPortError naming the port and the reason when it cannot be bound.
    """
    if not 0 < port < 65536:
        raise MetricsPortError(f"SPECRAG_METRICS_PORT: {port} is not a TCP port (1-65535)")
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            reason = "is taken by another process (address already in use)"
        elif exc.errno == errno.EACCES:
            reason = "needs privileges this process does not have"
        else:
            reason = f"cannot be bound: {exc.strerror or exc}"
        raise MetricsPortError(
            f"SPECRAG_METRICS_PORT: port {port} on {host} {reason}; "
            "choose a free port or unset SPECRAG_METRICS_PORT"
        ) from exc
    return MetricsServer(host, port, server, thread)


def start_worker_metrics(settings: Any) -> tuple[Any, MetricsServer] | None:
    """With ``SPECRAG_METRICS_PORT`` set: serve this worker's metrics and feed them every answer.

    Returns ``(WorkerMetrics, MetricsServer)``, or None when the port is unset. Raises
    MetricsPortError when the port is taken or the pool forks (a forked child's counters would be
    invisible to the server in the parent).
    """
    port = settings.metrics_port
    if port is None:
        return None
    if settings.worker_pool == "prefork":
        raise MetricsPortError(
            "SPECRAG_METRICS_PORT: the prefork pool answers in child processes whose counters this "
            "port cannot serve; use the solo or threads pool (one engine per process anyway)"
        )
    metrics = WorkerMetrics(tenant_label=settings.metrics_tenant_label)
    server = serve(metrics.registry, port, settings.metrics_host)
    register_after_answer(metrics)
    register_after_grounding(metrics.observe_grounding)
    return metrics, server
