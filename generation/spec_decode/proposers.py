"""Proposers: each row's draft tokens, padded into one tensor ``[B, k]``.

Draft-model rows are drafted together, one batched draft pass per position; EAGLE rows too,
one batched pass of the head per position (generation/spec_decode/eagle.py). N-gram rows use prompt lookup
(generation/spec_decode/ngram.py), suffix rows suffix-tree lookup (generation/spec_decode/suffix.py);
both are deterministic given the row's tokens, so their draft distribution is one-hot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from generation.model.model_runner import ModelRunner
from generation.spec_decode.eagle import draft_with_eagle
from generation.spec_decode.rows import DraftRow
from generation.spec_decode.sampling import draft_position


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


def propose(
    rows: Sequence[DraftRow],
    ks: list[int],
    draft: ModelRunner | None,
    device: torch.device,
    head: ModelRunner | None = None,
) -> Drafts:
    """Return up to ``ks[b]`` draft tokens for each row ``b``, padded to the widest: prompt
    lookup row by row, the draft model for all its rows at once, the EAGLE ``head`` for all
    its rows at once."""
    host: list[list[int]] = [[] for _ in rows]
    probs: list[torch.Tensor | None] = [None for _ in rows]
    model_rows, head_rows = [], []
    for b, (seq, k) in enumerate(zip(rows, ks, strict=True)):
        if k and seq.ngram is not None:
            host[b] = seq.ngram.propose(seq.tokens, k)
        elif k and seq.suffix is not None:
            host[b] = seq.suffix.propose(seq.tokens, k)
        elif k and seq.params.method == "draft_model":
            model_rows.append(b)
        elif k and seq.params.method == "eagle":
            head_rows.append(b)
    for runner, picked, drafter in (
        (draft, model_rows, draft_with_model),
        (head, head_rows, draft_with_eagle),
    ):
        if not picked:
            continue
        assert runner is not None
        found = drafter(runner, [rows[b] for b in picked], [ks[b] for b in picked], device)
        for b, (tokens, p) in zip(picked, found, strict=True):
            host[b], probs[b] = tokens, p
    width = max(len(d) for d in host)
    padded = [d + [0] * (width - len(d)) for d in host]
    token_ids = torch.tensor(padded, dtype=torch.long, device=device).view(len(rows), width)
    return Drafts(token_ids, [len(d) for d in host], probs)


def draft_with_model(
    runner: ModelRunner, rows: Sequence[DraftRow], ks: list[int], device: torch.device
) -> list[tuple[list[int], torch.Tensor | None]]:
    """Return each row's ``ks[i]`` draft tokens and, for a sampled row, their distributions.

    The draft's slot lags the row by the tokens it has not seen (the target's last token,
    after a fully accepted round also the last draft, more after rounds that drafted
    nothing): they are fed first, so no prompt is recomputed. Every draft token but the last
    enters the slot (a row stops feeding after its own k); the engine's postprocess rolls back
    those the target rejected (generation/engine/step.py), the one place a slot is rolled back.
    """
    slots = [s.slot for s in rows]
    pending = [s.tokens[runner.length(s.slot) :] for s in rows]
    width = max(len(p) for p in pending)
    input_ids = torch.tensor(
        [p + [0] * (width - len(p)) for p in pending], dtype=torch.long, device=device
    )  # [R, width]
    counts = [len(p) for p in pending]
    drafted: list[list[torch.Tensor]] = [[] for _ in rows]
    probs: list[list[torch.Tensor]] = [[] for _ in rows]
    for position in range(max(ks)):
        logits = runner.run(slots, input_ids, counts, last_only=True)  # [R, vocab]
        input_ids = draft_position(logits, rows, ks, position, drafted, probs)  # [R, 1]
        counts = [1 if position + 1 < k else 0 for k in ks]
    host = torch.stack([torch.cat(t) for t in drafted]).tolist()  # [R, max k]
    return [
        (row[:k], torch.stack(p) if p else None) for row, k, p in zip(host, ks, probs, strict=True)
    ]
