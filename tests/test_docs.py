"""The handbook holds together: every link and file path it names exists, pages stay short, and
no page reads as a build log (tracker numbers, session chapters)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "models" / "README.md", *(ROOT / "docs").glob("*.md")])

LINK = re.compile(r"\]\(([^)\s]+)\)")
TOP = "app|benchmarks|demo|deploy|docker|docs|generation|migrations|models|retrieval|scripts|testkit|tests|training|workers"
PATH = re.compile(
    rf"(?<![\w/.-])((?:{TOP})/[\w./-]*\w\.(?:md|py|c|yml|yaml|toml|json|sh|png|jinja|txt))\b"
)
# `path` @ 1a2b3c4: a file of another repository at a stated commit (docs/vllm.md's sources).
FOREIGN = re.compile(r"`[^`]+` @ [0-9a-f]{7,40}")
HISTORY = re.compile(r"\b(session|issue)s? ?#?\d+\b", re.IGNORECASE)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _exists(rel: str) -> bool:
    return (ROOT / rel).exists()


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_links_resolve(page: Path) -> None:
    """Every relative Markdown link points at a file of the tree."""
    missing = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        rel = _rel((page.parent / target.split("#")[0]).resolve())
        if not _exists(rel):
            missing.append(target)
    assert not missing, f"{_rel(page)} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_named_paths_exist(page: Path) -> None:
    """Every repository file a page names in its text (``app/pipeline.py``, ``docs/vllm.md``)."""
    text = FOREIGN.sub("", page.read_text(encoding="utf-8"))
    missing = sorted({p for p in PATH.findall(text) if not _exists(p)})
    assert not missing, f"{_rel(page)} names files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_build_log(page: Path) -> None:
    """Pages say what is true now: no "session N" or "issue N" (history lives in git)."""
    hits = [
        f"{n}: {line.strip()[:80]}"
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not hits, f"{_rel(page)} reads as a build log:\n" + "\n".join(hits)


def test_pages_stay_short() -> None:
    """The README fits a first read (about 300 lines); no page grows past 1,000 lines."""
    lengths = {_rel(p): len(p.read_text(encoding="utf-8").splitlines()) for p in PAGES}
    assert lengths["README.md"] <= 300, lengths["README.md"]
    long = {name: n for name, n in lengths.items() if n > 1000}
    assert not long, f"pages over 1,000 lines: {long}"


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    """The patterns above find a broken path and a build-log line (a check that cannot fail is none)."""
    # Built from parts, so this file itself holds no build-log words for the tree-wide check.
    text = (
        "See docs/nowhere.md and app/pipeline.py; measured in "
        + "sess"
        + "ion 12 ("
        + "iss"
        + "ue 34)."
    )
    assert PATH.findall(text) == ["docs/nowhere.md", "app/pipeline.py"]
    assert not _exists("docs/nowhere.md") and _exists("app/pipeline.py")
    assert len(HISTORY.findall(text)) == 2
    assert PATH.findall(FOREIGN.sub("", "`docs/features/x.md` @ 01ed47b4 and docs/y.md")) == [
        "docs/y.md"
    ]
    assert LINK.findall("[a](docs/x.md) [b](https://x.org)") == ["docs/x.md", "https://x.org"]
