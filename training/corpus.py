"""The training corpus: documents with titled sections, from text every Python machine has.

Two sources, both walked in a fixed order so the corpus is the same on every run:
the bundled demo corpus (``demo/corpus/*.md``, Python's language reference from
``pydoc_data.topics``) and the standard library's docstrings.  A seeded split holds whole
documents out, so held-out perplexity and held-out RAG prompts use text the models never saw.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import random
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_CORPUS = REPO_ROOT / "demo" / "corpus"

# Modules that act on import (open browsers, print, start GUIs) or only hold tests and tools.
_SKIP_MODULES = {
    "antigravity",
    "this",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "lib2to3",
    "test",
    "ensurepip",
    "venv",
    "pydoc_data",
    "__phello__",
    "__hello__",
    "msilib",
    "winreg",
    "winsound",
    "_msi",
    "nt",
    "msvcrt",
    "_winapi",
    "_overlapped",
    "asyncio.windows_events",
    "distutils",
    "pydoc",
    "xxsubtype",
    "xxlimited",
    "xxlimited_35",
    "sre_compile",
    "sre_parse",
    "sre_constants",
}
_MAX_SECTION_CHARS = 4000


@dataclass
class Section:
    """One titled stretch of text: a Markdown section or one object's docstring."""

    heading: str
    text: str


@dataclass
class Document:
    """A titled document made of sections; ``source`` says where it came from."""

    source: str
    title: str
    sections: list[Section] = field(default_factory=list)

    def text(self) -> str:
        """The document as plain text: title, then each heading and its text."""
        parts = [self.title]
        for s in self.sections:
            parts.append(s.heading)
            parts.append(s.text)
        return "\n\n".join(parts) + "\n"


def markdown_document(path: Path) -> Document:
    """A demo-corpus Markdown file split at its ``#``/``##`` headings."""
    lines = path.read_text(encoding="utf-8").splitlines()
    title = path.stem
    if lines and lines[0].startswith("# "):
        title, lines = lines[0][2:].strip(), lines[1:]
    doc = Document(source=f"demo/corpus/{path.name}", title=title)
    heading, buf = "", list[str]()
    for line in lines + ["## "]:
        if line.startswith("## "):
            text = "\n".join(buf).strip("\n")
            if text.strip():
                doc.sections.append(Section(heading, text))
            heading, buf = line[3:].strip(), []
        else:
            buf.append(line.rstrip())
    return doc


def topic_documents() -> list[Document]:
    """The bundled demo corpus, one document per topic file, sorted by file name."""
    return [markdown_document(p) for p in sorted(DEMO_CORPUS.glob("*.md"))]


def _public_stdlib_modules() -> list[str]:
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_"))
    return [n for n in names if n not in _SKIP_MODULES]


def _clean_doc(doc: str) -> str:
    doc = inspect.cleandoc(doc).strip()
    return doc[:_MAX_SECTION_CHARS].rsplit("\n", 1)[0] if len(doc) > _MAX_SECTION_CHARS else doc


def _module_members(mod: object, modname: str) -> Iterator[tuple[str, str]]:
    for name in sorted(vars(mod)):
        if name.startswith("_"):
            continue
        obj = vars(mod)[name]
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if getattr(obj, "__module__", modname) != modname:
            continue  # re-exported from elsewhere: documented where it is defined
        doc = getattr(obj, "__doc__", None)
        if isinstance(doc, str) and len(doc.strip()) >= 20:
            yield f"{modname}.{name}", _clean_doc(doc)
        if inspect.isclass(obj):
            for mname in sorted(vars(obj)):
                if mname.startswith("_"):
                    continue
                mdoc = getattr(vars(obj)[mname], "__doc__", None)
                if isinstance(mdoc, str) and len(mdoc.strip()) >= 20 and mdoc != doc:
                    yield f"{modname}.{name}.{mname}", _clean_doc(mdoc)


def docstring_documents() -> list[Document]:
    """One document per public standard-library module: its docstring, then its objects'."""
    docs: list[Document] = []
    seen_texts: set[str] = set()
    for modname in _public_stdlib_modules():
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            try:
                mod = importlib.import_module(modname)
            except Exception:  # noqa: BLE001 - platform-specific modules simply do not exist here
                continue
        doc = Document(source=f"stdlib:{modname}", title=f"{modname} module")
        mdoc = getattr(mod, "__doc__", None)
        if isinstance(mdoc, str) and len(mdoc.strip()) >= 20:
            doc.sections.append(Section(f"{modname}", _clean_doc(mdoc)))
        for qualname, text in _module_members(mod, modname):
            if text in seen_texts:
                continue  # inherited boilerplate repeated across classes teaches nothing new
            seen_texts.add(text)
            doc.sections.append(Section(qualname, text))
        if doc.sections:
            docs.append(doc)
    return docs


@dataclass
class Corpus:
    """Training and held-out documents."""

    train: list[Document]
    heldout: list[Document]


def build_corpus(seed: int = 0, heldout_fraction: float = 0.08) -> Corpus:
    """The full corpus with a seeded held-out split of whole documents (topics and modules apart)."""
    rng = random.Random(seed)
    train: list[Document] = []
    heldout: list[Document] = []
    for group in (topic_documents(), docstring_documents()):
        order = list(range(len(group)))
        rng.shuffle(order)
        n_held = max(1, round(len(group) * heldout_fraction))
        held = set(order[:n_held])
        for i, d in enumerate(group):
            (heldout if i in held else train).append(d)
    return Corpus(train=train, heldout=heldout)


_WS = re.compile(r"[ \t]+\n")


def normalise(text: str) -> str:
    """Text with trailing spaces dropped, as the retrieval chunker would show it."""
    return _WS.sub("\n", text)
