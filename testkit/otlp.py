"""A real OTLP/HTTP receiver in this process: decodes ``ExportTraceServiceRequest`` protobufs.

The tracing tests assert on what it received. ``OtlpSink`` is the same endpoint in a process of
its own that only stores each export's bytes (decoded afterwards): benchmarks/tracing.py exports
to it, so that the traced variant pays a real export while the receiving end, a collector on
another machine in a deployment, takes next to nothing of the measured machine's CPU and none of
the load generator's interpreter.

It serves ``POST /v1/traces`` on a loopback port as a collector would (``http/protobuf``), and
keeps every span it was sent, flattened to plain data the tests can assert on. ``refuse`` makes
it answer 503, as a collector that is up but refusing does.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

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


def decode(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """Every span of one export, flattened."""
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
    return found


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
                _accept(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        found = decode(request)
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


class OtlpSink:
    """``with OtlpSink(path) as sink:`` serves ``sink.endpoint`` from a subprocess that appends
    each export's body to ``path`` (length-prefixed) and answers 200; ``sink.spans()`` decodes
    what arrived so far. ``nice``: the subprocess's niceness (below the measured processes)."""

    def __init__(self, path: Path, *, nice: int = 10) -> None:
        self.path, self.nice = path, nice
        self.endpoint = ""
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> OtlpSink:
        self.path.write_bytes(b"")
        self._proc = subprocess.Popen(
            ["nice", "-n", str(self.nice), sys.executable, "-m", "testkit.otlp", str(self.path)],
            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self._proc.kill()
            raise RuntimeError(f"OTLP sink did not start: {line!r}")
        self.endpoint = line
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)

    def exports(self) -> int:
        """How many exports arrived so far."""
        return sum(1 for _ in _bodies(self.path))

    def spans(self) -> list[ReceivedSpan]:
        """Every span that arrived so far, decoded."""
        found: list[ReceivedSpan] = []
        for body in _bodies(self.path):
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            found.extend(decode(request))
        return found


def _bodies(path: Path) -> list[bytes]:
    data, out, at = path.read_bytes(), [], 0
    while at + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, at)
        if at + 4 + size > len(data):
            break  # being written
        out.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def _accept(handler: BaseHTTPRequestHandler) -> None:
    """Answer an export as a collector does: 200 with an empty ExportTraceServiceResponse."""
    reply = ExportTraceServiceResponse().SerializeToString()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/x-protobuf")
    handler.send_header("Content-Length", str(len(reply)))
    handler.end_headers()
    handler.wfile.write(reply)


def _sink(path: Path) -> None:
    """The sink process: serve on a free loopback port, print the endpoint, store every export."""
    lock = threading.Lock()
    out: IO[bytes] = path.open("ab", buffering=0)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a collector serves the SDK's session

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with lock:
                out.write(struct.pack("<I", len(body)) + body)
            _accept(self)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    os.close(1)  # nothing more on stdout; the parent stops reading
    server.serve_forever()


if __name__ == "__main__":
    _sink(Path(sys.argv[1]))
