"""The engine interface every implementation honours (built-in torch engine, vLLM engine)."""

from __future__ import annotations

from dataclasses import dataclass
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
