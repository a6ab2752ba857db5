"""Files to text: one loader per supported format, each returning titled sections.

It exists so that every format reaches the chunker in one shape (a title and sections under their
nearest heading) and so that every way a file can be unusable becomes one clear ``DocumentError``
that names the file and the problem, before anything touches the database or the index.
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

from retrieval.errors import DocumentError

SUPPORTED_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm", ".pdf")
# Navigation boilerplate and non-visible content: never part of a passage.
HTML_DROP_TAGS = (
    "script", "style", "noscript", "template", "nav", "header", "footer", "aside",
    "form", "iframe", "svg", "button",
)  # fmt: skip
HTML_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
HTML_BLOCKS = (
    "p", "div", "section", "article", "main", "li", "ul", "ol", "pre", "blockquote",
    "table", "tr", "td", "th", "dd", "dt", "dl", "figcaption", "br", "hr",
)  # fmt: skip
_MD_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
_MD_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_HEADING_MARK = "\x00"


@dataclass(frozen=True)
class Section:
    """Text under one heading (``None`` before the first heading)."""

    heading: str | None
    text: str


@dataclass(frozen=True)
class LoadedDocument:
    """A file's title, its sections in order, and the hash of its bytes."""

    title: str
    sections: list[Section]
    content_hash: str
    size_bytes: int


def content_hash(data: bytes) -> str:
    """sha256 hex of a file's bytes: the ingest's unchanged/changed decision."""
    return hashlib.sha256(data).hexdigest()


def read_bytes(path: Path, max_bytes: int) -> bytes:
    """The file's bytes, after the checks that need no parsing (exists, type, size)."""
    if not path.exists():
        raise DocumentError(f"{path}: no such file")
    if not path.is_file():
        raise DocumentError(f"{path}: not a regular file")
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise DocumentError(
            f"{path}: unsupported file type {suffix or '(no extension)'!r}"
            f" (supported: {', '.join(SUPPORTED_SUFFIXES)})"
        )
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise DocumentError(f"{path}: {size} bytes is over the size limit of {max_bytes} bytes")
        with path.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise DocumentError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
    if len(data) > max_bytes:  # grew while we looked
        raise DocumentError(f"{path}: over the size limit of {max_bytes} bytes")
    if not data.strip():
        raise DocumentError(f"{path}: file is empty")
    return data


def load_document(path: str | Path, max_bytes: int, max_chars: int = 0) -> LoadedDocument:
    """The parsed document; raises ``DocumentError`` naming the file and what is wrong.

    ``max_chars`` (0: none) bounds the text a document may extract to. Text formats hold at most
    one character per byte, so they are checked once parsed; a PDF can extract to far more text
    than its bytes (compressed streams), so its extraction stops as soon as it passes the limit.
    """
    path = Path(path)
    data = read_bytes(path, max_bytes)
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        title, sections = _parse_pdf(path, data, max_chars)
    else:
        text = _decode_text(path, data)
        if suffix in (".html", ".htm"):
            title, sections = _parse_html(path, text)
        elif suffix in (".md", ".markdown"):
            title, sections = _parse_markdown(path, text)
        else:
            title, sections = _parse_plain(path, text)
    sections = [s for s in sections if s.text.strip()]
    if not sections:
        raise DocumentError(f"{path}: no text to index")
    chars = sum(len(s.text) for s in sections)
    if max_chars and chars > max_chars:
        raise DocumentError(f"{path}: extracted {chars} characters; the limit is {max_chars}")
    return LoadedDocument(title[:512], sections, content_hash(data), len(data))


