"""Draft-model proposer: the draft decodes each row's k tokens, one batched pass a position."""

from __future__ import annotations

import torch

from generation.model_runner import ModelRunner


def propose_with_draft_model(
    runner: ModelRunner,
    slots: list[int],
    tokens: list[list[int]],
    ks: list[int],
    temperatures: list[float],
    generators: list[torch.Generator | None],
) -> tuple[list[list[int]], list[torch.Tensor | None]]:
    """Return each row's ``ks[i]`` draft tokens and, for sampled rows, their distributions.

    ``tokens[i]``: row i's sequence so far. The draft's slot lags it by the tokens it has not
    seen (the target's last token, after a fully accepted round also the last draft, more after
    rounds that drafted nothing): they are fed first, so no prompt is recomputed. Every draft
    token but the last enters the slot; ``postprocess`` rolls back those the target rejected.
    """
    device = runner.fwd.device
    pending = [seq[runner.length(slot) :] for seq, slot in zip(tokens, slots, strict=True)]
    width = max(len(p) for p in pending)
    input_ids = torch.tensor(
        [p + [0] * (width - len(p)) for p in pending], dtype=torch.long, device=device
    )  # [R, width]
    counts = [len(p) for p in pending]
    drafted: list[list[torch.Tensor]] = [[] for _ in slots]
    probs: list[list[torch.Tensor]] = [[] for _ in slots]
    for position in range(max(ks)):
        logits = runner.run(slots, input_ids, counts, last_only=True)  # [R, vocab]
        greedy = logits.argmax(dim=-1, keepdim=True)  # [R, 1]
        for i, temperature in enumerate(temperatures):
            if position >= ks[i] or temperature == 0.0:
                drafted[i].append(greedy[i])
                continue
            p = torch.softmax(logits[i] / temperature, dim=-1)  # [vocab]
            drafted[i].append(torch.multinomial(p, 1, generator=generators[i]))
            probs[i].append(p)
        input_ids = torch.stack([t[-1] for t in drafted])  # [R, 1]
        counts = [1 if position + 1 < k else 0 for k in ks]
    host = torch.stack([torch.cat(t) for t in drafted]).tolist()  # [R, max k]
    for i, slot in enumerate(slots):
        runner.set_length(slot, len(tokens[i]) + ks[i] - 1)
    return (
        [row[:k] for row, k in zip(host, ks, strict=True)],
        [torch.stack(p) if p else None for p in probs],
    )
