"""The copy recipe's synthetic induction batches: the loss falls only on the repeated span."""

from __future__ import annotations

import torch

from training.copy_recipe import induction_batch


def test_induction_batch_labels_only_the_repeat() -> None:
    b = induction_batch(vocab=8192, eos=0, tokens=4096, gen=torch.Generator().manual_seed(3))
    ids = b.input_ids
    assert ids.numel() <= 4096 + 2 * ids.shape[1]
    assert bool((b.is_answer <= b.is_real).all())
    for r in range(ids.shape[0]):
        row = ids[r].tolist()
        assert row[-1] == 0 and 0 not in row[:-1]  # EOS only at the end
        pos = b.is_answer[r].nonzero().flatten().tolist()
        assert pos == list(range(pos[0], len(row) - 1))  # one run, up to the EOS label
        # The labelled tokens, with the token before them, repeat a span seen earlier verbatim,
        # so an induction head can predict every one of them.
        repeat = row[pos[0] : len(row) - 1]
        before = row[: pos[0]]
        assert len(repeat) >= 24
        assert any(
            before[i : i + len(repeat)] == repeat for i in range(len(before) - len(repeat) + 1)
        )
