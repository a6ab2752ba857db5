"""Prometheus metrics: a worker's spec-decode counters and latencies, the API's requests and queues.

- ``WorkerMetrics`` (worker.py): the after-answer hook that counts every final query once.
- ``start_worker_metrics`` (serve.py): ``SPECRAG_METRICS_PORT`` served from the worker process.
- ``install`` (api.py): the API's request middleware and ``GET /metrics`` with queue depth.

docs/metrics.md says what each metric means and how it relates to the stored stats.
"""

from app.metrics.api import ApiMetrics, install
from app.metrics.serve import MetricsPortError, MetricsServer, serve, start_worker_metrics
from app.metrics.worker import STAGES, WorkerMetrics

__all__ = [
    "STAGES",
    "ApiMetrics",
    "MetricsPortError",
    "MetricsServer",
    "WorkerMetrics",
    "install",
    "serve",
    "start_worker_metrics",
]
