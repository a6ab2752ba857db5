"""Reciprocal rank fusion of the dense and lexical rankings, and the search modes.

It exists so that the rule that orders hybrid results is written once. RRF (Cormack et al.,
2009) scores a chunk ``sum over legs of 1 / (RRF_K + rank)``: it needs no calibration between a
cosine and a BM25 score, which live on unrelated scales and shift with the collection, and it is
the default of the systems that run both legs (Elasticsearch, OpenSearch, Vespa, Weaviate).
The alternative measured beside it (min-max normalised scores, summed) is in
benchmarks/retrieval.py; docs/benchmarks.md has the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

SearchMode = Literal["hybrid", "dense", "lexical"]
SEARCH_MODES: tuple[SearchMode, ...] = ("hybrid", "dense", "lexical")
RRF_K = 60


@dataclass(frozen=True)
class Fused:
    """One chunk's place in the fused ranking and in each leg (ranks from 1; None: absent)."""

    chunk_id: int
    score: float
    dense_rank: int | None
    dense_score: float | None
    lexical_rank: int | None
    lexical_score: float | None


def fuse(
    dense: Sequence[tuple[int, float]],
    lexical: Sequence[tuple[int, float]],
    k: int = RRF_K,
) -> list[Fused]:
    """Every chunk of either ranking (each ``(chunk id, score)``, best first), by RRF score;
    equal scores in chunk-id order, so every host cuts the list at the same place."""
    found: dict[int, list[float | int | None]] = {}
    for rank, (chunk_id, score) in enumerate(dense, start=1):
        found.setdefault(chunk_id, [None, None, None, None])[0:2] = [rank, score]
    for rank, (chunk_id, score) in enumerate(lexical, start=1):
        found.setdefault(chunk_id, [None, None, None, None])[2:4] = [rank, score]
    fused = []
    for chunk_id, (d_rank, d_score, l_rank, l_score) in found.items():
        total = sum(1.0 / (k + int(r)) for r in (d_rank, l_rank) if r is not None)
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
