"""Tracing for one process: the SDK from ``OTEL_*`` when an endpoint is set, else nothing at all.

``configure`` runs at a process's entry point (``specrag api``, ``specrag worker``, the CLI's
in-process paths); until it turns tracing on there is no tracer provider, no instrumentation and
no exporter thread, and app/tracing/spans.py's helpers return before touching OpenTelemetry.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app.tracing.config import TracingConfig, read_config

if TYPE_CHECKING:
    from fastapi import FastAPI
    from sqlalchemy import Engine

    from app.tracing.export import CountingExporter

log = logging.getLogger(__name__)
EXCLUDED_URLS = "healthz,metrics"
"""API paths polled by probes and scrapers: no trace each (``OTEL_PYTHON_FASTAPI_EXCLUDED_URLS``
overrides)."""


class _State:
    config: TracingConfig | None = None
    exporter: CountingExporter | None = None
    provider: Any = None
    lock = threading.Lock()


_state = _State()


def enabled() -> bool:
    """Whether this process traces (``configure`` found an endpoint)."""
    return _state.config is not None


def config() -> TracingConfig | None:
    """This process's tracing configuration, None when off."""
    return _state.config


def dropped_spans() -> int:
    """Spans this process could not export (collector down or refusing), since it started."""
    return 0 if _state.exporter is None else _state.exporter.dropped


def configure(
    service: str, *, enabled: bool = True, environ: Mapping[str, str] | None = None
) -> bool:
    """Turn tracing on for this process when the environment asks; returns whether it is on.

    Raises TracingConfigError (naming the variable and the choices) on a value it cannot honour,
    before anything is started. ``enabled`` is ``Settings.tracing`` (``SPECRAG_TRACING``). Calling
    it again is a no-op: a process has one tracer provider.
    """
    env = os.environ if environ is None else environ
    found = read_config(env, enabled=enabled, default_service=service)
    with _state.lock:
        if _state.config is not None or found is None:
            return _state.config is not None
        _start(found)
        _state.config = found
    log.info("tracing on: %s (sampler %s) to %s", found.service_name, found.sampler, found.endpoint)
    return True


def _start(found: TracingConfig) -> None:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from app.tracing.export import CountingExporter, HashedResource, quiet_exporter_logs
    from app.tracing.sampling import build_sampler

    # vLLM's exporter (the engine's own spans, in this process and its engine processes) reads
    # only the traces-specific protocol name and defaults to gRPC: it follows this process's.
    os.environ.setdefault("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    exporter = CountingExporter(OTLPSpanExporter(endpoint=found.endpoint), found.endpoint)
    quiet_exporter_logs()
    provider = TracerProvider(
        resource=HashedResource.of(Resource.create({SERVICE_NAME: found.service_name})),
        sampler=build_sampler(found.sampler, found.ratio),
        shutdown_on_exit=False,  # ``shutdown`` below, which also reports the dropped spans
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    # Publish and run spans with the context in the message headers; Redis commands (broker,
    # streams, rate windows) inside a traced piece of work. SQL: ``trace_engine``, on request.
    CeleryInstrumentor().instrument()
    RedisInstrumentor().instrument()
    _gate_redis()  # commands outside traced work skip it
    _state.exporter, _state.provider = exporter, provider
    atexit.register(shutdown)


REDIS_METHODS = (
    ("redis", "Redis.execute_command"),
    ("redis.client", "Pipeline.execute"),
    ("redis.client", "Pipeline.immediate_execute_command"),
    ("redis.asyncio", "Redis.execute_command"),
    ("redis.asyncio.client", "Pipeline.execute"),
    ("redis.asyncio.client", "Pipeline.immediate_execute_command"),
)
"""The client methods ``RedisInstrumentor`` wraps (redis-py 3+, no cluster clients here)."""


def _gate_redis() -> None:
    """Redis commands outside a sampled span call the client directly, past the instrumentation.

    The sampler drops a client span without a sampled parent (app/tracing/sampling.py), but the
    instrumentation's wrapper still formats the command, asks the sampler, makes a non-recording
    span and attaches and detaches it as the current one: about 25 us of CPU a command, on each of
    the worker's broker acknowledgements, token-stream writes and suffix-feed reads, none of them
    inside a trace (near 1 ms of the traced worker's CPU a query on the tiny pair, in a profile).
    The gate reads the current span's sampled flag (the sampler's first test) and only hands a
    command inside a sampled span to the wrapper, which then samples and records it as before.
    """
    from opentelemetry.trace import get_current_span
    from wrapt import wrap_function_wrapper

    def gate(wrapped: Any, instance: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if get_current_span().get_span_context().trace_flags.sampled:
            return wrapped(*args, **kwargs)
        return wrapped.__wrapped__(*args, **kwargs)  # the client's own method, bound

    for module, name in REDIS_METHODS:
        wrap_function_wrapper(module, name, gate)


def instrument_app(app: FastAPI) -> None:
    """Server spans for ``app``'s requests (an inbound ``traceparent`` is their parent); no-op off."""
    if not enabled():
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    excluded = os.environ.get("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS", EXCLUDED_URLS)
    # One server span per request: the ASGI ``http receive`` / ``http send`` spans under it (three
    # a request) time the transport's chunks, not our work, and cost as much as the rest.
    FastAPIInstrumentor.instrument_app(
        app, excluded_urls=excluded, exclude_spans=["receive", "send"]
    )


def trace_engine(engine: Engine, *, statements: bool) -> Engine:
    """``engine`` with a span per SQL statement run inside traced work when tracing is on and
    ``statements`` (``Settings.trace_sql``) asks for them; else untouched, at no cost per statement.

    The maintained instrumentation's ``EngineTracer``, attached per engine: its instrumentor
    declares SQLAlchemy < 2.1 and its ``create_engine`` patch imports the asyncio extension
    (greenlet), neither of which holds here, while the event listeners it attaches are 2.1's too.
    """
    if not enabled() or not statements:
        return engine
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
    from opentelemetry.metrics import get_meter
    from opentelemetry.trace import get_tracer

    scope = "opentelemetry.instrumentation.sqlalchemy"
    usage = get_meter(scope).create_up_down_counter("db.client.connections.usage")
    EngineTracer(get_tracer(scope), engine, usage)
    return engine


def flush(timeout_s: float = 5.0) -> None:
    """Export what is buffered now and log the spans dropped so far (no-op when off).

    ``specrag api`` calls it as it stops: uvicorn ends a stopped server by raising the signal
    again, so no exit handler (``shutdown``) runs there.
    """
    provider = _state.provider
    if provider is not None:
        provider.force_flush(int(timeout_s * 1000))
        if _state.exporter is not None and _state.exporter.dropped:
            log.warning("tracing: %d spans were dropped (export failed)", _state.exporter.dropped)


def shutdown() -> None:
    """Export what is buffered and stop the exporter thread (a process's exit)."""
    provider, _state.provider = _state.provider, None
    if provider is not None:
        provider.shutdown()
        if _state.exporter is not None and _state.exporter.dropped:
            log.warning("tracing: %d spans were dropped (export failed)", _state.exporter.dropped)
