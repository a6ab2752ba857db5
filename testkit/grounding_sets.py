"""Labeled (claim, passage, supported?) sets for calibrating the grounding scorer.

Two sources: the demo corpus (``demo/corpus``, chunked by the service's own chunker), split by
document into a training and a held-out part, and the standard library's docstrings (a set the
scorer was never fitted on). From each picked prose sentence of a passage come positives (the
sentence, a clause of it, the sentence behind a lead-in phrase) and hard negatives (``kind``):

- ``other_doc``: the most similar sentence of another document, against this passage;
- ``number``: one number changed; ``name``: one name swapped for another name of the corpus;
- ``negation``: a negation added or removed;
- ``half_quote``: the sentence's first half ending in the second half of another's.
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.grounding.checks import named
from retrieval.grounding.sentences import split_sentences

STDLIB_MODULES = (
    "argparse collections contextlib csv dataclasses datetime decimal difflib email.message "
    "enum fractions functools gzip hashlib heapq http.client inspect io ipaddress itertools "
    "json logging math os os.path pathlib pickle queue random re sched secrets shlex shutil "
    "socket sqlite3 statistics string struct subprocess tarfile tempfile textwrap threading "
    "time timeit tokenize typing unittest urllib.parse uuid weakref zipfile zlib"
).split()
_LEADS = ("In Python, ", "Note that ", "According to the documentation, ", "As documented, ")
_VERB_NOT = re.compile(r"\b(is|are|was|were|can|does|do|must|will|may|should|has|have)\b")
_NEG = re.compile(r"\b(is|are|was|were|does|do|must|will|may|should|has|have) not\b|\bcannot\b")


@dataclass(frozen=True)
class Example:
    """One labeled pair; ``group`` is the passage's id (pairs of one passage are scored together)."""

    claim: str
    passage: str
    supported: bool
    kind: str
    group: int
    split: str


def prose(sentence: str) -> bool:
    """A sentence worth claiming: 8 to 45 words of prose, not grammar or code."""
    words = sentence.split()
    if not 8 <= len(words) <= 45 or "::=" in sentence or sentence.count("\n   ") > 0:
        return False
    letters = sum(c.isalpha() for c in sentence)
    return letters > 0.7 * len(sentence.replace(" ", "")) and sentence[0].isupper()


def change_number(rng: random.Random, s: str) -> str | None:
    """``s`` with one number changed, or None when it writes none."""
    found = list(re.finditer(r"(?<![\w.])\d+(?![\w])", s))
    if not found:
        return None
    m = rng.choice(found)
    value = int(m.group(0))
    new = value + rng.choice([1, 2, 10]) if value < 5 or rng.random() < 0.5 else value * 2
    return s[: m.start()] + str(new) + s[m.end() :]


def change_name(rng: random.Random, s: str, pool: Sequence[str]) -> str | None:
    """``s`` with one of its names swapped for another name of the corpus, or None."""
    spans = [m for m in re.finditer(r"[\w.]+", s) if m.group(0).lower() in named(s)]
    others = [n for n in pool if n.lower() not in s.lower()]
    if not spans or not others:
        return None
    m = rng.choice(spans)
    return s[: m.start()] + rng.choice(others) + s[m.end() :]


def flip_negation(s: str) -> str | None:
    """``s`` with a negation removed, or else added after its first auxiliary verb."""
    if _NEG.search(s):
        return _NEG.sub(lambda m: m.group(1) if m.group(1) else "can", s, count=1)
    if " not " in s:
        return s.replace(" not ", " ", 1)
    if " never " in s:
        return s.replace(" never ", " always ", 1)
    m = _VERB_NOT.search(s)
    return None if m is None else s[: m.end()] + " not" + s[m.end() :]


def clause(s: str) -> str | None:
    """The sentence's first clause (up to a comma or semicolon, at least 6 words), or None."""
    for m in re.finditer(r"[,;]", s):
        head = s[: m.start()]
        if len(head.split()) >= 6:
            return head + "."
    return None


def half_quote(s: str, other: str) -> str:
    """The first half of ``s`` ending in the second half of ``other``."""
    a, b = s.split(), other.split()
    return " ".join(a[: len(a) // 2] + b[len(b) // 2 :])


def examples(
    passages: Sequence[tuple[str, str]],
    held_docs: set[str],
    nearest: Callable[[str, str], str],
    seed: int = 0,
    per_passage: int = 2,
) -> list[Example]:
    """The labeled pairs of ``(document, passage)``s; ``nearest(sentence, doc)`` is the most
    similar sentence of another document. Documents in ``held_docs`` are the held-out split."""
    rng = random.Random(seed)
    sentences = {
        i: [s.text for s in split_sentences(p) if prose(s.text)]
        for i, (_, p) in enumerate(passages)
    }
    pool = sorted(
        {
            n
            for ss in sentences.values()
            for s in ss
            for n in re.findall(r"[\w.]+", s)
            if n.lower() in named(s)
        }
    )
    everyone = [(passages[i][0], s) for i, ss in sentences.items() for s in ss]
    out: list[Example] = []
    for i, (doc, passage) in enumerate(passages):
        split = "held_out" if doc in held_docs else "train"
        picked = rng.sample(sentences[i], min(per_passage, len(sentences[i])))

        def add(
            claim: str | None,
            supported: bool,
            kind: str,
            at: tuple[str, int, str] = (passage, i, split),
        ) -> None:
            if claim and claim.strip():
                out.append(Example(claim, at[0], supported, kind, at[1], at[2]))

        for s in picked:
            add(s, True, "verbatim")
            add(clause(s), True, "clause")
            add(rng.choice(_LEADS) + s[0].lower() + s[1:], True, "lead_in")
            add(nearest(s, doc), False, "other_doc")
            add(change_number(rng, s), False, "number")
            add(change_name(rng, s, pool), False, "name")
            add(flip_negation(s), False, "negation")
            others = [t for d, t in everyone if d != doc]
            add(half_quote(s, rng.choice(others)) if others else None, False, "half_quote")
    return out


def demo_passages(root: Path, tokenizer: Any) -> list[tuple[str, str]]:
    """``(document, passage)`` of every demo-corpus chunk, as the service chunks them."""
    from retrieval.chunking import Chunker
    from retrieval.loaders import load_document

    chunker = Chunker(tokenizer)
    out = []
    for path in sorted((root / "demo" / "corpus").glob("*.md")):
        doc = load_document(path, max_bytes=10_000_000)
        out += [(path.name, c.text) for c in chunker.chunk(doc)]
    return out


def stdlib_passages(min_chars: int = 300) -> list[tuple[str, str]]:
    """``(module, docstring)`` of the public functions and classes of ``STDLIB_MODULES``."""
    out = []
    for name in STDLIB_MODULES:
        module = importlib.import_module(name)
        for attr, obj in sorted(vars(module).items()):
            if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            doc = inspect.getdoc(obj)
            if doc and len(doc) >= min_chars:
                out.append((name, doc))
    return out
