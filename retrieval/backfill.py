"""Vectors for chunks ingested before migration 0004: from this host's index file, else embedded.

It exists because migration 0004 is schema-only (it must not load a model or run for hours) while
every host now builds its index from stored vectors. A chunk's vector never changes while the
chunk exists (changed text gets new chunk ids), so any index file of this host that holds the
chunk's id holds its exact vector; only chunks no file holds are embedded, and that is logged as
a warning with the count. Nothing here moves a version: the index content is unchanged.
Run it as ``specrag index backfill`` after ``specrag db upgrade``; a host that meets missing
vectors before that runs it for the collection it needs (docs/scaleout.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session, sessionmaker

from retrieval.chunking import embedding_text
from retrieval.index_store import IndexStore
from retrieval.indexes import all_vectors, centroids_of, new_ivf
from retrieval.records import Chunk, CollectionIndex, Document
from retrieval.terms import chunk_terms
from retrieval.vectors import from_bytes, matrix_to_bytes, to_bytes

log = logging.getLogger(__name__)
Encode = Callable[[list[str]], np.ndarray]
BATCH = 2000


@dataclass
class BackfillResult:
    """What one collection's backfill stored: vectors taken from files, vectors embedded."""

    tenant: str
    collection: str
    from_files: int = 0
    embedded: int = 0
    terms: int = 0  # chunks whose lexical terms were analysed and stored (before migration 0008)
    centroids: str | None = None  # "file" or "trained" when IVF centroids were stored

    def to_dict(self) -> dict[str, object]:
        """JSON shape for the CLI."""
        return dict(vars(self))


def backfill_collection(
    session_factory: sessionmaker[Session],
    store: IndexStore,
    encode: Encode | None,
    tenant: str,
    collection: str,
    progress: Callable[[int], object] | None = None,
) -> BackfillResult:
    """Store every missing vector (and IVF centroids) and lexical terms of one collection; see
    the module doc. ``encode=None`` stores only the vectors this host's files hold;
    ``progress(n)``: after each batch of lexical terms stored."""
    result = BackfillResult(tenant, collection)
    missing = _chunk_ids(session_factory, tenant, collection, Chunk.embedding.is_(None))
    found = _from_files(store, tenant, collection, set(missing))
    result.from_files = _store(session_factory, found)
    rest = [c for c in missing if c not in found]
    if rest and encode is not None:
        log.warning(
            "embedding %d chunks of %s/%s that have no stored vector and no index file on this "
            "host (ingested before migration 0004)", len(rest), tenant, collection,
        )  # fmt: skip
        for start in range(0, len(rest), BATCH):
            result.embedded += _store(session_factory, _embed(session_factory, encode,
                                                              rest[start : start + BATCH]))  # fmt: skip
    result.centroids = _centroids(session_factory, store, tenant, collection)
    result.terms = backfill_terms(session_factory, tenant, collection, progress)
    return result


def _chunk_ids(
    session_factory: sessionmaker[Session], tenant: str, collection: str, condition: Any
) -> list[int]:
    """The ids, in order, of the collection's chunks that meet ``condition`` (a column test)."""
    with session_factory() as session:
        return list(
            session.scalars(
                select(Chunk.id)
                .join(Document, Chunk.document_id == Document.id)
                .where(Document.tenant == tenant, Document.collection == collection, condition)
                .order_by(Chunk.id)
            )
        )


def backfill_terms(
    session_factory: sessionmaker[Session],
    tenant: str,
    collection: str,
    progress: Callable[[int], object] | None = None,
) -> int:
    """Analyse and store the lexical terms of the collection's chunks that have none (ingested
    before migration 0008), ``BATCH`` at a time, calling ``progress(n)`` after each batch; the
    number stored. Terms depend on the text alone, so no version moves."""
    missing = _chunk_ids(session_factory, tenant, collection, Chunk.lexical_terms.is_(None))
    stmt = (
        update(Chunk)
        .where(Chunk.id == bindparam("cid"), Chunk.lexical_terms.is_(None))
        .values(lexical_terms=bindparam("terms"))
    )
    for start in range(0, len(missing), BATCH):
        with session_factory() as session, session.begin():
            rows = session.execute(
                select(Chunk.id, Chunk.title, Chunk.heading, Chunk.text).where(
                    Chunk.id.in_(missing[start : start + BATCH])
                )
            ).all()
            items = [{"cid": r.id, "terms": chunk_terms(r.title, r.heading, r.text)} for r in rows]
            if items:
                session.connection().execute(stmt, items)
        if progress is not None:
            progress(len(rows))
    return len(missing)


