"""Two hosts (two data directories) on one PostgreSQL: same results, no re-embedding, no churn."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import faiss
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from retrieval import Embedder
from retrieval.backfill import backfill_collection
from retrieval.records import Chunk, Document, IndexChange
from tests.retrieval.docs import ENGINES, FRUIT, write
from tests.retrieval.hosts import HostFactory, answers, host_factory, row

QUESTIONS = [
    "When should apple trees be pruned?",
    "How does a governor regulate speed?",
    "lemon trees frost",
    "boiler pressure",
]
GARDEN = """# Garden tools

## Spades

A spade with a sharpened edge cuts roots cleanly. Clean the blade after use and oil it before
winter so that it does not rust.

## Shears

Bypass shears make clean cuts on living wood; anvil shears crush and suit dead wood.
"""


@pytest.fixture
def make_host(
    pg_session_factory: sessionmaker[Session], embedder: Embedder, tmp_path: Path
) -> HostFactory:
    """Hosts with their own data directories under tmp_path, sharing the session's PostgreSQL."""
    return host_factory(pg_session_factory, embedder, tmp_path)


def test_ingest_on_a_search_on_b_without_embedding_documents(
    make_host: HostFactory, names: dict[str, str], tmp_path: Path
) -> None:
    a, b = make_host("a"), make_host("b")
    c, t = names["collection"], names["a"]
    fruit, engines = write(tmp_path / "fruit.md", FRUIT), write(tmp_path / "engines.md", ENGINES)
    report = a.ingest([fruit, engines], collection=c, tenant=t)
    assert report.index_version == 1 and report.to_dict()["chunks"] > 0
    before = row(a, t, c)

    assert answers(b, QUESTIONS, t, c) == answers(a, QUESTIONS, t, c)
    assert b.embedder.texts == len(QUESTIONS)  # the questions only, no document
    assert row(a, t, c) == before  # searching on two hosts moved nothing
    assert b.indexes.sources["build"] == 1  # built once from the stored vectors

    # Deletes, a changed document and a new one on A: visible on B at its next query.
    assert a.delete(str(fruit), collection=c, tenant=t) is True
    write(engines, ENGINES.replace("governor", "flyball governor"))
    a.ingest([engines, write(tmp_path / "garden.md", GARDEN)], collection=c, tenant=t)
    version = row(a, t, c)[0]
    assert version == 3
    texts = b.embedder.texts
    got = answers(b, QUESTIONS + ["sharpening a spade"], t, c)
    assert got == answers(a, QUESTIONS + ["sharpening a spade"], t, c)
    assert b.embedder.texts == texts + len(QUESTIONS) + 1
    assert {hit[4] for hits in got for hit in hits} == {version}
    assert all("fruit.md" not in hit[0] for hits in got for hit in hits)
    assert b.indexes.sources["delta"] == 1  # caught up by replaying the log, not rebuilt
    assert row(a, t, c)[0] == version


def test_alternating_searches_never_create_versions(
    make_host: HostFactory, names: dict[str, str], tmp_path: Path
) -> None:
    a, b = make_host("a"), make_host("b")
    c, t = names["collection"], names["a"]
    a.ingest([write(tmp_path / "engines.md", ENGINES)], collection=c, tenant=t)
    before = row(a, t, c)
    with a.session_factory() as session:
        logged = session.scalar(select(func.count()).select_from(IndexChange))
    hosts = [a, b]
    for i in range(100):
        hosts[i % 2].search(QUESTIONS[i % len(QUESTIONS)], collection=c, tenant=t)
    assert row(a, t, c) == before
    with a.session_factory() as session:
        assert session.scalar(select(func.count()).select_from(IndexChange)) == logged
    assert b.embedder.texts == 50 and b.indexes.sources["build"] == 1


