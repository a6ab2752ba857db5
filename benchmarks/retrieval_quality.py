"""Recall@5 and MRR per search mode on natural-language and exact-name question sets.

Two corpora: demo/corpus (the method was developed on it) and a held-out one it never saw
(standard-library docstrings, benchmarks/question_sets.py). Modes: dense, lexical, hybrid (RRF,
what the service runs) and, computed here from the same two legs' top 50, a min-max score
fusion, the common alternative to RRF.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from question_sets import docstring_questions, exact_name_questions, write_held_out_corpus

from retrieval import RetrievalService
from retrieval.fusion import fuse

Item = dict[str, str]
Docs = list[str]
ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden_retrieval.jsonl"
DEPTH = 50


def _score(ranked: list[Docs], items: list[Item], k: int = 5) -> tuple[float, float]:
    found, rr = 0, 0.0
    for docs, item in zip(ranked, items, strict=True):
        rank = next((i for i, d in enumerate(docs[:k], 1) if d.endswith(item["expected_source"])),
                    None)  # fmt: skip
        if rank:
            found, rr = found + 1, rr + 1 / rank
    return found / len(items), rr / len(items)


def _minmax(dense: list[tuple[int, float]], lexical: list[tuple[int, float]]) -> list[int]:
    """Chunk ids by the sum of each leg's min-max-normalised score (0 where a leg lacks it)."""
    total: dict[int, float] = {}
    for leg in (dense, lexical):
        if not leg:
            continue
        low, high = min(s for _, s in leg), max(s for _, s in leg)
        for chunk_id, score in leg:
            norm = (score - low) / (high - low) if high > low else 1.0
            total[chunk_id] = total.get(chunk_id, 0.0) + norm
    return sorted(total, key=lambda c: (-total[c], c))


def _evaluate(service: RetrievalService, collection: str, items: list[Item]) -> dict[str, Docs]:
    """Per mode, the ranked documents of every question (top 5)."""
    out: dict[str, list[Docs]] = {m: [] for m in ("dense", "lexical", "hybrid", "min-max")}
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
        # The service's own RRF on the same legs: a check that the table's hybrid row is RRF.
        assert [f.chunk_id for f in fuse(d, lx)][:5] == [
            h.chunk_id for h in service.search(q, collection=collection, top_k=5)
        ], q
        out["min-max"].append([doc_of[c] for c in _minmax(d, lx)[:5]])
    return out  # type: ignore[return-value]


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
        "| corpus | questions | n | dense | lexical | hybrid (RRF) | min-max fusion |",
        "|---|---|---|---|---|---|---|",
    ]
    for corpus, label, items in sets:
        ranked = _evaluate(services[corpus], corpus, items)
        cells = []
        for mode in ("dense", "lexical", "hybrid", "min-max"):
            recall, mrr = _score(ranked[mode], items)
            cells.append(f"{recall:.3f} / {mrr:.3f}")
        out.append(f"| {corpus} | {label} | {len(items)} | " + " | ".join(cells) + " |")
    return out
