"""FAISS indexes: approximate (IVF) search against exact IndexFlat on seeded data; updates."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from retrieval.indexes import all_vectors, apply_changes, kind_of, new_flat, new_ivf


def clustered(n: int, dim: int = 384, clusters: int = 200, seed: int = 0) -> np.ndarray:
    """Unit vectors around random centres: shaped like sentence embeddings, unlike pure noise."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype("float32")
    vectors = centres[rng.integers(0, clusters, n)] + 0.6 * rng.standard_normal((n, dim))
    vectors = vectors.astype("float32")
    faiss.normalize_L2(vectors)
    return vectors


def exact_top(vectors: np.ndarray, ids: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    index = new_flat(vectors.shape[1])
    index.add_with_ids(vectors, ids)
    return index.search(queries, k)[1]


def test_ivf_keeps_recall_at_5_against_exact_search() -> None:
    data = clustered(20_300)
    vectors, queries = data[:20_000], data[20_000:]  # held-out queries, same distribution
    ids = np.arange(100, 20_100, dtype="int64")
    truth = exact_top(vectors, ids, queries, 5)
    approx = new_ivf(vectors, ids).search(queries, 5)[1]
    recalls = np.array([len(set(t) & set(a)) / 5 for t, a in zip(truth, approx, strict=True)])
    # 300 queries: the mean's standard error is < 0.02, so 0.95 is a bound, not a coin toss.
    assert recalls.mean() >= 0.95, recalls.mean()
    # Exact search itself agrees with brute force numpy on the same data (sanity of the baseline).
    brute = ids[np.argsort(-(queries[:20] @ vectors.T), axis=1)[:, :5]]
    assert (truth[:20] == brute).mean() > 0.99


def test_flat_updates_match_a_fresh_exact_index() -> None:
    vectors = clustered(2_000)
    ids = np.arange(2_000, dtype="int64") * 3 + 7
    index = new_flat(384)
    index.add_with_ids(vectors[:1500], ids[:1500])
    drop = ids[:300]
    index = apply_changes(index, drop, ids[1500:], vectors[1500:], approx_threshold=10_000)
    assert kind_of(index) == "flat" and index.ntotal == 1700
    queries = clustered(50, seed=2)
    got = index.search(queries, 5)[1]
    want = exact_top(vectors[300:], ids[300:], queries, 5)
    assert (got == want).all()
    assert not set(got.ravel()) & set(drop.tolist())


def test_crossing_the_threshold_switches_kind_and_keeps_every_vector() -> None:
    vectors = clustered(3_000)
    ids = np.arange(3_000, dtype="int64")
    index = new_flat(384)
    index.add_with_ids(vectors[:1000], ids[:1000])
    index = apply_changes(index, ids[:0], ids[1000:], vectors[1000:], approx_threshold=2_000)
    assert kind_of(index) == "ivf" and index.ntotal == 3_000
    got_ids, got_vectors = all_vectors(index)
    order = np.argsort(got_ids)
    assert (got_ids[order] == ids).all() and np.allclose(got_vectors[order], vectors)
    # Removing below half the threshold goes back to exact search.
    index = apply_changes(index, ids[:2_500], ids[:0], vectors[:0], approx_threshold=2_000)
    assert kind_of(index) == "flat" and index.ntotal == 500
    assert sorted(all_vectors(index)[0].tolist()) == list(range(2_500, 3_000))


@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_removed_ids_never_come_back(kind: str) -> None:
    vectors = clustered(4_000)
    ids = np.arange(4_000, dtype="int64")
    index = new_ivf(vectors, ids) if kind == "ivf" else new_flat(384)
    if kind == "flat":
        index.add_with_ids(vectors, ids)
    index = apply_changes(index, ids[::2], ids[:0], vectors[:0], approx_threshold=3_000)
    found = index.search(vectors[:200], 10)[1]
    assert not (set(found.ravel()) - {-1}) & set(ids[::2].tolist())


def test_a_low_threshold_works_for_tiny_collections() -> None:
    vectors = clustered(60)
    ids = np.arange(60, dtype="int64")
    index = apply_changes(new_flat(384), ids[:0], ids, vectors, approx_threshold=10)
    assert kind_of(index) == "ivf" and index.ntotal == 60
    assert index.search(vectors[:1], 1)[1][0, 0] == 0
