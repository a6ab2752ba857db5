"""RetrievalService: ingest files, delete them, and search one tenant's collection.

It exists as the one facade the CLI, the API, the Celery task and the pipeline share. Tenant
isolation is enforced here: every collection is keyed by (tenant, collection), with its own index,
and the chunks a search returns are re-checked against the tenant in the database. The database
holds every chunk's vector; this host's index is a cache of it (retrieval.host_indexes), so any
number of hosts with their own data directories serve the same versions without re-embedding.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from opentelemetry import trace
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from tqdm import tqdm

from retrieval.backfill import backfill_collection
from retrieval.chunking import Chunker, embedding_text
from retrieval.embedder import Embedder
from retrieval.errors import (
    CollectionLimitError,
    DocumentError,
    QueryError,
    UnknownCollectionError,
    check_name,
    public_reason,
)
from retrieval.fusion import (
    ALL_TERMS_BONUS,
    SEARCH_MODES,
    Fused,
    SearchMode,
    fuse,
    reward_all_terms,
    single,
)
from retrieval.grounding.passages import encode_passages
from retrieval.host_indexes import HostIndexes
from retrieval.index_store import IndexStore
from retrieval.loaders import load_document
from retrieval.records import Chunk, CollectionIndex, Document
from retrieval.results import FileResult, FileStatus, IngestReport, SearchHit
from retrieval.sources import expand_paths, inside, normalise_source
from retrieval.terms import query_terms
from retrieval.writes import CollectionWriter, PreparedDocument

# Chunks gathered before one database transaction + index write: large enough that writing the
# index file is a small share of an ingest, small enough that a failure loses little work.
FLUSH_CHUNKS = 512
_NO_VECTORS = np.zeros((0, 0), dtype=np.float32)
MAX_TOP_K = 100
# Extra neighbours fetched so that equal scores (duplicate passages) are ordered by chunk id, not
# by where each host's index happens to hold them: the same top_k on every host.
TIE_MARGIN = 8
# Candidates each leg hands to fusion: a chunk ranked this low by one leg and absent from the
# other cannot reach a top 10 anyway (RRF: 1/(60+50) < 2/(60+10) needs both legs).
FUSION_DEPTH = 50


class RetrievalService:
    """Tenant-scoped ingest, delete and search over per-collection FAISS indexes."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        index_dir: str | Path,
        embedder: Embedder,
        *,
        chunk_tokens: int = 224,
        chunk_overlap: int = 32,
        max_file_bytes: int = 20 * 1024 * 1024,
        approx_index_threshold: int = 200_000,
        max_query_chars: int = 2000,
        indexes: HostIndexes | None = None,
        search_mode: SearchMode = "hybrid",
        max_held: int = 0,
        max_collections: int | Callable[[str], int] = 0,
        all_terms_bonus: float = ALL_TERMS_BONUS,
        grounding_vectors: bool = False,
    ) -> None:
        """``indexes``: this host's indexes when already opened (``open_retrieval`` warms them
        while the embedding model loads); by default opened here on ``index_dir``, holding at
        most ``max_held`` collections in memory (0: no limit).
        ``search_mode``: what ``search`` runs when not told (retrieval.fusion).
        ``max_collections``: collections one tenant may have (0: no limit; a callable gives a
        tenant's own); an ingest that would create one more is refused (CollectionLimitError).
        ``all_terms_bonus``: hybrid mode adds this to the fused score of a passage holding every
        term of the question (retrieval.fusion.reward_all_terms; 0: off).
        ``grounding_vectors``: ingest also stores what the grounding scorer needs of each chunk
        (retrieval.grounding.passages), so that grounding an answer encodes only its claims."""
        self.search_mode = _check_mode(search_mode)
        if not all_terms_bonus >= 0:  # also refuses NaN
            raise ValueError(f"all_terms_bonus must be 0 or more, got {all_terms_bonus}")
        self.all_terms_bonus = all_terms_bonus
        self.session_factory = session_factory
        self.embedder = embedder
        self.max_file_bytes = max_file_bytes
        self.max_query_chars = max_query_chars
        self.grounding_vectors = grounding_vectors
        if indexes is None:
            indexes = HostIndexes(session_factory, IndexStore(index_dir), max_held=max_held)
        self.store = indexes.store
        self.chunker = Chunker(embedder.tokenizer, chunk_tokens, chunk_overlap)
        indexes.fill = self._backfill
        self.indexes = indexes
        self.writer = CollectionWriter(
            session_factory, self.indexes, embedder.dim, approx_index_threshold, max_collections
        )

    # -- ingest ---------------------------------------------------------------------------------

    def ingest(
        self,
        paths: Iterable[str | Path],
        *,
        collection: str,
        tenant: str = "default",
        progress: bool = False,
        sources: Mapping[str, str] | None = None,
        max_chars: int = 0,
    ) -> IngestReport:
        """Per-file outcome of ingesting files or folders into the tenant's collection.

        Unchanged files are skipped, changed ones replace their old chunks, files gone from an
        ingested folder are deleted; a bad file is reported and the others still ingest.
        ``sources`` renames files (normalised path -> the source name to store, e.g. an upload's
        own name rather than a worker's path); ``max_chars`` (0: none) fails a file whose text
        extracts to more characters."""
        check_name("tenant", tenant)
        check_name("collection", collection)
        started = time.perf_counter()
        report = IngestReport(tenant=tenant, collection=collection)
        files, folders, failures = expand_paths(paths)
        if sources:
            files = [(sources.get(source, source), path) for source, path in files]
        report.files += failures
        gone = self._gone(tenant, collection, folders, {source for source, _ in files})
        pending: list[PreparedDocument] = []
        # Counted in chunks, the unit of the real work; the total grows as files are chunked.
        bar = tqdm(total=0, unit="chunk", desc=f"ingest {collection}", file=sys.stderr,
                   disable=not progress)  # fmt: skip
        with bar:
            for source, path in files:
                prepared = self._prepare(report, tenant, collection, source, path, max_chars)
                if prepared is not None:
                    pending.append(prepared)
                    bar.total += len(prepared.chunks)
                    bar.refresh()
                if sum(len(p.chunks) for p in pending) >= FLUSH_CHUNKS:
                    self._flush(report, tenant, collection, pending, [], bar)
                    pending = []
            if pending or gone:
                self._flush(report, tenant, collection, pending, gone, bar)
        report.index_version = self.index_version(collection=collection, tenant=tenant)
        report.seconds = time.perf_counter() - started
        return report

    def _gone(self, tenant: str, collection: str, folders: list[str], found: set[str]) -> list[str]:
        """Sources once ingested from these folders whose files no longer exist."""
        if not folders:
            return []
        with self.session_factory() as session:
            known = session.scalars(
                select(Document.source).where(
                    Document.tenant == tenant, Document.collection == collection
                )
            ).all()
        return [s for s in known if inside(s, folders) and s not in found and not Path(s).exists()]

    def _prepare(
        self,
        report: IngestReport,
        tenant: str,
        collection: str,
        source: str,
        path: Path,
        max_chars: int = 0,
    ) -> PreparedDocument | None:
        """The loaded and chunked file (embedded later, with others), or None when it is
        unchanged or failed (and then reported)."""
        try:
            # The limit holds during extraction: a small PDF can expand to millions of characters.
            doc = load_document(path, self.max_file_bytes, max_chars)
            stored = self._stored_hash(tenant, collection, source)
            if stored == doc.content_hash:
                report.files.append(FileResult(source, "unchanged"))
                return None
            return PreparedDocument(source, doc, self.chunker.chunk(doc), _NO_VECTORS,
                                    existed=stored is not None)  # fmt: skip
        except DocumentError as exc:
            report.files.append(FileResult(source, "failed", error=str(exc)))
        except Exception as exc:  # a parser crashing on one odd file must not stop the others
            error = f"{source}: cannot parse ({public_reason(exc)})"
            report.files.append(FileResult(source, "failed", error=error))
        return None

    def _embed(self, pending: list[PreparedDocument], bar: Any) -> None:
        """Fill in every pending document's vectors, in full batches across files.

        Batches of similar length from many files run faster on a CPU than one small batch per
        file (docs/results.md, retrieval), so files are embedded together."""
        texts = [embedding_text(c.title, c.heading, c.text) for p in pending for c in p.chunks]
        vectors = np.zeros((len(texts), self.embedder.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # little padding
        size = self.embedder.batch_size
        for start in range(0, len(order), size):
            batch = order[start : start + size]
            vectors[batch] = self.embedder.encode([texts[i] for i in batch])
            bar.update(len(batch))
        offset = 0
        for p in pending:
            p.vectors = vectors[offset : offset + len(p.chunks)]
            offset += len(p.chunks)
        if self.grounding_vectors:
            found = encode_passages(self.embedder, [c.text for p in pending for c in p.chunks])
            blobs: list[bytes | None] = [v.to_bytes() for v in found]
            offset = 0
            for p in pending:
                p.grounding = blobs[offset : offset + len(p.chunks)]
                offset += len(p.chunks)

    def _stored_hash(self, tenant: str, collection: str, source: str) -> str | None:
        with self.session_factory() as session:
            return session.scalars(
                select(Document.content_hash).where(
                    Document.tenant == tenant,
                    Document.collection == collection,
                    Document.source == source,
                )
            ).one_or_none()

    def _flush(
        self,
        report: IngestReport,
        tenant: str,
        collection: str,
        pending: list[PreparedDocument],
        gone: list[str],
        bar: Any,
    ) -> None:
        try:
            self._embed(pending, bar)
            self.indexes.current(tenant, collection)  # legacy vectors are stored before locking
            result = self.writer.write(tenant, collection, pending, gone)
        except CollectionLimitError as exc:  # nothing stored: the limit names itself
            error = f"not stored: {exc}"
            report.files += [FileResult(p.source, "failed", error=error) for p in pending]
            report.files += [FileResult(s, "failed", error=error) for s in gone]
            return
        except Exception as exc:  # rolled back whole, unless it struck after the commit
            error = f"not stored, batch rolled back ({public_reason(exc)})"
            try:
                stored = self._committed(tenant, collection, pending, gone)
            except Exception:  # the database cannot tell us now: reported as not stored
                stored = set()
            for p in pending:
                if p.source in stored:  # committed: stored and searchable, never "failed"
                    status: FileStatus = "updated" if p.existed else "added"
                    report.files.append(FileResult(p.source, status, len(p.chunks)))
                else:
                    report.files.append(FileResult(p.source, "failed", error=error))
            report.files += [FileResult(s, "deleted") if s in stored
                             else FileResult(s, "failed", error=error) for s in gone]  # fmt: skip
            return
        for p in pending:
            status = result.statuses[p.source] or "unchanged"
            chunks = len(p.chunks) if status in ("added", "updated") else 0
            report.files.append(FileResult(p.source, status, chunks))
        report.files += [FileResult(s, "deleted") for s in gone if result.statuses.get(s)]

    def _committed(
        self, tenant: str, collection: str, pending: list[PreparedDocument], gone: list[str]
    ) -> set[str]:
        """The sources of a failed write whose change the database holds all the same: a
        pending file stored with these very bytes, a gone file no longer stored."""
        sources = [p.source for p in pending] + gone
        with self.session_factory() as session:
            held = dict(
                session.execute(
                    select(Document.source, Document.content_hash).where(
                        Document.tenant == tenant,
                        Document.collection == collection,
                        Document.source.in_(sources),
                    )
                ).all()
            )
        done = {p.source for p in pending if held.get(p.source) == p.doc.content_hash}
        return done | {s for s in gone if s not in held}

    # -- delete ---------------------------------------------------------------------------------

    def delete(self, source: str, *, collection: str, tenant: str = "default") -> bool:
        """True when the document was found and removed from the database and the index."""
        check_name("tenant", tenant)
        check_name("collection", collection)
        if self.indexes.current(tenant, collection) is None:
            raise UnknownCollectionError(_unknown(tenant, collection))
        result = self.writer.write(tenant, collection, deletes=[normalise_source(source)])
        return result.statuses.get(normalise_source(source)) == "deleted"

    # -- search ---------------------------------------------------------------------------------

    def search(
        self,
        question: str,
        *,
        collection: str,
        tenant: str = "default",
        top_k: int = 3,
        mode: SearchMode | None = None,
    ) -> list[SearchHit]:
        """The ``top_k`` best passages of the tenant's collection, best first.

        ``mode``: "hybrid" (both legs fused, passages holding every term lifted), "dense"
        (FAISS only, cosine scores) or "lexical" (BM25 only); default the service's
        ``search_mode``. A question with no lexical term (punctuation, function words) gets
        the dense leg's ranking in hybrid mode and no hits in lexical mode."""
        mode = self.search_mode if mode is None else _check_mode(mode)
        if not isinstance(question, str) or not question.strip():
            raise QueryError("question is empty")
        if len(question) > self.max_query_chars:
            raise QueryError(
                f"question is {len(question)} characters, over the limit of {self.max_query_chars}"
            )
        if not 1 <= top_k <= MAX_TOP_K:
            raise QueryError(f"top_k must be between 1 and {MAX_TOP_K}, got {top_k}")
        check_name("tenant", tenant)
        check_name("collection", collection)
        legs = self.indexes.legs(tenant, collection)
        if legs is None:
            raise UnknownCollectionError(_unknown(tenant, collection))
        version, index, lexical = legs
        if index.ntotal == 0:
            return []
        depth = top_k + TIE_MARGIN if mode == "dense" else max(FUSION_DEPTH, top_k + TIE_MARGIN)
        # Each leg a span of the caller's trace (the OpenTelemetry API alone: without an SDK
        # configured by the process these are no-op spans).
        tracer = trace.get_tracer(__name__)
        dense: list[tuple[int, float]] = []
        if mode != "lexical":
            with tracer.start_as_current_span("dense search") as leg:
                query = self.embedder.encode([question.strip()])  # [1, dim]
                scores, ids = _search_one(index, query, min(depth, index.ntotal))
                dense = [
                    (int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0
                ]
                dense.sort(key=lambda hit: (-hit[1], hit[0]))
                leg.set_attributes(
                    {"specrag.retrieval.depth": depth, "specrag.retrieval.hits": len(dense)}
                )
        words = [] if mode == "dense" else query_terms(question)
        sparse: list[tuple[int, float]] = []
        if words:
            with tracer.start_as_current_span("lexical search") as leg:
                sparse = lexical.search(words, depth)
                leg.set_attributes(
                    {"specrag.retrieval.terms": len(words), "specrag.retrieval.hits": len(sparse)}
                )
        with tracer.start_as_current_span("fusion", attributes={"specrag.retrieval.mode": mode}):
            if mode == "hybrid":
                ranked = fuse(dense, sparse)
                if self.all_terms_bonus and words and ranked:
                    holding = lexical.holding_all(words, [f.chunk_id for f in ranked])
                    ranked = reward_all_terms(ranked, holding, self.all_terms_bonus)
            else:
                ranked = single(dense if mode == "dense" else sparse, mode)
        # Only the passages that can make the top k are read (a margin for rows the tenant
        # check below drops, which a consistent index never has), not every fused candidate.
        ranked = sorted(ranked, key=lambda f: (-f.score, f.chunk_id))[: top_k + TIE_MARGIN]
        found: dict[int, Fused] = {f.chunk_id: f for f in ranked}
        if not found:
            return []
        with self.session_factory() as session:
            # The tenant and collection are checked again here, not only by choice of index file.
            rows = session.execute(
                select(Chunk, Document.source)
                .join(Document, Chunk.document_id == Document.id)
                .where(
                    Chunk.id.in_(found),
                    Document.tenant == tenant,
                    Document.collection == collection,
                )
            ).all()
        hits = []
        for c, source in rows:
            f = found[c.id]
            hits.append(SearchHit(source, c.id, f.score, c.text, c.title, c.heading, c.position,
                                  version, f.dense_rank, f.lexical_rank, f.dense_score,
                                  f.lexical_score))  # fmt: skip
        return sorted(hits, key=lambda h: (-h.score, h.chunk_id))[:top_k]

    def index_version(self, *, collection: str, tenant: str = "default") -> int | None:
        """The collection's current index version, or None when it does not exist."""
        check_name("tenant", tenant)
        check_name("collection", collection)
        with self.session_factory() as session:
            return session.scalars(
                select(CollectionIndex.version).where(
                    CollectionIndex.tenant == tenant, CollectionIndex.collection == collection
                )
            ).one_or_none()

    def _backfill(self, tenant: str, collection: str) -> None:
        """Store the vectors of chunks ingested before migration 0004 (from this host's index
        file where it has one, else embedded, with a warning): once, for every host."""
        backfill_collection(
            self.session_factory, self.store, self.embedder.encode, tenant, collection
        )


def _search_one(index: faiss.Index, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(scores [1, k], ids [1, k])`` for one query vector, searched on this thread alone.

    One query gains nothing from OpenMP threads and, on a shared CPU, loses a lot waiting for
    them (measured at 100k chunks: p50 73 ms with 2 threads, 17 ms with 1). The setting is this
    thread's own OpenMP state, so it is restored for whatever this thread runs next."""
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        return index.search(query, k)
    finally:
        faiss.omp_set_num_threads(previous)


def _check_mode(mode: str) -> SearchMode:
    if mode not in SEARCH_MODES:
        raise QueryError(f"search mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
    return mode  # type: ignore[return-value]


def _unknown(tenant: str, collection: str) -> str:
    return f"collection {collection!r} does not exist for tenant {tenant!r}"


def open_retrieval(
    session_factory: sessionmaker[Session],
    index_dir: str | Path,
    load_embedder: Callable[[], Embedder],
    *,
    warm_collections: int | None = 16,
    max_held: int = 0,
    **options: Any,
) -> RetrievalService:
    """A host's retrieval, started in the time of the slower of its two independent parts.

    The embedding model loads (``load_embedder``: imports and weights, seconds) while this
    host's indexes of the ``warm_collections`` most recently written collections catch up from
    the database (stored vectors or the change log, never the model). The index work is mostly
    database reads and FAISS adds, which release the GIL, so it overlaps the load.
    ``warm_collections=0`` skips warming (indexes then catch up at their first search).
    ``max_held``: collections held in memory at most (0: no limit).
    ``options``: RetrievalService's keyword arguments."""
    indexes = HostIndexes(session_factory, IndexStore(index_dir), max_held=max_held)
    warmer = None
    if warm_collections != 0:
        warmer = threading.Thread(
            target=indexes.warm, args=(warm_collections,), name="specrag-index-warm", daemon=True
        )
        warmer.start()
    embedder = load_embedder()
    if warmer is not None:
        warmer.join()
    return RetrievalService(session_factory, index_dir, embedder, indexes=indexes, **options)
