"""This host's lexical index of one version: opened from its directory, changed or built.

It exists so that retrieval.host_indexes treats the lexical leg as it treats FAISS files: each step
is a cache step that may fail (a damaged directory, a full disk) without failing a search, and
falls back to the next (open → change a base → build from stored terms → the caller reads every
chunk). Outcomes are counted in ``sources`` ("lexical open", "lexical delta", "lexical build",
"lexical unusable") and the bad ones logged. The directories' format: retrieval.lexical_files.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np

from retrieval.changelog import Delta, Terms
from retrieval.index_store import IndexStore
from retrieval.lexical import LexicalChange, LexicalIndex
from retrieval.lexical_files import LexicalDirectoryError, discard

log = logging.getLogger("retrieval.host_indexes")  # one logger for both legs' catch-up


class LexicalCopies:
    """Opens, changes, builds and prunes one host's lexical directories (``store``'s layout)."""

    def __init__(self, store: IndexStore, sources: Counter[str]) -> None:
        self.store = store
        self.sources = sources

    def reach(
        self,
        tenant: str,
        collection: str,
        version: int,
        *,
        base: int | None,
        held: LexicalIndex | None,
        delta: Delta | None,
        terms: Terms | None,
    ) -> LexicalIndex | None:
        """The index of ``version``: its directory, a base (``held`` when it is the base's, else
        the base's directory) plus ``delta``, or built from ``terms``; None when none of these
        worked (the caller then reads the stored terms itself)."""
        if base is not None:
            source = held if held is not None else self.open(tenant, collection, base)
            if source is not None and base == version:
                return source
            if source is not None and delta is not None:
                change = LexicalChange(base, delta.remove_ids, delta.add_ids, delta.add_terms)
                got = self.change(tenant, collection, version, source, change)
                if got is not None:
                    return got
        if terms is not None:
            return self.build(tenant, collection, version, terms.ids, terms.terms)
        return None

    def open(self, tenant: str, collection: str, version: int) -> LexicalIndex | None:
        """This host's directory of ``version``, checked; a damaged or foreign one is removed."""
        directory = self.store.lexical_dir(tenant, collection, version)
        try:
            opened = LexicalIndex.open(directory, version)
        except LexicalDirectoryError as exc:
            log.warning("lexical index of %s/%s v%d unusable, rebuilding: %s", tenant, collection,
                        version, exc)  # fmt: skip
            self.sources["lexical unusable"] += 1
            discard_quietly(directory)
            return None
        self.sources["lexical open"] += 1
        return opened

    def change(
        self, tenant: str, collection: str, version: int, source: LexicalIndex,
        change: LexicalChange,
    ) -> LexicalIndex | None:  # fmt: skip
        """``source`` with ``change`` applied, published as ``version``; None when it declines
        (too many removed documents, an index in memory only) or the disk refuses."""
        directory = self.store.lexical_dir(tenant, collection, version)
        try:
            got = source.changed(change.remove_ids, change.add_ids, change.add_terms, directory,
                                 version)  # fmt: skip
        except (OSError, ValueError, LexicalDirectoryError) as exc:  # tantivy: ValueError on I/O
            log.warning("could not write lexical index of %s/%s v%d: %s", tenant, collection,
                        version, exc)  # fmt: skip
            return None
        if got is not None:
            self.sources["lexical delta"] += 1
            self._prune(tenant, collection, version)
        return got

    def build(
        self, tenant: str, collection: str, version: int, ids: np.ndarray, terms: list[str]
    ) -> LexicalIndex:
        """An index of every stored term, published as ``version`` (progress logged every
        100,000 chunks); held in memory only when the disk refuses (a later version then
        builds again)."""
        directory = self.store.lexical_dir(tenant, collection, version)
        self.sources["lexical build"] += 1
        try:
            built = LexicalIndex.build(ids.tolist(), terms, directory=directory, version=version)
        except (OSError, ValueError, LexicalDirectoryError) as exc:  # a full disk, I/O errors
            log.warning("could not write lexical index of %s/%s v%d, holding it in memory: %s",
                        tenant, collection, version, exc)  # fmt: skip
            return LexicalIndex.build(ids.tolist(), terms)
        self._prune(tenant, collection, version)
        return built

    def _prune(self, tenant: str, collection: str, version: int) -> None:
        try:
            self.store.prune_lexical(tenant, collection, version)
        except OSError as exc:  # a cache: what is left is removed next time
            log.warning("could not prune lexical indexes of %s/%s: %s", tenant, collection, exc)


def discard_quietly(directory: Path) -> None:
    """Remove a directory that must not be served again; a failure is only logged."""
    try:
        discard(directory)
    except OSError as exc:  # a cache: a later version's prune or rebuild tries again
        log.warning("could not remove lexical index %s: %s", directory, exc)
