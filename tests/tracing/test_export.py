"""Export failures: spans dropped and counted, the failure logged once, recovery logged once."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from app.tracing.export import OTLP_LOGGER, CountingExporter, quiet_exporter_logs


class Flaky(SpanExporter):
    """Fails (or raises) while ``down``; accepts otherwise."""

    def __init__(self) -> None:
        self.down: str | None = "fail"

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.down == "raise":
            raise ConnectionError("refused")
        return SpanExportResult.FAILURE if self.down else SpanExportResult.SUCCESS


def test_failed_exports_are_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    inner = Flaky()
    exporter = CountingExporter(inner, "http://127.0.0.1:9/v1/traces")
    spans: list[ReadableSpan] = [ReadableSpan(name=f"s{i}") for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="app.tracing.export"):
        assert exporter.export(spans) == SpanExportResult.FAILURE
        inner.down = "raise"
        assert exporter.export(spans[:2]) == SpanExportResult.FAILURE  # never raised
        inner.down = None
        assert exporter.export(spans[:1]) == SpanExportResult.SUCCESS
        inner.down = "fail"
        exporter.export(spans[:1])
    assert (exporter.dropped, exporter.exported) == (6, 1)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("spans are dropped" in m for m in messages) == 2  # once per outage
    assert sum("works again" in m for m in messages) == 1


def test_the_otlp_exporters_own_lines_are_kept_to_one(caplog: pytest.LogCaptureFixture) -> None:
    quiet_exporter_logs()
    quiet_exporter_logs()  # idempotent: one filter
    logger = logging.getLogger(OTLP_LOGGER)
    with caplog.at_level(logging.ERROR, logger=OTLP_LOGGER):
        for _ in range(5):
            logger.error("Failed to export span batch")
    assert len([r for r in caplog.records if r.name == OTLP_LOGGER]) <= 1


def test_a_worker_exports_the_dropped_count_to_prometheus(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import generate_latest

    import app.metrics.worker as worker

    assert b"specrag_trace_spans_dropped_total 0.0" in generate_latest(
        worker.WorkerMetrics().registry
    )
    monkeypatch.setattr(worker, "dropped_spans", lambda: 7)
    text = generate_latest(worker.WorkerMetrics().registry)
    assert b"specrag_trace_spans_dropped_total 7.0" in text
