"""Checks of this host's index files of one collection, and their repair from the database.

It exists so that an operator can ask "is every index file on this host intact?" without
waiting for a search to load each one (``specrag index verify``). Every FAISS file's checksum
(retrieval.index_store) and every lexical directory's CRCs (retrieval.lexical_files) are read;
a damaged one is logged naming the collection and version, removed, and the committed version
rebuilt from the database's vectors and stored terms (progress logged by retrieval.host_indexes)
and written again. Files are caches: a repair never changes the database.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from retrieval.changelog import read_state
from retrieval.host_indexes import HostIndexes
from retrieval.lexical_copies import discard_quietly
from retrieval.lexical_files import LexicalDirectoryError, verify

log = logging.getLogger("retrieval.host_indexes")  # one logger for every index-file problem


@dataclass(frozen=True)
class Finding:
    """One file or directory checked: its leg ("faiss" or "lexical"), version and problem."""

    leg: str
    version: int
    problem: str | None  # None: intact


@dataclass
class Verified:
    """One collection's files on this host: what was checked, and whether it was rebuilt."""

    tenant: str
    collection: str
    version: int | None  # committed now (None: the collection does not exist)
    checked: list[Finding] = field(default_factory=list)
    rebuilt: bool = False

    @property
    def damaged(self) -> list[Finding]:
        """The files that were refused."""
        return [f for f in self.checked if f.problem is not None]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every field, plus ``damaged`` (a count)."""
        return {**asdict(self), "damaged": len(self.damaged)}


def verify_collection(
    indexes: HostIndexes, tenant: str, collection: str, *, repair: bool = True
) -> Verified:
    """Every index file of the collection on this host checked; with ``repair``, damaged ones
    removed and the committed version rebuilt from the database and written again."""
    store = indexes.store
    result = Verified(tenant, collection, None)
    for version in store.versions(tenant, collection):
        problem = store.check(tenant, collection, version).problem
        result.checked.append(Finding("faiss", version, problem))
        if problem is not None:
            log.error("index file of %s/%s version %d refused: %s%s", tenant, collection, version,
                      problem, "; removed, rebuilding" if repair else "")  # fmt: skip
            if repair:
                store.discard(tenant, collection, version)
    for version in store.lexical_versions(tenant, collection):
        directory = store.lexical_dir(tenant, collection, version)
        try:
            verify(directory, version)
            result.checked.append(Finding("lexical", version, None))
        except LexicalDirectoryError as exc:
            problem = str(exc).removeprefix(f"{directory}: ")  # no server paths in the report
            result.checked.append(Finding("lexical", version, problem))
            log.error("lexical index of %s/%s version %d refused: %s%s", tenant, collection,
                      version, problem, "; removed, rebuilding" if repair else "")  # fmt: skip
            if repair:
                discard_quietly(directory)
    if not (repair and result.damaged):
        with indexes.session_factory() as session:
            state = read_state(session, tenant, collection)
        result.version = None if state is None else state.version
        return result
    indexes.forget(tenant, collection)  # what memory holds may have been read from those files
    got = indexes.current(tenant, collection, fill=False)
    if got is None:
        return result
    result.version, index = got
    indexes.wait_for_files()
    if result.version not in store.versions(tenant, collection):
        store.write(tenant, collection, result.version, index)
    result.rebuilt = True
    log.info("index of %s/%s version %d rebuilt and written", tenant, collection, result.version)
    return result
