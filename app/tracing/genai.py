"""The generation span's attributes: the GenAI conventions' names, and specrag's spec-decode ones.

GenAI semantic conventions (development status, latest names): the span is called
``{gen_ai.operation.name} {gen_ai.request.model}`` and carries the request's parameters and the
token usage. No convention covers speculative decoding, so the draft/verify figures of the stored
stats (CONTRACT.md, Stats) go under ``specrag.spec_decode.*``. Message content
(``gen_ai.input.messages``, ``gen_ai.output.messages``) is added only when the operator opted in
(``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``) and questions are stored in clear.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from app.tracing.setup import config
from app.tracing.spans import span

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from app.settings import Settings

PROVIDERS = {"torch": "specrag", "vllm": "vllm"}
"""``gen_ai.provider.name`` per engine: the service itself, or vLLM's engine in it."""


def operation(prompt_format: str) -> str:
    """``gen_ai.operation.name``: ``chat`` for a chat-template prompt, else ``text_completion``."""
    return "chat" if prompt_format == "chat" else "text_completion"


def request_attributes(
    *, engine: str, model: str, prompt_format: str, params: dict[str, Any], prompt_tokens: int
) -> dict[str, Any]:
    """What is known of a generation before it runs (the span's start attributes)."""
    k = params.get("num_speculative_tokens")
    return {
        "gen_ai.operation.name": operation(prompt_format),
        "gen_ai.provider.name": PROVIDERS.get(engine, engine),
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": params.get("max_tokens"),
        "gen_ai.request.temperature": params.get("temperature"),
        "gen_ai.request.seed": params.get("seed"),
        "gen_ai.usage.input_tokens": prompt_tokens,
        "specrag.spec_decode.method": params.get("method"),
        "specrag.spec_decode.num_speculative_tokens": None if k is None else str(k),
    }


def result_attributes(stats: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """What the stored stats say of a finished generation, under GenAI and specrag names."""
    out = int(stats.get("num_output_tokens") or 0)
    attrs: dict[str, Any] = {
        "gen_ai.usage.output_tokens": out,
        "gen_ai.usage.cache_read.input_tokens": int(stats.get("num_cached_prompt_tokens") or 0),
        # The engine stops at max_new_tokens or at the end-of-sequence token: nothing else.
        "gen_ai.response.finish_reasons": ["length" if out >= max_tokens else "stop"],
        "specrag.spec_decode.num_drafts": stats.get("num_drafts"),
        "specrag.spec_decode.num_draft_tokens": stats.get("num_draft_tokens"),
        "specrag.spec_decode.num_accepted_tokens": stats.get("num_accepted_tokens"),
        "specrag.spec_decode.acceptance_rate": stats.get("acceptance_rate"),
        "specrag.spec_decode.mean_acceptance_length": stats.get("mean_acceptance_length"),
        "specrag.spec_decode.mean_chosen_k": stats.get("mean_chosen_k"),
        "specrag.spec_decode.num_cached_prompt_tokens": stats.get("num_cached_prompt_tokens"),
        "specrag.spec_decode.mean_batch_size": stats.get("mean_batch_size"),
        "specrag.spec_decode.num_target_forwards": stats.get("num_target_forwards"),
        "specrag.spec_decode.dtype": stats.get("dtype"),
        "specrag.ttft_ms": stats.get("ttft_ms"),
    }
    if stats.get("num_prompt_tokens") is not None:
        attrs["gen_ai.usage.input_tokens"] = int(stats["num_prompt_tokens"])
    return {k: v for k, v in attrs.items() if v is not None}


def content_attributes(question: str, answer: str) -> dict[str, str]:
    """The question and answer as GenAI message attributes (only ever set when opted in)."""
    asked = [{"role": "user", "parts": [{"type": "text", "content": question}]}]
    said = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
    return {
        "gen_ai.input.messages": json.dumps(asked, ensure_ascii=False),
        "gen_ai.output.messages": json.dumps(said, ensure_ascii=False),
    }


def generation_span(
    settings: Settings, params: dict[str, Any], prompt_format: str, prompt_tokens: int
) -> AbstractContextManager[Span | None]:
    """The GenAI inference span, ``{gen_ai.operation.name} {gen_ai.request.model}``."""
    model = settings.target_model.name
    attrs = request_attributes(
        engine=settings.engine,
        model=model,
        prompt_format=prompt_format,
        params=params,
        prompt_tokens=prompt_tokens,
    )
    return span(f"{attrs['gen_ai.operation.name']} {model}", attrs)


def content_allowed(settings: Settings) -> bool:
    """Whether question and answer text may go on spans: opted in, and questions kept in clear."""
    found = config()
    return found is not None and found.capture_content and settings.store_questions == "clear"