def _from_files(
    store: IndexStore, tenant: str, collection: str, wanted: set[int]
) -> dict[int, np.ndarray]:
    found: dict[int, np.ndarray] = {}
    for version in store.versions(tenant, collection):
        if len(found) == len(wanted):
            break
        try:
            ids, vectors = all_vectors(store.read(tenant, collection, version, legacy=True))
        except (FileNotFoundError, RuntimeError):
            continue
        for chunk_id, vector in zip(ids.tolist(), vectors, strict=True):
            if chunk_id in wanted and chunk_id not in found:
                found[chunk_id] = vector
    return found


def _embed(
    session_factory: sessionmaker[Session], encode: Encode, ids: list[int]
) -> dict[int, np.ndarray]:
    with session_factory() as session:
        rows = session.execute(
            select(Chunk.id, Chunk.title, Chunk.heading, Chunk.text).where(Chunk.id.in_(ids))
        ).all()
    vectors = encode([embedding_text(r.title, r.heading, r.text) for r in rows])
    return {r.id: vectors[i] for i, r in enumerate(rows)}


def _store(session_factory: sessionmaker[Session], vectors: dict[int, np.ndarray]) -> int:
    """Write the vectors of chunks that still have none (a concurrent backfill wins ties)."""
    if not vectors:
        return 0
    stmt = (
        update(Chunk)
        .where(Chunk.id == bindparam("cid"), Chunk.embedding.is_(None))
        .values(embedding=bindparam("vec"))
    )
    items = [{"cid": cid, "vec": to_bytes(v)} for cid, v in vectors.items()]
    with session_factory() as session, session.begin():
        for start in range(0, len(items), BATCH):
            session.connection().execute(stmt, items[start : start + BATCH])
    return len(items)


def _centroids(
    session_factory: sessionmaker[Session], store: IndexStore, tenant: str, collection: str
) -> str | None:
    """Store an IVF collection's centroids when none are stored: from a file of its current
    layout on this host, else trained (seeded) on the stored vectors."""
    where = (CollectionIndex.tenant == tenant, CollectionIndex.collection == collection)
    with session_factory() as session:
        row = session.execute(
            select(
                CollectionIndex.kind,
                CollectionIndex.layout_version,
                CollectionIndex.dim,
                CollectionIndex.centroids.is_(None),
            ).where(*where)  # fmt: skip
        ).one_or_none()
        if row is None or row.kind != "ivf" or not row[3]:
            return None
        centroids, how = None, "file"
        for version in store.versions(tenant, collection):
            if version >= row.layout_version:
                try:
                    centroids = centroids_of(store.read(tenant, collection, version, legacy=True))
                except (FileNotFoundError, RuntimeError):
                    continue
                break
        if centroids is None:
            how = "trained"
            blobs = session.execute(
                select(Chunk.id, Chunk.embedding)
                .join(Document, Chunk.document_id == Document.id)
                .where(Document.tenant == tenant, Document.collection == collection)
                .order_by(Chunk.id)
            ).all()
            stored = [(b[0], bytes(b[1])) for b in blobs if b[1] is not None]
            ids = np.asarray([cid for cid, _ in stored], dtype="int64")
            vectors = from_bytes([blob for _, blob in stored], row.dim)
            centroids = centroids_of(new_ivf(vectors, ids))
        assert centroids is not None
    with session_factory() as session, session.begin():
        session.execute(
            update(CollectionIndex)
            .where(*where, CollectionIndex.centroids.is_(None))
            .values(centroids=matrix_to_bytes(centroids))
        )
    return how
