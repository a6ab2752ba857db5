"""build_prompt: numbered passages in rank order, fitted into the token budget."""

from __future__ import annotations

import pytest

from retrieval import Embedder, SearchHit, build_prompt
from retrieval.prompt import Passage, format_prompt


def hit(n: int, words: int, heading: str | None = "Section") -> SearchHit:
    text = " ".join(f"w{n}x{i}" for i in range(words))
    return SearchHit(f"docs/d{n}.md", n, 1.0 - n / 10, text, f"Doc {n}", heading, 0)


def words(text: str) -> int:
    return len(text.split())


def test_everything_fits_in_rank_order_with_titles() -> None:
    hits = [hit(1, 10), hit(2, 10, heading=None), hit(3, 10, heading="Doc 3")]
    prompt, cited = build_prompt("What is w?", hits, words, 1_000)
    assert cited == hits
    assert prompt == format_prompt(
        "What is w?",
        [Passage("Doc 1 — Section", hits[0].text), Passage("Doc 2", hits[1].text),
         Passage("Doc 3", hits[2].text)],
    )  # fmt: skip
    assert prompt.startswith("Passages:\n[1] Doc 1 — Section\n")
    assert prompt.endswith("\nQuestion: What is w?\nAnswer:")


def test_lowest_ranked_are_dropped_and_last_kept_is_cut_at_a_word() -> None:
    hits = [hit(1, 40), hit(2, 40), hit(3, 40)]
    bare = words(format_prompt("q?", []))
    one = words(format_prompt("q?", [Passage("Doc 1 — Section", hits[0].text)]))
    budget = one + 25  # room for the first passage and part of the second
    prompt, cited = build_prompt("q?", hits, words, budget)
    assert words(prompt) <= budget
    assert [h.chunk_id for h in cited] == [1, 2]
    assert cited[0] == hits[0]
    assert hits[1].text.startswith(cited[1].text) and len(cited[1].text) < len(hits[1].text)
    assert hits[1].text[len(cited[1].text)] == " "  # cut between words
    assert words(prompt) > budget - 3  # as much as fits: one more word would not
    assert "[3]" not in prompt and bare < budget


def test_a_cut_too_short_to_cite_is_dropped() -> None:
    hits = [hit(1, 40), hit(2, 40)]
    one = words(format_prompt("q?", [Passage("Doc 1 — Section", hits[0].text)]))
    prompt, cited = build_prompt("q?", hits, words, one + 8)
    assert [h.chunk_id for h in cited] == [1] and "[2]" not in prompt


def test_no_hits_and_question_over_budget() -> None:
    prompt, cited = build_prompt("Why?", [], words, 100)
    assert cited == [] and prompt == format_prompt("Why?", [])
    with pytest.raises(ValueError, match="over the budget of 3"):
        build_prompt("a long question with many words", [hit(1, 5)], words, 3)


def test_budget_in_real_tokenizer_tokens(embedder: Embedder) -> None:
    def count(text: str) -> int:
        return len(embedder.tokenizer.tokenize(text))

    hits = [hit(n, 120) for n in range(1, 6)]
    for budget in (60, 200, 450, 5_000):
        prompt, cited = build_prompt("Which word?", hits, count, budget)
        assert count(prompt) <= budget
        assert [f"[{i}]" in prompt for i in range(1, 6)] == [i <= len(cited) for i in range(1, 6)]
