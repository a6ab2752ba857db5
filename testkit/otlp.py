"""A real OTLP/HTTP receiver in this process: decodes ``ExportTraceServiceRequest`` protobufs.

The tracing tests assert on what it received; benchmarks/tracing.py exports to it, so that the
traced variant pays a real export.

It serves ``POST /v1/traces`` on a loopback port as a collector would (``http/protobuf``), and
keeps every span it was sent, flattened to plain data the tests can assert on. ``refuse`` makes
it answer 503, as a collector that is up but refusing does.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span: ids as hex, its attributes and links, and the sending service."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]] = field(default_factory=list)
    """(trace id, span id) of each link."""
    status_code: int = 0


class OtlpReceiver:
    """``with OtlpReceiver() as r:`` serves ``r.endpoint``; ``r.spans`` holds what arrived."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.refuse = False
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != "/v1/traces" or receiver.refuse:
                    self.send_response(404 if self.path != "/v1/traces" else 503)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._keep(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            attrs = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            service = str(attrs.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            service=service,
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            attributes={kv.key: _value(kv.value) for kv in s.attributes},
                            links=[(lk.trace_id.hex(), lk.span_id.hex()) for lk in s.links],
                            status_code=s.status.code,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(found)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans received so far of ``trace_id``."""
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, names: set[str], timeout: float = 60) -> list[ReceivedSpan]:
        """The trace's spans once every one of ``names`` arrived; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.trace(trace_id)
            missing = names - {s.name for s in spans}
            if not missing:
                return spans
            if time.monotonic() > deadline:
                got = sorted({s.name for s in spans})
                raise AssertionError(
                    f"trace {trace_id}: missing spans {sorted(missing)}; got {got}"
                )
            time.sleep(0.2)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
