"""A PDF's page contents, measured before its text is extracted: pages, bytes and text operators.

A small PDF can inflate hugely: a 239 KB file whose content streams decode to ~70 MB of text
operators (under pypdf's own decompression cap) kept text extraction busy for the ingest time
limit, at over a gigabyte. Extraction costs about one pass of pypdf's content parser per
operator, so the ingest worker first decodes the page contents (zlib, fast) and counts the
operators that show text; a document over a bound fails at once with the reason, before the
extractor spends minutes on it. Decoding stops at the first bound passed, so the check itself
holds at most one page's contents beyond the byte bound in memory.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

# Text-showing operators: Tj, TJ, ' and ". Counted as bytes (no parse, no allocation); quote
# marks inside strings count too, which errs towards refusing only text full of apostrophes.
_SHOW = (b"Tj", b"TJ", b"'", b'"')


@dataclass(frozen=True)
class PdfBounds:
    """What one PDF's page contents may hold (0: no bound)."""

    max_pages: int
    max_content_bytes: int
    """Decoded content-stream bytes over all pages."""
    max_text_operators: int
    """Text-showing operators (Tj, TJ, ', ") over all pages."""


def pdf_problem(path: Path, bounds: PdfBounds) -> str | None:
    """Why the PDF at ``path`` is over ``bounds`` (``pdf_limit: ...``), or None when it is not.

    A PDF pypdf cannot read is not judged here: the loader reports it with its own reason.
    """
    from pypdf import PdfReader  # heavy: pypdf

    try:
        reader = PdfReader(io.BytesIO(path.read_bytes()))
        pages = len(reader.pages)
    except Exception:  # unreadable: the loader says why
        return None
    if bounds.max_pages and pages > bounds.max_pages:
        return f"pdf_limit: {pages} pages; the limit is {bounds.max_pages}"
    size = shown = 0
    for number, page in enumerate(reader.pages, start=1):
        try:
            contents = page.get_contents()
            data = contents.get_data() if contents is not None else b""
        except Exception:
            return None
        size += len(data)
        shown += sum(data.count(op) for op in _SHOW)
        if bounds.max_content_bytes and size > bounds.max_content_bytes:
            return (
                f"pdf_limit: page contents decode to more than {bounds.max_content_bytes} bytes "
                f"by page {number} of {pages}; the limit is {bounds.max_content_bytes}"
            )
        if bounds.max_text_operators and shown > bounds.max_text_operators:
            return (
                f"pdf_limit: more than {bounds.max_text_operators} text operators by page "
                f"{number} of {pages}; the limit is {bounds.max_text_operators}"
            )
    return None
