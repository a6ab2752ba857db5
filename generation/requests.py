"""What every engine checks and derives from a request, and how ``generate_many`` gathers results.

``check_prompt`` refuses what no engine can serve, ``token_budget`` is the one rule for how many
tokens a request may get, ``per_prompt`` spreads ``generate_many``'s params, and ``collect``
waits for a batch's handles, naming the failed ones in ``BatchRequestError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

from generation.interface import GenerationResult, RequestHandle
from generation.params import SamplingParams


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


def token_budget(prompt_len: int, params: SamplingParams, max_context: int) -> int:
    """Return how many new tokens a request of ``prompt_len`` tokens may get: ``max_new_tokens``,
    capped by the room the context leaves after the prompt."""
    return min(params.max_new_tokens, max_context - prompt_len)


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
