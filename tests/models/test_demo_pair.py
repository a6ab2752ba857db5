"""The shipped demo pair loads offline from the repository and decodes consistently."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from generation import SamplingParams, SpeculativeEngine, load_tokenizer
from generation.model.kv_store import KVShape
from retrieval.chat import PromptFormat
from retrieval.prompt import Passage, user_message

pytestmark = pytest.mark.models

MAX_TOTAL_BYTES = 80 * 1024 * 1024
CORPUS = Path(__file__).resolve().parents[2] / "demo" / "corpus"


@pytest.fixture(scope="module")
def engine(
    demo_dirs: tuple[Path, Path], monkeypatch_module: pytest.MonkeyPatch
) -> SpeculativeEngine:
    target, draft = demo_dirs
    return SpeculativeEngine.from_pretrained(
        target, draft, device="cpu", eagle_dir=target.parent / "eagle"
    )


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    # Offline: any attempt to reach a model hub fails instead of downloading.
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    yield mp
    mp.undo()


def test_pair_is_complete_and_small(demo_dirs: tuple[Path, Path]) -> None:
    total = 0
    for d in demo_dirs:
        for name in (
            "model.safetensors",
            "config.json",
            "generation_config.json",
            "tokenizer.json",
        ):
            assert (d / name).is_file(), f"{d} lacks {name}"
        total += sum(f.stat().st_size for f in d.iterdir() if f.is_file())
    assert total <= MAX_TOTAL_BYTES, f"demo pair is {total / 2**20:.1f} MiB, limit 80 MiB"


def test_pair_is_an_instruct_pair_sharing_one_chat_tokenizer(
    demo_dirs: tuple[Path, Path],
) -> None:
    target, draft = demo_dirs
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (target / name).read_bytes() == (draft / name).read_bytes()
    tok = load_tokenizer(target)
    end_of_turn, end_of_text = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert tok.eos_token_id == end_of_turn and tok.pad_token_id == end_of_text
    assert PromptFormat.for_tokenizer(tok).name == "chat"  # ChatML
    for d in demo_dirs:
        config = json.loads((d / "config.json").read_text())
        gen = json.loads((d / "generation_config.json").read_text())
        assert config["model_type"] == "llama"
        assert config["eos_token_id"] == end_of_turn
        assert gen["eos_token_id"] == [end_of_turn, end_of_text]  # the answer ends at either
        assert config["vocab_size"] == len(tok)


def test_target_step_is_much_larger_than_draft(engine: SpeculativeEngine) -> None:
    # The issue asks for a measured >= 8x step-cost ratio (models/README.md); here only the
    # structural precondition: the draft is shallow and narrow next to the target.
    assert engine.draft is not None
    t, d = engine.target.config, engine.draft.config
    assert d.num_hidden_layers * 3 <= t.num_hidden_layers
    assert d.hidden_size < t.hidden_size


QUESTION = "What does the assert statement do?"


def _passages() -> list[Passage]:
    text = (CORPUS / "assert.md").read_text().split("\n", 2)[2]
    words = text.split()
    passages = [Passage('The "assert" statement', " ".join(words[:120]))]
    other = (CORPUS / "pass.md").read_text().split("\n", 2)[2]
    passages.append(Passage('The "pass" statement', " ".join(other.split()[:80])))
    return passages


@pytest.fixture(scope="module")
def prompt_ids(demo_dirs: tuple[Path, Path]) -> list[int]:
    """The service's prompt for the demo pair: its ChatML template (retrieval/chat.py)."""
    return PromptFormat.for_tokenizer(load_tokenizer(demo_dirs[0])).encode(QUESTION, _passages())


@pytest.fixture(scope="module")
def plain_output(engine: SpeculativeEngine, prompt_ids: list[int]) -> list[int]:
    params = SamplingParams(max_new_tokens=24, temperature=0.0, method="none")
    return engine.generate(prompt_ids, params).token_ids


@pytest.mark.parametrize("method", ["draft_model", "ngram", "eagle"])
def test_greedy_is_token_identical_with_and_without_speculation(
    engine: SpeculativeEngine, prompt_ids: list[int], plain_output: list[int], method: str
) -> None:
    params = SamplingParams(
        max_new_tokens=24, temperature=0.0, method=method, num_speculative_tokens=4
    )
    spec = engine.generate(prompt_ids, params)
    assert plain_output, "the target produced nothing"
    assert spec.token_ids == plain_output
    assert spec.stats.num_draft_tokens > 0, f"{method} never proposed a token"


def test_the_answer_opens_with_words_of_its_passage(
    engine: SpeculativeEngine, demo_dirs: tuple[Path, Path]
) -> None:
    """Grounded, not noise: the greedy answer cites a passage and copies a run of its words.

    Four words, not a sentence: the shipped pair opens its quotes from the passage but often
    drifts after a few words (models/README.md, "Quality": 10 of 16 held-out answers quote >= 8
    words).  The session-1 pair, which never copied, fails this.
    """
    tok = load_tokenizer(demo_dirs[0])
    ids = PromptFormat.for_tokenizer(tok).encode(QUESTION, _passages())
    out = engine.generate(ids, SamplingParams(max_new_tokens=48, method="ngram"))
    answer = tok.decode(out.token_ids, skip_special_tokens=True)
    assert "[1]" in answer or "[2]" in answer, answer
    assert "<|" not in answer
    prompt = user_message(QUESTION, _passages())
    passages = " ".join(prompt.split("Question:")[0].replace('"', " ").split())
    words = answer.replace('"', " ").split()
    runs = [" ".join(words[i : i + 4]) for i in range(len(words) - 3)]
    assert any(run in passages for run in runs if "[" not in run), (
        f"no 4-word run of the answer is quoted: {answer}"
    )


def test_the_instruct_fine_tune_kept_the_induction_circuit(engine: SpeculativeEngine) -> None:
    """Both shipped models still copy a repeated random span (98 % measured; the circuit
    written in at initialisation, training/induction_init.py, survived every stage)."""
    from tests.models.test_induction import copy_accuracy

    for model in (engine.target, engine.draft):
        assert copy_accuracy(model, seed=0) >= 0.9


def test_eagle_head_ships_in_vllm_format_and_adds_less_than_the_draft(
    engine: SpeculativeEngine, demo_dirs: tuple[Path, Path]
) -> None:
    """The head (models/demo/eagle) is vLLM's EAGLE layout and, weights and KV of a slot at
    the full context together, takes less memory than the draft model it stands in for."""
    head_dir = demo_dirs[0].parent / "eagle"
    config = json.loads((head_dir / "config.json").read_text())
    assert config["architectures"] == ["EagleLlamaForCausalLM"]
    assert config["num_hidden_layers"] == 1
    assert config["hidden_size"] == engine.target.config.hidden_size
    assert engine.eagle_head is not None and engine.draft is not None
    capacity = engine.max_context

    def memory(params: object, config: object, dtype: object) -> int:
        weights = sum(p.numel() * p.element_size() for p in params)  # type: ignore[attr-defined]
        kv = KVShape.of_config(config, dtype).bytes_per_token() * capacity  # type: ignore[arg-type]
        return int(weights + kv)

    head = engine.eagle_head
    head_bytes = memory(head.module.parameters(), head.config, head.dtype)
    draft_bytes = memory(engine.draft.parameters(), engine.draft.config, head.dtype)
    assert head_bytes < draft_bytes, (head_bytes, draft_bytes)
