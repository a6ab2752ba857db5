"""Faults of this host's index files, injected on real FAISS, Tantivy and the databases.

- A FAISS file whose vector bytes are damaged in place (size unchanged) is refused at load with
  a log line naming the collection and version, removed, and rebuilt from the database's vectors:
  search answers as before, never from the damaged file. ``specrag index verify`` finds it too.
- A full disk (a real tmpfs) while an ingest writes its index files: the batch is committed and
  reported stored, it is searchable here and on another host, and nothing says "failed".
- Held indexes are an LRU: 60 collections served one after another with ``max_held=4`` leave the
  process's OS thread count where it was after 10 (each held Tantivy index has a watcher thread).
"""

from __future__ import annotations

import gc
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from app.cli import main
from retrieval import Embedder
from retrieval.errors import public_reason
from retrieval.records import Chunk, CollectionIndex, Document
from tests.disks import fill, small_disk
from tests.retrieval.conftest import ServiceFactory
from tests.retrieval.docs import ENGINES, FRUIT, write
from tests.waiting import settled

QUESTIONS = ["How do governors control engine speed?", "Why do apple trees need a second variety?"]


def _answers(service, tenant: str, collection: str) -> list[list[tuple[str, int]]]:  # type: ignore[no-untyped-def]
    return [
        [
            (h.document, h.chunk_id)
            for h in service.search(q, collection=collection, tenant=tenant, top_k=4, mode="dense")
        ]  # fmt: skip
        for q in QUESTIONS
    ]


def _scramble_vectors(path: Path, first_vector: bytes, count: int, dim: int) -> None:
    """Roll the stored vectors by one row in place: same size, same ntotal, other passages."""
    data = bytearray(path.read_bytes())
    start = data.find(first_vector)
    assert start >= 0, "the first vector is not where a flat index keeps it"
    end = start + count * dim * 4
    rows = np.frombuffer(bytes(data[start:end]), dtype="<f4").reshape(count, dim)
    data[start:end] = np.roll(rows, 1, axis=0).tobytes()
    size = path.stat().st_size
    path.write_bytes(bytes(data))
    assert path.stat().st_size == size


def _first_vector(service, tenant: str, collection: str) -> tuple[bytes, int]:  # type: ignore[no-untyped-def]
    with service.session_factory() as session:
        blobs = session.scalars(
            select(Chunk.embedding)
            .join(Document, Chunk.document_id == Document.id)
            .where(Document.tenant == tenant, Document.collection == collection)
            .order_by(Chunk.id)
        ).all()
    return bytes(blobs[0]), len(blobs)


def test_damaged_faiss_file_is_refused_logged_and_rebuilt(
    make_service: ServiceFactory, tmp_path: Path, names: dict[str, str], caplog
) -> None:  # type: ignore[no-untyped-def]
    tenant, collection = names["a"], names["collection"]
    first = make_service()
    paths = [
        write(tmp_path / "kb" / "fruit.md", FRUIT),
        write(tmp_path / "kb" / "engines.md", ENGINES),
    ]
    first.ingest(paths, collection=collection, tenant=tenant)
    first.indexes.wait_for_files()
    expected = _answers(first, tenant, collection)
    version = first.index_version(collection=collection, tenant=tenant)
    path = first.store.path(tenant, collection, version)
    vector, count = _first_vector(first, tenant, collection)
    _scramble_vectors(path, vector, count, first.embedder.dim)

    restarted = make_service()  # a restarted worker: nothing in memory, the file on disk
    with caplog.at_level(logging.INFO, logger="retrieval.host_indexes"):
        got = _answers(restarted, tenant, collection)
    assert got == expected  # never answered from the damaged file
    refused = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(refused) == 1
    assert f"{tenant}/{collection} version {version} refused" in refused[0]
    assert "damaged" in refused[0] and "rebuilding" in refused[0]
    assert any("rebuilt from the database" in r.getMessage() for r in caplog.records)
    assert restarted.indexes.sources["damaged"] == 1
    restarted.indexes.wait_for_files()
    assert restarted.store.check(tenant, collection, version).problem is None  # written again
    assert _answers(make_service(), tenant, collection) == expected


