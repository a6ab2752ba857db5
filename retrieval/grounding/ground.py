"""One answer's grounding: per sentence the passages that support it, and the answer's shares.

It exists so that the worker, ``specrag grounding check`` and the benchmarks compute the same
thing the same way. Passages are indexed from 0 (``supported_by``); a citation marker ``[n]``
points to passage ``n - 1``, as the prompt numbers them from 1. Per answer:

- ``groundedness``: share of sentences with a supporting passage;
- ``citation_precision``: share of the markers (each marker of each sentence once) that point to
  a passage supporting their sentence; null when the answer has no marker;
- ``citation_recall``: share of the supported sentences whose markers include a supporting
  passage; null when no sentence is supported.

The answer's text and markers are read, never changed. Grounding is null with a ``reason`` when
there is nothing to judge: an empty answer, an answer without sentences, no passages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from retrieval.grounding.scorer import Known, SupportScorer
from retrieval.grounding.sentences import split_sentences


@dataclass(frozen=True)
class PassageSupport:
    """One passage supporting a sentence: its index, score and the span of it that does."""

    passage: int
    score: float
    start: int
    end: int


@dataclass(frozen=True)
class SentenceGrounding:
    """One sentence: its span in the answer, best score, supporting passages and its markers."""

    text: str
    start: int
    end: int
    score: float
    supported_by: list[int]
    markers: list[int] = field(default_factory=list)
    support: list[PassageSupport] = field(default_factory=list)


@dataclass(frozen=True)
class Grounding:
    """An answer's grounding, or (``groundedness`` None) the reason it has none."""

    groundedness: float | None
    sentences: list[SentenceGrounding]
    citation_precision: float | None = None
    citation_recall: float | None = None
    reason: str | None = None
    scorer: str | None = None
    threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``specrag grounding check``'s line plus citation shares)."""
        return asdict(self)


def ground(
    answer: str, passages: Sequence[str], scorer: SupportScorer, known: Known | None = None
) -> Grounding:
    """The grounding of ``answer`` against ``passages`` (indexed from 0) under ``scorer``;
    ``known``: the passages' vectors where they were stored (the fused scorer then encodes only
    the answer's claims)."""
    name, threshold = scorer.name, scorer.threshold
    if not answer.strip():
        return Grounding(None, [], reason="empty answer", scorer=name, threshold=threshold)
    said = split_sentences(answer)
    if not said:
        return Grounding(None, [], reason="no sentences", scorer=name, threshold=threshold)
    if not passages:
        return Grounding(None, [], reason="no passages", scorer=name, threshold=threshold)
    support = scorer.support([s.claim for s in said], list(passages), known)
    out: list[SentenceGrounding] = []
    marks = marks_supported = supported = supported_cited = 0
    for i, sentence in enumerate(said):
        row = support.scores[i]
        good = [j for j in range(len(passages)) if row[j] >= threshold]
        good.sort(key=lambda j: -row[j])
        backing = [PassageSupport(j, float(row[j]), *support.spans[i][j]) for j in good]
        cited = [m - 1 for m in sentence.markers]
        marks += len(cited)
        marks_supported += sum(1 for j in cited if j in good)
        if good:
            supported += 1
            supported_cited += int(any(j in good for j in cited))
        out.append(
            SentenceGrounding(
                text=sentence.text,
                start=sentence.start,
                end=sentence.end,
                score=float(row.max()),
                supported_by=good,
                markers=list(sentence.markers),
                support=backing,
            )
        )
    return Grounding(
        groundedness=supported / len(said),
        sentences=out,
        citation_precision=marks_supported / marks if marks else None,
        citation_recall=supported_cited / supported if supported else None,
        scorer=name,
        threshold=threshold,
    )
