"""IVF across hosts: every host builds the same lists from the stored centroids.

Approximate search is checked against exact IndexFlat on the same seeded data, and a host that
replays the change log answers exactly like the writer and like a host that rebuilt from scratch.
"""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest
from sqlalchemy.orm import Session, sessionmaker

from retrieval import Embedder
from retrieval.chunking import ChunkDraft
from retrieval.indexes import kind_of, new_flat
from retrieval.loaders import LoadedDocument, Section
from retrieval.writes import PreparedDocument
from tests.retrieval.hosts import HostFactory, host_factory, row
from tests.retrieval.test_indexes import clustered

DIM = 384


def prepared(name: str, vectors: np.ndarray) -> PreparedDocument:
    """A document of ``len(vectors)`` chunks with the given (already unit) vectors."""
    doc = LoadedDocument(name, [Section(None, name)], name.ljust(64, "0"), 10)
    chunks = [ChunkDraft(i, name, None, f"{name} part {i}", 3) for i in range(len(vectors))]
    return PreparedDocument(f"{name}.md", doc, chunks, vectors)


@pytest.fixture
def make_host(
    pg_session_factory: sessionmaker[Session], embedder: Embedder, tmp_path: Path
) -> HostFactory:
    """Hosts with their own data directories, switching to IVF above 300 vectors."""
    make = host_factory(pg_session_factory, embedder, tmp_path)
    return lambda name: make(name, approx_index_threshold=300)


def top(index: faiss.Index, queries: np.ndarray, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    faiss.omp_set_num_threads(1)
    return index.search(queries, k)


def test_ivf_hosts_agree_with_the_writer_and_with_exact_search(
    make_host: HostFactory, names: dict[str, str]
) -> None:
    a, b = make_host("a"), make_host("b")
    c, t = names["collection"], names["a"]
    data = clustered(2_100, seed=3)
    docs = [prepared(f"d{i}", data[i * 100 : (i + 1) * 100]) for i in range(20)]
    queries = data[2_000:]  # held out, same distribution
    for doc in docs[:4]:
        a.writer.write(t, c, [doc])  # 400 vectors: IVF from the 4th write on
    version, layout = row(a, t, c)[0], row(a, t, c)[2]
    assert (version, layout) == (4, 4)
    got_b = b.indexes.current(t, c)
    assert got_b is not None and kind_of(got_b[1]) == "ivf" and got_b[0] == version

    # Small writes: replayed on B; a new host builds from scratch; all answer alike.
    for doc in docs[4:8]:
        a.writer.write(t, c, [doc])
    a.writer.write(t, c, deletes=["d1.md", "d5.md"])
    final = row(a, t, c)
    assert final[2] == layout  # no retraining for small writes: the lists stay put
    held_a, held_b = a.indexes.current(t, c), b.indexes.current(t, c)
    fresh = make_host("fresh").indexes.current(t, c)
    assert held_a and held_b and fresh
    assert held_a[0] == held_b[0] == fresh[0] == final[0]
    assert b.indexes.sources["delta"] >= 1
    want = top(held_a[1], queries)
    for other in (held_b[1], fresh[1]):
        got = top(other, queries)
        assert (got[1] == want[1]).all() and np.array_equal(got[0], want[0])

    # Against exact search over the very same vectors.
    kept = [d for d in docs[:8] if d.source not in ("d1.md", "d5.md")]
    ids = np.concatenate([np.asarray(_chunk_ids(a, d.source, t, c)) for d in kept])
    vectors = np.concatenate([d.vectors for d in kept])
    exact = new_flat(DIM)
    exact.add_with_ids(vectors, ids.astype("int64"))
    truth = top(exact, queries)[1]
    recall = np.mean([len(set(x) & set(y)) / 5 for x, y in zip(truth, want[1], strict=True)])
    assert recall >= 0.9, recall
    assert held_a[1].ntotal == len(ids) == 100 * len(kept)


def _chunk_ids(service: object, source: str, tenant: str, collection: str) -> list[int]:
    """The chunk ids of one document, in position order (the order of its vectors)."""
    from sqlalchemy import select

    from retrieval.records import Chunk, Document

    with service.session_factory() as session:  # type: ignore[attr-defined]
        return list(
            session.scalars(
                select(Chunk.id)
                .join(Document)
                .where(
                    Document.tenant == tenant,
                    Document.collection == collection,
                    Document.source == source,
                )
                .order_by(Chunk.position)
            )
        )
