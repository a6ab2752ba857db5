"""Index files on disk: this host's cache of committed versions, each replaced atomically.

It exists so that a reader never sees half an index and a host restarts from its newest file
plus the database's change log rather than from nothing. The database is the truth
(retrieval.changelog); a file is written only for a version that is already committed, so a
file named ``v…N`` holds exactly version N on every host. A file is written beside its final
name (``*.tmp``), fsynced and ``os.replace``d into place. Hosts keep their own files (separate
data directories); a lost file costs a rebuild from the stored vectors, never an embedding.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path

import faiss

from retrieval.indexes import set_search_params
from retrieval.lexical_files import discard, fsync_dir, remove_stale

# Keep the previous file too: another process on this host may be loading it right now.
KEEP_VERSIONS = 2
_FILE = re.compile(r"v(\d+)\.faiss")
_LEXICAL = re.compile(r"v(\d+)\.tantivy")


def _slug(name: str) -> str:
    # Readable, but a hash keeps distinct names distinct and keeps paths inside index_dir.
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40].lstrip(".")
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


class IndexStore:
    """Reads and atomically writes the versioned index files under ``index_dir``."""

    def __init__(self, index_dir: str | Path) -> None:
        self.index_dir = Path(index_dir)

    def folder(self, tenant: str, collection: str) -> Path:
        """The directory that holds one collection's index versions."""
        return self.index_dir / _slug(tenant) / _slug(collection)

    def path(self, tenant: str, collection: str, version: int) -> Path:
        """The file of one index version."""
        return self.folder(tenant, collection) / f"v{version:09d}.faiss"

    def lexical_dir(self, tenant: str, collection: str, version: int) -> Path:
        """The lexical (Tantivy) directory of one index version (retrieval.lexical_files)."""
        return self.folder(tenant, collection) / f"v{version:09d}.tantivy"

    def read(self, tenant: str, collection: str, version: int) -> faiss.Index:
        """The index of that version; ``FileNotFoundError`` when its file is gone."""
        path = self.path(tenant, collection, version)
        if not path.is_file():
            raise FileNotFoundError(f"index file {path} is missing")
        index = faiss.read_index(str(path))
        set_search_params(index)
        return index

    def versions(self, tenant: str, collection: str) -> list[int]:
        """The versions this host holds files of, newest first."""
        return self._held(tenant, collection, _FILE)

    def lexical_versions(self, tenant: str, collection: str) -> list[int]:
        """The versions this host holds lexical directories of, newest first."""
        return self._held(tenant, collection, _LEXICAL)

    def _held(self, tenant: str, collection: str, name: re.Pattern[str]) -> list[int]:
        folder = self.folder(tenant, collection)
        if not folder.is_dir():
            return []
        found = (name.fullmatch(entry.name) for entry in folder.iterdir())
        return sorted((int(m.group(1)) for m in found if m is not None), reverse=True)

    def write(self, tenant: str, collection: str, version: int, index: faiss.Index) -> Path:
        """Write ``index`` as that version: beside, fsync, then ``os.replace`` into place."""
        path = self.path(tenant, collection, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            faiss.write_index(index, str(tmp))
            with tmp.open("rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(path.parent)  # the rename itself survives a power cut
        return path

    def prune(self, tenant: str, collection: str, current: int) -> None:
        """Remove the files older than the newest ``KEEP_VERSIONS`` up to ``current``.

        Never newer ones: another process on this host may have just written a newer version."""
        older = [v for v in self.versions(tenant, collection) if v <= current]
        for version in older[KEEP_VERSIONS:]:
            self.path(tenant, collection, version).unlink(missing_ok=True)

    def prune_lexical(self, tenant: str, collection: str, current: int) -> None:
        """As ``prune``, for lexical directories; also removes private directories that a
        process which died while writing left behind."""
        older = [v for v in self.lexical_versions(tenant, collection) if v <= current]
        for version in older[KEEP_VERSIONS:]:
            discard(self.lexical_dir(tenant, collection, version))
        remove_stale(self.folder(tenant, collection))
