"""What the database says a collection's index holds: its state, the logged changes, all vectors.

It exists so that any host can bring its index to a committed version from the database alone.
Every read here happens inside ``snapshot``: one consistent view in which the version and the
rows agree (PostgreSQL: a REPEATABLE READ transaction; any backend: the version is read before
and after, and a write in between makes the read start again), so a host never labels a mix of
two versions with one number. Reads never lock or write anything, so they never move versions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from retrieval.records import Chunk, CollectionIndex, Document, IndexChange
from retrieval.terms import chunk_terms
from retrieval.vectors import from_bytes, matrix_from_bytes

# The change log keeps this many versions; a host further behind rebuilds from stored vectors.
LOG_KEEP_VERSIONS = 1000
SNAPSHOT_TRIES = 3

T = TypeVar("T")


class MissingVectorsError(RuntimeError):
    """Some chunks of the collection have no stored vector (ingested before migration 0004)."""

    def __init__(self, tenant: str, collection: str, count: int) -> None:
        super().__init__(
            f"{count} chunks of collection {collection!r} (tenant {tenant!r}) have no stored "
            "vector: run `specrag index backfill`"
        )
        self.count = count


@dataclass(frozen=True)
class IndexState:
    """A collection's committed index: version, layout and size (what a host must reproduce)."""

    row_id: int
    version: int
    kind: str
    layout_version: int
    log_floor: int
    num_vectors: int
    dim: int

    def can_replay_from(self, held: int) -> bool:
        """True when the log covers every change after version ``held`` in the same layout."""
        return self.log_floor <= held <= self.version and self.layout_version <= held


@dataclass
class Delta:
    """The changes from one version to a later one: ids to remove, then ids and vectors to add."""

    remove_ids: np.ndarray  # [r] int64
    add_ids: np.ndarray  # [a] int64
    add_vectors: np.ndarray  # [a, dim] float32
    add_terms: list[str]  # [a] stored lexical terms, in add_ids order

    def __len__(self) -> int:
        return len(self.remove_ids) + len(self.add_ids)


@dataclass
class Contents:
    """Every vector of a collection at one version, in chunk-id order, and its IVF centroids."""

    ids: np.ndarray  # [n] int64
    vectors: np.ndarray  # [n, dim] float32
    centroids: np.ndarray | None  # [nlist, dim] float32, IVF only
    terms: list[str]  # [n] stored lexical terms, in ids order


@dataclass
class Terms:
    """Every chunk's stored lexical terms at one version, in chunk-id order."""

    ids: np.ndarray  # [n] int64
    terms: list[str]  # [n]


def read_state(session: Session, tenant: str, collection: str) -> IndexState | None:
    """The collection's committed state, or None when it does not exist."""
    row = session.execute(
        select(
            CollectionIndex.id,
            CollectionIndex.version,
            CollectionIndex.kind,
            CollectionIndex.layout_version,
            CollectionIndex.log_floor,
            CollectionIndex.num_vectors,
            CollectionIndex.dim,
        ).where(CollectionIndex.tenant == tenant, CollectionIndex.collection == collection)
    ).one_or_none()
    return None if row is None else IndexState(*row)


def snapshot(
    session_factory: sessionmaker[Session],
    tenant: str,
    collection: str,
    read: Callable[[Session, IndexState], T],
) -> tuple[IndexState, T] | None:
    """``(state, read(session, state))`` from one consistent view; None when no collection.

    ``read`` returns None when it read nothing (the caller's copy is current)."""
    for _ in range(SNAPSHOT_TRIES):
        with session_factory() as session:
            if session.get_bind().dialect.name == "postgresql":
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            state = read_state(session, tenant, collection)
            if state is None:
                return None
            result = read(session, state)
            # None: nothing else was read, and one statement is a consistent view by itself.
            if result is None or read_state(session, tenant, collection) == state:
                return state, result
    # Writes kept landing between the two reads (SQLite under a busy writer): wait for the
    # collection's write lock once, read, and release it (rolled back: nothing is written).
    with session_factory() as session:
        session.execute(
            update(CollectionIndex)
            .where(CollectionIndex.tenant == tenant, CollectionIndex.collection == collection)
            .values(version=CollectionIndex.version),
            execution_options={"synchronize_session": False},
        )
        state = read_state(session, tenant, collection)
        if state is None:
            return None
        result = read(session, state)
        session.rollback()
    return state, result


def read_delta(
    session: Session, tenant: str, collection: str, state: IndexState, since: int
) -> Delta:
    """The logged changes after version ``since`` up to ``state.version``."""
    changes = session.execute(
        select(IndexChange.chunk_id, IndexChange.added).where(
            IndexChange.collection_index_id == state.row_id,
            IndexChange.version > since,
            IndexChange.version <= state.version,
        )
    ).all()
    removed = {c for c, added in changes if not added}
    wanted = sorted({c for c, added in changes if added})
    rows: list[Any] = []
    for start in range(0, len(wanted), 5000):  # bounded IN lists
        batch = wanted[start : start + 5000]
        # By primary key alone: the log names this collection's chunks (a join on documents
        # made PostgreSQL scan every chunk; docs/scaleout.md).
        rows += session.execute(
            select(Chunk.id, Chunk.embedding, Chunk.lexical_terms)
            .where(Chunk.id.in_(batch))
            .order_by(Chunk.id)
        ).all()
    # An added chunk that is gone again is not found here: its later removal is in ``removed``.
    ids, vectors = _decode(rows, tenant, collection, state.dim)
    terms = _terms(session, rows)
    return Delta(np.asarray(sorted(removed), dtype="int64"), ids, vectors, terms)


