"""Where the passage holding the answer sits in the training prompts (training/qa.py).

The raw pair's data put it first most of the time (retrieval's prior); the instruct pair's
second fine-tune draws it uniformly so that citing [1] whatever it holds stops paying. Both
are checked as distributions (chi-square), and the answer must cite the gold passage's number.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from scipy.stats import chisquare

from training.corpus import build_corpus
from training.qa import RETRIEVAL_GOLD_WEIGHTS, UNIFORM_GOLD_WEIGHTS, make_examples

pytestmark = pytest.mark.models

N = 600


def _cited_positions(weights: tuple[float, ...]) -> Counter[int]:
    docs = [d for d in build_corpus(0).train if d.source.startswith("demo/corpus/")]
    examples = make_examples(docs, N, seed=7, n_passages=(3,), gold_weights=weights)
    counts: Counter[int] = Counter()
    for ex in examples:
        m = re.search(r"\[(\d)\]", ex.answer)
        assert m is not None, ex.answer
        n = int(m.group(1))
        q = re.search(r'(?:According to \[\d\], |says: )"(.*)"$', ex.answer, re.DOTALL)
        assert q is not None, ex.answer
        quote = q.group(1)
        # The cited passage is the one that holds the quote (line breaks may be flattened).
        assert " ".join(quote.split()) in " ".join(ex.passages[n - 1].text.split()), ex.answer
        counts[n] += 1
    return counts


def test_uniform_gold_position_is_uniform() -> None:
    counts = _cited_positions(UNIFORM_GOLD_WEIGHTS)
    observed = [counts[n] for n in (1, 2, 3)]
    assert sum(observed) == N
    assert chisquare(observed).pvalue > 1e-3, observed


def test_retrieval_gold_position_follows_its_weights() -> None:
    counts = _cited_positions(RETRIEVAL_GOLD_WEIGHTS)
    observed = [counts[n] for n in (1, 2, 3)]
    total = sum(RETRIEVAL_GOLD_WEIGHTS)
    expected = [N * w / total for w in RETRIEVAL_GOLD_WEIGHTS]
    assert chisquare(observed, expected).pvalue > 1e-3, observed
    # and it is not uniform: the test above could not pass on this data
    assert chisquare(observed).pvalue < 1e-6, observed