def test_index_verify_finds_repairs_and_reports(tmp_path: Path, embedder: Embedder) -> None:
    env = {"SPECRAG_DATA_DIR": str(tmp_path / "var"), "SPECRAG_DATABASE_URL": None}

    def run(*args: str):  # type: ignore[no-untyped-def]
        return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)

    write(tmp_path / "kb" / "fruit.md", FRUIT)
    write(tmp_path / "kb" / "engines.md", ENGINES)
    assert run("ingest", str(tmp_path / "kb"), "--collection", "kb").exit_code == 0
    clean = run("index", "verify", "--json")
    assert clean.exit_code == 0, clean.stderr
    assert json.loads(clean.stdout)["damaged"] == 0 and json.loads(clean.stdout)["checked"] >= 2

    from retrieval.index_store import IndexStore

    store = IndexStore(tmp_path / "var" / "indexes")
    version = store.versions("default", "kb")[0]
    path = store.path("default", "kb", version)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40  # one bit, size unchanged
    path.write_bytes(bytes(data))

    report = run("index", "verify", "--no-repair")
    assert report.exit_code == 1
    assert f"default/kb faiss v{version}: is damaged" in report.stdout
    assert path.exists()  # --no-repair removes nothing

    repaired = run("index", "verify", "--json")
    assert repaired.exit_code == 0, repaired.stderr
    body = json.loads(repaired.stdout)
    assert body["damaged"] == 1 and body["collections"][0]["rebuilt"] is True
    assert store.check("default", "kb", version).problem is None
    assert json.loads(run("index", "verify", "--json").stdout)["damaged"] == 0
    search = run("search", "How do governors control engine speed?", "-c", "kb", "--json")
    assert "engines.md" in json.loads(search.stdout)["results"][0]["document"]


def test_full_disk_during_ingest_is_stored_not_failed(
    make_service: ServiceFactory, tmp_path: Path, names: dict[str, str], embedder: Embedder
) -> None:
    tenant, collection = names["a"], names["collection"]
    with small_disk(tmp_path / "disk", "4m") as disk:
        from retrieval import RetrievalService

        service = RetrievalService(make_service().session_factory, disk / "indexes", embedder)
        fruit = write(tmp_path / "kb" / "fruit.md", FRUIT)
        assert (
            service.ingest([fruit], collection=collection, tenant=tenant).files[0].status == "added"
        )
        service.indexes.wait_for_files()
        fill(disk)
        engines = write(tmp_path / "kb" / "engines.md", ENGINES)
        report = service.ingest([engines], collection=collection, tenant=tenant)
        service.indexes.wait_for_files()
        (result,) = report.files
        assert result.status == "added", result.error  # committed: never "failed"
        hits = service.search(QUESTIONS[0], collection=collection, tenant=tenant, top_k=1)
        assert hits[0].document == str(engines)
        assert service.search(QUESTIONS[1], collection=collection, tenant=tenant,
                              top_k=1)[0].document == str(fruit)  # fmt: skip
        other = make_service()  # another host: the database alone serves the same version
        assert other.search(QUESTIONS[0], collection=collection, tenant=tenant,
                            top_k=1)[0].document == str(engines)  # fmt: skip
        (disk / "filler").unlink()
        restarted = RetrievalService(service.session_factory, disk / "indexes", embedder)
        assert restarted.search(QUESTIONS[0], collection=collection, tenant=tenant,
                                top_k=1)[0].document == str(engines)  # fmt: skip


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _settled_threads() -> int:
    """OS threads once Tantivy's watchers of dropped indexes have seen their stop flag (they
    poll every 500 ms); earlier tests' services collected first, so they cannot drop meanwhile."""
    gc.collect()
    return settled(_os_threads, quiet=0.6, timeout=30, message="this process's thread count")


def test_held_indexes_are_an_lru_and_threads_stay_bounded(
    make_service: ServiceFactory, tmp_path: Path, names: dict[str, str]
) -> None:
    service = make_service(max_held=4)
    tenant = names["a"]
    doc = write(tmp_path / "one.md", FRUIT)
    after: dict[int, int] = {}
    for i in range(60):
        collection = f"{names['collection']}-{i}"
        service.ingest([doc], collection=collection, tenant=tenant)
        assert service.search(QUESTIONS[1], collection=collection, tenant=tenant, top_k=1)
        if i + 1 in (10, 60):
            service.indexes.wait_for_files()
            after[i + 1] = _settled_threads()
    assert after[60] <= after[10] + 4, after  # without the LRU: one thread more per collection
    assert service.indexes.held_count() == 4
    # An evicted collection is caught up again from its files when asked.
    first = f"{names['collection']}-0"
    assert service.indexes.held_version(tenant, first) is None
    assert service.search(QUESTIONS[1], collection=first, tenant=tenant, top_k=1)
    assert service.indexes.held_version(tenant, first) == 1
    with service.session_factory() as session:
        count = session.query(CollectionIndex).filter(CollectionIndex.tenant == tenant).count()
    assert count == 60


def test_failure_reasons_name_the_problem_without_server_paths(tmp_path: Path) -> None:
    import faiss
    import tantivy

    missing = tmp_path / "deep" / "v000000001.faiss"
    failures: list[BaseException] = []
    for attempt in (
        lambda: faiss.read_index(str(missing)),
        lambda: tantivy.Index.open(str(tmp_path / "nowhere.tantivy")),
        lambda: missing.open("rb"),
    ):
        with pytest.raises(Exception) as caught:
            attempt()
        failures.append(caught.value)
    for exc in failures:
        assert str(tmp_path) in str(exc)  # the raw error names the server's path
        reason = public_reason(exc)
        assert str(tmp_path) not in reason and "/tmp" not in reason, reason
        assert reason.strip()
    assert public_reason(failures[2]) == "No such file or directory (ENOENT)"
