"""RetrievalService on SQLite and PostgreSQL: re-ingest, replace, delete, tenants, versions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from retrieval import QueryError, RetrievalService, UnknownCollectionError
from retrieval.records import Chunk, CollectionIndex, Document
from tests.retrieval.conftest import ServiceFactory
from tests.retrieval.docs import ENGINES, FRUIT, write


def agree(service: RetrievalService, tenant: str, collection: str) -> set[int]:
    """The collection's chunk ids, after checking that database and index file hold the same."""
    with service.session_factory() as session:
        db_ids = set(
            session.scalars(
                select(Chunk.id)
                .join(Document)
                .where(Document.tenant == tenant, Document.collection == collection)
            )
        )
        row = session.scalars(
            select(CollectionIndex).where(
                CollectionIndex.tenant == tenant, CollectionIndex.collection == collection
            )
        ).one()
    from retrieval.indexes import all_vectors

    current = service.indexes.current(tenant, collection)  # what this host serves
    assert current is not None and current[0] == row.version
    assert set(all_vectors(current[1])[0].tolist()) == db_ids
    assert row.num_vectors == len(db_ids)
    return db_ids


def test_reingest_unchanged_is_a_noop_and_changed_replaces(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    service = make_service()
    c, t = names["collection"], names["a"]
    fruit = write(tmp_path / "docs" / "fruit.md", FRUIT)
    first = service.ingest([fruit], collection=c, tenant=t)
    assert [f.status for f in first.files] == ["added"] and first.index_version == 1
    old_ids = agree(service, t, c)

    again = service.ingest([fruit], collection=c, tenant=t)
    assert [f.status for f in again.files] == ["unchanged"]
    assert again.index_version == 1  # no new version, no new file
    assert agree(service, t, c) == old_ids

    write(fruit, FRUIT.replace("Citrus", "Figs").replace("Lemon and orange", "Fig"))
    changed = service.ingest([fruit], collection=c, tenant=t)
    assert [f.status for f in changed.files] == ["updated"] and changed.index_version == 2
    new_ids = agree(service, t, c)
    assert not new_ids & old_ids
    hits = service.search("Which trees are frost tender?", collection=c, tenant=t, top_k=5)
    assert {h.chunk_id for h in hits} <= new_ids
    assert all("Lemon" not in h.text for h in hits)
    with service.session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Document)) >= 1


