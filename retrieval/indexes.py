"""FAISS indexes for one collection: exact below a size threshold, IVF (approximate) above.

It exists to keep every FAISS detail in one place. Vector ids are chunk ids from the database.
Small collections use ``IndexIDMap2(IndexFlatIP)``: exact inner product (= cosine on unit
vectors). Past ``approx_threshold`` vectors a collection switches to ``IndexIVFFlat``, which keeps
incremental adds and removals cheap (no graph to rebuild) and whose recall against exact search
is measured in tests/retrieval/test_indexes.py and benchmarks/retrieval.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import faiss
import numpy as np

IndexKind = Literal["flat", "ivf"]
# Probing this fraction of the lists keeps recall@5 >= 0.95 on clustered embeddings
# (tests/retrieval/test_indexes.py holds it to that).
IVF_PROBE_FRACTION = 1 / 16
IVF_MIN_PROBES = 16
# k-means on this many points per list is plenty; more only slows the switch.
TRAIN_POINTS_PER_LIST = 64
# Vectors added between two progress reports of a large build.
BUILD_BLOCK = 100_000


def kind_of(index: faiss.Index) -> IndexKind:
    """ "flat" for the exact index, "ivf" for the approximate one."""
    return "ivf" if isinstance(index, faiss.IndexIVF) else "flat"


def new_flat(dim: int) -> faiss.Index:
    """An empty exact index whose ids are chunk ids."""
    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


def ivf_nlist(num_vectors: int) -> int:
    """Number of IVF lists for a collection of this size: about 4·sqrt(n) (a power of two), but
    never fewer than 39 vectors per list, FAISS's minimum for k-means to train well."""
    rule = 2 ** round(math.log2(4 * math.sqrt(max(num_vectors, 1))))
    return max(1, min(rule, num_vectors // 39))


def new_ivf(vectors: np.ndarray, ids: np.ndarray, seed: int = 1234) -> faiss.Index:
    """An IVF index trained on (a seeded sample of) ``vectors`` and holding all of them."""
    dim = vectors.shape[1]
    nlist = ivf_nlist(len(vectors))
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    sample = vectors
    if len(vectors) > TRAIN_POINTS_PER_LIST * nlist:
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(vectors), TRAIN_POINTS_PER_LIST * nlist, replace=False)
        sample = vectors[np.sort(pick)]
    index.train(sample)
    index.add_with_ids(vectors, ids)
    set_search_params(index)
    return index


def set_search_params(index: faiss.Index) -> None:
    """Search-time settings that FAISS does not persist with the file (IVF probes)."""
    if isinstance(index, faiss.IndexIVF):
        index.nprobe = min(index.nlist, max(IVF_MIN_PROBES, int(index.nlist * IVF_PROBE_FRACTION)))


def all_vectors(index: faiss.Index) -> tuple[np.ndarray, np.ndarray]:
    """Every ``(ids [n], vectors [n, dim])`` the index holds, in no particular order."""
    if isinstance(index, faiss.IndexIVF):
        from faiss.contrib.inspect_tools import get_invlist  # heavy: faiss.contrib

        id_parts, vec_parts = [], []
        for list_no in range(index.nlist):
            list_ids, codes = get_invlist(index.invlists, list_no)
            id_parts.append(list_ids)
            vec_parts.append(codes.view("float32").reshape(len(list_ids), index.d))
        return np.concatenate(id_parts).astype("int64"), np.concatenate(vec_parts)
    idmap: Any = index  # IndexIDMap2 (swig types are opaque to mypy)
    ids = faiss.vector_to_array(idmap.id_map).astype("int64")
    vectors = idmap.index.reconstruct_n(0, index.ntotal) if index.ntotal else np.zeros((0, index.d))
    return ids, np.ascontiguousarray(vectors, dtype=np.float32)


def rebuilt(ids: np.ndarray, vectors: np.ndarray, dim: int, approx_threshold: int) -> faiss.Index:
    """A fresh index of the right kind for this many vectors."""
    if len(ids) > approx_threshold:
        return new_ivf(vectors, ids)
    index = new_flat(dim)
    if len(ids):
        index.add_with_ids(vectors, ids)
    return index


def apply_changes(
    index: faiss.Index,
    remove_ids: np.ndarray,  # [r] int64 chunk ids
    add_ids: np.ndarray,  # [a] int64 chunk ids
    add_vectors: np.ndarray,  # [a, dim] float32, unit length
    approx_threshold: int,
) -> faiss.Index:
    """The index after removing and adding vectors: ``index`` itself, changed in place, or a
    rebuilt one when the collection crossed the size threshold or outgrew its IVF lists."""
    if len(remove_ids):
        index.remove_ids(faiss.IDSelectorBatch(np.ascontiguousarray(remove_ids, dtype="int64")))
    if len(add_ids):
        index.add_with_ids(np.ascontiguousarray(add_vectors, dtype="float32"), add_ids)
    total = index.ntotal
    kind = kind_of(index)
    needs_ivf = total > approx_threshold
    # Hysteresis (halve / quadruple) so a collection near a boundary does not rebuild each write.
    switch = (kind == "flat" and needs_ivf) or (kind == "ivf" and total < approx_threshold // 2)
    outgrown = kind == "ivf" and ivf_nlist(total) >= 4 * getattr(index, "nlist", 1)
    if switch or outgrown:
        ids, vectors = all_vectors(index)
        return rebuilt(ids, vectors, index.d, approx_threshold)
    return index


def centroids_of(index: faiss.Index) -> np.ndarray | None:
    """The IVF coarse centroids ``[nlist, dim]`` float32, or None for the exact index."""
    if not isinstance(index, faiss.IndexIVF):
        return None
    quantizer: Any = index.quantizer
    return np.ascontiguousarray(quantizer.reconstruct_n(0, index.nlist), dtype=np.float32)


def build(
    kind: str,
    centroids: np.ndarray | None,  # [nlist, dim] float32, IVF only
    ids: np.ndarray,  # [n] int64 chunk ids
    vectors: np.ndarray,  # [n, dim] float32, unit length
    dim: int,
    progress: Callable[[int], object] | None = None,
) -> faiss.Index:
    """An index of the given layout holding these vectors; no training, so every host that
    builds it from the same stored centroids gets the same inverted lists. ``progress(n)``
    after every ``BUILD_BLOCK`` vectors added (None: added at once)."""
    if kind == "flat":
        index = new_flat(dim)
    else:
        if centroids is None:
            raise ValueError("an IVF layout needs its stored centroids")
        quantizer = faiss.IndexFlatIP(dim)
        quantizer.add(np.ascontiguousarray(centroids, dtype=np.float32))
        index = faiss.IndexIVFFlat(quantizer, dim, len(centroids), faiss.METRIC_INNER_PRODUCT)
        index.is_trained = True  # the quantizer holds the trained centroids already
        set_search_params(index)
    block = BUILD_BLOCK if progress is not None else max(len(ids), 1)
    for start in range(0, len(ids), block):
        part = slice(start, start + block)
        index.add_with_ids(np.ascontiguousarray(vectors[part], dtype=np.float32), ids[part])
        if progress is not None:
            progress(min(start + block, len(ids)))
    return index
