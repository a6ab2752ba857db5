"""This host's indexes, brought to the committed version from its own files and the database.

It exists so that any host serves the version the database names without the embedding model
and without writing anything: from memory when it is current; else from the newest index it
holds (in memory, a FAISS file, a lexical directory) plus the logged changes since (small
deltas), or built from the stored vectors and terms (a new host, a lost data directory, a host
far behind, a new IVF layout). Each leg starts from its own newest copy: FAISS files are
written every few thousand replayed changes, lexical directories at every version.
Nothing here locks a collection or commits, so searching never moves a version.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from weakref import WeakValueDictionary

import faiss
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from retrieval.changelog import (
    Contents,
    Delta,
    IndexState,
    MissingVectorsError,
    Terms,
    read_contents,
    read_delta,
    read_state,
    read_terms,
    snapshot,
)
from retrieval.held import Held, HeldIndexes, Key
from retrieval.index_store import IndexFileError, IndexStore
from retrieval.indexes import build
from retrieval.lexical import LexicalChange, LexicalIndex
from retrieval.lexical_copies import LexicalCopies, discard_quietly
from retrieval.records import CollectionIndex, IndexChange

log = logging.getLogger(__name__)

# A delta touching more than this share of the collection (and more than REPLAY_ALWAYS changes,
# which replay in milliseconds whatever the size) is slower to replay than a rebuild.
REBUILD_FRACTION = 0.5
REPLAY_ALWAYS = 1000
# Changes replayed since this host last wrote a file before it writes one (restarts stay cheap
# without writing a large file on every small catch-up).
PERSIST_CHANGES = 2000
# A build this large logs its progress (a million vectors take seconds to add).
BUILD_PROGRESS_EVERY = 100_000

Fill = Callable[[str, str], object]
Legs = tuple[int, faiss.Index, LexicalIndex]


@dataclass
class _Plan:
    base: int | None  # version replayed from (None: build from ``contents``)
    delta: Delta | None
    contents: Contents | None
    terms: Terms | None = None  # every chunk's terms, when the lexical leg has no base
    lex_base: int | None = None  # version the lexical leg starts from (held or a directory)
    lex_delta: Delta | None = None  # the changes since lex_base (``delta`` when the same base)


class HostIndexes:
    """Per-process holder of this host's indexes; ``current`` catches up, never writes."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        store: IndexStore,
        fill: Fill | None = None,
        *,
        max_held: int = 0,
    ) -> None:
        """``max_held``: collections held in memory at most (0: no limit); the least recently
        used is let go when another is caught up (docs/operations.md, "Faults")."""
        self.session_factory = session_factory
        self.store = store
        # Called to store the vectors of chunks ingested before migration 0004 (retrieval.backfill).
        self.fill = fill
        # memory / delta / build (FAISS), lexical open / delta / build: how each catch-up went
        self.sources: Counter[str] = Counter()
        self.lexical_copies = LexicalCopies(store, self.sources)
        self._held = HeldIndexes(max_held)  # an LRU: each held index costs a Tantivy thread
        # Weak: a collection's lock lives while some thread uses it, not for the process's life.
        self._locks: WeakValueDictionary[Key, threading.RLock] = WeakValueDictionary()
        self._guard = threading.Lock()
        self._writing: list[threading.Thread] = []  # index files being written after an answer
        self._damaged: set[Key] = set()  # collections whose file was refused, being rebuilt

    def current(
        self, tenant: str, collection: str, *, fill: bool = True
    ) -> tuple[int, faiss.Index] | None:
        """``(version, index)`` as committed now, or None when the collection does not exist.

        The index is shared with other threads: search it, never change it. ``fill=False``
        raises MissingVectorsError rather than storing legacy vectors (a writer holding the
        collection's lock must not wait for a second write)."""
        legs = self.legs(tenant, collection, fill=fill)
        return None if legs is None else (legs[0], legs[1])

    def legs(self, tenant: str, collection: str, *, fill: bool = True) -> Legs | None:
        """``(version, FAISS index, lexical index)`` as committed now (both legs of the same
        version), or None when the collection does not exist; as ``current`` otherwise."""
        key = (tenant, collection)
        held = self._get(key)
        if held is not None:  # the common case, without waiting for a catch-up lock
            with self.session_factory() as session:
                state = read_state(session, tenant, collection)
            if state is None:
                return None
            if state.version == held.version:
                self.sources["memory"] += 1
                return held.version, held.index, held.lexical
        with self._key_lock(key):
            held = self._get(key)  # another thread may have caught up meanwhile
            try:
                got = self._snapshot(tenant, collection, held)
            except MissingVectorsError:
                if self.fill is None or not fill:
                    raise
                self.fill(tenant, collection)
                got = self._snapshot(tenant, collection, held)
            if got is None:
                return None
            state, plan = got
            return self._apply(tenant, collection, state, held, plan)

    def warm(self, limit: int | None = None) -> int:
        """Bring the ``limit`` most recently written collections (all: None) up to date now.

        A host start calls this beside the embedding model's load, so its first answers find
        their indexes in memory. Never raises: a collection that cannot be caught up (legacy
        rows without vectors, a transient database error) is logged and left to its first
        search. Returns the number of collections held afterwards."""
        with self.session_factory() as session:
            query = select(CollectionIndex.tenant, CollectionIndex.collection).order_by(
                CollectionIndex.updated_at.desc(), CollectionIndex.id.desc()
            )
            if limit is not None:
                query = query.limit(limit)
            keys = [(str(t), str(c)) for t, c in session.execute(query)]
        for tenant, collection in keys:
            try:
                self.current(tenant, collection, fill=False)
            except Exception:  # warming is an optimisation: the first search retries
                log.warning("warming %s/%s failed", tenant, collection, exc_info=True)
        return sum(1 for key in keys if self._get(key) is not None)

    def committed(self, tenant: str, collection: str, version: int) -> faiss.Index:
        """The (shared) index of ``version``, for a writer that holds the collection's lock, so
        that the committed version cannot move; it copies the index before changing it."""
        got = self.current(tenant, collection, fill=False)
        if got is None or got[0] != version:
            found = None if got is None else got[0]
            raise RuntimeError(f"{tenant}/{collection}: expected version {version}, read {found}")
        return got[1]

    def remember(
        self, tenant: str, collection: str, version: int, index: faiss.Index, change: LexicalChange
    ) -> None:
        """Hold ``index`` as ``version`` (when newer than what is held) with the lexical index
        of ``change`` applied, and write the FAISS file."""
        key = (tenant, collection)
        with self._key_lock(key):
            held = self._get(key)
            lexical = None
            if change.base == 0:
                lexical = self.lexical_copies.build(tenant, collection, version, change.add_ids,
                                                    change.add_terms)  # fmt: skip
            elif held is not None and held.version == change.base:
                lexical = self.lexical_copies.change(tenant, collection, version, held.lexical,
                                                     change)  # fmt: skip
            if lexical is not None:
                self._hold(key, version, index, 0, lexical)
            # else: another thread holds this version already, or the next search catches up
        self._persist(tenant, collection, version, index)

    def forget(self, tenant: str, collection: str) -> None:
        """Let go of what memory holds of the collection (its next search catches up again)."""
        self._held.forget((tenant, collection))

    def held_count(self) -> int:
        """Collections held in memory now."""
        return len(self._held)

    def held_version(self, tenant: str, collection: str) -> int | None:
        """The version this process holds in memory (None: none yet)."""
        held = self._get((tenant, collection))
        return None if held is None else held.version

    # -- steps ----------------------------------------------------------------------------------

    def _snapshot(
        self, tenant: str, collection: str, held: Held | None
    ) -> tuple[IndexState, _Plan | None] | None:
        def read(session: Session, state: IndexState) -> _Plan | None:
            return self._plan(session, tenant, collection, state, held)

        return snapshot(self.session_factory, tenant, collection, read)

    def _plan(
        self,
        session: Session,
        tenant: str,
        collection: str,
        state: IndexState,
        held: Held | None,
    ) -> _Plan | None:
        """What to read to reach ``state``: nothing (held is current), a delta, or everything."""
        if held is not None and held.version == state.version:
            return None
        base = held.version if held is not None and held.version < state.version else None
        if base is None:
            base = next((v for v in self.store.versions(tenant, collection)
                         if v <= state.version), None)  # fmt: skip
        plan = _Plan(None, None, None)
        if base is not None and state.can_replay_from(base) and _small_gap(session, state, base):
            plan.base, plan.delta = base, read_delta(session, tenant, collection, state, base)
        else:
            plan.contents = read_contents(session, tenant, collection, state)
        # The lexical leg: held in memory, or this host's newest directory, whichever is newer.
        disk = next((v for v in self.store.lexical_versions(tenant, collection)
                     if v <= state.version), None)  # fmt: skip
        mine = held.version if held is not None and held.version < state.version else None
        lex_base = max((v for v in (disk, mine) if v is not None), default=None)
        if lex_base is not None and lex_base < state.version:
            if lex_base == plan.base:
                plan.lex_delta = plan.delta
            elif state.log_floor <= lex_base and _small_gap(session, state, lex_base):
                plan.lex_delta = read_delta(session, tenant, collection, state, lex_base)
            else:
                lex_base = None
        plan.lex_base = lex_base
        if lex_base is None and plan.contents is None:
            plan.terms = read_terms(session, tenant, collection)
        return plan

    def _apply(
        self,
        tenant: str,
        collection: str,
        state: IndexState,
        held: Held | None,
        plan: _Plan | None,
    ) -> Legs:
        """``(version, index, lexical)``: normally ``state``'s, or a later one if it moved."""
        if plan is None:
            assert held is not None
            self.sources["memory"] += 1
            return held.version, held.index, held.lexical
        index: Any = None
        unsaved = 0
        if plan.delta is not None:
            index, unsaved = self._replay(tenant, collection, held, plan.base, plan.delta)
        lexical = self.lexical_copies.reach(
            tenant, collection, state.version, base=plan.lex_base, delta=plan.lex_delta,
            held=held.lexical if held is not None and held.version == plan.lex_base else None,
            terms=plan.terms,
        )  # fmt: skip
        if lexical is not None and lexical.ntotal != state.num_vectors:
            log.warning("lexical index of %s/%s at version %d holds %d chunks, the database %d:"
                        " rebuilding", tenant, collection, state.version, lexical.ntotal,
                        state.num_vectors)  # fmt: skip
            if lexical.directory is not None:  # never opened again: this version is rebuilt
                discard_quietly(lexical.directory)
            lexical = None
        if index is not None and index.ntotal != state.num_vectors:
            log.warning(
                "index of %s/%s at version %d holds %d vectors, the database %d: rebuilding",
                tenant, collection, state.version, index.ntotal, state.num_vectors,
            )  # fmt: skip
            index = None
        if index is None or lexical is None:
            contents: Contents | Terms | None = plan.contents
            if contents is None:
                # A replay failed or a lexical copy was unusable: read again, at this very
                # version; the stored terms alone when only the lexical leg is missing.
                def read(s: Session, st: IndexState) -> Contents | Terms:
                    if index is None:
                        return read_contents(s, tenant, collection, st)
                    return read_terms(s, tenant, collection)

                got = snapshot(self.session_factory, tenant, collection, read)
                if got is None or got[0].version != state.version:
                    # Moved on meanwhile: serve what is committed now (re-entrant lock).
                    now = self.legs(tenant, collection)
                    if now is None:
                        raise LookupError(f"collection {collection!r} of {tenant!r} is gone")
                    return now
                contents = got[1]
            if lexical is None:
                lexical = self.lexical_copies.build(tenant, collection, state.version,
                                                    contents.ids, contents.terms)  # fmt: skip
            if index is None:
                assert isinstance(contents, Contents)
                index = self._build(tenant, collection, state, contents)
                self.sources["build"] += 1
                unsaved = PERSIST_CHANGES
            else:
                self.sources["delta"] += 1
        else:
            self.sources["delta"] += 1
        if unsaved >= PERSIST_CHANGES:
            self._hold((tenant, collection), state.version, index, 0, lexical)
            # After the answer, not before it: a 100k-chunk file takes seconds on a busy disk.
            self._persist_later(tenant, collection, state.version, index)
        else:
            self._hold((tenant, collection), state.version, index, unsaved, lexical)
        return state.version, index, lexical

    def _build(
        self, tenant: str, collection: str, state: IndexState, contents: Contents
    ) -> faiss.Index:
        """The index of ``state`` built from the database's vectors, its progress logged."""
        started = time.perf_counter()
        total = len(contents.ids)

        def progress(done: int) -> None:
            log.info("index of %s/%s v%d: %d of %d vectors added", tenant, collection,
                     state.version, done, total)  # fmt: skip

        index = build(state.kind, contents.centroids, contents.ids, contents.vectors, state.dim,
                      progress if total >= BUILD_PROGRESS_EVERY else None)  # fmt: skip
        with self._guard:
            repaired = (tenant, collection) in self._damaged
            self._damaged.discard((tenant, collection))
        if total >= BUILD_PROGRESS_EVERY or repaired:
            log.info("index of %s/%s v%d rebuilt from the database's %d vectors in %.1f s",
                     tenant, collection, state.version, total,
                     time.perf_counter() - started)  # fmt: skip
        return index

    def _replay(
        self, tenant: str, collection: str, held: Held | None, base: int | None, delta: Delta
    ) -> tuple[faiss.Index | None, int]:
        """``(index at base + delta, changes not yet in a file)``; None when the base is gone."""
        if held is not None and held.version == base:
            index = faiss.clone_index(held.index)  # searches may be running on the held one
            unsaved = held.unsaved
        else:
            try:
                index = self.store.read(tenant, collection, base or 0)
            except IndexFileError as exc:  # damaged: never served, never tried again
                log.error("index file of %s/%s version %s refused: %s; removed, rebuilding from"
                          " the database's vectors", tenant, collection, base, exc)  # fmt: skip
                self.sources["damaged"] += 1
                self.store.discard(tenant, collection, base or 0)
                with self._guard:
                    self._damaged.add((tenant, collection))
                return None, 0
            except (FileNotFoundError, RuntimeError) as exc:  # pruned meanwhile, or unreadable
                log.warning("index file of %s/%s v%s unusable (%s)", tenant, collection, base, exc)
                return None, 0
            unsaved = 0
        if len(delta.remove_ids):
            index.remove_ids(faiss.IDSelectorBatch(delta.remove_ids))
        if len(delta.add_ids):
            index.add_with_ids(delta.add_vectors, delta.add_ids)
        return index, unsaved + len(delta)

    def wait_for_files(self, timeout: float | None = 60.0) -> None:
        """Return once the index files this process started writing are on disk."""
        with self._guard:
            writing, self._writing = self._writing, []
        for thread in writing:
            thread.join(timeout)

    def _persist_later(self, tenant: str, collection: str, version: int, index: Any) -> None:
        thread = threading.Thread(
            target=self._persist, args=(tenant, collection, version, index), daemon=True,
            name=f"index-file-{version}",
        )  # fmt: skip
        with self._guard:
            self._writing = [t for t in self._writing if t.is_alive()] + [thread]
        thread.start()

    def _persist(self, tenant: str, collection: str, version: int, index: faiss.Index) -> None:
        try:
            self.store.write(tenant, collection, version, index)
            self.store.prune(tenant, collection, version)
        except (OSError, RuntimeError) as exc:  # a cache file: the database has everything
            log.warning("could not write index file of %s/%s v%d: %s", tenant, collection,
                        version, exc)  # fmt: skip

    def _hold(
        self, key: Key, version: int, index: faiss.Index, unsaved: int, lexical: LexicalIndex
    ) -> None:
        self._held.hold(key, Held(version, index, unsaved, lexical))

    def _get(self, key: Key) -> Held | None:
        return self._held.get(key)

    def _key_lock(self, key: Key) -> threading.RLock:
        # Re-entrant: a replay that finds its base gone serves ``current`` again on this thread.
        with self._guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.RLock()
            return lock


def _small_gap(session: Session, state: IndexState, since: int) -> bool:
    """True when the changes after ``since`` are few enough to replay rather than rebuild."""
    count = session.scalar(
        select(func.count())
        .select_from(IndexChange)
        .where(
            IndexChange.collection_index_id == state.row_id,
            IndexChange.version > since,
            IndexChange.version <= state.version,
        )
    )
    return (count or 0) <= max(REPLAY_ALWAYS, REBUILD_FRACTION * state.num_vectors)
