"""Index files on disk: one file per (tenant, collection, version), replaced atomically.

It exists so that a reader never sees half an index and the database's version always names a
complete file. A writer builds the new version beside the old one (``*.tmp``), fsyncs it and
``os.replace``s it into place *before* committing the new version number; a crash in between
leaves an orphan file that the next writer overwrites, while the committed version still names
its own intact file. Old versions are removed only after a newer one is committed.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path

import faiss

from retrieval.indexes import set_search_params

# Keep the previous version too: another process may have just read its number from the database.
KEEP_VERSIONS = 2


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

    def read(self, tenant: str, collection: str, version: int) -> faiss.Index:
        """The index of that version; ``FileNotFoundError`` when its file is gone."""
        path = self.path(tenant, collection, version)
        if not path.is_file():
            raise FileNotFoundError(f"index file {path} is missing")
        index = faiss.read_index(str(path))
        set_search_params(index)
        return index

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
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a power cut
        finally:
            os.close(dir_fd)
        return path

    def prune(self, tenant: str, collection: str, current: int) -> None:
        """Remove versions older than the last ``KEEP_VERSIONS``.

        Never newer ones: a concurrent writer may be about to commit one (orphans of failed
        commits are simply overwritten by the next write of that version)."""
        folder = self.folder(tenant, collection)
        if not folder.is_dir():
            return
        for entry in folder.iterdir():
            match = re.fullmatch(r"v(\d+)\.faiss", entry.name)
            if match is not None and int(match.group(1)) <= current - KEEP_VERSIONS:
                entry.unlink(missing_ok=True)
