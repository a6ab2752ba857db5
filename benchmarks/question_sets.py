"""Question sets for the retrieval benchmark, built by program so that nothing is hand-picked.

- A held-out corpus: the docstrings of standard-library modules (one Markdown file per module:
  its docstring, then each public function's and class's signature and docstring). demo/corpus
  is ``pydoc_data.topics`` (the language reference), so these texts are unseen by the method.
- Exact-name questions: identifiers (snake_case, dotted, CamelCase, dunder, ALLCAPS; at least
  4 characters) that occur in exactly one file of a corpus, asked bare and as
  "What is X used for?", expected: that file.
- Natural-language questions on the held-out corpus: a public function's docstring summary line
  with the function's own name removed, expected: its module's file.
Samples are seeded; the same Python gives the same sets.
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
from pathlib import Path

HELD_OUT_MODULES = (
    "argparse base64 bisect calendar cmd codecs colorsys configparser contextlib copy csv "
    "dataclasses datetime difflib enum filecmp fileinput fnmatch fractions ftplib functools "
    "getopt gettext glob graphlib gzip heapq hmac html.parser http.client imaplib ipaddress "
    "json locale logging mailbox mimetypes netrc operator optparse pathlib pickle pkgutil "
    "plistlib poplib pprint queue quopri random sched secrets selectors shelve shlex shutil "
    "smtplib socketserver statistics string tarfile tempfile textwrap threading tokenize "
    "trace traceback turtle typing urllib.parse urllib.request uuid wave weakref webbrowser "
    "zipfile zoneinfo"
).split()
MAX_FILE_CHARS = 40_000
_IDENT = re.compile(r"(?<![\w.])[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?![\w])")


def _module_markdown(name: str) -> str | None:
    try:
        module = importlib.import_module(name)
    except Exception:  # a module this Python lacks is skipped, the same way every run
        return None
    parts = [f"# {name}\n\n{inspect.getdoc(module) or ''}\n"]
    for attr in sorted(vars(module)):
        obj = getattr(module, attr)
        if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        doc = inspect.getdoc(obj)
        if not doc:
            continue
        try:
            signature = str(inspect.signature(obj))
        except (TypeError, ValueError):
            signature = "(...)"
        parts.append(f"## {attr}{signature}\n\n{doc}\n")
    return "\n".join(parts)[:MAX_FILE_CHARS]


def write_held_out_corpus(folder: Path) -> list[Path]:
    """The held-out corpus as one ``<module>.md`` per module; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in HELD_OUT_MODULES:
        text = _module_markdown(name)
        if text:
            path = folder / f"{name}.md"
            path.write_text(text, encoding="utf-8")
            paths.append(path)
    return paths


def _is_identifier_like(word: str) -> bool:
    if len(word) < 4 or word.isdigit():
        return False
    return (
        "_" in word.strip("_")
        or word.startswith("__")
        or "." in word
        or (word.isupper() and word.isalpha())
        or bool(re.search(r"[a-z][A-Z]", word))
    )


def exact_name_questions(paths: list[Path], n: int, seed: int) -> list[dict[str, str]]:
    """``2 * n`` questions on ``n`` identifiers that occur in exactly one of ``paths``."""
    texts = {p.name: p.read_text(encoding="utf-8") for p in paths}
    owners: dict[str, set[str]] = {}
    for name, text in texts.items():
        for word in set(_IDENT.findall(text)):
            if _is_identifier_like(word):
                owners.setdefault(word, set()).add(name)
    unique = sorted(w for w, files in owners.items() if len(files) == 1)
    picked = random.Random(seed).sample(unique, min(n, len(unique)))
    out = []
    for word in picked:
        (source,) = owners[word]
        out.append({"question": word, "expected_source": source})
        out.append({"question": f"What is {word} used for?", "expected_source": source})
    return out


def docstring_questions(paths: list[Path], n: int, seed: int) -> list[dict[str, str]]:
    """``n`` natural-language questions: docstring summaries without the function's name."""
    heading = re.compile(r"^## (\w+)\(.*?\n\n(.+?)(?:\n\n|\Z)", re.M | re.S)
    candidates = []
    for path in paths:
        for name, summary in heading.findall(path.read_text(encoding="utf-8")):
            line = " ".join(summary.split())
            words = line.split()
            if len(words) >= 6 and name.lower() not in line.lower():
                candidates.append({"question": line[:300], "expected_source": path.name})
    return random.Random(seed).sample(candidates, min(n, len(candidates)))
