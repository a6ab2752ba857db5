"""One collection's lexical (BM25) index on this host: a Tantivy directory fed stored terms.

It exists beside the FAISS index so that exact names are found (docs/lexical.md says why
Tantivy). Each chunk's terms are computed once, at ingest (retrieval.terms), and stored in
``chunks.lexical_terms``; a host builds this index from those stored terms and applies the same
logged changes as its FAISS index (retrieval.host_indexes), so no host re-analyses text and both
legs always hold the same version. Tantivy splits the stored string at spaces only.

Each version lives in its own directory, never changed once published
(retrieval.lexical_files): ``changed`` writes the next version into a new directory that shares
the unchanged segment files, so a ``LexicalIndex`` is a snapshot that searches keep using while
a later version is written, and a restarted host ``open``s the directory instead of rebuilding.
Without a directory (a full disk, a benchmark) an index is built in memory and cannot change.
Questions become OR-ed term queries built here, never parsed, so no character of a question is
query syntax.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tantivy

import retrieval.lexical_files as files
from retrieval.lexical_files import LexicalDirectoryError, Manifest

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
    # Any change here must change lexical_files.FORMAT, so that old directories are rebuilt.
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


class LexicalIndex:
    """A BM25 snapshot of one collection version: ``search`` it, ``changed`` gives the next."""

    def __init__(self, index: tantivy.Index, directory: Path | None, manifest: Manifest) -> None:
        self._index = index
        self._searcher = index.searcher()
        self._schema = index.schema
        self.directory = directory  # None: held in memory only
        self._manifest = manifest

    @property
    def ntotal(self) -> int:
        """Chunks this snapshot holds."""
        return int(self._searcher.num_docs)

    @classmethod
    def build(
        cls,
        ids: Sequence[int],
        terms: Sequence[str],
        progress: Progress | None = None,
        *,
        directory: Path | None = None,
        version: int = 0,
    ) -> LexicalIndex:
        """A new index holding every ``(chunk id, stored terms)``; ``progress(n)`` after each
        ``PROGRESS_EVERY`` chunks (large builds are also logged).

        ``directory``: published there as ``version``; when another process of this host
        published it first, that one is opened. OSError when
        the disk refuses (the caller may build in memory instead)."""
        tmp = None if directory is None else files.private_dir(directory)
        try:
            index = _new_index(tmp)
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
            if len(ids) >= PROGRESS_EVERY:
                log.info("lexical index of %d chunks built in %.1f s", len(ids),
                         time.perf_counter() - started)  # fmt: skip
            if tmp is None or directory is None:
                index.reload()
                return cls(index, None, Manifest(version, len(ids), len(ids), {}))
            manifest = files.seal(tmp, version, len(ids), len(ids), None)
            return _published(tmp, directory, manifest)
        finally:
            if tmp is not None and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def open(cls, directory: Path, version: int) -> LexicalIndex:
        """The published index of ``version`` in ``directory``, every file checked first;
        LexicalDirectoryError when it is missing, damaged or of another format or version."""
        manifest = files.verify(directory, version)
        try:
            index = _open_index(directory)
            opened = cls(index, directory, manifest)
        except Exception as exc:  # checksums passed, yet Tantivy refuses it
            raise LexicalDirectoryError(f"{directory}: Tantivy cannot open it ({exc})") from exc
        if opened.ntotal != manifest.chunks:
            raise LexicalDirectoryError(
                f"{directory}: holds {opened.ntotal} chunks, its manifest {manifest.chunks}"
            )
        return opened

    def changed(
        self,
        remove_ids: np.ndarray,
        add_ids: np.ndarray,
        add_terms: Sequence[str],
        directory: Path,
        version: int,
    ) -> LexicalIndex | None:
        """The snapshot of ``version`` after removing and adding chunks, published in
        ``directory``; None when this one is held in memory only or the result would hold
        too many removed documents (then the caller builds one from stored terms).
        This snapshot is left as it was."""
        if self.directory is None:
            return None
        live = self.ntotal - len(remove_ids) + len(add_ids)  # about: removals may miss
        added = self._manifest.added + len(add_ids)
        if added - live > MAX_REMOVED_FRACTION * max(live, 1):
            return None
        tmp = files.private_dir(directory)
        try:
            files.clone(self.directory, self._manifest, tmp)
            index = _open_index(tmp)
            writer = index.writer(heap_size=CHANGE_HEAP_BYTES, num_threads=1)
            try:
                if len(remove_ids):
                    query = tantivy.Query.term_set_query(
                        index.schema, "chunk_id", [int(i) for i in remove_ids]
                    )
                    writer.delete_documents_by_query(query)
                for chunk_id, text in zip(add_ids, add_terms, strict=True):
                    writer.add_document(_document(int(chunk_id), text))
                writer.commit()
                writer.wait_merging_threads()
            except BaseException:
                writer.rollback()
                raise
            index.reload()
            live = int(index.searcher().num_docs)
            manifest = files.seal(tmp, version, live, added, self._manifest)
            return _published(tmp, directory, manifest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def search(self, terms: Sequence[str], k: int) -> list[tuple[int, float]]:
        """Up to ``k`` ``(chunk id, BM25 score)`` matching any of ``terms``, best first; equal
        scores in chunk-id order (the caller asks a few extra, so the cut is host-independent)."""
        if not terms or k <= 0 or self.ntotal == 0:
            return []
        schema = self._schema
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "terms", t)) for t in terms]
        )
        found = self._searcher.search(query, k, count=False).hits
        ids = self._searcher.fast_field_values("chunk_id", [address for _, address in found])
        hits = [(int(i or 0), float(score)) for (score, _), i in zip(found, ids, strict=True)]
        return sorted(hits, key=lambda hit: (-hit[1], hit[0]))

    def holding_all(self, terms: Sequence[str], chunk_ids: Sequence[int]) -> set[int]:
        """Those of ``chunk_ids`` whose stored terms include every one of ``terms`` (one
        Tantivy query: every term required, the chunk id among the given ones)."""
        if not terms or not chunk_ids or self.ntotal == 0:
            return set()
        schema = self._schema
        required = [tantivy.Query.term_query(schema, "terms", t) for t in terms]
        required.append(
            tantivy.Query.term_set_query(schema, "chunk_id", [int(i) for i in chunk_ids])
        )
        query = tantivy.Query.boolean_query([(tantivy.Occur.Must, q) for q in required])
        found = self._searcher.search(query, len(chunk_ids), count=False).hits
        ids = self._searcher.fast_field_values("chunk_id", [address for _, address in found])
        return {int(i) for i in ids if i is not None}


def _document(chunk_id: int, terms: str) -> tantivy.Document:
    doc = tantivy.Document()
    doc.add_unsigned("chunk_id", chunk_id)
    doc.add_text("terms", terms)
    return doc


def _new_index(directory: Path | None) -> tantivy.Index:
    index = tantivy.Index(_schema(), path=None if directory is None else str(directory),
                          reuse=False)  # fmt: skip
    _configure(index)
    return index


def _open_index(directory: Path) -> tantivy.Index:
    index = tantivy.Index.open(str(directory))
    _configure(index)
    return index


def _configure(index: tantivy.Index) -> None:
    # Tantivy stores the tokenizer's name, not the tokenizer: every opening registers it.
    index.register_tokenizer(
        _TOKENIZER, tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()
    )
    index.config_reader(reload_policy="manual")  # a snapshot moves only when we say so


def _published(tmp: Path, directory: Path, manifest: Manifest) -> LexicalIndex:
    """The index in ``directory`` once ``tmp`` is published there (or another process's)."""
    if files.publish(tmp, directory):
        return LexicalIndex(_open_index(directory), directory, manifest)
    return LexicalIndex.open(directory, manifest.version)
