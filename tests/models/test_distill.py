"""Distilling the draft on the target's answers: data from the training split only, and a
deepened draft that starts as the same function."""

from __future__ import annotations

import random
import re

import pytest
import torch

from training.corpus import build_corpus
from training.data import bucket
from training.distill_draft import grow, training_prompts
from training.model import DRAFT_SHAPE, make_model

pytestmark = pytest.mark.models

VOCAB, EOS = 512, 0


def test_grow_appends_layers_that_change_nothing_yet() -> None:
    draft = make_model(DRAFT_SHAPE, VOCAB, EOS, seed=0).eval()
    with torch.no_grad():
        for p in draft.parameters():  # a trained-looking draft: every branch non-zero
            p.add_(0.02 * torch.randn_like(p))
    deeper = grow(draft, 4, seed=1).eval()
    ids = torch.randint(1, VOCAB, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(deeper(ids).logits, draft(ids).logits)
    assert deeper.config.num_hidden_layers == 4 and len(deeper.model.layers) == 4
    assert draft.config.num_hidden_layers == 2  # the original is left alone
    assert grow(draft, 2, seed=1) is draft
    # The new layers learn: their attention is not zero, only their writes are.
    assert deeper.model.layers[3].self_attn.q_proj.weight.abs().sum() > 0


def test_distillation_prompts_never_show_held_out_documents() -> None:
    corpus = build_corpus(0)
    held_out = {d.title for d in corpus.heldout}
    prompts = training_prompts(0, 60)
    cited = set()
    for example in prompts:
        for title in re.findall(r"^\[\d+\] (.+?) — ", example.prompt, flags=re.M):
            cited.add(title)
    assert cited, "no passage titles parsed: the prompt format changed"
    assert not cited & held_out
    assert prompts == training_prompts(0, 60)  # seeded


def test_batches_cover_every_row_once_within_the_token_budget() -> None:
    rows = [([1] * n, n // 2) for n in (5, 50, 300, 301, 900, 17, 64, 64)]
    got = bucket(rows, tokens_per_batch=1000, rng=random.Random(0))
    flat = sorted(len(ids) for b in got for ids, _ in b)
    assert flat == sorted(len(ids) for ids, _ in rows)
    for b in got:
        assert len(b) == 1 or len(b) * max(len(ids) for ids, _ in b) <= 1000
