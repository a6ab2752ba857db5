"""Method ``suffix``: greedy answers are the target's with and without a scope's past answers, at
every k and batch composition; the memory's bounds, scopes and refusals.

The scope holds the target's own greedy answers to some prompts (re-asking them drafts long,
accepted chains) and corrupted copies of others (drafts the target rejects), so accepted,
rejected and recovered tokens all occur.
"""

from __future__ import annotations

import logging
import random

import pytest

from generation import SamplingParams, SpeculativeEngine
from generation.config import EngineConfig
from generation.spec_decode.suffix import SuffixMemory, SuffixProposer
from tests.generation.batch_support import References, check_greedy
from tests.generation.conformance import check_stats_invariants
from tests.generation.tiny_models import build_model

VOCAB = 96
MAX_NEW = 40


@pytest.fixture(scope="module")
def engine() -> SpeculativeEngine:
    target = build_model(
        "llama", vocab_size=VOCAB, seed=3, hidden_size=32, num_layers=2, logit_scale=3.0
    )
    return SpeculativeEngine(target, config=EngineConfig(max_speculative_tokens=8))


def _prompts() -> list[list[int]]:
    rng = random.Random(5)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(6, 30))] for _ in range(6)]
    prompts.append(prompts[0][:10] * 3)  # repeats a passage: the request's own tree matches
    return prompts


@pytest.fixture(scope="module")
def references(engine: SpeculativeEngine) -> list[list[int]]:
    """Greedy answers of ``none``; scope "seen" holds those of prompts 0-2 as past answers and
    corrupted copies of those of prompts 3-4."""
    refs = References(engine.target)
    answers = [refs(p, MAX_NEW) for p in _prompts()]
    memory = engine.suffix_memory
    assert memory is not None
    rng = random.Random(9)
    for i, answer in enumerate(answers[:5]):
        stored = list(answer)
        if i >= 3:  # every fourth token replaced: long matches, then a rejected draft
            stored = [rng.randrange(VOCAB) if j % 4 == 3 else t for j, t in enumerate(stored)]
        memory.add("seen", f"answer-{i}", stored)
    return answers


@pytest.mark.parametrize("k", [1, 3, 8, 16, "auto"])
@pytest.mark.parametrize("scope", [None, "seen"])
@pytest.mark.parametrize("max_batch_size", [1, 3, 16])
def test_greedy_suffix_equals_none(
    engine: SpeculativeEngine,
    references: list[list[int]],
    k: int | str,
    scope: str | None,
    max_batch_size: int,
) -> None:
    prompts = _prompts()
    params = SamplingParams(
        max_new_tokens=MAX_NEW, method="suffix", num_speculative_tokens=k, suffix_scope=scope
    )
    results = engine.generate_many(prompts, params, max_batch_size=max_batch_size)
    for prompt, expected, result in zip(prompts, references, results, strict=True):
        assert not check_greedy(engine.target, prompt, result.token_ids, expected)
        check_stats_invariants(result.stats, len(result.token_ids), MAX_NEW)
        assert result.stats.method == "suffix"
    if scope == "seen" and k in (8, 16):
        # Re-asked questions draft their whole past answer: few target passes.
        for result in results[:3]:
            assert result.stats.mean_acceptance_length is not None
            assert result.stats.mean_acceptance_length > 4.0, result.stats
        # Corrupted past answers are drafted and partly rejected.
        assert any(r.stats.num_accepted_tokens < r.stats.num_draft_tokens for r in results[3:5])


def test_auto_drafts_the_trees_chain_past_k_max_from_the_first_token(
    engine: SpeculativeEngine,
) -> None:
    """Past answers held after their prompts' last 32 tokens (as the service holds them): a
    repeated prompt's "auto" rounds draft its whole answer at once, up to
    ``suffix_max_speculative_tokens`` (32), not ``max_speculative_tokens`` (8)."""
    memory = engine.suffix_memory
    assert memory is not None and engine.max_speculative_tokens == 8
    rng = random.Random(11)
    prompts = [[rng.randrange(VOCAB) for _ in range(40)] for _ in range(3)]
    none = SamplingParams(max_new_tokens=MAX_NEW, method="none")
    answers = [engine.generate(p, none).token_ids for p in prompts]
    for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        memory.add("tails", f"answer-{i}", prompt[-32:] + answer)
        memory.add("answers", f"answer-{i}", answer)
    for prompt, expected in zip(prompts, answers, strict=True):
        rounds = {}
        for scope in ("answers", "tails"):
            params = SamplingParams(max_new_tokens=MAX_NEW, method="suffix",
                                    num_speculative_tokens="auto", suffix_scope=scope)  # fmt: skip
            result = engine.generate(prompt, params)
            assert result.token_ids == expected
            check_stats_invariants(result.stats, len(result.token_ids), MAX_NEW)
            rounds[scope] = result.stats.num_drafts
        # 39 tokens after the first: a round of 32 drafts, then one of the rest, all accepted.
        assert rounds["tails"] == 2, result.stats
        assert result.stats.num_accepted_tokens == MAX_NEW - 1 - 2
        assert rounds["answers"] > rounds["tails"]  # answers alone: chains grow with the match


def test_mixed_methods_in_one_batch(engine: SpeculativeEngine, references: list[list[int]]) -> None:
    prompts = _prompts()
    kinds = [("suffix", 4, "seen"), ("ngram", 3, None), ("none", 1, None), ("suffix", "auto", None)]
    params = [
        SamplingParams(
            max_new_tokens=MAX_NEW, method=m, num_speculative_tokens=k, suffix_scope=scope
        )
        for m, k, scope in (kinds[i % len(kinds)] for i in range(len(prompts)))
    ]
    results = engine.generate_many(prompts, params, max_batch_size=4)
    for prompt, expected, result in zip(prompts, references, results, strict=True):
        assert not check_greedy(engine.target, prompt, result.token_ids, expected)


