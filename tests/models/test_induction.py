"""The induction circuit written at initialisation, and the synthetic batches that exercise it."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from training.data import induction_batch
from training.induction_init import wire_induction
from training.model import DRAFT_SHAPE, TARGET_SHAPE, make_config, make_model

pytestmark = pytest.mark.models

VOCAB, EOS = 8192, 0


def test_induction_batch_labels_only_the_repeat() -> None:
    b = induction_batch(vocab=VOCAB, eos=EOS, tokens=4096, gen=torch.Generator().manual_seed(3))
    ids = b.input_ids
    assert ids.numel() <= 4096 + 2 * ids.shape[1]
    assert bool((b.is_answer <= b.is_real).all())
    for r in range(ids.shape[0]):
        row = ids[r].tolist()
        assert row[-1] == EOS and EOS not in row[:-1]  # EOS only at the end
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


def copy_accuracy(model: LlamaForCausalLM, seed: int) -> float:
    """Share of a repeated random span's tokens that ``model`` predicts (greedy), untrained."""
    b = induction_batch(VOCAB, EOS, 3000, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logits = model(b.input_ids).logits[:, :-1]
    hit = logits.argmax(-1) == b.input_ids[:, 1:]
    return float(hit[b.is_answer[:, :-1]].float().mean())


@pytest.mark.parametrize("shape", [DRAFT_SHAPE, TARGET_SHAPE], ids=["draft", "target"])
def test_wired_model_copies_before_any_training(shape: dict) -> None:
    wired = make_model(shape, VOCAB, EOS, seed=0)
    torch.manual_seed(0)
    plain = LlamaForCausalLM(make_config(shape, VOCAB, EOS))  # the same config, not wired
    for seed in (1, 2):
        assert copy_accuracy(wired, seed) >= 0.9
        assert copy_accuracy(plain, seed) <= 0.01


def test_previous_token_head_attends_one_back() -> None:
    model = make_model(DRAFT_SHAPE, VOCAB, EOS, seed=0)
    model.config._attn_implementation = "eager"
    ids = torch.randint(256, VOCAB, (1, 600), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        attn = model(ids, output_attentions=True).attentions[0][0, 0]  # layer 0, head 0
    assert float(torch.diagonal(attn, offset=-1).min()) > 0.95


def test_wiring_refuses_shapes_without_room_for_the_circuit() -> None:
    narrow = LlamaForCausalLM(
        make_config(
            {
                **DRAFT_SHAPE,
                "hidden_size": 128,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "intermediate_size": 256,
            },
            VOCAB,
            EOS,
        )
    )
    with pytest.raises(ValueError, match="hidden >= 145"):
        wire_induction(narrow, seed=0)