def test_delete_removes_from_database_and_index(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    service = make_service()
    c, t = names["collection"], names["a"]
    fruit = write(tmp_path / "fruit.md", FRUIT)
    engines = write(tmp_path / "engines.md", ENGINES)
    service.ingest([fruit, engines], collection=c, tenant=t)
    assert service.delete(str(fruit), collection=c, tenant=t) is True
    assert service.delete(str(fruit), collection=c, tenant=t) is False
    remaining = agree(service, t, c)
    hits = service.search("pruning apple trees", collection=c, tenant=t, top_k=10)
    assert {h.document for h in hits} == {str(engines)} and {h.chunk_id for h in hits} <= remaining
    with pytest.raises(UnknownCollectionError):
        service.delete(str(fruit), collection="never-made", tenant=t)


def test_folder_ingest_sources_and_sync(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    service = make_service()
    c, t = names["collection"], names["a"]
    folder = tmp_path / "kb"
    write(folder / "fruit.md", FRUIT)
    write(folder / "sub" / "engines.md", ENGINES)
    write(folder / "image.png", "not text")  # unsupported files in folders are skipped
    write(folder / ".hidden.md", "# Hidden\nsecret\n")
    report = service.ingest([str(folder)], collection=c, tenant=t)
    assert {f.source: f.status for f in report.files} == {
        str(folder / "fruit.md"): "added",
        str(folder / "sub" / "engines.md"): "added",
    }
    (folder / "sub" / "engines.md").unlink()
    report = service.ingest([str(folder)], collection=c, tenant=t)
    assert {f.source: f.status for f in report.files} == {
        str(folder / "fruit.md"): "unchanged",
        str(folder / "sub" / "engines.md"): "deleted",
    }
    agree(service, t, c)


def test_bad_files_do_not_stop_good_ones(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    service = make_service(max_file_bytes=2_000)
    c, t = names["collection"], names["a"]
    good = write(tmp_path / "fruit.md", FRUIT)
    big = write(tmp_path / "big.txt", "steam " * 1_000)
    empty = write(tmp_path / "empty.md", "")
    report = service.ingest([big, good, empty, tmp_path / "missing.txt"], collection=c, tenant=t)
    statuses = {f.source: (f.status, f.error) for f in report.files}
    assert statuses[str(good)] == ("added", None)
    assert "over the size limit of 2000 bytes" in (statuses[str(big)][1] or "")
    assert "file is empty" in (statuses[str(empty)][1] or "")
    assert "no such file" in (statuses[str(tmp_path / "missing.txt")][1] or "")
    data = report.to_dict()
    assert (data["added"], data["failed"]) == (1, 3) and not report.ok
    agree(service, t, c)


def test_tenant_isolation_same_collection_name(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    service = make_service()
    c, a, b = names["collection"], names["a"], names["b"]
    service.ingest([write(tmp_path / "a" / "fruit.md", FRUIT)], collection=c, tenant=a)
    service.ingest([write(tmp_path / "b" / "engines.md", ENGINES)], collection=c, tenant=b)
    a_ids, b_ids = agree(service, a, c), agree(service, b, c)
    assert a_ids and b_ids and not a_ids & b_ids
    # Tenant B asks exactly about tenant A's content, with a k larger than both collections.
    for question in ("When should apple trees be pruned?", "lemon trees frost"):
        hits = service.search(question, collection=c, tenant=b, top_k=100)
        assert hits and {h.chunk_id for h in hits} <= b_ids
        assert all("fruit.md" not in h.document for h in hits)
    with pytest.raises(UnknownCollectionError, match="does not exist for tenant"):
        service.search("apples", collection=c, tenant="tenant-c-nobody")
    # Deleting A's document through tenant B's name finds nothing.
    assert service.delete(str(tmp_path / "a" / "fruit.md"), collection=c, tenant=b) is False
    assert agree(service, a, c) == a_ids


def test_new_version_is_picked_up_by_another_instance(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    writer, reader = make_service(), make_service()  # as two processes sharing DB and data dir
    c, t = names["collection"], names["a"]
    writer.ingest([write(tmp_path / "fruit.md", FRUIT)], collection=c, tenant=t)
    first = reader.search("boilers", collection=c, tenant=t, top_k=5)
    assert {h.document for h in first} == {str(tmp_path / "fruit.md")}
    writer.ingest([write(tmp_path / "engines.md", ENGINES)], collection=c, tenant=t)
    hits = reader.search("How does a governor regulate speed?", collection=c, tenant=t)
    assert hits[0].document == str(tmp_path / "engines.md")
    assert reader.index_version(collection=c, tenant=t) == 2
    # Each hit names the index version it was found in (what an answer records).
    assert {h.index_version for h in first} == {1} and {h.index_version for h in hits} == {2}


def test_failed_write_leaves_database_and_index_agreeing(
    make_service: ServiceFactory,
    names: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = make_service()
    c, t = names["collection"], names["a"]
    service.ingest([write(tmp_path / "fruit.md", FRUIT)], collection=c, tenant=t)
    before = agree(service, t, c)

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    # The index file is this host's cache: a full disk costs the file, not the committed write.
    monkeypatch.setattr(service.store, "write", disk_full)
    report = service.ingest([write(tmp_path / "engines.md", ENGINES)], collection=c, tenant=t)
    assert report.files[0].status == "added" and report.index_version == 2
    monkeypatch.undo()
    assert service.store.versions(t, c) == [1]
    assert service.search("centrifugal governor", collection=c, tenant=t)[0].index_version == 2
    restarted = make_service()  # replays version 2 onto the file of version 1
    assert restarted.search("governor", collection=c, tenant=t)[0].index_version == 2
    with_engines = agree(restarted, t, c)
    assert before < with_engines
    # A commit that fails: no new version, and no file of an uncommitted version on disk.
    original_commit = Session.commit

    def failing_commit(self: Session) -> None:
        raise RuntimeError("connection lost at commit")

    monkeypatch.setattr(Session, "commit", failing_commit)
    other = write(tmp_path / "orchard.md", FRUIT.replace("Fruit", "Orchard"))
    report = service.ingest([other], collection=c, tenant=t)
    assert report.files[0].status == "failed"
    monkeypatch.setattr(Session, "commit", original_commit)
    assert service.index_version(collection=c, tenant=t) == 2
    assert 3 not in service.store.versions(t, c)
    assert agree(restarted, t, c) == with_engines
    # The next write takes the version number the failed one did not commit.
    report = service.ingest([other], collection=c, tenant=t)
    assert report.files[0].status == "added" and report.index_version == 3
    agree(service, t, c)


def test_lost_index_file_is_rebuilt_from_the_database(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    service = make_service()
    c, t = names["collection"], names["a"]
    service.ingest([write(tmp_path / "engines.md", ENGINES)], collection=c, tenant=t)
    shutil.rmtree(service.store.folder(t, c))  # FAISS files and lexical directories
    fresh = make_service()
    hits = fresh.search("centrifugal governor", collection=c, tenant=t)
    assert hits and hits[0].document == str(tmp_path / "engines.md")
    assert fresh.index_version(collection=c, tenant=t) == 1  # rebuilt, not a new version
    agree(fresh, t, c)


def test_bad_queries(make_service: ServiceFactory, names: dict[str, str], tmp_path: Path) -> None:
    service = make_service(max_query_chars=50)
    c, t = names["collection"], names["a"]
    service.ingest([write(tmp_path / "fruit.md", FRUIT)], collection=c, tenant=t)
    with pytest.raises(QueryError, match="question is empty"):
        service.search("   ", collection=c, tenant=t)
    with pytest.raises(QueryError, match="51 characters, over the limit of 50"):
        service.search("x" * 51, collection=c, tenant=t)
    with pytest.raises(QueryError, match="top_k"):
        service.search("apples", collection=c, tenant=t, top_k=0)
    with pytest.raises(ValueError, match="collection name is empty"):
        service.search("apples", collection="", tenant=t)
    with pytest.raises(UnknownCollectionError):
        service.search("apples", collection="missing", tenant=t)


def test_concurrent_writers_keep_index_and_database_in_step(
    make_service: ServiceFactory, names: dict[str, str]
) -> None:
    import threading

    import numpy as np

    from retrieval.chunking import ChunkDraft
    from retrieval.loaders import LoadedDocument, Section
    from retrieval.writes import PreparedDocument

    service = make_service()
    c, t = names["collection"], names["a"]
    rng = np.random.default_rng(0)

    def prepared(name: str) -> PreparedDocument:
        doc = LoadedDocument(name, [Section(None, name)], name.ljust(64, "0"), 10)
        chunks = [ChunkDraft(i, name, None, f"{name} part {i}", 3) for i in range(3)]
        vectors = rng.standard_normal((3, service.embedder.dim)).astype("float32")
        return PreparedDocument(
            f"{name}.md", doc, chunks, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        )

    batches = {w: [prepared(f"w{w}-{i}") for i in range(5)] for w in range(3)}
    errors: list[BaseException] = []

    def work(w: int) -> None:
        # Each thread writes through its own service, as separate processes would.
        own = make_service()
        try:
            for p in batches[w]:
                own.writer.write(t, c, [p])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert service.index_version(collection=c, tenant=t) == 15
    assert len(agree(service, t, c)) == 45
