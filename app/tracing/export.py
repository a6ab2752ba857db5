"""An exporter that never lets a missing collector reach the answers: failures dropped and counted.

The SDK's batch processor already exports from its own thread, so a slow or refusing collector
never blocks a request; what it does not do is keep count, and the OTLP exporter logs every
failed batch. ``CountingExporter`` counts the spans of every failed batch and logs the first
failure once (and the recovery once), and ``quiet_exporter_logs`` keeps the OTLP exporter's own
per-batch error lines out of the log after that.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger(__name__)
OTLP_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
"""The logger the OTLP/HTTP span exporter (and its HTTP client) writes its failures to."""


class CountingExporter(SpanExporter):
    """Wraps an exporter: spans of a failed export are dropped, counted, and logged once."""

    def __init__(self, inner: SpanExporter, endpoint: str) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.exported = 0
        """Spans the collector accepted."""
        self.dropped = 0
        """Spans lost to failed exports (collector down, refusing, or too slow)."""
        self._failing = False
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export through the wrapped exporter; a failure is counted, never raised."""
        try:
            result = self.inner.export(spans)
            reason = "" if result == SpanExportResult.SUCCESS else "the collector did not accept"
        except Exception as exc:  # an exporter bug must not reach the processor's thread either
            result, reason = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        with self._lock:
            if result == SpanExportResult.SUCCESS:
                self.exported += len(spans)
                if self._failing:
                    self._failing = False
                    log.warning("trace export to %s works again", self.endpoint)
                return result
            self.dropped += len(spans)
            first = not self._failing
            self._failing = True
        if first:
            log.warning(
                "trace export to %s failed (%s); spans are dropped and counted until an export "
                "succeeds, answers are unaffected",
                self.endpoint,
                reason,
            )
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        """Shut the wrapped exporter down."""
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the wrapped exporter."""
        return self.inner.force_flush(timeout_millis)


class HashedResource(Resource):
    """A ``Resource`` that computes its hash once.

    The OTLP encoder groups every exported span by its resource (a dict keyed by it), and
    ``Resource.__hash__`` JSON-encodes the sorted attributes on each call: once per span, in the
    export thread, for a value that never changes (a resource's attributes are immutable).
    """

    def __init__(self, attributes: Any, schema_url: str | None = None) -> None:
        super().__init__(attributes, schema_url)
        self._hash = super().__hash__()

    @classmethod
    def of(cls, resource: Resource) -> HashedResource:
        """``resource`` (as ``Resource.create`` built it, detectors merged) with a fixed hash."""
        return cls(resource.attributes, resource.schema_url)

    def __hash__(self) -> int:
        return self._hash


class _FirstOnly(logging.Filter):
    """Lets a logger's first record through and no other (``CountingExporter`` says the rest)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if self.seen:
            return False
        self.seen = True
        return True


def quiet_exporter_logs() -> None:
    """Keep one of the OTLP exporter's own failure lines (the first, with its detail), once."""
    logger = logging.getLogger(OTLP_LOGGER)
    if not any(isinstance(f, _FirstOnly) for f in logger.filters):
        logger.addFilter(_FirstOnly())
