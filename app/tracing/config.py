"""What the standard ``OTEL_*`` variables ask of tracing, checked: a ``TracingConfig`` or None (off).

Tracing is on when an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or
``OTEL_EXPORTER_OTLP_ENDPOINT`` with ``/v1/traces`` appended, as the specification says) and
neither ``SPECRAG_TRACING=0`` nor ``OTEL_SDK_DISABLED=true`` turns it off. A value the SDK would
warn about and replace (an unknown sampler, a ratio that is not a number) is refused instead, so
that a process never runs with a sampling policy nobody chose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
"""The ``OTEL_TRACES_SAMPLER`` values the SDK builds in (the specification's list)."""
RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
PROTOCOLS = ("http/protobuf",)
"""Export protocols this service ships an exporter for."""
CONTENT_FLAG = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI instrumentations' opt-in for prompt and answer text on spans."""


class TracingConfigError(ValueError):
    """An ``OTEL_*`` variable holds a value this service cannot honour; the message names it."""


@dataclass(frozen=True)
class TracingConfig:
    """Tracing as the environment asks for it (only built when tracing is on)."""

    endpoint: str
    """The OTLP/HTTP traces URL spans are posted to."""
    service_name: str
    """``service.name`` of this process's spans."""
    sampler: str
    """One of ``SAMPLERS``."""
    ratio: float | None = None
    """The sampling ratio of a ratio sampler (``OTEL_TRACES_SAMPLER_ARG``, default 1.0)."""
    capture_content: bool = False
    """The operator's opt-in for question and answer text (still only for clear-text tenants)."""


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def check_sampler(environ: Mapping[str, str]) -> tuple[str, float | None]:
    """The sampler name and ratio the environment names; TracingConfigError naming the choices."""
    name = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    if name not in SAMPLERS:
        raise TracingConfigError(
            f"OTEL_TRACES_SAMPLER: unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}"
        )
    if name not in RATIO_SAMPLERS:
        return name, None
    raw = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    try:
        ratio = float(raw) if raw else 1.0
    except ValueError:
        raise TracingConfigError(
            f"OTEL_TRACES_SAMPLER_ARG: {raw!r} is not a number; {name} takes a ratio in [0, 1]"
        ) from None
    if not 0.0 <= ratio <= 1.0:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG: {ratio} is outside [0, 1]")
    return name, ratio


def traces_endpoint(environ: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP traces URL the environment names, or None when none is set."""
    signal = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if signal:
        return signal
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return base.rstrip("/") + "/v1/traces" if base else None


def read_config(
    environ: Mapping[str, str], *, enabled: bool = True, default_service: str = "specrag"
) -> TracingConfig | None:
    """The process's tracing, or None when off; raises TracingConfigError on a value it refuses.

    The sampler is checked even when tracing is off: a variable set is a variable meant, and a
    typo found at the next start with an endpoint would be found too late.
    """
    sampler, ratio = check_sampler(environ)
    endpoint = traces_endpoint(environ)
    if not enabled or endpoint is None or _flag(environ, "OTEL_SDK_DISABLED"):
        return None
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or "http/protobuf"
    )
    if protocol not in PROTOCOLS:
        raise TracingConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported; use {', '.join(PROTOCOLS)}"
        )
    if not endpoint.startswith(("http://", "https://")):
        raise TracingConfigError(
            f"OTEL_EXPORTER_OTLP_ENDPOINT: {endpoint!r} is not an http:// or https:// URL"
        )
    service = environ.get("OTEL_SERVICE_NAME", "").strip() or default_service
    return TracingConfig(endpoint, service, sampler, ratio, _flag(environ, CONTENT_FLAG))