def test_scope_without_history_drafts_from_the_prompt(
    engine: SpeculativeEngine, references: list[list[int]]
) -> None:
    prompt = _prompts()[-1]  # a repeated passage
    alone = SamplingParams(max_new_tokens=MAX_NEW, method="suffix", num_speculative_tokens=4)
    empty = SamplingParams(
        max_new_tokens=MAX_NEW, method="suffix", num_speculative_tokens=4, suffix_scope="nobody"
    )
    a, b = engine.generate(prompt, alone), engine.generate(prompt, empty)
    assert a.token_ids == b.token_ids == references[-1]
    assert a.stats.num_draft_tokens == b.stats.num_draft_tokens > 0
    proposer = SuffixProposer(SuffixMemory(), "nobody", max_depth=64)
    assert proposer.propose([5, 6, 7, 8, 9, 5, 6, 7], 3) == [8, 9, 5]


def test_drafts_never_cross_scopes() -> None:
    memory = SuffixMemory()
    distinctive = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    memory.add("tenant-a/docs", "a-1", distinctive)
    question = [1, 2, 3, 11, 12, 13]
    a = SuffixProposer(memory, "tenant-a/docs").propose(question, 8)
    b = SuffixProposer(memory, "tenant-b/docs").propose(question, 8)
    none = SuffixProposer(memory, None).propose(question, 8)
    assert a == [14, 15, 16]  # the match is 3 tokens long: max_spec_factor 1 proposes 3
    assert b == [] and none == []
    memory.add("tenant-b/docs", "b-1", [11, 12, 13, 40, 41, 42])
    assert SuffixProposer(memory, "tenant-b/docs").propose(question, 8) == [40, 41, 42]
    assert SuffixProposer(memory, "tenant-a/docs").propose(question, 8) == [14, 15, 16]


@pytest.mark.parametrize(
    "bad",
    [[1, 2, VOCAB], [1, -2, 3], [1, "2", 3], [1, 2.0, 3], [True, 1], "123", None, [2**40]],
    ids=["past-vocab", "negative", "str-id", "float-id", "bool-id", "string", "none", "huge"],
)
def test_corrupt_id_lists_are_skipped_and_logged(
    bad: object, caplog: pytest.LogCaptureFixture
) -> None:
    memory = SuffixMemory()
    memory.set_vocab_size(VOCAB)
    with caplog.at_level(logging.WARNING, logger="generation.spec_decode.suffix"):
        assert memory.add("s", "bad", bad) is False  # type: ignore[arg-type]
    assert "answer bad of scope s skipped" in caplog.text
    assert memory.size("s") == 0 and memory.scopes() == []
    assert SuffixProposer(memory, "s").propose([1, 2], 4) == []


def test_set_vocab_size_drops_answers_outside_it(caplog: pytest.LogCaptureFixture) -> None:
    memory = SuffixMemory()
    memory.add("s", "foreign", [1, 2, 500])  # before an engine told the memory its vocabulary
    memory.add("s", "ours", [1, 2, 50])
    with caplog.at_level(logging.WARNING, logger="generation.spec_decode.suffix"):
        memory.set_vocab_size(VOCAB)
    assert "answer foreign of scope s dropped" in caplog.text
    assert memory.size("s") == 1
    assert SuffixProposer(memory, "s").propose([7, 1, 2], 4) == [50]
    with pytest.raises(ValueError, match="vocabulary of 96 ids; an engine of 100"):
        memory.set_vocab_size(100)


def test_bounds_eviction_remove_and_idempotent_add() -> None:
    memory = SuffixMemory(max_answers_per_scope=3, max_depth=16)
    for i in range(5):
        assert memory.add("s", f"a{i}", [10 * i + 1, 10 * i + 2, 10 * i + 3])
    assert memory.add("s", "a4", [9, 9, 9]) is False  # heard twice: held once
    assert memory.size("s") == 3
    proposer = SuffixProposer(memory, "s", max_depth=16)
    assert proposer.propose([5, 1, 2], 1) == []  # the oldest answers are out
    assert proposer.propose([5, 41, 42], 1) == [43]
    memory.remove("s", "a4")
    memory.remove("s", "never")
    memory.remove("other", "a1")
    assert memory.size("s") == 2
    assert proposer.propose([5, 41, 42], 1) == []
    before = memory.memory_bytes()
    memory.drop_scope("s")
    assert memory.scopes() == [] and memory.memory_bytes() < before
    with pytest.raises(ValueError, match="max_answers_per_scope must be an int >= 1"):
        SuffixMemory(max_answers_per_scope=0)


def test_the_engine_shares_a_given_memory_and_refuses_suffix_without_the_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=1, hidden_size=32, num_layers=1)
    memory = SuffixMemory(max_answers_per_scope=10)
    engine = SpeculativeEngine(target, suffix_memory=memory)
    assert engine.suffix_memory is memory and "suffix" in engine.methods
    assert memory.vocab_size == VOCAB
    monkeypatch.setattr("generation.torch_engine.suffix_available", lambda: False)
    without = SpeculativeEngine(target)
    assert without.suffix_memory is None and "suffix" not in without.methods
    with pytest.raises(ValueError, match="'suffix' needs arctic-inference's suffix tree"):
        without.generate([1, 2], SamplingParams(method="suffix"))


def test_suffix_scope_is_validated() -> None:
    for bad in ("", 3):
        with pytest.raises(ValueError, match="suffix_scope: must be a non-empty string"):
            SamplingParams(method="suffix", suffix_scope=bad)  # type: ignore[arg-type]
