"""Sentence spans, citation markers, lexical checks and the per-answer shares (no model)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from retrieval.grounding import Support, ground, split_sentences
from retrieval.grounding.checks import content_terms, evidence, named, negated, numbers
from retrieval.grounding.passages import passage_view


def test_sentences_keep_their_spans_and_markers() -> None:
    text = (
        "The value is 3.12. [2] Next, e.g. this one [1][3]! Is it?\n\n- item one\n- item two [4, 5]"
    )
    said = split_sentences(text)
    assert [s.text for s in said] == [
        "The value is 3.12. [2]",
        "Next, e.g. this one [1][3]!",
        "Is it?",
        "- item one",
        "- item two [4, 5]",
    ]
    assert all(text[s.start : s.end] == s.text for s in said)
    assert [s.markers for s in said] == [(2,), (1, 3), (), (), (4, 5)]
    assert said[1].claim == "Next, e.g. this one !"
    assert said[4].claim == "item two"


def test_an_attribution_to_a_marker_is_not_part_of_the_claim() -> None:
    text = (
        'According to [1], "The except clause, if present, must be last." As stated in [2]: it '
        "matches. In [1][3] the value is 3. According to the manual, it is 4 [2]. In Python it is 5."
    )
    said = split_sentences(text)
    assert [s.claim for s in said] == [
        '"The except clause, if present, must be last."',
        "it matches.",
        "the value is 3.",
        "According to the manual, it is 4 .",  # no marker as its object: a claim of its own
        "In Python it is 5.",
    ]
    assert [s.markers for s in said] == [(1,), (2,), (1, 3), (2,), ()]
    assert all(text[s.start : s.end] == s.text for s in said)  # the text itself is kept


def test_a_lone_marker_line_cites_the_sentence_before_it() -> None:
    said = split_sentences("It ends here.\n\n[2]")
    assert len(said) == 1 and said[0].markers == (2,) and said[0].end == len("It ends here.\n\n[2]")


def test_empty_and_marker_only_texts_have_no_sentences() -> None:
    assert split_sentences("") == []
    assert split_sentences("  [1] ") == []


def test_checks_see_numbers_names_and_negations() -> None:
    assert numbers("It holds 1,000 items in 3.12 and [2].") == {"1000", "3.12", "2"}
    assert "assertionerror" in named("It raises AssertionError when asked.")
    assert "os.path.join" in named("Use os.path.join here.")
    assert negated("It does not stop.") and negated("It can't stop.") and not negated("It stops.")


def test_negation_mismatch_is_read_against_the_best_window() -> None:
    view = passage_view("Assignments to __debug__ are illegal. The value is not a constant.")
    windows = [(w[0], w[1]) for w in view.windows]

    def mismatch(claim: str) -> tuple[str, float]:
        ev = evidence(claim, content_terms(claim), view.text, view.terms, windows)
        return windows[ev.window][0], ev.negation_mismatch

    # A negation added, or removed, on a term the best window holds: a mismatch either way.
    assert mismatch("Assignments to __debug__ are not illegal.") == (
        "Assignments to __debug__ are illegal.",
        1.0,
    )
    assert mismatch("The value is a constant.") == ("The value is not a constant.", 1.0)
    # The same polarity, or a negation elsewhere in the passage: none.
    assert mismatch("Assignments to __debug__ are illegal.")[1] == 0.0
    assert mismatch("The value is not a constant.")[1] == 0.0


class TableScorer:
    """Scores from a table: claim text -> one score per passage (a fake for the shares' logic)."""

    name = "table"
    threshold = 0.5

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = table

    def support(self, claims: Sequence[str], passages: Sequence[str], known: Any = None) -> Support:
        scores = np.array([self.table[c] for c in claims], dtype=np.float64)
        return Support(scores, [[(0, len(p)) for p in passages] for _ in claims])


def test_groundedness_and_citation_shares() -> None:
    scorer = TableScorer({"A.": [0.9, 0.1], "B.": [0.2, 0.7], "C.": [0.1, 0.2]})
    g = ground("A. [1][2] B. [1] C. [2]", ["p0", "p1"], scorer)
    assert g.groundedness == pytest.approx(2 / 3)
    # Markers: [1] on A (supports), [2] on A (no), [1] on B (no), [2] on C (no).
    assert g.citation_precision == pytest.approx(1 / 4)
    # Supported sentences A and B; only A's markers include a supporter.
    assert g.citation_recall == pytest.approx(1 / 2)
    assert [s.supported_by for s in g.sentences] == [[0], [1], []]
    assert [s.score for s in g.sentences] == [0.9, 0.7, 0.2]
    assert g.sentences[0].support[0].passage == 0


def test_markers_out_of_range_count_as_unsupported() -> None:
    g = ground("A. [7]", ["p0"], TableScorer({"A.": [0.9]}))
    assert g.citation_precision == 0.0 and g.citation_recall == 0.0


@pytest.mark.parametrize(
    ("answer", "passages", "reason"),
    [("", ["p"], "empty answer"), ("  [1] ", ["p"], "no sentences"), ("A.", [], "no passages")],
)
def test_nothing_to_judge_gives_null_with_a_reason(
    answer: str, passages: list[str], reason: str
) -> None:
    g = ground(answer, passages, TableScorer({"A.": []}))
    assert g.groundedness is None and g.reason == reason and g.sentences == []