def _decode_text(path: Path, data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise DocumentError(f"{path}: looks like a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            f"{path}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from exc


def _parse_plain(path: Path, text: str) -> tuple[str, list[Section]]:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    title = first if 0 < len(first) <= 100 else path.stem
    return title, [Section(None, text)]


def _parse_markdown(path: Path, text: str) -> tuple[str, list[Section]]:
    sections: list[Section] = []
    heading: str | None = None
    title: str | None = None
    lines: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if _MD_FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else _MD_HEADING.match(line)
        if match is None:
            lines.append(line)
            continue
        sections.append(Section(heading, "\n".join(lines)))
        heading, lines = match.group(2).strip(), []
        if title is None and len(match.group(1)) == 1:
            title = heading
    sections.append(Section(heading, "\n".join(lines)))
    return title or path.stem, sections


def _parse_html(path: Path, text: str) -> tuple[str, list[Section]]:
    from bs4 import BeautifulSoup  # heavy: bs4

    soup = BeautifulSoup(text, "html.parser")
    title_tag = soup.find("title")
    page_title = title_tag.get_text(" ", strip=True) if title_tag else ""
    for tag in soup.find_all(HTML_DROP_TAGS):
        tag.decompose()
    for tag in soup.select("[hidden]"):
        tag.decompose()
    first_h1: str | None = None
    for tag in soup.find_all(HTML_HEADINGS):
        heading = " ".join(tag.get_text(" ", strip=True).split())
        if first_h1 is None and tag.name == "h1" and heading:
            first_h1 = heading
        # Headings become markers in the text stream, so sections split where they stood.
        tag.replace_with(f"\n{_HEADING_MARK}{heading}{_HEADING_MARK}\n")
    for tag in soup.find_all(HTML_BLOCKS):
        tag.insert_before("\n")
        tag.insert_after("\n")
    body = soup.body or soup
    raw = body.get_text("")
    lines = [" ".join(line.split()) for line in raw.splitlines()]
    flat = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    parts = flat.split(_HEADING_MARK)
    # parts alternate: text, heading, text, heading, text ...
    sections = [Section(None, parts[0])]
    for i in range(1, len(parts) - 1, 2):
        sections.append(Section(parts[i] or None, parts[i + 1]))
    return page_title or first_h1 or path.stem, sections


class _OverLimit(Exception):
    """Raised from inside a PDF page's text extraction once the document passes its limit."""


class _TextBudget:
    """The characters a PDF may still extract to; ``visit`` (pypdf's ``visitor_text``) counts
    each piece of text as the page's extraction produces it and stops it past the limit."""

    def __init__(self, max_chars: int) -> None:
        self.left = max_chars
        self.over = False

    def visit(self, text: str, *_: object) -> None:
        self.left -= len(text)
        if self.left < 0:
            self.over = True
            raise _OverLimit


def _parse_pdf(path: Path, data: bytes, max_chars: int = 0) -> tuple[str, list[Section]]:
    from pypdf import PdfReader  # heavy: pypdf
    from pypdf.errors import PdfReadError  # heavy: pypdf

    budget = _TextBudget(max_chars) if max_chars else None
    pages: list[str] = []
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError(f"{path}: PDF is encrypted")
        count = len(reader.pages)
        for number, page in enumerate(reader.pages, start=1):
            if budget is None:
                pages.append(page.extract_text() or "")
                continue
            try:
                pages.append(page.extract_text(visitor_text=budget.visit) or "")
            except _OverLimit:
                pass
            # pypdf swallows an exception raised inside a form XObject, hence the flag.
            if budget.over:
                raise DocumentError(
                    f"{path}: extracted more than {max_chars} characters by page {number} of "
                    f"{count} (extraction stopped there); the limit is {max_chars}"
                )
        meta_title = reader.metadata.title if reader.metadata else None
    except DocumentError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        raise DocumentError(f"{path}: not a readable PDF ({exc})") from exc
    if not any(p.strip() for p in pages):
        raise DocumentError(f"{path}: PDF has no text layer (scanned images need OCR first)")
    title = (meta_title or "").strip() or path.stem
    return title, [Section(f"page {i}", text) for i, text in enumerate(pages, start=1)]
