"""Every metric the code exports, by name and type: what dashboards, rules and docs may refer to."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from app.metrics.http import HttpMetrics
from app.metrics.queues import QueueCollector
from app.metrics.worker import WorkerMetrics

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def exported_families() -> dict[str, str]:
    """Family name -> type ("counter", "histogram", "gauge") of the worker's and the API's metrics."""
    http = CollectorRegistry()
    HttpMetrics(http)
    # describe() names the queue families without reading a broker or a database.
    queues = QueueCollector(dict, None, ()).describe()  # type: ignore[arg-type]
    families: dict[str, str] = {}
    for family in [*WorkerMetrics().registry.collect(), *http.collect(), *queues]:
        families[family.name] = family.type
    return families


def exported_series_names() -> set[str]:
    """Every series name a PromQL query can select (``..._total``, ``..._bucket``, ...)."""
    return {
        name + suffix
        for name, kind in exported_families().items()
        for suffix in _SUFFIXES.get(kind, ("",))
    }
