"""Documents uploaded over the API: validated here, carried to an ingest worker in the message.

The upload travels inside the Celery message (base64), not through a shared disk, so an ingest
worker on another host can index it; the worker writes it under its data dir and ingests that
file. A refused upload stores and queues nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.documents.state import upload_states
from app.requests import RequestError, check_text
from app.validation import text_problem
from retrieval.errors import InvalidNameError, character_problem, check_name
from retrieval.loaders import SUPPORTED_SUFFIXES
from retrieval.records import Document

MAX_FILES_PER_UPLOAD = 100
MAX_NAME_CHARS = 255
"""The ``document_uploads.name`` column's width."""
MAX_NAME_BYTES = 240
"""A file name's UTF-8 bytes: under the file system's 255 with room for the ingest worker's
temporary ``.NAME.partial``."""
TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm")


class UploadError(RequestError):
    """A refused upload; ``field`` names the part of the request that is wrong (the API's
    RequestError handler answers 422 with it)."""


@dataclass(frozen=True)
class Upload:
    """One validated file of an upload."""

    name: str
    content: bytes

    def to_message(self) -> dict[str, str]:
        """The JSON-safe form the ingest task receives."""
        return {"name": self.name, "content_b64": base64.b64encode(self.content).decode("ascii")}


def validate_uploads(
    collection: str, documents: list[dict[str, Any]], max_file_bytes: int
) -> list[Upload]:
    """The uploads as files to ingest, or UploadError naming the first bad field."""
    check_text("collection", collection)
    try:
        check_name("collection", collection)
    except InvalidNameError as exc:
        raise UploadError("collection", str(exc)) from None
    if not documents:
        raise UploadError("documents", "no documents given")
    if len(documents) > MAX_FILES_PER_UPLOAD:
        raise UploadError("documents", f"{len(documents)} files; at most {MAX_FILES_PER_UPLOAD}")
    uploads, seen = [], set()
    for i, doc in enumerate(documents):
        name = str(doc.get("name", ""))
        check_text(f"documents[{i}].name", name)
        problem = name_problem(name)
        if problem is not None:
            raise UploadError(f"documents[{i}].name", problem)
        suffix = Path(name).suffix.lower()
        if suffix not in SUPPORTED_SUFFIXES:
            raise UploadError(
                f"documents[{i}].name",
                f"unsupported file type {suffix or '(none)'!r} "
                f"(supported: {', '.join(SUPPORTED_SUFFIXES)})",
            )
        if name in seen:
            raise UploadError(f"documents[{i}].name", f"{name!r} appears twice")
        seen.add(name)
        uploads.append(Upload(name, _content(doc, i, suffix, max_file_bytes)))
    return uploads


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a document's file name, or None when it can.

    The rules of collection names (retrieval.errors.character_problem: no invisible,
    direction-changing or look-alike characters, no edge spaces) and those of a file the ingest
    worker writes: a plain name, at most MAX_NAME_CHARS characters and MAX_NAME_BYTES bytes.
    """
    if not name or name != Path(name).name or name.startswith(".") or name != name.strip():
        return f"{name!r} is not a plain file name"
    if len(name) > MAX_NAME_CHARS:
        return f"is {len(name)} characters, over the limit of {MAX_NAME_CHARS}"
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        return f"is {size} bytes in UTF-8, over the limit of {MAX_NAME_BYTES}"
    return character_problem(name)


def _content(doc: dict[str, Any], i: int, suffix: str, max_file_bytes: int) -> bytes:
    encoding = doc.get("encoding", "text")
    raw = doc.get("content", "")
    if not isinstance(raw, str):
        raise UploadError(f"documents[{i}].content", "must be a string")
    check_text(f"documents[{i}].content", raw)
    if encoding == "base64":
        try:
            content = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise UploadError(f"documents[{i}].content", "is not valid base64") from None
    elif encoding == "text":
        if suffix not in TEXT_SUFFIXES:
            raise UploadError(f"documents[{i}].encoding", f"a {suffix} file must be sent as base64")
        content = raw.encode("utf-8")
    else:
        raise UploadError(f"documents[{i}].encoding", f"{encoding!r}: expected 'text' or 'base64'")
    if not content.strip():
        raise UploadError(f"documents[{i}].content", "is empty")
    if len(content) > max_file_bytes:
        raise UploadError(
            f"documents[{i}].content",
            f"{len(content)} bytes is over the size limit of {max_file_bytes} bytes",
        )
    problem = content_problem(suffix, content)
    if problem is not None:
        raise UploadError(f"documents[{i}].content", problem)
    return content


def content_problem(suffix: str, content: bytes) -> str | None:
    """Why an ingest worker could not read these bytes as a ``suffix`` file, or None.

    Checked at submit so that a bad file is a 422 now, not a silent failure in the worker:
    text must be UTF-8 without NUL bytes, a PDF must open (its text is extracted later).
    """
    if suffix == ".pdf":
        return _pdf_problem(content)
    if b"\x00" in content:
        return "looks like a binary file (NUL bytes), not text"
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return f"is not valid UTF-8 (byte 0x{content[exc.start]:02x} at offset {exc.start})"
    return text_problem(text)


def _pdf_problem(content: bytes) -> str | None:
    from pypdf import PdfReader  # heavy: pypdf

    if not content.lstrip()[:5] == b"%PDF-":
        return "is not a PDF (no %PDF- header)"
    try:
        reader = PdfReader(io.BytesIO(content))
        if reader.is_encrypted and not reader.decrypt(""):
            return "is an encrypted PDF"
        if len(reader.pages) == 0:
            return "is a PDF without pages"
    except Exception as exc:  # pypdf raises many types for broken files; all mean "unreadable"
        return f"is not a readable PDF ({type(exc).__name__})"
    return None


def write_uploads(upload_dir: Path, files: list[dict[str, str]]) -> list[Path]:
    """Write the task's files under ``upload_dir`` (each atomically) and return their paths."""
    upload_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for file in files:
        path = upload_dir / Path(file["name"]).name  # never a path outside upload_dir
        tmp = path.with_name(f".{path.name}.partial")
        tmp.write_bytes(base64.b64decode(file["content_b64"]))
        os.replace(tmp, path)
        paths.append(path)
    return paths


