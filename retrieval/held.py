"""The indexes one process holds in memory: a least-recently-used set of a fixed size.

It exists because a held index is not free: its vectors' memory and, for a lexical index opened
on a directory, a Tantivy thread (its meta-file watcher) that ends only when the index is let go.
A worker serving thousands of collections one after another holds the ``max_held`` most recently
used and lets go of the rest; a let-go collection's next search catches up again from this
host's files and the change log (retrieval.host_indexes). Searches still running on a let-go
index keep it alive until they return.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import faiss

from retrieval.lexical import LexicalIndex

Key = tuple[str, str]


@dataclass
class Held:
    """One collection as this process holds it: both legs of one version."""

    version: int
    index: faiss.Index
    unsaved: int  # changes replayed since the newest file this host wrote
    lexical: LexicalIndex  # the same version's BM25 index (its directory, or memory only)


class HeldIndexes:
    """Thread-safe LRU of ``Held`` by (tenant, collection); ``max_held`` 0 means no limit."""

    def __init__(self, max_held: int = 0) -> None:
        self.max_held = max_held
        self._held: OrderedDict[Key, Held] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Key) -> Held | None:
        """What is held for ``key`` (now the most recently used), or None."""
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                self._held.move_to_end(key)
            return held

    def hold(self, key: Key, held: Held) -> None:
        """Hold ``held`` unless a newer version is held; let go of the least recently used
        beyond ``max_held``."""
        with self._lock:
            current = self._held.get(key)
            if current is None or current.version < held.version:
                self._held[key] = held
            self._held.move_to_end(key)
            while self.max_held and len(self._held) > self.max_held:
                self._held.popitem(last=False)

    def forget(self, key: Key) -> None:
        """Let go of ``key``."""
        with self._lock:
            self._held.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)
