"""Index files on disk: this host's cache of committed versions, each replaced atomically.

It exists so that a reader never sees half an index and a host restarts from its newest file
plus the database's change log rather than from nothing. The database is the truth
(retrieval.changelog); a file is written only for a version that is already committed, so a
file named ``v…N`` holds exactly version N on every host. A file is written beside its final
name (``*.tmp``), fsynced and ``os.replace``d into place. Hosts keep their own files (separate
data directories); a lost file costs a rebuild from the stored vectors, never an embedding.

Every file carries its checksum, written with it: FAISS's bytes, then a trailer (``TRAILER``:
a magic, the version, the FAISS bytes' length and their SHA-256). One file, so the one
``os.replace`` publishes data and checksum together and no reader can pair one writer's bytes
with another's checksum; FAISS reads only its own bytes, so a trailer changes nothing for it.
``read`` checks the checksum first and refuses a damaged file (``IndexFileError``): vector bytes
flipped in place change no size and load without complaint, then search returns other passages.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import faiss

from retrieval.indexes import set_search_params
from retrieval.lexical_files import discard, fsync_dir, remove_stale

# Keep the previous file too: another process on this host may be loading it right now.
KEEP_VERSIONS = 2
MAGIC = b"specrag-faiss-1\n"
# magic, version (u64), FAISS bytes (u64), SHA-256 of those bytes; little-endian, at the end.
TRAILER = struct.Struct("<16sQQ32s")
_BLOCK = 1 << 20


class IndexFileError(RuntimeError):
    """An index file that must not be served: damaged (its checksum), truncated, of another
    version, or without a checksum (written before checksums); the message says which."""


@dataclass(frozen=True)
class FileCheck:
    """What ``check`` found in one index file: None when intact, else the problem."""

    version: int
    size: int
    problem: str | None


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

    def read(
        self, tenant: str, collection: str, version: int, *, legacy: bool = False
    ) -> faiss.Index:
        """The index of that version, its checksum checked first; ``FileNotFoundError`` when
        its file is gone, ``IndexFileError`` when it is damaged. ``legacy``: a file written
        before checksums is read unchecked (backfill's last source of old vectors)."""
        path = self.path(tenant, collection, version)
        try:
            fh = path.open("rb")
        except FileNotFoundError:
            raise FileNotFoundError(f"index file of version {version} is missing") from None
        with fh:
            # One open file for the check and the read: a file replaced meanwhile is not mixed in.
            length = _checked_length(fh, version, legacy)
            fh.seek(0)
            index = faiss.read_index(faiss.PyCallbackIOReader(_bounded(fh, length)))  # type: ignore[attr-defined]
        set_search_params(index)
        return index

    def check(self, tenant: str, collection: str, version: int) -> FileCheck:
        """Whether that version's file is intact (reads it whole; loads nothing)."""
        path = self.path(tenant, collection, version)
        try:
            with path.open("rb") as fh:
                _checked_length(fh, version, legacy=False)
                size = os.fstat(fh.fileno()).st_size
        except IndexFileError as exc:
            return FileCheck(version, path.stat().st_size if path.exists() else 0, str(exc))
        except OSError as exc:
            return FileCheck(version, 0, f"unreadable ({exc.strerror or exc})")
        return FileCheck(version, size, None)

    def discard(self, tenant: str, collection: str, version: int) -> None:
        """Remove that version's file (one that must not be served again)."""
        self.path(tenant, collection, version).unlink(missing_ok=True)

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
            with tmp.open("wb") as fh:
                digest = hashlib.sha256()
                length = 0

                def put(data: bytes) -> int:
                    nonlocal length
                    fh.write(data)
                    digest.update(data)
                    length += len(data)
                    return len(data)

                # Hashed as written, not read back: the checksum is of what FAISS produced.
                faiss.write_index(index, faiss.PyCallbackIOWriter(put))  # type: ignore[attr-defined]
                fh.write(TRAILER.pack(MAGIC, version, length, digest.digest()))
                fh.flush()
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


def _checked_length(fh: BinaryIO, version: int, legacy: bool) -> int:
    """The length of the FAISS bytes of an open index file whose trailer and checksum agree;
    IndexFileError naming the problem otherwise (with ``legacy``, a file without a trailer is
    taken whole, unchecked)."""
    size = os.fstat(fh.fileno()).st_size
    trailer = None
    if size >= TRAILER.size:
        fh.seek(size - TRAILER.size)
        trailer = TRAILER.unpack(fh.read(TRAILER.size))
    if trailer is None or trailer[0] != MAGIC:
        if legacy:
            return size
        raise IndexFileError("has no checksum (written before checksums, or its end is damaged)")
    _, written_version, length, expected = trailer
    if written_version != version:
        raise IndexFileError(f"holds version {written_version}, not {version}")
    if length != size - TRAILER.size:
        raise IndexFileError(f"is {size} bytes, its checksum covers {length + TRAILER.size}")
    fh.seek(0)
    digest = hashlib.sha256()
    left = length
    while left:
        block = fh.read(min(_BLOCK, left))
        if not block:
            raise IndexFileError("ended early while being checked")
        digest.update(block)
        left -= len(block)
    if digest.digest() != expected:
        raise IndexFileError("is damaged (its SHA-256 does not match the one written with it)")
    return length


def _bounded(fh: BinaryIO, length: int) -> Callable[[int], bytes]:
    """A read callback for FAISS that never reads past the FAISS bytes (into the trailer)."""
    left = length

    def read(n: int) -> bytes:
        nonlocal left
        data = fh.read(min(n, left))
        left -= len(data)
        return data

    return read
