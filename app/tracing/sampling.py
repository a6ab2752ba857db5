"""The sampler: the one ``OTEL_TRACES_SAMPLER`` names, minus client calls that start a trace.

A worker polls its broker (Redis ``BRPOP``), heartbeats its queries and sweeps the outbox from
threads that carry no trace; instrumented, each of those calls would be a one-span trace of its
own, thousands an hour, burying the queries' traces and paying their export. A client span
(SQL, Redis) is kept only inside a trace some traced work began: under a sampled parent. A client
call that makes client calls of its own (a Redis pipeline loading its scripts) is dropped with
them, whatever the sampler would say of the inner ones (``always_on`` samples a span whose
parent was dropped).
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    Decision,
    ParentBasedTraceIdRatio,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.util.types import Attributes


class ClientsInsideTraces(Sampler):
    """Drops a client span outside a sampled span; asks ``inner`` about every other span."""

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: object = None,
    ) -> SamplingResult:
        """DROP for a client span with no parent or an unsampled one, else ``inner``'s decision."""
        if kind == SpanKind.CLIENT:
            parent = get_current_span(parent_context).get_span_context()
            if not parent.is_valid or not parent.trace_flags.sampled:
                return SamplingResult(Decision.DROP)
        return self.inner.should_sample(
            parent_context,
            trace_id,
            name,
            kind,
            attributes,
            links,
            trace_state,  # type: ignore[arg-type]
        )

    def get_description(self) -> str:
        """The sampler's name in the SDK's style."""
        return f"ClientsInsideTraces{{{self.inner.get_description()}}}"


def build_sampler(name: str, ratio: float | None) -> Sampler:
    """The SDK's sampler called ``name`` (``config.SAMPLERS``), wrapped in ``ClientsInsideTraces``."""
    fixed = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "parentbased_always_on": DEFAULT_ON,
        "parentbased_always_off": DEFAULT_OFF,
    }
    rate = 1.0 if ratio is None else ratio
    if name == "traceidratio":
        return ClientsInsideTraces(TraceIdRatioBased(rate))
    if name == "parentbased_traceidratio":
        return ClientsInsideTraces(ParentBasedTraceIdRatio(rate))
    return ClientsInsideTraces(fixed[name])
