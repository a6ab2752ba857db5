"""Draft-model proposer: a small causal LM decodes k tokens on its own KV cache."""

from __future__ import annotations

from typing import Any

import torch

from generation.forward import Forward
from generation.proposers.base import Draft


class DraftModelProposer:
    """Drafts k tokens autoregressively with the draft model; rolls its cache back after each round.

    The draft cache covers a prefix of the engine's sequence; the tokens after that prefix
    (the target's last token, and after a fully accepted round also the last draft token) are
    fed at the start of the next proposal, so the prompt is never recomputed.
    """

    def __init__(self, model: Forward) -> None:
        self.model = model
        self.device = model.device
        self.cache: Any = None
        self.cached_len = 0
        """Tokens of the sequence whose keys/values are in ``cache``."""

    def begin(self, tokens: list[int]) -> None:
        """Prefill the draft cache with all but the last token (fed by the first proposal)."""
        self.cache = self.model.new_cache()
        self.cached_len = 0
        if len(tokens) > 1:
            ids = torch.tensor([tokens[:-1]], dtype=torch.long, device=self.device)
            self.model(ids, self.cache, logits_to_keep=1)
            self.cached_len = len(tokens) - 1

    def propose(
        self, tokens: list[int], k: int, temperature: float, generator: torch.Generator | None
    ) -> Draft:
        """Return k draft tokens (greedy at temperature 0, else sampled) and their distributions."""
        pending = torch.tensor([tokens[self.cached_len :]], dtype=torch.long, device=self.device)
        self.cached_len = len(tokens) + k - 1  # every draft token but the last enters the cache
        draft_tokens = []
        draft_probs = []
        input_ids = pending  # [1, num_pending]
        for _ in range(k):
            logits = self.model(input_ids, self.cache, logits_to_keep=1)[-1].float()  # [vocab]
            if temperature == 0.0:
                token = logits.argmax(dim=-1, keepdim=True)  # [1]
            else:
                probs = torch.softmax(logits / temperature, dim=-1)  # [vocab_size]
                token = torch.multinomial(probs, 1, generator=generator)  # [1]
                draft_probs.append(probs)
            draft_tokens.append(token)
            input_ids = token.view(1, 1)
        return Draft(
            token_ids=torch.cat(draft_tokens),  # [k]
            probs=torch.stack(draft_probs) if draft_probs else None,  # [k, vocab_size]
        )

    def rollback(self, tokens: list[int], num_draft_tokens: int, num_accepted: int) -> None:
        """Drop the cached keys/values of rejected draft tokens."""
        assert self.cache is not None
        # The cache holds draft tokens 1..k-1; those past the accepted ones are now wrong.
        stale = max(0, num_draft_tokens - 1 - num_accepted)
        if stale:
            self.cache.crop(-stale)
            self.cached_len -= stale
