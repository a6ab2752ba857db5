"""Export failures: spans dropped and counted, the failure logged once, recovery logged once; a
stopped API exports what it still holds."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from app.tracing.export import OTLP_LOGGER, CountingExporter, quiet_exporter_logs
from testkit.otlp import OtlpReceiver
from testkit.services import free_port


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


def test_a_stopped_api_exports_its_last_requests_spans(tmp_path: Path) -> None:
    # uvicorn ends a stopped server by raising SIGTERM again, so no exit handler runs: the spans
    # still buffered (the batch processor exports every 5 s) go out as the app shuts down.
    with OtlpReceiver() as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPECRAG_"))}
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_PYTHON_FASTAPI_EXCLUDED_URLS="metrics",  # /healthz traced, for this test
            SPECRAG_DATA_DIR=str(tmp_path),
        )
        port = free_port()
        api = subprocess.Popen(
            [str(Path(sys.executable).parent / "specrag"), "api", "--port", str(port)],
            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while True:
                assert api.poll() is None, "specrag api exited"
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).is_success:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "specrag api not healthy in 120 s"
                time.sleep(0.2)
        finally:
            api.terminate()
            api.wait(timeout=30)
        assert [s.name for s in receiver.spans] == ["GET /healthz"]
