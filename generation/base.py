"""The engine interface every implementation honours (built-in torch engine, vLLM engine)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from numbers import Integral
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
    ) -> RequestHandle:
        """Queue one request; it joins the batch at the next step.

        ``background`` (batch jobs): it takes a free slot after every waiting foreground request,
        and where extra rows cost real arithmetic (a CPU) it pauses while one runs."""
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
        """Every id that ends an answer (generation/loading.py ``CheckpointLimits``)."""
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


def check_prompt(
    prompt_token_ids: list[int], params: SamplingParams, vocab_size: int, max_context: int
) -> None:
    """Raise ValueError naming the problem when a request cannot be served by any engine."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params: expected SamplingParams, got {type(params).__name__}")
    if len(prompt_token_ids) == 0:
        raise ValueError("prompt_token_ids: empty prompt; at least one token is needed")
    not_ints = [t for t in prompt_token_ids if isinstance(t, bool) or not isinstance(t, Integral)]
    if not_ints:
        raise ValueError(f"prompt_token_ids: token ids must be integers, got {not_ints[0]!r}")
    bad = [t for t in prompt_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(
            f"prompt_token_ids: {len(bad)} ids outside the vocabulary [0, {vocab_size}), "
            f"e.g. {bad[0]!r}"
        )
    if len(prompt_token_ids) >= max_context:
        raise ValueError(
            f"prompt_token_ids: prompt of {len(prompt_token_ids)} tokens leaves no room in "
            f"the context of {max_context} tokens"
        )


def per_prompt(
    prompts: list[list[int]], params: list[SamplingParams] | SamplingParams
) -> list[SamplingParams]:
    """Return ``generate_many``'s params as one per prompt (one given for all is repeated)."""
    if isinstance(params, SamplingParams):
        return [params] * len(prompts)
    if len(params) != len(prompts):
        raise ValueError(
            f"params: expected one SamplingParams per prompt ({len(prompts)}), got {len(params)}"
        )
    return params


class BatchRequestError(ValueError):
    """Some requests of a ``generate_many`` call failed; the others' results are kept.

    ``errors`` maps each failed request's index to its error; ``results`` holds every result in
    input order, None where the request failed.
    """

    def __init__(
        self, errors: dict[int, BaseException], results: list[GenerationResult | None]
    ) -> None:
        self.errors = errors
        self.results = results
        detail = "; ".join(f"request {i}: {e}" for i, e in sorted(errors.items()))
        super().__init__(f"{len(errors)} of {len(results)} requests failed: {detail}")


def collect(
    handles: Sequence[RequestHandle], timeout: float | None = None
) -> list[GenerationResult]:
    """Return every handle's result in order, after all of them ended; ``BatchRequestError``
    names the failed ones, so a bad request never costs the others their results."""
    results: list[GenerationResult | None] = []
    errors: dict[int, BaseException] = {}
    for i, handle in enumerate(handles):
        try:
            results.append(handle.result(timeout=timeout))
        except Exception as exc:
            errors[i] = exc
            results.append(None)
    if errors:
        raise BatchRequestError(errors, results)
    return [r for r in results if r is not None]
