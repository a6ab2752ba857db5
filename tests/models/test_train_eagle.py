"""training/train_eagle.py's pieces: length-bucketed batches, and a run dir tied to its target."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from training.train_eagle import batches, check_same_target


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
