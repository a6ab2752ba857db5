"""One atomic write to a collection: documents, chunks, index file and version, or nothing.

It exists because the database and the FAISS file must always agree. Every write holds the
collection's row lock (an UPDATE first, so SQLite takes its write lock at once and PostgreSQL
locks the row), reads the current index file, applies the chunk changes to both, writes the new
version's file beside the old, and only then commits the new version number. Any exception before
the commit rolls the database back; the committed version still names its own intact file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import faiss
import numpy as np
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from retrieval.chunking import ChunkDraft, embedding_text
from retrieval.index_store import IndexStore
from retrieval.indexes import apply_changes, kind_of, new_flat, rebuilt
from retrieval.loaders import LoadedDocument
from retrieval.records import Chunk, CollectionIndex, Document
from retrieval.results import FileStatus

Encode = Callable[[list[str]], np.ndarray]


@dataclass
class PreparedDocument:
    """A parsed, chunked and embedded file, ready to be written."""

    source: str
    doc: LoadedDocument
    chunks: list[ChunkDraft]
    vectors: np.ndarray  # [len(chunks), dim] float32, unit length


@dataclass
class WriteResult:
    """The outcome of one write: per-source status and the version now current."""

    statuses: dict[str, FileStatus | None]  # None: a delete found nothing
    version: int
    index: faiss.Index | None  # the committed index, None when nothing changed


class CollectionWriter:
    """Applies document upserts and deletes to one collection's rows and index, atomically."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        store: IndexStore,
        encode: Encode,
        dim: int,
        approx_threshold: int,
    ) -> None:
        self.session_factory = session_factory
        self.store = store
        self.encode = encode
        self.dim = dim
        self.approx_threshold = approx_threshold

    def write(
        self,
        tenant: str,
        collection: str,
        upserts: Sequence[PreparedDocument] = (),
        deletes: Sequence[str] = (),
        rebuild: bool = False,
    ) -> WriteResult:
        """Commit the changes (or, with ``rebuild``, re-embed the collection's index from the
        database); retried once when another process created the collection concurrently."""
        for attempt in range(2):
            try:
                return self._write_once(tenant, collection, upserts, deletes, rebuild)
            except IntegrityError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _write_once(
        self,
        tenant: str,
        collection: str,
        upserts: Sequence[PreparedDocument],
        deletes: Sequence[str],
        rebuild: bool,
    ) -> WriteResult:
        statuses: dict[str, FileStatus | None] = {}
        remove: list[int] = []
        add_ids: list[int] = []
        add_vectors: list[np.ndarray] = []
        with self.session_factory() as session:
            try:
                row = self._lock_row(session, tenant, collection)
                for prepared in upserts:
                    status, old, new = self._upsert(session, tenant, collection, prepared)
                    statuses[prepared.source] = status
                    remove += old
                    if new:
                        add_ids += new
                        add_vectors.append(prepared.vectors)
                for source in deletes:
                    dropped = self._delete(session, tenant, collection, source)
                    statuses[source] = None if dropped is None else "deleted"
                    remove += dropped or []
                if not (remove or add_ids or rebuild) and row.version > 0:
                    session.rollback()  # nothing changed: no new version, no file
                    return WriteResult(statuses, row.version, None)
                index = self._next_index(session, row, remove, add_ids, add_vectors, rebuild)
                row.version += 1
                row.kind = kind_of(index)
                row.num_vectors = int(index.ntotal)
                session.flush()
                # The file first, the version second: a committed version always has its file.
                self.store.write(tenant, collection, row.version, index)
                session.commit()
            except BaseException:
                session.rollback()
                raise
            version = row.version
        self.store.prune(tenant, collection, version)
        return WriteResult(statuses, version, index)

    def _next_index(
        self,
        session: Session,
        row: CollectionIndex,
        remove: list[int],
        add_ids: list[int],
        add_vectors: list[np.ndarray],
        rebuild: bool,
    ) -> faiss.Index:
        if rebuild:
            return self._reembed(session, row.tenant, row.collection)
        vectors = np.concatenate(add_vectors) if add_vectors else np.zeros((0, self.dim))
        return apply_changes(
            self._current(session, row),
            np.asarray(remove, dtype="int64"),
            np.asarray(add_ids, dtype="int64"),
            vectors.astype("float32"),
            self.approx_threshold,
        )

    def _lock_row(self, session: Session, tenant: str, collection: str) -> CollectionIndex:
        where = (CollectionIndex.tenant == tenant, CollectionIndex.collection == collection)
        # A no-op UPDATE as the first statement: the write lock is taken before anything is read.
        locked = session.execute(
            update(CollectionIndex).where(*where).values(version=CollectionIndex.version),
            execution_options={"synchronize_session": False},
        )
        if getattr(locked, "rowcount", 0) == 0:
            row = CollectionIndex(
                tenant=tenant,
                collection=collection,
                version=0,
                kind="flat",
                num_vectors=0,
                dim=self.dim,
            )
            session.add(row)
            session.flush()  # IntegrityError when another process created it meanwhile
            return row
        return session.scalars(select(CollectionIndex).where(*where)).one()

    def _current(self, session: Session, row: CollectionIndex) -> faiss.Index:
        if row.version == 0:
            return new_flat(self.dim)
        try:
            return self.store.read(row.tenant, row.collection, row.version)
        except FileNotFoundError:
            # The data dir lost the file (restore, wiped volume): the database is the truth.
            return self._reembed(session, row.tenant, row.collection)

    def _reembed(self, session: Session, tenant: str, collection: str) -> faiss.Index:
        rows = session.execute(
            select(Chunk.id, Chunk.title, Chunk.heading, Chunk.text)
            .join(Document, Chunk.document_id == Document.id)
            .where(Document.tenant == tenant, Document.collection == collection)
            .order_by(Chunk.id)
        ).all()
        ids = np.asarray([r.id for r in rows], dtype="int64")
        vectors = self.encode([embedding_text(r.title, r.heading, r.text) for r in rows])
        return rebuilt(ids, vectors.reshape(len(rows), self.dim), self.dim, self.approx_threshold)

    def _upsert(
        self, session: Session, tenant: str, collection: str, prepared: PreparedDocument
    ) -> tuple[FileStatus, list[int], list[int]]:
        doc = prepared.doc
        existing = self._find(session, tenant, collection, prepared.source)
        if existing is not None and existing.content_hash == doc.content_hash:
            return "unchanged", [], []
        old_ids: list[int] = []
        if existing is None:
            status: FileStatus = "added"
            existing = Document(tenant=tenant, collection=collection, source=prepared.source)
            session.add(existing)
        else:
            status = "updated"
            old_ids = self._drop_chunks(session, existing.id)
        existing.title = doc.title
        existing.content_hash = doc.content_hash
        existing.size_bytes = doc.size_bytes
        existing.num_chunks = len(prepared.chunks)
        session.flush()
        rows = [
            Chunk(
                document_id=existing.id,
                position=c.position,
                title=c.title[:512],
                heading=c.heading[:512] if c.heading else None,
                text=c.text,
                token_count=c.token_count,
            )
            for c in prepared.chunks
        ]
        session.add_all(rows)
        session.flush()
        return status, old_ids, [r.id for r in rows]

    def _delete(
        self, session: Session, tenant: str, collection: str, source: str
    ) -> list[int] | None:
        existing = self._find(session, tenant, collection, source)
        if existing is None:
            return None
        old_ids = self._drop_chunks(session, existing.id)
        session.execute(delete(Document).where(Document.id == existing.id))
        session.expunge(existing)
        return old_ids

    @staticmethod
    def _find(session: Session, tenant: str, collection: str, source: str) -> Document | None:
        return session.scalars(
            select(Document).where(
                Document.tenant == tenant,
                Document.collection == collection,
                Document.source == source,
            )
        ).one_or_none()

    @staticmethod
    def _drop_chunks(session: Session, document_id: int) -> list[int]:
        ids = list(session.scalars(select(Chunk.id).where(Chunk.document_id == document_id)))
        session.execute(delete(Chunk).where(Chunk.document_id == document_id))
        return ids
