"""One collection's lexical (BM25) index on this host: Tantivy in memory, fed stored terms.

It exists beside the FAISS index so that exact names are found (docs/lexical.md says why
Tantivy). Each chunk's terms are computed once, at ingest (retrieval.terms), and stored in
``chunks.lexical_terms``; a host builds this index from those stored terms and applies the same
logged changes as its FAISS index (retrieval.host_indexes), so no host re-analyses text and both
legs always hold the same version. Tantivy splits the stored string at spaces only.

A ``LexicalIndex`` is a searcher snapshot: searches keep using it while a later version is
written. Several snapshots share one Tantivy index, which only moves forward; ``changed``
returns the next snapshot, or None when that index has moved past this one (build a new one).
Questions become OR-ed term queries built here, never parsed, so no character of a question is
query syntax.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import tantivy

log = logging.getLogger(__name__)

# Writer memory: Tantivy flushes a segment when it fills; 50 MB keeps a 1M-chunk build to a few
# segments, and a small change needs far less.
BUILD_HEAP_BYTES = 50_000_000
CHANGE_HEAP_BYTES = 15_000_000
PROGRESS_EVERY = 100_000
# Removed chunks stay in Tantivy's BM25 statistics (document count, frequencies, mean length)
# until their segment merges, so a host that applied removals scores slightly differently from
# one that built from the stored terms. Past this share of removed documents ``changed``
# declines and the host builds afresh, which bounds that difference (docs/lexical.md).
MAX_REMOVED_FRACTION = 0.2
_TOKENIZER = "stored_terms"

Progress = Callable[[int], object]


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_unsigned_field("chunk_id", stored=False, indexed=True, fast=True)
    builder.add_text_field("terms", stored=False, tokenizer_name=_TOKENIZER, index_option="freq")
    return builder.build()


@dataclass
class LexicalChange:
    """What one write changed, for the lexical index: its base version, removals, additions."""

    base: int
    remove_ids: np.ndarray  # [r] int64
    add_ids: np.ndarray  # [a] int64
    add_terms: list[str]  # [a]


@dataclass
class _Shared:
    """The Tantivy index that a chain of snapshots shares; ``head`` names the newest one."""

    index: tantivy.Index
    schema: tantivy.Schema
    head: int = 0
    added: int = 0  # documents ever added (live + removed ones still in statistics)
    lock: threading.Lock = field(default_factory=threading.Lock)


class LexicalIndex:
    """A BM25 snapshot of one collection: ``search`` it, ``changed`` gives the next one."""

    def __init__(self, shared: _Shared, searcher: tantivy.Searcher, generation: int) -> None:
        self._shared = shared
        self._searcher = searcher
        self._generation = generation

    @property
    def ntotal(self) -> int:
        """Chunks this snapshot holds."""
        return int(self._searcher.num_docs)

    @classmethod
    def build(
        cls, ids: Sequence[int], terms: Sequence[str], progress: Progress | None = None
    ) -> LexicalIndex:
        """A new index holding every ``(chunk id, stored terms)``; ``progress(n)`` after each
        ``PROGRESS_EVERY`` chunks (large builds are also logged)."""
        schema = _schema()
        index = tantivy.Index(schema)
        index.register_tokenizer(
            _TOKENIZER, tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()
        )
        index.config_reader(reload_policy="manual")  # a snapshot moves only when we say so
        shared = _Shared(index, schema)
        started = time.perf_counter()
        writer = index.writer(heap_size=BUILD_HEAP_BYTES, num_threads=1)
        try:
            for done, (chunk_id, text) in enumerate(zip(ids, terms, strict=True), start=1):
                writer.add_document(_document(int(chunk_id), text))
                if done % PROGRESS_EVERY == 0:
                    log.info("lexical index: %d of %d chunks", done, len(ids))
                    if progress is not None:
                        progress(done)
            writer.commit()
            writer.wait_merging_threads()
        except BaseException:
            writer.rollback()
            raise
        shared.added = len(ids)
        index.reload()
        if len(ids) >= PROGRESS_EVERY:
            log.info("lexical index of %d chunks built in %.1f s", len(ids),
                     time.perf_counter() - started)  # fmt: skip
        return cls(shared, index.searcher(), 0)

    def changed(
        self, remove_ids: np.ndarray, add_ids: np.ndarray, add_terms: Sequence[str]
    ) -> LexicalIndex | None:
        """The snapshot after removing and adding chunks, or None when the shared index has
        already moved past this snapshot or would hold too many removed documents (then the
        caller builds one from stored terms)."""
        shared = self._shared
        with shared.lock:
            if shared.head != self._generation:
                return None
            live = self.ntotal - len(remove_ids) + len(add_ids)  # about: removals may miss
            if shared.added + len(add_ids) - live > MAX_REMOVED_FRACTION * max(live, 1):
                return None
            writer = shared.index.writer(heap_size=CHANGE_HEAP_BYTES, num_threads=1)
            try:
                if len(remove_ids):
                    query = tantivy.Query.term_set_query(
                        shared.schema, "chunk_id", [int(i) for i in remove_ids]
                    )
                    writer.delete_documents_by_query(query)
                for chunk_id, text in zip(add_ids, add_terms, strict=True):
                    writer.add_document(_document(int(chunk_id), text))
                writer.commit()
                writer.wait_merging_threads()
            except BaseException:
                writer.rollback()
                shared.head = -1  # half-applied: no snapshot may build on this index again
                raise
            shared.added += len(add_ids)
            shared.index.reload()
            shared.head += 1
            return LexicalIndex(shared, shared.index.searcher(), shared.head)

    def search(self, terms: Sequence[str], k: int) -> list[tuple[int, float]]:
        """Up to ``k`` ``(chunk id, BM25 score)`` matching any of ``terms``, best first; equal
        scores in chunk-id order (the caller asks a few extra, so the cut is host-independent)."""
        if not terms or k <= 0 or self.ntotal == 0:
            return []
        schema = self._shared.schema
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "terms", t)) for t in terms]
        )
        found = self._searcher.search(query, k, count=False).hits
        ids = self._searcher.fast_field_values("chunk_id", [address for _, address in found])
        hits = [(int(i or 0), float(score)) for (score, _), i in zip(found, ids, strict=True)]
        return sorted(hits, key=lambda hit: (-hit[1], hit[0]))


def _document(chunk_id: int, terms: str) -> tantivy.Document:
    doc = tantivy.Document()
    doc.add_unsigned("chunk_id", chunk_id)
    doc.add_text("terms", terms)
    return doc
