"""An uploaded PDF that inflates hugely fails at once with the reason, on the ingest side (real
pypdf, MiniLM, FAISS and PostgreSQL), instead of holding the shared ingest worker for minutes."""

from __future__ import annotations

import base64
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from app.db import make_session_factory
from app.documents.ingest import ingest_uploaded
from app.documents.pdf_bounds import PdfBounds, pdf_problem
from app.documents.upload import list_documents
from app.resources import Resources
from app.settings import Settings
from tests.retrieval.docs import lines_stream, pdf_from_streams

# ~600,000 one-character text operators in 4 MiB of content that compresses to a few KB: pypdf
# extracts them at roughly 6 s per MiB on this machine, well inside the 5 M-character limit.
BOMB = pdf_from_streams([b"BT /F1 12 Tf 72 720 Td\n" + b"(x) Tj\n" * 600_000 + b"ET"],
                        compress=True)  # fmt: skip
BOOK = pdf_from_streams([lines_stream(f"Page {n}: rotate keys before they expire.", 40)
                         for n in range(20)], compress=True)  # fmt: skip


def _file(name: str, data: bytes) -> dict[str, str]:
    return {"name": name, "content_b64": base64.b64encode(data).decode()}


def test_the_bounds_measure_pages_bytes_and_operators(tmp_path: Path) -> None:
    bomb, book = tmp_path / "bomb.pdf", tmp_path / "book.pdf"
    bomb.write_bytes(BOMB)
    book.write_bytes(BOOK)
    assert len(BOMB) < 20_000
    roomy = PdfBounds(max_pages=100, max_content_bytes=64 << 20, max_text_operators=500_000)
    assert pdf_problem(book, roomy) is None
    started = time.monotonic()
    assert "text operators" in (pdf_problem(bomb, roomy) or "")
    # The check decodes and counts; extracting the same text takes tens of seconds.
    assert time.monotonic() - started < 5
    assert "bytes" in (pdf_problem(bomb, PdfBounds(0, 1 << 20, 0)) or "")
    assert "20 pages" in (pdf_problem(book, PdfBounds(10, 0, 0)) or "")
    assert pdf_problem(bomb, PdfBounds(0, 0, 0)) is None  # 0: no bound


def test_an_inflating_pdf_fails_at_once_and_its_neighbours_are_indexed(
    tenancy_pg: str, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path, database_url=tenancy_pg)
    engine = create_engine(tenancy_pg)
    resources = Resources(settings, make_session_factory(engine))
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    ingest_uploaded(resources, [_file("bomb.pdf", BOMB), _file("book.pdf", BOOK)], "docs", tenant)
    with Session(engine) as session:
        docs = {d["document"]: d for d in list_documents(session, tenant, "docs")}
    engine.dispose()
    assert docs["bomb.pdf"]["status"] == "failed"
    assert docs["bomb.pdf"]["reason"].startswith("pdf_limit: more than 500000 text operators")
    assert docs["book.pdf"]["status"] == "indexed" and docs["book.pdf"]["chunks"] >= 1
