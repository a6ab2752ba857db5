"""The step's proposer: each row's draft tokens, padded into one tensor ``[B, k]``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from generation.model_runner import ModelRunner
from generation.proposers.draft_model import propose_with_draft_model

if TYPE_CHECKING:
    from generation.sequence import Sequence


@dataclass
class Drafts:
    """Draft tokens of one step, as vLLM lays them out: padded rows and their real lengths."""

    token_ids: torch.Tensor
    """[B, k] int64 on the engine's device, k the step's widest draft; padded with 0."""
    num_tokens: list[int]
    """num_tokens[b]: real draft tokens of row b (a lookup may find fewer than asked, or none)."""
    probs: list[torch.Tensor | None]
    """probs[b]: [num_tokens[b], vocab_size] draft probabilities of a sampled draft-model row;
    None means one-hot on the tokens (greedy rows, prompt lookup)."""


class Proposer:
    """Drafts a step's rows: prompt lookup row by row, the draft model for all its rows at once."""

    def __init__(self, draft: ModelRunner | None, device: torch.device) -> None:
        self.draft = draft
        self.device = device

    def propose(self, rows: list[Sequence], ks: list[int]) -> Drafts:
        """Return up to ``ks[b]`` draft tokens for each row ``b``, padded to the widest."""
        host: list[list[int]] = [[] for _ in rows]
        probs: list[torch.Tensor | None] = [None for _ in rows]
        model_rows = []
        for b, (seq, k) in enumerate(zip(rows, ks, strict=True)):
            if k and seq.ngram is not None:
                host[b] = seq.ngram.propose(seq.tokens, k)
            elif k and seq.params.method == "draft_model":
                model_rows.append(b)
        if model_rows:
            assert self.draft is not None
            picked = [rows[b] for b in model_rows]
            found, found_probs = propose_with_draft_model(
                self.draft,
                [s.slot for s in picked],
                [s.tokens for s in picked],
                [ks[b] for b in model_rows],
                [s.temperature for s in picked],
                [s.generator for s in picked],
            )
            for b, draft, p in zip(model_rows, found, found_probs, strict=True):
                host[b], probs[b] = draft, p
        width = max(len(d) for d in host)
        padded = [d + [0] * (width - len(d)) for d in host]
        token_ids = torch.tensor(padded, dtype=torch.long, device=self.device).view(
            len(rows), width
        )
        return Drafts(token_ids, [len(d) for d in host], probs)
