"""Per-request speculative-decoding statistics, named after vLLM's spec-decode metrics (the
vocabulary, accepted / recovered / bonus token, is defined in generation/spec_decode/rejection_sampler.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GenerationStats:
    """Counters and timings of one generation; leaves the engine as data."""

    method: str = "none"
    """Proposer asked for."""
    num_speculative_tokens: int | str | None = None
    """k asked for (an int, or "auto")."""
    num_output_tokens: int = 0
    """Tokens generated."""
    num_target_forwards: int = 0
    """Target forward passes after the prompt's prefill."""
    num_drafts: int = 0
    """Verification rounds that carried at least one draft token."""
    num_draft_tokens: int = 0
    """Draft tokens proposed (and verified)."""
    num_accepted_tokens: int = 0
    """Draft tokens accepted."""
    accepted_per_position: list[int] = field(default_factory=list)
    """Accepted count at draft position 1, 2, ..."""
    ttft_ms: float | None = None
    """Time to first token (prefill plus the first emitted token)."""
    generation_ms: float | None = None
    """Total generation time."""
    queue_ms: float | None = None
    """Service timing: time waiting in the queue (set by the service)."""
    retrieval_ms: float | None = None
    """Service timing: retrieval (set by the service)."""
    total_ms: float | None = None
    """Service timing: submit to done (set by the service)."""
    mean_batch_size: float = 1.0
    """Mean number of requests in the target passes this request took part in (1 when alone)."""
    mean_chosen_k: float | None = None
    """Mean k the engine chose over this request's target passes (0 for a plain pass); None
    when the engine does not choose per step."""
    num_cached_prompt_tokens: int = 0
    """Prompt tokens whose KV was reused from earlier requests (0 when none; vLLM:
    ``num_cached_tokens``): the prefill ran only past them."""
    dtype: str | None = None
    """Numerics the answer was computed in ("float32", "bfloat16"); None where unknown."""

    prompt_format: str | None = None
    """How the prompt was made: ``"chat"`` (the target tokenizer's chat template) or ``"raw"``
    (set by the service; None when token ids came in directly)."""

    def record_round(self, num_draft_tokens: int, num_accepted: int, num_emitted: int) -> None:
        """Count one target pass that verified ``num_draft_tokens`` and kept ``num_emitted``.

        ``num_accepted`` counts only accepted drafts that were kept (an end-of-sequence token
        among them drops what follows); the rest of ``num_emitted`` came from the target.
        """
        self.num_target_forwards += 1
        self.num_output_tokens += num_emitted
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        missing = num_draft_tokens - len(self.accepted_per_position)
        if missing > 0:
            self.accepted_per_position.extend([0] * missing)
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    @property
    def acceptance_rate(self) -> float | None:
        """num_accepted_tokens / num_draft_tokens, or None when nothing was drafted."""
        if self.num_draft_tokens == 0:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + num_accepted_tokens / num_drafts, or None when there were no drafts."""
        if self.num_drafts == 0:
            return None
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    def to_dict(self) -> dict[str, Any]:
        """Every contract field, derived rates included, JSON-ready."""
        data = asdict(self)
        data["acceptance_rate"] = self.acceptance_rate
        data["mean_acceptance_length"] = self.mean_acceptance_length
        return data
