"""OpenTelemetry for specrag: one trace per query, from the web backend's request to the engine.

- setup.py: ``configure`` (the SDK from ``OTEL_*``, only when an endpoint is set), the FastAPI
  instrumentation, flush and shutdown; config.py checks the variables; sampling.py, export.py.
- spans.py: the spans app/ writes by hand, and a stored query's ``traceparent``.
- genai.py: the generation span's GenAI and ``specrag.spec_decode.*`` attributes.

docs/operations.md ("Tracing") says how to turn it on and read a query's trace.
"""

from app.tracing.config import SAMPLERS, TracingConfig, TracingConfigError, read_config
from app.tracing.setup import (
    config,
    configure,
    dropped_spans,
    enabled,
    flush,
    instrument_app,
    shutdown,
    trace_engine,
)
from app.tracing.spans import (
    current_trace_id,
    current_traceparent,
    links_to,
    record_error,
    resumed,
    span,
)

__all__ = [
    "SAMPLERS",
    "TracingConfig",
    "TracingConfigError",
    "config",
    "configure",
    "current_trace_id",
    "current_traceparent",
    "dropped_spans",
    "enabled",
    "flush",
    "instrument_app",
    "links_to",
    "read_config",
    "record_error",
    "resumed",
    "shutdown",
    "span",
    "trace_engine",
]
