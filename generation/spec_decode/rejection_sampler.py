"""Verification of draft tokens against the target: greedy and rejection sampling.

Vocabulary (as in vLLM's rejection sampler): the proposer drafts ``k`` *draft tokens*; the target
scores them in one forward pass, giving ``k + 1`` distributions. Leading draft tokens the target
keeps are *accepted*; at the first rejection the target emits a *recovered* token in its place;
when all ``k`` are accepted it emits a *bonus* token from its last distribution. Either way a
round yields ``num_accepted + 1`` tokens, and the output follows the target's distribution
exactly (Leviathan et al. 2023; Chen et al. 2023).

``verify`` decides a whole step: greedy rows by the target's argmax (the limit of the rule at
temperature 0, ties to the lowest id), sampled rows by ``rejection_sample`` with each row's own
generator, so a seeded row draws the same numbers whatever company it keeps. Its result reaches
the host in one copy.
"""

from __future__ import annotations

import torch

from generation.spec_decode.proposers import Drafts
from generation.spec_decode.sampling import sample_from_logits, temperature_probs

PLACEHOLDER = -1
"""Pads a row of ``verify``'s output after its last emitted token."""


def verify(
    logits: torch.Tensor,  # [B, k + 1, vocab_size]: the target after the last token and each draft
    drafts: Drafts,
    temperatures: list[float],
    generators: list[torch.Generator | None],
) -> list[list[int]]:
    """Return each row's emitted tokens ``[B, k + 1]`` (host lists, ``PLACEHOLDER``-padded):
    its accepted draft tokens, then the recovered or bonus token."""
    batch, width, _ = logits.shape
    k = width - 1
    argmax = logits.argmax(dim=-1)  # [B, k + 1]
    num_drafts = torch.tensor(drafts.num_tokens, device=logits.device)  # [B]
    positions = torch.arange(k, device=logits.device)  # [k]
    matches = (drafts.token_ids == argmax[:, :k]) & (positions < num_drafts[:, None])  # [B, k]
    accepted = matches.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [B]
    next_token = argmax.gather(1, accepted[:, None])[:, 0]  # [B]
    for b, temperature in enumerate(temperatures):
        if temperature == 0.0:
            continue
        n = drafts.num_tokens[b]
        if n == 0:
            next_token[b] = sample_from_logits(logits[b, 0], temperature, generators[b])[0]
            accepted[b] = 0
            continue
        target_probs = temperature_probs(logits[b, : n + 1], temperature)  # [n + 1, vocab]
        num, token = rejection_sample(
            target_probs, drafts.probs[b], drafts.token_ids[b, :n], generators[b]
        )
        accepted[b], next_token[b] = num[0], token[0]
    out = torch.where(positions < accepted[:, None], drafts.token_ids, PLACEHOLDER)  # [B, k]
    pad = torch.full((batch, 1), PLACEHOLDER, dtype=out.dtype, device=out.device)
    out = torch.cat([out, pad], dim=1)  # [B, k + 1]
    out.scatter_(1, accepted[:, None], next_token[:, None])
    return out.tolist()


def rejection_sample(
    target_probs: torch.Tensor,  # [k + 1, vocab_size]
    draft_probs: torch.Tensor | None,  # [k, vocab_size]; None = one-hot on the draft tokens
    draft_token_ids: torch.Tensor,  # [k]
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (num_accepted [1], next token [1]) so that the output follows ``target_probs``.

    Draws exactly k uniforms and one multinomial sample per call, so a seeded generator gives
    reproducible output.
    """
    k = draft_token_ids.shape[0]
    rows = torch.arange(k, device=target_probs.device)
    p_target = target_probs[rows, draft_token_ids]  # [k]
    if draft_probs is None:
        p_draft = torch.ones_like(p_target)  # [k]
        residual = target_probs[:k].clone()  # [k, vocab_size]
        residual[rows, draft_token_ids] = 0.0
    else:
        p_draft = draft_probs[rows, draft_token_ids]  # [k]
        residual = (target_probs[:k] - draft_probs).clamp_(min=0.0)  # [k, vocab_size]

    # Acceptance rule: keep draft token x with probability min(1, p_target(x) / p_draft(x));
    # at the first rejection sample the recovered token from normalise(max(0, p_target - p_draft));
    # when all k are kept, sample the bonus token from the target's (k+1)-th distribution.
    uniform = torch.rand(k, device=target_probs.device, generator=generator)  # [k]
    accepted = (uniform * p_draft < p_target).to(torch.int64)  # [k]
    num_accepted = accepted.cumprod(dim=0).sum().view(1)  # [1]

    # Rows 0..k-1 are the recovered distributions, row k the bonus one; a residual that is all
    # zero (p_target == p_draft, so rejection had probability 0) falls back to the target's row.
    empty = residual.sum(dim=-1, keepdim=True) <= 0  # [k, 1]
    residual = torch.where(empty, target_probs[:k], residual)
    next_dists = torch.cat([residual, target_probs[k:]])  # [k + 1, vocab_size]
    chosen = next_dists.index_select(0, num_accepted)  # [1, vocab_size]
    next_token = torch.multinomial(chosen, 1, generator=generator).view(1)  # [1]
    return num_accepted, next_token
