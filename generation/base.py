"""The engine interface every implementation honours (built-in torch engine, vLLM engine)."""

from __future__ import annotations

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
        """The target's end-of-sequence token, if it has one."""
        ...

    @property
    def model_pair(self) -> str:
        """A short label of the loaded target/draft pair, stored with every answer."""
        ...

    def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> GenerationResult:
        """Generate up to ``params.max_new_tokens`` tokens after ``prompt_token_ids``."""
        ...


def check_prompt(
    prompt_token_ids: list[int], params: SamplingParams, vocab_size: int, max_context: int
) -> None:
    """Raise ValueError naming the problem when a request cannot be served by any engine.

    The checks every engine shares (params type, empty prompt, non-integer or out-of-vocabulary
    ids, a prompt that fills the context); engine-specific checks follow in each engine.
    """
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
