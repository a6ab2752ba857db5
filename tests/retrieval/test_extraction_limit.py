"""The extracted-characters limit holds during extraction, not after it.

A PDF's text can be far larger than its bytes (a compressed content stream), so the loader stops
reading pages, and stops inside a page, as soon as the document passes the limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from retrieval.errors import DocumentError
from retrieval.loaders import load_document
from tests.retrieval.docs import FRUIT, lines_stream, pdf_from_streams, write

LIMIT = 10**7
LINE = "All work and no play makes Jack a dull boy. "  # 44 characters


def _pdf(tmp_path: Path, streams: list[bytes]) -> Path:
    path = tmp_path / "big.pdf"
    path.write_bytes(pdf_from_streams(streams, compress=True))
    return path


@pytest.fixture
def pages_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many pages' text extraction started (one entry per call)."""
    from pypdf import PageObject

    calls: list[int] = []
    original = PageObject.extract_text

    def counted(self: Any, *args: Any, **kwargs: Any) -> str:
        calls.append(1)
        return str(original(self, *args, **kwargs))

    monkeypatch.setattr(PageObject, "extract_text", counted)
    return calls


@pytest.fixture
def operations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many content-stream operators the text extraction processed."""
    from pypdf._text_extraction._text_extractor import TextExtraction

    calls: list[int] = []
    original = TextExtraction.process_operation

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TextExtraction, "process_operation", counted)
    return calls


def test_pdf_stops_reading_pages_once_over_the_limit(tmp_path: Path, pages_read: list[int]) -> None:
    path = _pdf(tmp_path, [lines_stream(LINE, 25)] * 30)  # ~1100 characters a page
    full = load_document(path, LIMIT)
    assert len(full.sections) == 30 and len(pages_read) == 30
    per_page = len(full.sections[0].text)
    pages_read.clear()
    with pytest.raises(DocumentError) as info:
        load_document(path, LIMIT, max_chars=2 * per_page + 10)  # passed on page 3
    assert len(pages_read) == 3
    message = str(info.value)
    assert message.startswith(f"{path}: ") and f"the limit is {2 * per_page + 10}" in message
    assert "page 3 of 30" in message


def test_pdf_stops_inside_a_page_that_expands_past_the_limit(
    tmp_path: Path, operations: list[int]
) -> None:
    # One page, 20,000 lines: a ~6 KB file that extracts to ~900,000 characters.
    path = _pdf(tmp_path, [lines_stream(LINE, 20_000)])
    assert path.stat().st_size < 20_000
    with pytest.raises(DocumentError, match="the limit is 10000"):
        load_document(path, LIMIT, max_chars=10_000)
    # ~2 operators a line; 10,000 characters are ~230 lines, so well under a tenth was processed.
    assert 0 < len(operations) < 4_000, len(operations)


def test_pdf_under_the_limit_extracts_the_same_text(tmp_path: Path) -> None:
    path = _pdf(tmp_path, [lines_stream(LINE, 40), lines_stream("Second page. ", 10)])
    unlimited = load_document(path, LIMIT)
    total = sum(len(s.text) for s in unlimited.sections)
    assert load_document(path, LIMIT, max_chars=total) == unlimited


@pytest.mark.parametrize("name", ["fruit.md", "fruit.txt", "fruit.html"])
def test_text_formats_over_the_limit_name_it(tmp_path: Path, name: str) -> None:
    text = FRUIT if not name.endswith(".html") else f"<html><body><p>{FRUIT}</p></body></html>"
    path = write(tmp_path / name, text)
    total = sum(len(s.text) for s in load_document(path, LIMIT).sections)
    assert load_document(path, LIMIT, max_chars=total).sections
    with pytest.raises(DocumentError) as info:
        load_document(path, LIMIT, max_chars=total - 1)
    assert str(info.value) == f"{path}: extracted {total} characters; the limit is {total - 1}"
