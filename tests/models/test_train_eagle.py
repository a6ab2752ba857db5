"""training/train_eagle.py's pieces: length-bucketed batches, and a run dir tied to its target."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from training.train_eagle import (
    batches,
    check_same_target,
    record_features,
    reference_rows,
    target_features,
)

pytestmark = pytest.mark.models


def test_batches_cover_every_row_once_within_the_token_budget() -> None:
    rng = random.Random(0)
    lengths = [rng.randrange(20, 700) for _ in range(200)]
    groups = batches(lengths, 4096, random.Random(1))
    assert sorted(i for g in groups for i in g) == list(range(200))
    for g in groups:
        assert len(g) == 1 or max(lengths[i] for i in g) * len(g) <= 4096


def test_a_run_dir_recorded_from_another_target_is_refused(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for d, content in ((first, b"one"), (second, b"two")):
        d.mkdir()
        (d / "model.safetensors").write_bytes(content)
    run = tmp_path / "run"
    run.mkdir()
    check_same_target(first, run, run / "answers.jsonl")
    check_same_target(first, run, run / "answers.jsonl")  # the same target resumes
    with pytest.raises(SystemExit, match="recorded from another target"):
        check_same_target(second, run, run / "answers.jsonl")


def _tiny_target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


def test_batched_features_are_each_rows_own_and_resume(tmp_path: Path) -> None:
    """Rows of different lengths recorded several per padded pass give the features each row
    gets alone (float32), and an interrupted recording resumes where its file ends."""
    target = _tiny_target()
    rng = random.Random(0)
    rows = [[rng.randrange(64) for _ in range(rng.randrange(3, 40))] for _ in range(9)]
    alone = [target_features(target, [r], torch.float32)[0] for r in rows]
    out = tmp_path / "features.pt"
    # 120 padded tokens a pass: several rows share each pass; saved after every pass.
    first = record_features(target, rows[:5], out, tmp_path, 120, chunk=1, amp=torch.float32)
    assert len(torch.load(out)) == 5
    every = record_features(target, rows, out, tmp_path, 120, chunk=1, amp=torch.float32)
    assert len(every) == len(rows) and all(
        torch.equal(a, b) for a, b in zip(first, every, strict=False)
    )
    for a, b, r in zip(alone, every, rows, strict=True):
        assert b.shape == (len(r), 32) and b.dtype == torch.float16
        torch.testing.assert_close(a.float(), b.float(), atol=2e-3, rtol=0)
    assert "features 9/9 sequences" in (tmp_path / "eagle.log").read_text()
    fewer = record_features(target, rows[:3], out, tmp_path, 120, amp=torch.float32)
    assert len(fewer) == 3  # a shorter run reads a prefix of the file


def test_reference_rows_come_from_the_training_split_only() -> None:
    """The reference-answer rows are training-split prompts, prompt + answer + EOS: no held-out
    demo-corpus document (benchmarks/eagle_acceptance.py's questions) appears in them."""
    from generation import load_tokenizer
    from training.corpus import REPO_ROOT, Document, build_corpus
    from training.qa import chunk_documents

    tok = load_tokenizer(REPO_ROOT / "models" / "demo" / "target")
    rows, prompt_lens = reference_rows(tok, 0, 40)
    assert len(rows) == len(prompt_lens) == 40
    assert all(
        0 < n < len(r) and r[-1] == tok.eos_token_id for r, n in zip(rows, prompt_lens, strict=True)
    )
    text = "\n".join(tok.decode(r) for r in rows)
    corpus = build_corpus(0)

    def openings(docs: list[Document]) -> list[str]:
        demo = [d for d in docs if d.source.startswith("demo/corpus/")]
        return [c.text[:80] for c in chunk_documents(demo, 120) if len(c.text) >= 80]

    held, train = openings(corpus.heldout), openings(corpus.train)
    # Most held-out passages are also inside training documents (the corpus's documents
    # overlap); the ones only the held-out split has must never appear.
    train_text = "\n".join(d.text() for d in corpus.train)
    held_only = [t for t in held if t not in train_text]
    assert held_only and not [t for t in held_only if t in text]
    assert sum(t in text for t in train) >= 10  # the check can see a passage when it is there