def test_concurrent_searches_on_two_hosts_during_ingest(
    make_host: HostFactory, names: dict[str, str], tmp_path: Path
) -> None:
    a, b, writer = make_host("a"), make_host("b"), make_host("w")
    c, t = names["collection"], names["a"]
    writer.ingest([write(tmp_path / "engines.md", ENGINES)], collection=c, tenant=t)
    errors: list[BaseException] = []
    seen: dict[str, set[int]] = {"a": set(), "b": set()}

    def search(name: str) -> None:
        host = a if name == "a" else b
        try:
            for i in range(12):
                hits = host.search(QUESTIONS[i % 4], collection=c, tenant=t)
                seen[name] |= {h.index_version or 0 for h in hits}
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=search, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    writer.ingest([write(tmp_path / "fruit.md", FRUIT)], collection=c, tenant=t)
    writer.ingest([write(tmp_path / "garden.md", GARDEN)], collection=c, tenant=t)
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert row(a, t, c)[0] == 3  # one version per write, none from the searches
    assert seen["a"] <= {1, 2, 3} and seen["b"] <= {1, 2, 3}
    assert answers(a, QUESTIONS, t, c) == answers(b, QUESTIONS, t, c)


def test_lost_files_are_rebuilt_from_the_database(
    make_host: HostFactory, names: dict[str, str], tmp_path: Path
) -> None:
    a, b = make_host("a"), make_host("b")
    c, t = names["collection"], names["a"]
    a.ingest([write(tmp_path / "fruit.md", FRUIT), write(tmp_path / "engines.md", ENGINES)],
             collection=c, tenant=t)  # fmt: skip
    want = answers(a, QUESTIONS, t, c)
    assert answers(b, QUESTIONS, t, c) == want
    b.indexes.wait_for_files()  # B's own file is on disk before B loses it
    before = row(a, t, c)
    for lost in ("a", "b"):
        shutil.rmtree(tmp_path / lost)  # the whole data directory, then a process restart
        fresh = make_host(lost)
        assert answers(fresh, QUESTIONS, t, c) == want
        assert fresh.embedder.texts == len(QUESTIONS)
        assert fresh.indexes.sources["build"] == 1
        fresh.indexes.wait_for_files()
        assert fresh.store.versions(t, c) == [before[0]]  # the cache file is back
    assert row(a, t, c) == before


def test_restart_replays_changes_since_its_file(
    make_host: HostFactory, names: dict[str, str], tmp_path: Path
) -> None:
    a, b = make_host("a"), make_host("b")
    c, t = names["collection"], names["a"]
    a.ingest([write(tmp_path / "fruit.md", FRUIT)], collection=c, tenant=t)
    b.search("apples", collection=c, tenant=t)
    b.indexes.wait_for_files()  # B now has a file of version 1
    a.ingest([write(tmp_path / "engines.md", ENGINES)], collection=c, tenant=t)
    a.delete(str(tmp_path / "fruit.md"), collection=c, tenant=t)
    restarted = make_host("b")  # same data directory, empty memory
    assert answers(restarted, QUESTIONS, t, c) == answers(a, QUESTIONS, t, c)
    assert restarted.indexes.sources["delta"] == 1 and restarted.indexes.sources["build"] == 0
    assert restarted.embedder.texts == len(QUESTIONS)


