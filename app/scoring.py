"""Answer-quality metrics: exact match, token F1, recall, faithfulness (pure text scoring).

The golden evaluations score with them, and the audit re-scores stored baseline answers of runs
recorded before their scores were stored; neither owns them, so they live here.

Exact match and token F1 follow SQuAD's evaluation: lower-case, drop punctuation and the articles
a/an/the, split on whitespace; F1 is the harmonic mean of token precision and recall over the
multiset of tokens. Faithfulness is the share of the answer's sentences that some cited passage
supports, "supports" meaning cosine similarity of their MiniLM embeddings >= a threshold.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
# Citation markers like [1] carry no meaning of their own: they would only dilute a sentence.
_CITATION = re.compile(r"\[\d+\]")


def normalize(text: str) -> list[str]:
    """SQuAD-normalized tokens of ``text``."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCT))
    return text.split()


def exact_match(answer: str, reference: str) -> bool:
    """Whether the normalized answer equals the normalized reference."""
    return normalize(answer) == normalize(reference)


def token_f1(answer: str, reference: str) -> float:
    """Token-overlap F1 between answer and reference (1.0 when both are empty)."""
    a, r = normalize(answer), normalize(reference)
    if not a or not r:
        return float(a == r)
    common = sum((Counter(a) & Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(a), common / len(r)
    return 2 * precision * recall / (precision + recall)


def retrieval_recall(expected: Sequence[str], documents: Sequence[str]) -> float | None:
    """Share of expected sources among the cited documents (a document matches when it ends with
    the expected source); None when nothing is expected."""
    if not expected:
        return None
    found = sum(any(d.endswith(e) for d in documents) for e in expected)
    return found / len(expected)


def sentences(text: str) -> list[str]:
    """The answer's sentences (citation markers removed), empty and one-character ones dropped."""
    parts = (" ".join(_CITATION.sub(" ", s).split()) for s in _SENTENCE_END.split(text))
    return [p for p in parts if len(p) > 1]


def faithfulness(
    answer: str, passages: Sequence[str], embedder: Any, threshold: float
) -> float | None:
    """Share of answer sentences whose best cited passage has cosine >= ``threshold``.

    None when the answer has no sentence; 0.0 when it has sentences but cites nothing.
    ``embedder.encode`` must return L2-normalized rows (retrieval's Embedder does).
    """
    said = sentences(answer)
    if not said:
        return None
    if not passages:
        return 0.0
    vectors = embedder.encode([*said, *passages])
    s, p = vectors[: len(said)], vectors[len(said) :]
    best = (np.asarray(s) @ np.asarray(p).T).max(axis=1)  # [num_sentences]
    return float((best >= threshold).mean())
