"""One atomic write to a collection: documents, chunks with their vectors, the change log and
the new version, or nothing.

It exists because every host's index must be derivable from the database alone. Every write
holds the collection's row lock (an UPDATE first, so SQLite takes its write lock at once and
PostgreSQL locks the row), stores the chunks and their vectors, logs the added and removed chunk
ids under the new version, and commits; only then does this host write its index file for the
new version (a cache: a file always names a committed version). Any exception before the commit
rolls the database back; other hosts replay the logged changes (retrieval.host_indexes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import faiss
import numpy as np
from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from retrieval.changelog import log_changes, prune_log
from retrieval.chunking import ChunkDraft
from retrieval.errors import CollectionLimitError, public_reason
from retrieval.grounding.passages import LAYOUT as GROUNDING_LAYOUT
from retrieval.host_indexes import HostIndexes
from retrieval.indexes import apply_changes, centroids_of, kind_of, new_flat
from retrieval.lexical import LexicalChange
from retrieval.loaders import LoadedDocument
from retrieval.records import Chunk, CollectionIndex, Document
from retrieval.results import FileStatus
from retrieval.terms import chunk_terms
from retrieval.vectors import matrix_to_bytes, to_bytes

log = logging.getLogger(__name__)


@dataclass
class PreparedDocument:
    """A parsed, chunked and embedded file, ready to be written."""

    source: str
    doc: LoadedDocument
    chunks: list[ChunkDraft]
    vectors: np.ndarray  # [len(chunks), dim] float32, unit length
    existed: bool = False  # an earlier version of the file was stored (its status: "updated")
    # Per chunk, the grounding scorer's vectors (retrieval.grounding.passages), when computed.
    grounding: list[bytes | None] | None = None


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
        indexes: HostIndexes,
        dim: int,
        approx_threshold: int,
        max_collections: int | Callable[[str], int] = 0,
    ) -> None:
        """``max_collections``: collections one tenant may have (0: no limit; a callable
        gives each tenant's own); creating one more raises CollectionLimitError."""
        self.session_factory = session_factory
        self.indexes = indexes
        self.dim = dim
        self.approx_threshold = approx_threshold
        self.max_collections = max_collections

    def write(
        self,
        tenant: str,
        collection: str,
        upserts: Sequence[PreparedDocument] = (),
        deletes: Sequence[str] = (),
    ) -> WriteResult:
        """Commit the changes; retried once when another process created the collection
        concurrently."""
        for attempt in range(2):
            try:
                return self._write_once(tenant, collection, upserts, deletes)
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
    ) -> WriteResult:
        statuses: dict[str, FileStatus | None] = {}
        remove: list[int] = []
        add_ids: list[int] = []
        add_terms: list[str] = []
        add_vectors: list[np.ndarray] = []
        with self.session_factory() as session:
            try:
                row = self._lock_row(session, tenant, collection)
                # The committed index, read before this transaction writes anything (a second
                # connection must not wait on our own uncommitted pages); no other writer can
                # commit while we hold the lock, so it stays the one we change.
                committed = (
                    self.indexes.committed(tenant, collection, row.version) if row.version else None
                )
                for prepared in upserts:
                    status, old, new, terms = self._upsert(session, tenant, collection, prepared)
                    statuses[prepared.source] = status
                    remove += old
                    if new:
                        add_ids += new
                        add_terms += terms
                        add_vectors.append(prepared.vectors)
                for source in deletes:
                    dropped = self._delete(session, tenant, collection, source)
                    statuses[source] = None if dropped is None else "deleted"
                    remove += dropped or []
                if not (remove or add_ids) and row.version > 0:
                    session.rollback()  # nothing changed: no new version, no file
                    return WriteResult(statuses, row.version, None)
                # A private copy: searches on other threads keep using the committed one.
                base = new_flat(self.dim) if committed is None else faiss.clone_index(committed)
                vectors = np.concatenate(add_vectors) if add_vectors else np.zeros((0, self.dim))
                index = apply_changes(
                    base,
                    np.asarray(remove, dtype="int64"),
                    np.asarray(add_ids, dtype="int64"),
                    vectors.astype("float32"),
                    self.approx_threshold,
                )
                base_version = row.version
                row.version += 1
                if index is not base or row.version == 1:
                    # A new layout (kind, or IVF lists trained on this version's vectors): every
                    # host builds the next index from these centroids, never trains its own.
                    row.layout_version = row.version
                    centroids = centroids_of(index)
                    row.centroids = None if centroids is None else matrix_to_bytes(centroids)
                row.kind = kind_of(index)
                row.num_vectors = int(index.ntotal)
                log_changes(session, row.id, row.version, remove, add_ids)
                prune_log(session, row)
                session.commit()
            except BaseException:
                session.rollback()
                raise
            version = row.version
        # Committed: the documents are stored and, for every host, searchable at this version.
        # What follows is this host's cache (memory, files): a failure there (a full disk) costs
        # a rebuild from the database at the next search, and never makes the write "failed".
        change = LexicalChange(base_version, np.asarray(remove, dtype="int64"),
                               np.asarray(add_ids, dtype="int64"), add_terms)  # fmt: skip
        try:
            self.indexes.remember(tenant, collection, version, index, change)
        except (OSError, ValueError, RuntimeError) as exc:  # tantivy: ValueError on I/O errors
            log.warning("%s/%s v%d committed; its index files could not be written (%s): the "
                        "next search rebuilds them from the database", tenant, collection,
                        version, public_reason(exc))  # fmt: skip
            self.indexes.forget(tenant, collection)
        return WriteResult(statuses, version, index)

    def _lock_row(self, session: Session, tenant: str, collection: str) -> CollectionIndex:
        where = (CollectionIndex.tenant == tenant, CollectionIndex.collection == collection)
        # A no-op UPDATE as the first statement: the write lock is taken before anything is read.
        locked = session.execute(
            update(CollectionIndex).where(*where).values(version=CollectionIndex.version),
            execution_options={"synchronize_session": False},
        )
        if getattr(locked, "rowcount", 0) == 0:
            self._check_limit(session, tenant)
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

    def _check_limit(self, session: Session, tenant: str) -> None:
        """CollectionLimitError when the tenant has its ``max_collections`` already.

        On PostgreSQL the tenant's creations take turns (a transaction-scoped advisory lock), so
        two racing first ingests cannot both take the last place; SQLite writes one at a time."""
        limit = self.max_collections
        cap = limit(tenant) if callable(limit) else limit
        if not cap:
            return
        if session.get_bind().dialect.name == "postgresql":
            session.execute(
                select(func.pg_advisory_xact_lock(func.hashtext(f"collections:{tenant}")))
            )
        count = session.scalar(
            select(func.count())
            .select_from(CollectionIndex)
            .where(CollectionIndex.tenant == tenant)
        )
        if (count or 0) >= cap:
            raise CollectionLimitError(
                f"collection_limit: the tenant has {count} collections and its max_collections "
                f"is {cap}: delete one, or ask an admin to raise it"
            )

    def _upsert(
        self, session: Session, tenant: str, collection: str, prepared: PreparedDocument
    ) -> tuple[FileStatus, list[int], list[int], list[str]]:
        """``(status, removed chunk ids, added chunk ids, the added chunks' terms)``."""
        doc = prepared.doc
        existing = self._find(session, tenant, collection, prepared.source)
        if existing is not None and existing.content_hash == doc.content_hash:
            return "unchanged", [], [], []
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
        terms = [chunk_terms(c.title, c.heading, c.text) for c in prepared.chunks]
        grounding = prepared.grounding or [None] * len(prepared.chunks)
        rows = [
            Chunk(
                document_id=existing.id,
                position=c.position,
                title=c.title[:512],
                heading=c.heading[:512] if c.heading else None,
                text=c.text,
                token_count=c.token_count,
                embedding=to_bytes(vector),
                lexical_terms=chunk_terms_text,
                grounding_vectors=blob,
                grounding_layout=None if blob is None else GROUNDING_LAYOUT,
            )
            for c, vector, chunk_terms_text, blob in zip(
                prepared.chunks, prepared.vectors, terms, grounding, strict=True
            )
        ]
        session.add_all(rows)
        session.flush()
        return status, old_ids, [r.id for r in rows], terms

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
