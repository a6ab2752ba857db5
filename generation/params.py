"""What a caller asks of one generation: the contract's ``SamplingParams``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Method = Literal["draft_model", "ngram", "suffix", "eagle", "none"]
METHODS: tuple[str, ...] = ("draft_model", "ngram", "suffix", "eagle", "none")


@dataclass(frozen=True)
class SamplingParams:
    """Decoding parameters for one request; validated on construction."""

    max_new_tokens: int = 64
    """Upper bound on generated tokens (the end-of-sequence token stops earlier)."""
    temperature: float = 0.0
    """0 means greedy (argmax, ties to the lowest token id); > 0 samples from softmax(logits / T)."""
    seed: int | None = None
    """Seed for a private generator: the same seed gives the same sampled output."""
    method: str = "draft_model"
    """Proposer: ``draft_model``, ``ngram`` (prompt lookup), ``suffix`` (suffix trees over the
    request's tokens and its scope's past answers), ``eagle`` (a head on the target's features)
    or ``none`` (target only)."""
    num_speculative_tokens: int | str = 4
    """Tokens drafted per verification round (k >= 1), or ``"auto"`` for adaptive k."""
    cache_salt: str | None = None
    """Requests with different salts never share cached prompt KV (vLLM's ``cache_salt``): the
    service salts with the tenant, so a cache hit's speed tells no tenant of another's prompts."""
    suffix_scope: str | None = None
    """Whose past answers a ``suffix`` request drafts from: a scope of the engine's
    ``SuffixMemory`` (generation/spec_decode/suffix.py; the service's tenant + collection).
    None: the request's own prompt and output only."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"method: unknown method {self.method!r}; expected one of {', '.join(METHODS)}"
            )
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not (isinstance(k, int) or k == "auto"):
            raise ValueError(f"num_speculative_tokens: expected an int >= 1 or 'auto', got {k!r}")
        if isinstance(k, int) and k < 1:
            raise ValueError(f"num_speculative_tokens: must be >= 1, got {k}")
        if (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, int)
            or self.max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens: must be an int >= 1, got {self.max_new_tokens!r}")
        if (
            not isinstance(self.temperature, (int, float))
            or self.temperature < 0
            or self.temperature != self.temperature
        ):
            raise ValueError(f"temperature: must be a number >= 0, got {self.temperature!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise ValueError(f"seed: must be an int or None, got {self.seed!r}")
        if self.cache_salt is not None and (
            not isinstance(self.cache_salt, str) or not self.cache_salt
        ):
            raise ValueError(
                f"cache_salt: must be a non-empty string or None, got {self.cache_salt!r}"
            )
        if self.suffix_scope is not None and (
            not isinstance(self.suffix_scope, str) or not self.suffix_scope
        ):
            raise ValueError(
                f"suffix_scope: must be a non-empty string or None, got {self.suffix_scope!r}"
            )
