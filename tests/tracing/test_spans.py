"""The span helpers: no OpenTelemetry work when off; the sampler's rule for client spans; GenAI names."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from app.settings import Settings
from app.tracing import (
    current_trace_id,
    current_traceparent,
    enabled,
    links_to,
    resumed,
    span,
)
from app.tracing.genai import content_allowed, request_attributes, result_attributes
from app.tracing.sampling import ClientsInsideTraces, build_sampler


def test_off_by_default_and_free() -> None:
    assert not enabled()
    assert isinstance(span("x"), nullcontext)
    assert isinstance(resumed("00-" + "1" * 32 + "-" + "2" * 16 + "-01"), nullcontext)
    assert current_traceparent() is None and current_trace_id() is None
    assert links_to(["00-" + "1" * 32 + "-" + "2" * 16 + "-01"]) == []
    # Nothing installed a provider: OpenTelemetry is still its no-op proxy in this process.
    assert type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider"
    assert not content_allowed(Settings())


def _parent(sampled: bool = True, remote: bool = True) -> Context:
    ctx = SpanContext(0x1234, 0x5678, is_remote=remote, trace_flags=TraceFlags(int(sampled)))
    return trace.set_span_in_context(NonRecordingSpan(ctx))


def test_client_spans_only_inside_a_trace() -> None:
    sampler = ClientsInsideTraces(ALWAYS_ON)
    orphan = sampler.should_sample(Context(), 1, "BRPOP", SpanKind.CLIENT)
    inside = sampler.should_sample(_parent(), 0x1234, "SELECT", SpanKind.CLIENT)
    server = sampler.should_sample(Context(), 1, "POST /v1/queries", SpanKind.SERVER)
    assert orphan.decision == Decision.DROP
    assert inside.decision == server.decision == Decision.RECORD_AND_SAMPLE


def test_a_client_span_under_a_dropped_one_is_dropped_too() -> None:
    # A Redis pipeline's EVALSHA outside any trace is dropped; the SCRIPT EXISTS it sends first
    # has that dropped span as its parent, and ``always_on`` alone would sample it.
    sampler = ClientsInsideTraces(ALWAYS_ON)
    under_dropped = sampler.should_sample(
        _parent(sampled=False, remote=False), 0x1234, "SCRIPT EXISTS", SpanKind.CLIENT
    )
    internal = sampler.should_sample(_parent(sampled=False), 0x1234, "answer query")
    assert under_dropped.decision == Decision.DROP
    assert internal.decision == Decision.RECORD_AND_SAMPLE  # always_on's own rule for the rest


def test_every_named_sampler_builds() -> None:
    assert "ParentBased" in build_sampler("parentbased_always_on", None).get_description()
    assert "0.25" in build_sampler("traceidratio", 0.25).get_description()
    off = build_sampler("always_off", None).should_sample(Context(), 1, "x", SpanKind.SERVER)
    assert off.decision == Decision.DROP


def test_generation_attributes_follow_the_genai_names() -> None:
    params = {"max_tokens": 8, "temperature": 0.0, "seed": None, "method": "ngram",
              "num_speculative_tokens": "auto"}  # fmt: skip
    start = request_attributes(
        engine="torch", model="tiny", prompt_format="chat", params=params, prompt_tokens=40
    )
    assert start["gen_ai.operation.name"] == "chat" and start["gen_ai.request.model"] == "tiny"
    assert start["specrag.spec_decode.num_speculative_tokens"] == "auto"
    stats = {"num_output_tokens": 8, "num_cached_prompt_tokens": 16, "num_drafts": 3,
             "num_draft_tokens": 9, "num_accepted_tokens": 5, "acceptance_rate": 5 / 9,
             "mean_acceptance_length": 1 + 5 / 3, "mean_batch_size": 1.0, "dtype": "float32",
             "num_prompt_tokens": 40}  # fmt: skip
    done = result_attributes(stats, max_tokens=8)
    assert done["gen_ai.response.finish_reasons"] == ["length"]
    assert done["gen_ai.usage.cache_read.input_tokens"] == 16
    assert done["specrag.spec_decode.acceptance_rate"] == 5 / 9
    assert result_attributes({**stats, "num_output_tokens": 3}, 8)[
        "gen_ai.response.finish_reasons"
    ] == ["stop"]


def test_content_needs_the_operators_opt_in_and_questions_kept_in_clear(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import app.tracing.genai as genai
    from app.tracing import TracingConfig

    def on(capture: bool) -> None:
        found = TracingConfig("http://c/v1/traces", "w", "always_on", capture_content=capture)
        monkeypatch.setattr(genai, "config", lambda: found)

    on(capture=False)
    assert not content_allowed(Settings(store_questions="clear"))
    on(capture=True)
    assert content_allowed(Settings(store_questions="clear"))
    assert not content_allowed(Settings(store_questions="hashed"))
    assert not content_allowed(Settings(store_questions="redacted"))
    attrs = genai.content_attributes("q?", "a.")
    assert '"content": "q?"' in attrs["gen_ai.input.messages"]


def test_a_tracing_vllm_worker_starts_vllm_with_the_same_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import app.resources as resources
    from app.tracing import TracingConfig

    settings = Settings(vllm_options={"llm_kwargs": {"max_model_len": 512}})
    assert resources.vllm_options(settings) == {"llm_kwargs": {"max_model_len": 512}}
    found = TracingConfig("http://c:4318/v1/traces", "w", "always_on")
    monkeypatch.setattr(resources, "tracing_config", lambda: found)
    assert resources.vllm_options(settings)["llm_kwargs"] == {
        "otlp_traces_endpoint": "http://c:4318/v1/traces", "max_model_len": 512}  # fmt: skip
    own = Settings(vllm_options={"llm_kwargs": {"otlp_traces_endpoint": "http://other/v1/traces"}})
    assert resources.vllm_options(own)["llm_kwargs"]["otlp_traces_endpoint"] == (
        "http://other/v1/traces")  # fmt: skip


def test_heartbeats_run_in_the_context_of_the_query_they_keep() -> None:
    # Traced, a heartbeat's UPDATE is then a span of the query's trace, not an orphan.
    import contextvars
    import threading
    import uuid

    from app.lifecycle.lease import heartbeat

    current: contextvars.ContextVar[str] = contextvars.ContextVar("current", default="none")
    seen: list[str] = []
    beat = threading.Event()

    def session_factory() -> None:
        seen.append(current.get())
        beat.set()
        raise RuntimeError("no database here")  # a failed beat is logged and skipped

    current.set("the query's")
    with heartbeat(session_factory, uuid.uuid4(), 1, 0.01, 60.0):  # type: ignore[arg-type]
        assert beat.wait(5)
    assert seen and set(seen) == {"the query's"}
