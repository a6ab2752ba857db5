"""Lexical index directories on disk: written privately, published by one rename, verified.

It exists so that a host restarts from its own Tantivy directory instead of re-indexing every
stored term, with the guarantees the FAISS files have (retrieval.index_store): a directory named
``v…N.tantivy`` holds exactly committed version N, a reader never sees half of one, and one
that is damaged or from another schema or Tantivy format is detected and never served.

A directory is never changed once published. A new version is made in a private directory
(``*.<pid>.<random>.tmp``, hard links to the previous version's segment files, which Tantivy
never rewrites, plus the new segment), described by a manifest (format, version, counts, each
file's size and CRC-32) and renamed into place. Renaming onto an existing directory fails, so
when two processes of one host publish the same version the second discards its copy and
opens the first's: no file lock is needed and no published directory is ever replaced under a
reader, except one found damaged.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import tantivy

MANIFEST = "specrag-lexical.json"
# Bump when the schema, the tokenizer or the meaning of the stored terms changes: directories
# written under another stamp (or another Tantivy index format) are rebuilt, never served.
# tantivy.__version__ reads "tantivy v0.27.0, index_format v7" (not in its type stubs).
_TANTIVY = tantivy.__version__  # type: ignore[attr-defined]
FORMAT = f"specrag-lexical-1; schema chunk_id:u64+terms:whitespace/freq; {_TANTIVY}"
# A private directory this old was left by a process that died while writing it.
STALE_TMP_SECONDS = 3600.0
_CHUNK = 1 << 20


class LexicalDirectoryError(RuntimeError):
    """A lexical index directory that must not be served (missing, damaged, other format)."""


@dataclass(frozen=True)
class Manifest:
    """What a published directory holds: its version, live and ever-added documents, files."""

    version: int
    chunks: int  # live documents
    added: int  # documents ever added (live + removed ones still in BM25 statistics)
    files: dict[str, tuple[int, int]]  # name -> (size, crc32)


def private_dir(final: Path) -> Path:
    """A new, empty directory beside ``final`` that only this process writes."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir()
    return tmp


def clone(source: Path, manifest: Manifest, target: Path) -> None:
    """Hard-link ``source``'s files (copies of its two JSON files) into the empty ``target``.

    Segment files are written once and never modified by Tantivy, so sharing them is safe;
    meta.json and .managed.json are replaced by their own rename, copied anyway for clarity.
    Tantivy's lock files are not carried over: each directory locks for itself."""
    for name in manifest.files:
        if name.endswith(".json"):
            shutil.copyfile(source / name, target / name)
        else:
            try:
                os.link(source / name, target / name)
            except OSError:  # a file system without hard links
                shutil.copyfile(source / name, target / name)


def seal(tmp: Path, version: int, chunks: int, added: int, known: Manifest | None) -> Manifest:
    """Write the manifest of the finished index in ``tmp`` and fsync it with the directory.

    Checksums of files linked from ``known`` (the source of a clone) are reused, not re-read."""
    files: dict[str, tuple[int, int]] = {}
    for entry in sorted(tmp.iterdir()):
        name = entry.name
        if name == MANIFEST or name.endswith(".lock") or not entry.is_file():
            continue
        size = entry.stat().st_size
        old = known.files.get(name) if known is not None and not name.endswith(".json") else None
        files[name] = old if old is not None and old[0] == size else (size, _crc(entry))
    manifest = Manifest(version, chunks, added, files)
    body = {"format": FORMAT, "version": version, "chunks": chunks, "added": added,
            "files": {name: list(v) for name, v in files.items()}}  # fmt: skip
    path = tmp / MANIFEST
    with path.open("w", encoding="utf-8") as fh:
        json.dump(body, fh)
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(tmp)
    return manifest


def publish(tmp: Path, final: Path) -> bool:
    """Rename the sealed ``tmp`` to ``final``; False (``tmp`` removed) when another process
    published ``final`` first (a damaged ``final`` is discarded before a rebuild)."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    fsync_dir(final.parent)
    return True


def verify(directory: Path, version: int) -> Manifest:
    """The manifest of a published directory whose every file is intact, or
    LexicalDirectoryError: missing, another format or version, a file missing, resized or
    changed (its CRC-32). Reads every file once, which also brings it into the page cache."""
    try:
        body = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LexicalDirectoryError(f"{directory}: no readable manifest ({exc})") from exc
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        found = body.get("format") if isinstance(body, dict) else None
        raise LexicalDirectoryError(f"{directory}: format {found!r}, expected {FORMAT!r}")
    if body.get("version") != version:
        raise LexicalDirectoryError(f"{directory}: holds version {body.get('version')}")
    try:
        files = {str(n): (int(v[0]), int(v[1])) for n, v in body["files"].items()}
        manifest = Manifest(version, int(body["chunks"]), int(body["added"]), files)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise LexicalDirectoryError(f"{directory}: malformed manifest ({exc})") from exc
    for name, (size, crc) in files.items():
        path = directory / name
        try:
            if path.stat().st_size != size or _crc(path) != crc:
                raise LexicalDirectoryError(f"{directory}: {name} is damaged")
        except OSError as exc:
            raise LexicalDirectoryError(f"{directory}: {name} unreadable ({exc})") from exc
    return manifest


def discard(directory: Path) -> None:
    """Remove a directory: renamed aside first, so its name is free (or gone) at once."""
    aside = directory.with_name(f"{directory.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        os.rename(directory, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def remove_stale(folder: Path, now: float | None = None) -> None:
    """Remove private directories left by processes that died while writing them."""
    if not folder.is_dir():
        return
    now = time.time() if now is None else now
    for entry in folder.iterdir():
        if entry.name.endswith(".tmp") and entry.is_dir():
            try:
                if now - entry.stat().st_mtime > STALE_TMP_SECONDS:
                    shutil.rmtree(entry, ignore_errors=True)
            except FileNotFoundError:
                continue


def _crc(path: Path) -> int:
    crc = 0
    with path.open("rb") as fh:
        while block := fh.read(_CHUNK):
            crc = zlib.crc32(block, crc)
    return crc


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` survive a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
