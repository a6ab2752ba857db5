"""Small documents for tests: text files and minimal PDFs written by hand."""

from __future__ import annotations

from pathlib import Path


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def pdf_bytes(pages: list[str | None]) -> bytes:
    """A minimal valid PDF: one page per entry, with that text drawn (None: a page with no text)."""
    streams = [
        b"" if text is None else f"BT /F1 12 Tf 72 720 Td ({_escape(text)}) Tj ET".encode("latin-1")
        for text in pages
    ]
    return pdf_from_streams(streams)


def lines_stream(line: str, count: int) -> bytes:
    """A page's content stream that draws ``line`` ``count`` times, one text line each."""
    show = f"({_escape(line)}) Tj T*\n".encode("latin-1")
    return b"BT /F1 12 Tf 14 TL 72 720 Td\n" + show * count + b"ET"


def pdf_from_streams(streams: list[bytes], *, compress: bool = False) -> bytes:
    """A minimal valid PDF with one page per content stream (Flate-compressed with ``compress``,
    so that a small file can draw a great deal of text)."""
    import zlib

    objects: list[bytes] = []
    kids = []
    font_id = 3
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(b"")  # pages, filled below
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for stream in streams:
        head = b"/Length %d" % len(stream)
        if compress:
            stream = zlib.compress(stream, 9)
            head = b"/Length %d /Filter /FlateDecode" % len(stream)
        objects.append(b"<< %s >>\nstream\n%s\nendstream" % (head, stream))
        content_id = len(objects)
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R"
            b" /Resources << /Font << /F1 %d 0 R >> >> >>" % (content_id, font_id)
        )
        kids.append(len(objects))
    kid_refs = b" ".join(b"%d 0 R" % k for k in kids)
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kid_refs, len(kids))
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def write(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path``, creating folders; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


FRUIT = """# Fruit growing

## Apples
Apple trees need cross-pollination from a second variety that flowers at the same time.
Prune apple trees in late winter while they are dormant.

## Citrus
Lemon and orange trees are frost tender and need a sheltered, sunny position.
"""

ENGINES = """# Steam engines

## Boilers
A fire-tube boiler passes hot gases through tubes surrounded by water to raise steam.

## Governors
A centrifugal governor regulates engine speed by throttling the steam supply.
"""
