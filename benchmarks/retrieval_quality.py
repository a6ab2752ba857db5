"""Recall@5 and MRR per search mode on natural-language and exact-name question sets.

Two corpora: demo/corpus (the method was developed on it) and a held-out one it never saw
(standard-library docstrings, benchmarks/question_sets.py). Modes: dense, lexical, hybrid
(what the service runs: min-max fusion, passages holding every term lifted by
``all_terms_bonus``) and, computed here from the same two legs' top 50, min-max fusion alone
(the service with ``all_terms_bonus`` 0) and reciprocal rank fusion plain and with the lexical
leg weighted for questions that name code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from question_sets import docstring_questions, exact_name_questions, write_held_out_corpus

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


def quality(make: Callable[[str], RetrievalService], root: Path) -> list[str]:
    """The quality table: every set, every mode."""
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
    for corpus, label, items in sets:
        ranked = _evaluate(services[corpus], corpus, items)
        cells = []
        for mode in MODES:
            recall, mrr = _score(ranked[mode], items)
            cells.append(f"{recall:.3f} / {mrr:.3f}")
        out.append(f"| {corpus} | {label} | {len(items)} | " + " | ".join(cells) + " |")
    return out
