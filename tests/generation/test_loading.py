"""Checkpoint validation, pair loading and the vocabulary compatibility check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from generation import (
    CheckpointError,
    IncompatibleDraftError,
    SamplingParams,
    SpeculativeEngine,
    load_engine,
    load_tokenizer,
)
from tests.generation.tiny_models import build_model, save_checkpoint, word_tokenizer

pytestmark = pytest.mark.models

WORDS = [f"w{i}" for i in range(48)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    tokenizer = word_tokenizer(WORDS)
    swapped = word_tokenizer([WORDS[1], WORDS[0], *WORDS[2:]])
    return {
        "target": save_checkpoint(
            build_model("llama", vocab_size=48, seed=1), root / "target", tokenizer
        ),
        "draft": save_checkpoint(
            build_model("llama", vocab_size=48, seed=2, num_layers=1), root / "draft", tokenizer
        ),
        "gpt2_draft": save_checkpoint(
            build_model("gpt2", vocab_size=48, seed=2), root / "gpt2_draft"
        ),
        "bigger_vocab": save_checkpoint(
            build_model("llama", vocab_size=64, seed=2), root / "bigger"
        ),
        "swapped_tokens": save_checkpoint(
            build_model("llama", vocab_size=48, seed=2), root / "swapped", swapped
        ),
    }


def test_pair_loads_and_generates(checkpoints: dict[str, Path]) -> None:
    engine = SpeculativeEngine.from_pretrained(checkpoints["target"], checkpoints["draft"])
    assert engine.vocab_size == 48 and engine.max_context == 256
    assert engine.model_pair == "target+draft"
    result = engine.generate([1, 2, 3, 1, 2], SamplingParams(max_new_tokens=5))
    assert len(result.token_ids) == 5
    assert load_tokenizer(checkpoints["target"]).convert_tokens_to_ids("w7") == 7


def test_draft_of_another_family_with_same_vocabulary_is_accepted(
    checkpoints: dict[str, Path],
) -> None:
    engine = load_engine("torch", checkpoints["target"], checkpoints["gpt2_draft"], device="cpu")
    assert engine.generate([4, 5], SamplingParams(max_new_tokens=4)).stats.num_output_tokens == 4


def test_vocabulary_size_mismatch_is_refused(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(IncompatibleDraftError, match="vocabulary size 64.*has 48"):
        SpeculativeEngine.from_pretrained(checkpoints["target"], checkpoints["bigger_vocab"])


def test_token_to_id_mismatch_is_refused(checkpoints: dict[str, Path]) -> None:
    # The first differing token is named, and the refusal says what is not supported.
    with pytest.raises(
        IncompatibleDraftError,
        match="id 0 is 'w0' in the target and 'w1' in the draft.*own vocabulary are not supported",
    ):
        SpeculativeEngine.from_pretrained(checkpoints["target"], checkpoints["swapped_tokens"])


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="nowhere.*does not exist"):
        SpeculativeEngine.from_pretrained(tmp_path / "nowhere")


def test_no_config(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no config.json"):
        SpeculativeEngine.from_pretrained(tmp_path)


def test_no_weights(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    (tmp_path / "config.json").write_text((checkpoints["target"] / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no weights"):
        SpeculativeEngine.from_pretrained(tmp_path)


def test_non_causal_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "distilbert"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="'distilbert' is not a causal language model"):
        SpeculativeEngine.from_pretrained(tmp_path)


def test_bad_draft_checkpoint_names_the_draft(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    with pytest.raises(CheckpointError, match="draft_missing"):
        SpeculativeEngine.from_pretrained(checkpoints["target"], tmp_path / "draft_missing")


def test_tokenizer_absent(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(CheckpointError, match="bigger.*no tokenizer files"):
        load_tokenizer(checkpoints["bigger_vocab"])


def test_unknown_engine_kind(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="unknown kind 'tensorrt'"):
        load_engine("tensorrt", checkpoints["target"])


def test_vllm_engine_without_vllm_says_so(checkpoints: dict[str, Path]) -> None:
    """Here (CPU, no vllm installed) the vllm kind fails with a message naming vLLM."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed: the real engine is tested in test_vllm_engine.py")
    with pytest.raises(RuntimeError, match="(?i)vllm"):
        load_engine("vllm", checkpoints["target"], checkpoints["draft"], device="auto")
