"""Fusion of the dense and lexical rankings, and the search modes.

It exists so that the rule that orders hybrid results is written once. ``fuse`` normalises each
leg's scores over its own candidates to [0, 1] (min-max) and adds them: OpenSearch's
``min_max`` + ``arithmetic_mean`` normalisation processor, Weaviate's relative-score fusion.
Reciprocal rank fusion (``rrf``, Cormack et al. 2009: ``sum of 1 / (RRF_K + rank)``), the common
default, was measured beside it (benchmarks/retrieval_quality.py): RRF gives a chunk that only
the lexical leg ranks first, as an exact name's passage often is, no more than a chunk that both
legs rank around tenth, and lost a tenth of the exact-name questions; min-max keeps how far the
best lexical match stands above the rest (docs/lexical.md, "Why min-max fusion and not RRF").

``reward_all_terms`` then lifts the chunks that contain every term of the question (Lucene's
"coordination" idea, and what a user who types three keywords expects): BM25 adds up per-term
scores, so a chunk that repeats one of the question's words can outscore the passage holding
all of them, and min-max normalisation keeps only each leg's order. With the bonus at 1.0 (one
leg's best match) the first passage holds the answer for 14 more of 300 generated questions
over the demo corpus (15 better, 1 worse) and 2 more of the held-out 30, the exact-name sets'
MRR rises and the hand-written set's is unchanged.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Literal

SearchMode = Literal["hybrid", "dense", "lexical"]
SEARCH_MODES: tuple[SearchMode, ...] = ("hybrid", "dense", "lexical")
RRF_K = 60
ALL_TERMS_BONUS = 1.0
"""Added to the fused score (0 to 2) of a chunk holding every term of the question."""


@dataclass(frozen=True)
class Fused:
    """One chunk's place in the fused ranking and in each leg (ranks from 1; None: absent)."""

    chunk_id: int
    score: float
    dense_rank: int | None
    dense_score: float | None
    lexical_rank: int | None
    lexical_score: float | None


def fuse(dense: Sequence[tuple[int, float]], lexical: Sequence[tuple[int, float]]) -> list[Fused]:
    """Every chunk of either ranking (each ``(chunk id, score)``, best first) by the sum of its
    min-max normalised scores (0 in a leg that lacks it; a leg's only score counts 1); equal
    sums in chunk-id order, so every host cuts the list at the same place."""
    return _combine(dense, lexical, [_minmax(dense), _minmax(lexical)])


def rrf(
    dense: Sequence[tuple[int, float]],
    lexical: Sequence[tuple[int, float]],
    k: int = RRF_K,
    lexical_weight: float = 1.0,
) -> list[Fused]:
    """As ``fuse`` but by reciprocal rank fusion (the lexical term times ``lexical_weight``):
    kept for the benchmark that compares the two."""
    dense_part = [1.0 / (k + r) for r in range(1, len(dense) + 1)]
    lexical_part = [lexical_weight / (k + r) for r in range(1, len(lexical) + 1)]
    return _combine(dense, lexical, [dense_part, lexical_part])


def reward_all_terms(
    fused: Sequence[Fused], holding: Collection[int], bonus: float = ALL_TERMS_BONUS
) -> list[Fused]:
    """``fused`` with ``bonus`` added to the score of every chunk in ``holding`` (the candidates
    that contain every term of the question), in the same order as ``fuse`` gives: by score,
    equal scores in chunk-id order."""
    if not holding or bonus == 0:
        return list(fused)
    lifted = [replace(f, score=f.score + bonus) if f.chunk_id in holding else f for f in fused]
    return sorted(lifted, key=lambda f: (-f.score, f.chunk_id))


def _minmax(ranking: Sequence[tuple[int, float]]) -> list[float]:
    if not ranking:
        return []
    low, high = min(s for _, s in ranking), max(s for _, s in ranking)
    return [(s - low) / (high - low) if high > low else 1.0 for _, s in ranking]


def _combine(
    dense: Sequence[tuple[int, float]],
    lexical: Sequence[tuple[int, float]],
    parts: list[list[float]],
) -> list[Fused]:
    """Chunks by the sum of their per-leg ``parts`` (aligned with each ranking)."""
    found: dict[int, list[float | int | None]] = {}
    for rank, (chunk_id, score) in enumerate(dense, start=1):
        found.setdefault(chunk_id, [None, None, None, None])[0:2] = [rank, score]
    for rank, (chunk_id, score) in enumerate(lexical, start=1):
        found.setdefault(chunk_id, [None, None, None, None])[2:4] = [rank, score]
    fused = []
    for chunk_id, (d_rank, d_score, l_rank, l_score) in found.items():
        total = 0.0 if d_rank is None else parts[0][int(d_rank) - 1]
        total += 0.0 if l_rank is None else parts[1][int(l_rank) - 1]
        fused.append(Fused(chunk_id, total, _int(d_rank), _float(d_score), _int(l_rank),
                           _float(l_score)))  # fmt: skip
    return sorted(fused, key=lambda f: (-f.score, f.chunk_id))


def single(ranking: Sequence[tuple[int, float]], leg: SearchMode) -> list[Fused]:
    """One leg's ranking as it is (its own scores), for the dense-only and lexical-only modes."""
    if leg == "dense":
        return [Fused(c, s, r, s, None, None) for r, (c, s) in enumerate(ranking, start=1)]
    return [Fused(c, s, None, None, r, s) for r, (c, s) in enumerate(ranking, start=1)]


def _int(value: float | int | None) -> int | None:
    return None if value is None else int(value)


def _float(value: float | int | None) -> float | None:
    return None if value is None else float(value)
