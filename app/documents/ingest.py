"""Ingest of uploaded files on a worker: named as the client named them, bounded, leaving no files.

Each upload is written to a private temporary folder, ingested under its own name (not the
worker's path), checked against the tenant's extracted-characters limit and the ingest time limit,
and the folder is removed afterwards: the index and the database hold everything a document needs,
so a deleted document leaves nothing on disk.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import select

from app.documents.deadline import IngestTimeLimit, time_limit
from app.documents.pdf_bounds import PdfBounds, pdf_problem
from app.documents.state import forget, record_results
from app.documents.upload import upload_dir, write_uploads
from retrieval.loaders import content_hash
from retrieval.records import Document
from retrieval.sources import normalise_source

log = logging.getLogger(__name__)


def ingest_uploaded(
    resources: Any, files: list[dict[str, str]], collection: str, tenant: str, max_chars: int = 0
) -> dict[str, Any]:
    """The ingest report of the uploaded ``files``; every file's state is recorded."""
    settings = resources.settings
    root = settings.data_dir / "uploads"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".ingest-") as tmp:
        try:
            paths = write_uploads(Path(tmp), files)
        except OSError as exc:
            # The API refuses names the file system cannot hold; this is the backstop, so that
            # no document stays pending for ever without a reason.
            return _failed(resources, tenant, collection, [f["name"] for f in files],
                           f"could not write the upload: {exc.strerror or exc}")  # fmt: skip
        bounds = PdfBounds(settings.max_pdf_pages, settings.max_pdf_content_bytes,
                           settings.max_pdf_text_operators)  # fmt: skip
        refused = [
            (p.name, "failed", problem)
            for p in paths
            if p.suffix.lower() == ".pdf" and (problem := pdf_problem(p, bounds)) is not None
        ]
        if refused:
            log.warning("uploads over the PDF bounds for %s/%s: %s", tenant, collection, refused)
            record_results(resources.session_factory, tenant, collection, refused)
            paths = [p for p in paths if p.name not in {name for name, _, _ in refused}]
            if not paths:
                return {"status": "failed", "error": refused[0][2]}
        names = {normalise_source(p): p.name for p in paths}
        try:
            with time_limit(settings.ingest_time_limit):
                report = resources.retrieval.ingest(
                    paths, collection=collection, tenant=tenant, sources=names,
                    max_chars=max_chars,
                )  # fmt: skip
        except IngestTimeLimit as exc:
            log.warning("ingest of %d uploads for %s/%s: %s", len(paths), tenant, collection, exc)
            # A batch committed before the limit struck is stored and searchable: say so.
            stored = _stored(resources, tenant, collection, paths)
            record_results(resources.session_factory, tenant, collection,
                           [(p.name, "indexed", None) for p in paths if p.name in stored])  # fmt: skip
            cut = [p.name for p in paths if p.name not in stored]
            if not cut:
                return {"status": "indexed", "error": None}
            return _failed(resources, tenant, collection, cut, f"time_limit: ingest {exc}")
    results = []
    for file in report.files:
        status = "failed" if file.status == "failed" else "indexed"
        # Loader messages start with the file's path on this worker: show the client's name.
        error = (file.error or "").replace(tmp, "").lstrip("/")
        results.append((file.source, status, (error or None) if status == "failed" else None))
    record_results(resources.session_factory, tenant, collection, results)
    return dict(report.to_dict())


def _failed(
    resources: Any, tenant: str, collection: str, names: list[str], reason: str
) -> dict[str, Any]:
    record_results(resources.session_factory, tenant, collection,
                   [(name, "failed", reason) for name in names])  # fmt: skip
    return {"status": "failed", "error": reason}


def _stored(resources: Any, tenant: str, collection: str, paths: list[Path]) -> set[str]:
    """The names among ``paths`` whose very bytes the database holds as a document."""
    hashes = {p.name: content_hash(p.read_bytes()) for p in paths}
    with resources.session_factory() as session:
        rows = session.execute(
            select(Document.source, Document.content_hash).where(
                Document.tenant == tenant,
                Document.collection == collection,
                Document.source.in_(list(hashes)),
            )
        ).all()
    return {str(source) for source, digest in rows if hashes.get(str(source)) == digest}


def delete_uploaded(resources: Any, source: str, collection: str, tenant: str) -> bool:
    """Remove one document from index and database, with its upload record and any old file."""
    deleted = bool(resources.retrieval.delete(source, collection=collection, tenant=tenant))
    forget(resources.session_factory, tenant, collection, source)
    # Uploads from before files were kept only while ingesting lie in the old folder.
    old = upload_dir(resources.settings.data_dir, tenant, collection) / Path(source).name
    if old.is_file():
        old.unlink()
    if old.parent.is_dir() and not any(old.parent.iterdir()):
        shutil.rmtree(old.parent, ignore_errors=True)
    return deleted
