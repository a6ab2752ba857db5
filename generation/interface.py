"""The engine interface every implementation honours (built-in torch engine, vLLM engine)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from generation.params import SamplingParams
from generation.stats import GenerationStats


@dataclass
class GenerationResult:
    """What one ``generate`` call returns: the new tokens only, and their stats."""

    token_ids: list[int]
    stats: GenerationStats


class Cancelled(Exception):
    """The request was cancelled (at a step boundary) before it finished."""


DeltaCallback = Callable[[list[int]], None]
"""Called from the loop's thread with each burst of newly verified token ids; it must return
quickly (hand the ids to a queue or a socket buffer, never block on a client)."""


class RequestHandle(Protocol):
    """One request in flight in a ``GenerationLoop``."""

    def deltas(self) -> Iterator[list[int]]:
        """Newly verified token ids as they land; ends when the request finished or was cancelled."""
        ...

    def result(self, timeout: float | None = None) -> GenerationResult:
        """The whole result; raises ``Cancelled``, the request's own error, or TimeoutError."""
        ...

    def cancel(self) -> None:
        """Stop the request at the next step boundary; its slot is freed, nothing else disturbed."""
        ...

    @property
    def done(self) -> bool:
        """Whether the request finished, failed or was cancelled."""
        ...


class GenerationLoop(Protocol):
    """An engine's online loop: requests join the running batch and leave as they finish.

    ``submit`` is thread-safe and returns at once; a request the engine cannot serve fails its own
    handle (``result`` raises the error naming the problem), never the loop or the other requests.
    """

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        on_delta: DeltaCallback | None = None,
        *,
        background: bool = False,
        trace_headers: Mapping[str, str] | None = None,
    ) -> RequestHandle:
        """Queue one request; it joins the batch at the next step.

        ``background`` (batch jobs): it takes a free slot after every waiting foreground request,
        and where extra rows cost real arithmetic (a CPU) it pauses while one runs.
        ``trace_headers``: the caller's W3C trace context (``traceparent``), for an engine that
        writes spans of its own (vLLM's ``llm_request``)."""
        ...

    def close(self) -> None:
        """Cancel what is in flight and stop the loop's thread."""
        ...


@runtime_checkable
class Engine(Protocol):
    """A loaded target (and optional draft) that turns prompt token ids into new token ids."""

    @property
    def vocab_size(self) -> int:
        """Size of the target's vocabulary; valid token ids are ``range(vocab_size)``."""
        ...

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + new tokens) the target accepts."""
        ...

    @property
    def eos_token_id(self) -> int | None:
        """The target's first end-of-sequence token, if it has one."""
        ...

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends an answer (generation/model/loading.py ``CheckpointLimits``)."""
        ...

    @property
    def model_pair(self) -> str:
        """A short label of the loaded target/draft pair, stored with every answer."""
        ...

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError naming the problem when this engine cannot serve the request."""
        ...

    def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> GenerationResult:
        """Generate up to ``params.max_new_tokens`` tokens after ``prompt_token_ids``."""
        ...

    def generate_many(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams] | SamplingParams,
        *,
        max_batch_size: int | None = None,
    ) -> list[GenerationResult]:
        """One result per prompt, in input order, generated as one continuous batch."""
        ...

    def start_loop(
        self, max_batch_size: int | None = None, *, prefill_chunk: int | None = None
    ) -> GenerationLoop:
        """A running online loop (continuous batching) over this engine.

        ``prefill_chunk``: most prompt tokens prefilled per step while others decode (None: the
        engine's default; vLLM schedules its own prefill and ignores it)."""
        ...
