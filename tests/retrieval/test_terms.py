"""Lexical analysis (retrieval.terms) and rank fusion (retrieval.fusion): pure functions."""

from __future__ import annotations

import pytest

from retrieval.fusion import RRF_K, fuse, reward_all_terms, rrf, single
from retrieval.terms import MAX_QUERY_TERMS, MAX_TERM_CHARS, chunk_terms, query_terms, terms


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("__init_subclass__", ["__init_subclass__", "init", "subclass"]),
        ("snake_case", ["snake_case", "snake", "case"]),
        ("os.path.join", ["os.path.join", "path.join", "os", "path", "join"]),
        ("HTTPServer", ["httpserver", "http", "server"]),
        ("CamelCase", ["camelcase", "camel", "case"]),
        ("PYTHONSAFEPATH", ["pythonsafepath"]),
        ("1,000,000", ["1,000,000", "1000000", "1", "000"]),
        ("3.14", ["3.14", "3", "14"]),
        ("ERR-4012", ["err-4012", "err", "4012"]),
        ("plain", ["plain"]),
        ("naïve", ["naïve"]),
    ],
)
def test_identifiers_are_kept_whole_and_split(text: str, expected: list[str]) -> None:
    assert terms(text) == expected


def test_a_name_ending_a_sentence_loses_only_the_full_stop() -> None:
    assert query_terms("What is __file__?") == ["__file__", "file"]
    assert query_terms("Call os.path.join.") == ["call", *query_terms("os.path.join")]


def test_question_and_passage_analyse_alike() -> None:
    """A name in a question yields exactly the terms it yields in a passage."""
    passage = terms("Call importlib.util.find_spec(name) to check.")
    for term in query_terms("importlib.util.find_spec"):
        assert term in passage


@pytest.mark.parametrize("question", ["?!?", "...", "the of and", "What is it?", "  -- ** "])
def test_punctuation_and_function_words_have_no_terms(question: str) -> None:
    assert query_terms(question) == []


def test_query_syntax_is_only_text() -> None:
    """FTS and SQL syntax characters separate words, as any punctuation does; AND is a word."""
    assert query_terms('"foo*" title:bar AND NEAR(baz, 3) OR \'qux\'') == [
        "foo", "title:bar", "title", "bar", "near", "baz", "3", "qux",
    ]  # fmt: skip


def test_long_tokens_and_long_questions_are_bounded() -> None:
    assert query_terms("x" * 5000) == ["x" * MAX_TERM_CHARS]
    many = " ".join(f"word{i}" for i in range(500))
    assert len(query_terms(many)) == MAX_QUERY_TERMS


def test_chunk_terms_are_space_separated_and_include_the_title() -> None:
    stored = chunk_terms("The import system", "Finders", "Use sys.meta_path to add one.")
    assert stored.split(" ") == terms("The import system Finders\nUse sys.meta_path to add one.")
    assert "  " not in stored and "sys.meta_path" in stored.split(" ")


def test_fuse_adds_min_max_normalised_scores() -> None:
    dense = [(1, 0.9), (2, 0.8), (3, 0.5)]
    lexical = [(3, 12.0), (4, 8.0), (5, 2.0)]
    by_id = {f.chunk_id: f for f in fuse(dense, lexical)}
    assert by_id[1].score == pytest.approx(1.0)  # best dense, absent from the lexical leg
    assert by_id[2].score == pytest.approx(0.75)
    assert by_id[3].score == pytest.approx(0.0 + 1.0)  # worst dense, best lexical
    assert by_id[4].score == pytest.approx(0.6) and by_id[5].score == 0.0
    assert [f.chunk_id for f in fuse(dense, lexical)] == [1, 3, 2, 4, 5]  # 1 and 3 tie: id order
    assert [f.chunk_id for f in fuse(dense, [(9, 3.0)])][:2] == [1, 9]  # a lone hit counts 1
    assert [f.chunk_id for f in fuse(dense, [])] == [1, 2, 3]  # no terms: the dense ranking


def test_reward_all_terms_lifts_only_the_chunks_holding_every_term() -> None:
    fused = fuse([(1, 0.9), (2, 0.8), (3, 0.5)], [(3, 12.0), (4, 8.0), (5, 2.0)])
    before = {f.chunk_id: f for f in fused}
    lifted = reward_all_terms(fused, {4, 5}, 1.0)
    assert [f.chunk_id for f in lifted] == [4, 1, 3, 5, 2]  # 4: 0.6 + 1; 5: 0 + 1 ties 1 and 3
    after = {f.chunk_id: f for f in lifted}
    assert after[4].score == pytest.approx(before[4].score + 1.0)
    assert all(after[c] == before[c] for c in (1, 2, 3))  # the others untouched
    assert (after[4].dense_rank, after[4].lexical_rank) == (None, 2)  # ranks kept for the audit
    assert reward_all_terms(fused, set(), 1.0) == fused  # no chunk holds every term
    assert reward_all_terms(fused, {4, 5}, 0.0) == fused  # off


def test_rrf_adds_reciprocal_ranks_and_breaks_ties_by_chunk_id() -> None:
    dense = [(1, 0.9), (2, 0.8), (3, 0.7)]
    lexical = [(3, 12.0), (4, 8.0)]
    fused = rrf(dense, lexical)
    by_id = {f.chunk_id: f for f in fused}
    assert by_id[3].score == pytest.approx(1 / (RRF_K + 3) + 1 / (RRF_K + 1))
    assert (by_id[3].dense_rank, by_id[3].lexical_rank) == (3, 1)
    assert (by_id[4].dense_rank, by_id[4].lexical_rank, by_id[4].lexical_score) == (None, 2, 8.0)
    assert [f.chunk_id for f in fused] == [3, 1, 2, 4]
    assert by_id[2].score == by_id[4].score  # rank 2 in one leg each: a tie, smaller id first


def test_single_leg_keeps_its_scores_and_ranks() -> None:
    ranked = single([(7, 3.5), (5, 1.0)], "lexical")
    assert [(f.chunk_id, f.score, f.lexical_rank, f.dense_rank) for f in ranked] == [
        (7, 3.5, 1, None), (5, 1.0, 2, None),
    ]  # fmt: skip
