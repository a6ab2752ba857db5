"""Loaders: every supported format parses into titled sections; every bad file gets a clear error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retrieval.errors import DocumentError
from retrieval.loaders import load_document
from tests.retrieval.docs import FRUIT, pdf_bytes, write

LIMIT = 1_000_000


def test_markdown_title_and_sections(tmp_path: Path) -> None:
    doc = load_document(write(tmp_path / "fruit.md", FRUIT), LIMIT)
    assert doc.title == "Fruit growing"
    assert [s.heading for s in doc.sections] == ["Apples", "Citrus"]
    assert "cross-pollination" in doc.sections[0].text
    assert len(doc.content_hash) == 64 and doc.size_bytes == len(FRUIT.encode())


def test_markdown_hash_in_code_fence_is_not_a_heading(tmp_path: Path) -> None:
    text = "# T\n\n```\n# just a comment\nx = 1\n```\nafter\n"
    doc = load_document(write(tmp_path / "c.md", text), LIMIT)
    assert [s.heading for s in doc.sections] == ["T"]
    assert "# just a comment" in doc.sections[0].text


def test_text_file_takes_its_first_line_as_title(tmp_path: Path) -> None:
    doc = load_document(
        write(tmp_path / "notes.txt", "Release notes\n\nFixed the boiler.\n"), LIMIT
    )
    assert doc.title == "Release notes"
    assert doc.sections[0].heading is None and "Fixed the boiler." in doc.sections[0].text


def test_html_keeps_visible_text_only(tmp_path: Path) -> None:
    html = """<html><head><title>Boilers</title><style>p {color: red}</style>
    <script>var secret = "script text";</script></head><body>
    <nav>Home | Products | Contact</nav><header>Site banner</header>
    <h1>Fire-tube boilers</h1><p>Hot gases pass <b>through</b> tubes.</p>
    <aside>Advertisement</aside><h2>Safety</h2><ul><li>Check the valve.</li></ul>
    <div hidden>hidden text</div><footer>Copyright 2026</footer></body></html>"""
    doc = load_document(write(tmp_path / "b.html", html), LIMIT)
    text = "\n".join(s.text for s in doc.sections)
    assert doc.title == "Boilers"
    assert [s.heading for s in doc.sections] == ["Fire-tube boilers", "Safety"]
    assert "Hot gases pass through tubes." in text and "Check the valve." in text
    for boilerplate in (
        "secret",
        "color",
        "Home",
        "banner",
        "Advertisement",
        "Copyright",
        "hidden",
    ):
        assert boilerplate not in text, boilerplate


def test_pdf_text_per_page(tmp_path: Path) -> None:
    path = tmp_path / "manual.pdf"
    path.write_bytes(pdf_bytes(["The governor regulates speed.", "Boilers raise steam."]))
    doc = load_document(path, LIMIT)
    assert doc.title == "manual"
    assert [s.heading for s in doc.sections] == ["page 1", "page 2"]
    assert "governor regulates speed" in doc.sections[0].text


def _bad(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("empty.txt", b"", "file is empty"),
        ("blank.md", b"  \n\n\t\n", "file is empty"),
        ("headings-only.md", b"# Title\n## Sub\n", "no text to index"),
        ("binary.txt", b"abc\x00\x01\x02def", "binary"),
        ("latin1.txt", "café crème".encode("latin-1"), "not valid UTF-8 (byte 0xe9 at offset 3)"),
        ("image.png", b"\x89PNG\r\n", "unsupported file type '.png'"),
        ("noext", b"hello", "unsupported file type '(no extension)'"),
        ("scan.pdf", pdf_bytes([None, None]), "no text layer"),
        ("broken.pdf", b"%PDF-1.4\nnot really a pdf", "not a readable PDF"),
        ("empty-page.html", b"<html><script>x()</script><nav>menu</nav></html>", "no text"),
    ],
)
def test_bad_files_get_an_error_naming_file_and_problem(
    tmp_path: Path, name: str, data: bytes, message: str
) -> None:
    path = _bad(tmp_path, name, data)
    with pytest.raises(DocumentError) as info:
        load_document(path, LIMIT)
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="no such file"):
        load_document(tmp_path / "gone.md", LIMIT)
    with pytest.raises(DocumentError, match="not a regular file"):
        load_document(tmp_path, LIMIT)


def test_size_limit_is_configurable(tmp_path: Path) -> None:
    path = write(tmp_path / "big.txt", "word " * 100)
    assert load_document(path, 500).size_bytes == 500
    with pytest.raises(DocumentError, match="500 bytes is over the size limit of 499 bytes"):
        load_document(path, 499)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_unreadable_file(tmp_path: Path) -> None:
    path = write(tmp_path / "secret.md", "# S\ntext\n")
    path.chmod(0)
    try:
        with pytest.raises(DocumentError, match="cannot read file"):
            load_document(path, LIMIT)
    finally:
        path.chmod(0o600)


def test_read_error_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Runs as root too (where chmod 0 does not stop reads): the OS error itself is simulated.
    path = write(tmp_path / "locked.md", "# L\ntext\n")

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(DocumentError, match=r"locked.md: cannot read file \(Permission denied\)"):
        load_document(path, LIMIT)