def test_chunks_from_before_migration_0004_are_backfilled_once(
    make_host: HostFactory, names: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = make_host("a")
    c, t = names["collection"], names["a"]
    a.ingest([write(tmp_path / "fruit.md", FRUIT), write(tmp_path / "engines.md", ENGINES)],
             collection=c, tenant=t)  # fmt: skip
    want = answers(a, QUESTIONS, t, c)

    def same(got: list[list[tuple[str, int, float, str, int | None]]]) -> bool:
        # Re-embedded passages may differ from the ingest's in the last float bits (batching).
        return [[h[:2] for h in hits] for hits in got] == [[h[:2] for h in w] for w in want] and all(
            abs(g[2] - w[2]) < 1e-4 for gs, ws in zip(got, want, strict=True)
            for g, w in zip(gs, ws, strict=True)
        )  # fmt: skip

    with a.session_factory() as session, session.begin():
        ids = select(Chunk.id).join(Document).where(Document.tenant == t, Document.collection == c)
        chunks = session.execute(update(Chunk).where(Chunk.id.in_(ids)).values(embedding=None))
        num_chunks = chunks.rowcount
    before = row(a, t, c)

    # A host whose data directory holds an index file takes the vectors from it: no embedding.
    result = backfill_collection(a.session_factory, make_host("a").store, None, t, c)
    assert (result.from_files, result.embedded) == (num_chunks, 0)
    from_file = make_host("c")
    assert answers(from_file, QUESTIONS, t, c) == want
    assert from_file.embedder.texts == len(QUESTIONS)

    with a.session_factory() as session, session.begin():
        session.execute(update(Chunk).where(Chunk.id.in_(ids)).values(embedding=None))
    # A host without files embeds them, loudly, and stores them for every other host.
    with caplog.at_level("WARNING", logger="retrieval.backfill"):
        b = make_host("b")
        assert same(answers(b, QUESTIONS, t, c))
    assert b.embedder.texts == num_chunks + len(QUESTIONS)
    assert f"embedding {num_chunks} chunks" in caplog.text
    other = make_host("d")
    assert same(answers(other, QUESTIONS, t, c)) and other.embedder.texts == len(QUESTIONS)
    assert row(a, t, c) == before


def test_a_file_that_disagrees_with_the_database_is_rebuilt(
    make_host: HostFactory, names: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import numpy as np

    a = make_host("a")
    c, t = names["collection"], names["a"]
    a.ingest([write(tmp_path / "fruit.md", FRUIT), write(tmp_path / "engines.md", ENGINES)],
             collection=c, tenant=t)  # fmt: skip
    want = answers(a, QUESTIONS, t, c)
    # A file named for version 1 that lacks two vectors (say, from before a database restore).
    current = a.indexes.current(t, c)
    assert current is not None
    damaged = a.store.read(t, c, 1)
    ids = np.sort(np.asarray([h[1] for hits in want for h in hits], dtype="int64"))[:2]
    damaged.remove_ids(faiss.IDSelectorBatch(ids))
    a.store.write(t, c, 1, damaged)
    with caplog.at_level("WARNING", logger="retrieval.host_indexes"):
        restarted = make_host("a")
        assert answers(restarted, QUESTIONS, t, c) == want
    assert "rebuilding" in caplog.text and restarted.indexes.sources["build"] == 1
    assert restarted.embedder.texts == len(QUESTIONS)


def test_a_host_start_warms_recent_indexes_while_the_model_loads(
    pg_session_factory: sessionmaker[Session],
    make_host: HostFactory,
    embedder: Embedder,
    names: dict[str, str],
    tmp_path: Path,
) -> None:
    """open_retrieval: B's index is current before its first search, built from the database
    (never the model) on another thread while the embedder loads; limits are respected."""
    from retrieval import open_retrieval
    from tests.retrieval.hosts import CountingEmbedder

    a = make_host("a")
    c, t = names["collection"], names["a"]
    a.ingest([write(tmp_path / "fruit.md", FRUIT)], collection=c, tenant=t)
    a.ingest([write(tmp_path / "engines.md", ENGINES)], collection=f"{c}-older", tenant=t)
    a.ingest([write(tmp_path / "garden.md", GARDEN)], collection=f"{c}-newest", tenant=t)
    before = row(a, t, c)
    loader_threads: list[str] = []
    counting = CountingEmbedder(embedder)

    def load() -> Embedder:
        loader_threads.append(threading.current_thread().name)
        return counting  # type: ignore[return-value]

    # warm_collections=2 in a database that other tests share: only what is newest is warmed.
    b = open_retrieval(pg_session_factory, tmp_path / "b", load, warm_collections=2)
    assert loader_threads == [threading.main_thread().name]
    assert b.indexes.held_version(t, f"{c}-newest") == 1
    assert b.indexes.held_version(t, c) is None  # third newest: left to its first search
    assert b.indexes.sources["build"] == 2 and counting.texts == 0

    b_all = open_retrieval(pg_session_factory, tmp_path / "b2", load, warm_collections=None)
    for name in (c, f"{c}-older", f"{c}-newest"):
        assert b_all.indexes.held_version(t, name) == 1
    assert answers(b_all, QUESTIONS, t, c) == answers(a, QUESTIONS, t, c)
    assert b_all.indexes.sources["memory"] >= len(QUESTIONS)  # served as warmed
    assert b_all.indexes.sources["build"] >= 3  # no catch-up at search time
    assert counting.texts == len(QUESTIONS)  # the questions only
    assert row(a, t, c) == before  # warming moved no version

    none = open_retrieval(pg_session_factory, tmp_path / "b3", load, warm_collections=0)
    assert none.indexes.held_version(t, c) is None
