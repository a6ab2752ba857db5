"""LexicalIndex queries on a real Tantivy index held in memory (no embedding model)."""

from __future__ import annotations

from retrieval.lexical import LexicalIndex
from retrieval.terms import chunk_terms, query_terms

PASSAGES = {
    1: "Descaling a kettle removes the scale; descaling the kettle keeps it quiet.",
    2: "For the kettle, descaling with white vinegar works as well as any tablet.",
    3: "White vinegar pickles vegetables and dresses salads.",
    4: "The kettle's vinegar smell fades after descaling twice.",
}


def build() -> LexicalIndex:
    ids = list(PASSAGES)
    return LexicalIndex.build(ids, [chunk_terms("Kitchen", None, PASSAGES[i]) for i in ids])


def test_holding_all_names_the_given_chunks_that_hold_every_term() -> None:
    index = build()
    words = query_terms("What about kettle descaling vinegar?")
    assert words == ["kettle", "descaling", "vinegar"]
    assert index.holding_all(words, [1, 2, 3, 4]) == {2, 4}
    assert index.holding_all(words, [1, 2, 3]) == {2}  # only among the chunk ids given
    assert index.holding_all(words, [1, 3]) == set()
    assert index.holding_all(["kettle", "descale"], [1, 2, 3, 4]) == set()  # no stemming
    assert index.holding_all(["kettle"], [1, 2, 3, 4]) == {1, 2, 4}
    assert index.holding_all([], [1, 2]) == set() and index.holding_all(words, []) == set()