def read_contents(session: Session, tenant: str, collection: str, state: IndexState) -> Contents:
    """Every stored vector of the collection (and its centroids, for IVF)."""
    if session.get_bind().dialect.name == "postgresql":
        rows: Sequence[Any] = _binary_rows(session, tenant, collection)
    else:
        rows = session.execute(_vectors_query(tenant, collection).order_by(Chunk.id)).all()
    ids, vectors = _decode(rows, tenant, collection, state.dim)
    terms = _terms(session, rows)
    centroids = None
    if state.kind == "ivf":
        blob = session.scalar(
            select(CollectionIndex.centroids).where(CollectionIndex.id == state.row_id)
        )
        if blob is None:
            raise MissingVectorsError(tenant, collection, 0)
        centroids = matrix_from_bytes(blob, state.dim)
    return Contents(ids, vectors, centroids, terms)


def read_terms(session: Session, tenant: str, collection: str) -> Terms:
    """Every chunk's stored lexical terms (for a host whose FAISS index came from its file)."""
    rows = session.execute(
        select(Chunk.id, Chunk.id, Chunk.lexical_terms)
        .join(Document, Chunk.document_id == Document.id)
        .where(Document.tenant == tenant, Document.collection == collection)
        .order_by(Chunk.id)
    ).all()
    return Terms(np.asarray([r[0] for r in rows], dtype="int64"), _terms(session, rows))


def log_changes(
    session: Session, row_id: int, version: int, removed: Iterable[int], added: Iterable[int]
) -> None:
    """Record one write's removals and additions as the changes of ``version``."""
    rows = [
        {"collection_index_id": row_id, "version": version, "chunk_id": int(c), "added": False}
        for c in removed
    ] + [
        {"collection_index_id": row_id, "version": version, "chunk_id": int(c), "added": True}
        for c in added
    ]
    if rows:
        session.execute(insert(IndexChange), rows)


def prune_log(session: Session, row: CollectionIndex) -> None:
    """Drop log entries older than ``LOG_KEEP_VERSIONS`` versions and raise the floor to match."""
    floor = row.version - LOG_KEEP_VERSIONS
    if floor > row.log_floor:
        session.execute(
            delete(IndexChange).where(
                IndexChange.collection_index_id == row.id, IndexChange.version <= floor
            )
        )
        row.log_floor = floor


def _vectors_query(tenant: str, collection: str):  # type: ignore[no-untyped-def]
    return (
        select(Chunk.id, Chunk.embedding, Chunk.lexical_terms)
        .join(Document, Chunk.document_id == Document.id)
        .where(Document.tenant == tenant, Document.collection == collection)
    )


def _binary_rows(session: Session, tenant: str, collection: str) -> list[Any]:
    """``(id, embedding, lexical_terms)`` rows in chunk-id order, in PostgreSQL's binary format: bytea as raw
    bytes instead of hex text, about twice as fast at 100k chunks (docs/scaleout.md).
    Runs on the session's own connection, so inside its consistent view."""
    driver: Any = session.connection().connection.driver_connection
    with driver.cursor(binary=True) as cur:
        cur.execute(
            "SELECT c.id, c.embedding, c.lexical_terms"
            " FROM chunks c JOIN documents d ON c.document_id = d.id"
            " WHERE d.tenant = %s AND d.collection = %s ORDER BY c.id",
            (tenant, collection),
        )
        return list(cur.fetchall())


def _terms(session: Session, rows: Sequence[Any]) -> list[str]:
    """The stored terms of ``(chunk id, _, lexical_terms)`` rows; a chunk stored before
    migration 0008 (NULL) is analysed from its text here, the same way an ingest does."""
    missing = [r[0] for r in rows if r[2] is None]
    made: dict[int, str] = {}
    for start in range(0, len(missing), 5000):
        found = session.execute(
            select(Chunk.id, Chunk.title, Chunk.heading, Chunk.text).where(
                Chunk.id.in_(missing[start : start + 5000])
            )
        ).all()
        made.update((r.id, chunk_terms(r.title, r.heading, r.text)) for r in found)
    return [r[2] if r[2] is not None else made.get(r[0], "") for r in rows]


def _decode(
    rows: Sequence[Any], tenant: str, collection: str, dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids [n], vectors [n, dim])`` of ``(chunk id, embedding, ...)`` rows; every vector
    stored."""
    missing = sum(1 for r in rows if r[1] is None)
    if missing:
        raise MissingVectorsError(tenant, collection, missing)
    ids = np.asarray([r[0] for r in rows], dtype="int64")
    return ids, from_bytes([r[1] for r in rows], dim)