def upload_dir(data_dir: Path, tenant: str, collection: str) -> Path:
    """Where an ingest worker keeps the uploads of one tenant's collection."""
    return data_dir / "uploads" / _dir_name(tenant) / _dir_name(collection)


def _dir_name(name: str) -> str:
    # Names may hold any printable character ('/', '..'): a slug plus a hash keeps the directory
    # inside the uploads folder and distinct per name.
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".")[:64] or "_"
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def list_documents(session: Session, tenant: str, collection: str) -> list[dict[str, Any]]:
    """The tenant's documents in ``collection`` with their state (another tenant's never listed).

    ``status`` is ``indexed`` for a document in the index, ``pending`` for an upload the ingest
    worker has not finished, ``failed`` (with ``reason``) for an upload it could not index.
    """

    uploads = upload_states(session, tenant, collection)
    rows = session.scalars(
        select(Document)
        .where(Document.tenant == tenant, Document.collection == collection)
        .order_by(Document.source)
    )
    listed: dict[str, dict[str, Any]] = {}
    for d in rows:
        upload = uploads.get(d.source)
        # A pending re-upload or a failed one leaves the indexed version in place: say both.
        status = upload.status if upload is not None and upload.status != "indexed" else "indexed"
        listed[d.source] = {
            "document": d.source,
            "status": status,
            "reason": upload.reason if upload is not None and status == "failed" else None,
            "title": d.title,
            "chunks": d.num_chunks,
            "size_bytes": d.size_bytes,
            "content_hash": d.content_hash,
            "updated_at": d.updated_at,
        }
    for name, upload in uploads.items():
        if name not in listed and upload.status != "indexed":
            listed[name] = {
                "document": name,
                "status": upload.status,
                "reason": upload.reason,
                "title": None,
                "chunks": 0,
                "size_bytes": upload.size_bytes,
                "content_hash": None,
                "updated_at": upload.updated_at,
            }
    return [listed[k] for k in sorted(listed)]
