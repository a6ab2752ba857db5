"""Recall@5 and MRR per search mode on natural-language and exact-name question sets.

Two corpora: demo/corpus (the method was developed on it) and a held-out one it never saw
(standard-library docstrings). Modes: dense, lexical, hybrid
(what the service runs: min-max fusion, passages holding every term lifted by
``all_terms_bonus``) and, computed here from the same two legs' top 50, min-max fusion alone
(the service with ``all_terms_bonus`` 0) and reciprocal rank fusion plain and with the lexical
leg weighted for questions that name code.

Question sets are built by program, so that nothing is hand-picked:
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
import json
import random
import re
from collections.abc import Callable
from pathlib import Path

from retrieval import RetrievalService
from retrieval.fusion import fuse, rrf
from retrieval.terms import names

Item = dict[str, str]
Docs = list[str]
ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden_retrieval.jsonl"
DEPTH = 50
# RRF with the lexical leg weighted this much for questions that name code (retrieval.terms.names).
NAME_WEIGHTS = (2.0, 3.0)
MODES = ("dense", "lexical", "hybrid", "min-max only", "rrf",
         *(f"rrf names x{w:g}" for w in NAME_WEIGHTS))  # fmt: skip


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


def _score(ranked: list[Docs], items: list[Item], k: int = 5) -> tuple[float, float]:
    found, rr = 0, 0.0
    for docs, item in zip(ranked, items, strict=True):
        rank = next((i for i, d in enumerate(docs[:k], 1) if d.endswith(item["expected_source"])),
                    None)  # fmt: skip
        if rank:
            found, rr = found + 1, rr + 1 / rank
    return found / len(items), rr / len(items)


def _evaluate(
    service: RetrievalService, collection: str, items: list[Item]
) -> dict[str, list[Docs]]:
    """Per mode, the ranked documents of every question (top 5)."""
    out: dict[str, list[Docs]] = {m: [] for m in MODES}
    for item in items:
        q = item["question"]
        for mode in ("dense", "lexical", "hybrid"):
            hits = service.search(q, collection=collection, top_k=5, mode=mode)  # type: ignore[arg-type]
            out[mode].append([h.document for h in hits])
        dense = service.search(q, collection=collection, top_k=DEPTH, mode="dense")
        lexical = service.search(q, collection=collection, top_k=DEPTH, mode="lexical")
        doc_of = {h.chunk_id: h.document for h in dense + lexical}
        d = [(h.chunk_id, h.score) for h in dense]
        lx = [(h.chunk_id, h.score) for h in lexical]
        min_max = [f.chunk_id for f in fuse(d, lx)][:5]
        out["min-max only"].append([doc_of[c] for c in min_max])
        # The same legs as the service's: without the bonus, its hybrid ranking is ``fuse``.
        bonus, service.all_terms_bonus = service.all_terms_bonus, 0.0
        try:
            assert min_max == [h.chunk_id for h in service.search(q, collection=collection,
                                                                  top_k=5)], q  # fmt: skip
        finally:
            service.all_terms_bonus = bonus
        out["rrf"].append([doc_of[f.chunk_id] for f in rrf(d, lx)[:5]])
        for weight in NAME_WEIGHTS:
            fused = rrf(d, lx, lexical_weight=weight if names(q) else 1.0)
            out[f"rrf names x{weight:g}"].append([doc_of[f.chunk_id] for f in fused[:5]])
    return out


def quality(make: Callable[[str], RetrievalService], root: Path, figures: dict) -> list[str]:
    """The quality table: every set, every mode; the goals' recalls go into ``figures``."""
    demo_files = sorted((ROOT / "demo" / "corpus").glob("*.md"))
    held_files = write_held_out_corpus(root / "held-out")
    golden = [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]
    sets = [
        ("demo", "natural language (golden, hand-written)", golden),
        ("demo", "exact names (bare + 'What is X used for?')", exact_name_questions(demo_files, 60, 1)),
        ("held-out", "exact names (bare + 'What is X used for?')", exact_name_questions(held_files, 60, 1)),
        ("held-out", "natural language (docstring summaries, name removed)", docstring_questions(held_files, 60, 2)),
    ]  # fmt: skip
    services = {}
    lines = []
    for name, files in (("demo", demo_files), ("held-out", held_files)):
        service = make(f"quality-{name}")
        report = service.ingest(files, collection=name)
        chunks = report.to_dict()["chunks"]
        lines.append(f"- {name}: {len(files)} files, {chunks} chunks")
        services[name] = service
    out = [
        "Quality: recall@5 / MRR (document level) per search mode",
        "",
        *lines,
        "",
        "| corpus | questions | n | " + " | ".join(MODES) + " |",
        "|---|---|---|" + "---|" * len(MODES),
    ]
    gaps = []
    for i, (corpus, label, items) in enumerate(sets):
        ranked = _evaluate(services[corpus], corpus, items)
        cells, recalls = [], {}
        for mode in MODES:
            recall, mrr = _score(ranked[mode], items)
            recalls[mode] = recall
            cells.append(f"{recall:.3f} / {mrr:.3f}")
        out.append(f"| {corpus} | {label} | {len(items)} | " + " | ".join(cells) + " |")
        if i == 0:
            figures["golden_recall_at_5"] = recalls["hybrid"]
        if i == 2:
            figures["exact_name_recall_at_5"] = recalls["hybrid"]
        if label.startswith("natural"):
            gaps.append(recalls["hybrid"] - recalls["dense"])
    figures["hybrid_minus_dense_recall"] = min(gaps)
    return out
