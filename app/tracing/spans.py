"""The spans app/ opens itself, and the trace context a stored query carries between processes.

Every helper checks ``setup.enabled()`` first and, with tracing off, returns without touching
OpenTelemetry: a span is a ``nullcontext``, a context is None.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache
from typing import TYPE_CHECKING, Any

from app.tracing.setup import enabled

if TYPE_CHECKING:
    from opentelemetry.trace import Link, Span, Tracer

TRACER = "specrag"
"""The instrumentation scope of the spans specrag writes by hand."""


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    links: Sequence[Link] = (),
    root: bool = False,
) -> AbstractContextManager[Span | None]:
    """A current span named ``name`` (None inside, and no work, when tracing is off).

    ``root``: a trace of its own (a batch job, a shadow re-decode) rather than a child of the
    current span; ``links`` point at the traces it relates to.
    """
    if not enabled():
        return nullcontext(None)
    return _span(name, dict(attributes or {}), list(links), root)


@cache
def _tracer() -> Tracer:
    # Once per process: the SDK builds a new tracer (and its scope) on every get_tracer call.
    from opentelemetry import trace

    return trace.get_tracer(TRACER)


@contextmanager
def _span(name: str, attributes: dict[str, Any], links: list[Link], root: bool) -> Iterator[Span]:
    from opentelemetry import context

    tracer = _tracer()
    parent = context.Context() if root else None
    clean = {k: v for k, v in attributes.items() if v is not None}
    # Exceptions are recorded by type only: a message may quote the question or the passages.
    with tracer.start_as_current_span(
        name,
        parent,
        attributes=clean,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            record_error(current, exc)
            raise


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, None when off or outside a sampled span."""
    if not enabled():
        return None
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")


def current_trace_id() -> str | None:
    """The current trace's id as 32 lower-case hex digits, None when off or not recording."""
    if not enabled():
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid and ctx.trace_flags.sampled else None


def resumed(traceparent: str | None) -> AbstractContextManager[object]:
    """Run the block in the trace ``traceparent`` names (as its parent); no-op when off or None.

    A malformed value is ignored, as the W3C propagator ignores it: the block starts a new trace.
    """
    if not enabled() or not traceparent:
        return nullcontext()
    return _resumed(traceparent)


@contextmanager
def _resumed(traceparent: str) -> Iterator[None]:
    from opentelemetry import context
    from opentelemetry.propagate import extract

    token = context.attach(extract({"traceparent": traceparent}))
    try:
        yield
    finally:
        context.detach(token)


def links_to(traceparents: Sequence[str | None]) -> list[Link]:
    """Span links to the spans the given ``traceparent`` values name (malformed ones skipped)."""
    if not enabled():
        return []
    from opentelemetry import trace
    from opentelemetry.propagate import extract
    from opentelemetry.trace import Link

    found = []
    for value in traceparents:
        if not value:
            continue
        ctx = trace.get_current_span(extract({"traceparent": value})).get_span_context()
        if ctx.is_valid:
            found.append(Link(ctx))
    return found


def record_error(current: Span | None, exc: BaseException) -> None:
    """Mark ``current`` failed with ``exc`` (its type only: messages may quote the question)."""
    if current is None:
        return
    from opentelemetry.trace import Status, StatusCode

    current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    current.set_attribute("error.type", type(exc).__name__)
