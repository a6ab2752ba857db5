"""The lexical leg on disk, on real parts: MiniLM, FAISS, Tantivy, SQLite and PostgreSQL.

A restarted host opens its Tantivy directory of the committed version instead of rebuilding it
from the stored terms; a damaged directory, or one of another format or version, is rebuilt and
never served; a deleted document is gone from both legs after a restart; two writers of one
version on one host do not disturb each other; old versions are pruned with the FAISS files.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from retrieval import RetrievalService
from retrieval.lexical import LexicalIndex
from retrieval.lexical_files import MANIFEST, LexicalDirectoryError
from tests.retrieval.conftest import ServiceFactory
from tests.retrieval.docs import write
from tests.retrieval.test_hybrid import ingest_settings, names_of

# Ten small files in all with ingest_settings: one delete stays under MAX_REMOVED_FRACTION, so
# every host applies it to its directory instead of building afresh.
EXTRA = {
    f"note{i}.md": f"# Note {i}\n\nA short note number {i} about gardens, rivers and trains."
    for i in range(4)
}
QUESTIONS = ["PYTHONSAFEPATH", "reset_peak_memory_counters", "How do governors control speed?"]


def ingest_all(service: RetrievalService, root: Path, c: str, t: str) -> None:
    ingest_settings(service, root, c, t)
    report = service.ingest([write(root / n, text) for n, text in EXTRA.items()],
                            collection=c, tenant=t)  # fmt: skip
    assert report.ok, report.to_dict()


def hits(service: RetrievalService, c: str, t: str) -> list[list[dict]]:  # type: ignore[type-arg]
    return [
        [h.to_dict() for h in service.search(q, collection=c, tenant=t, top_k=4, mode=mode)]
        for q in QUESTIONS
        for mode in ("hybrid", "lexical")  # type: ignore[misc]
    ]  # fmt: skip


def test_a_restart_opens_its_directory_instead_of_rebuilding(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    c, t = names["collection"], names["a"]
    writer = make_service()
    ingest_all(writer, tmp_path / "kb", c, t)
    version = writer.index_version(collection=c, tenant=t)
    assert version == 2
    # The writer published each version it wrote (built, then changed); nothing half-written.
    folder = writer.store.folder(t, c)
    assert writer.store.lexical_versions(t, c) == [2, 1]
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    want = hits(writer, c, t)

    restarted = make_service()  # same index dir, empty memory: a process restart
    assert hits(restarted, c, t) == want
    sources = restarted.indexes.sources
    assert sources["lexical open"] == 1 and sources["lexical build"] == 0, sources
    assert sources["lexical delta"] == 0 and sources["lexical unusable"] == 0, sources


def test_a_deleted_document_is_gone_from_both_legs_after_a_restart(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    c, t = names["collection"], names["a"]
    writer = make_service()
    ingest_all(writer, tmp_path / "kb", c, t)
    reader = make_service()  # a second process of this host, holding version 2
    assert names_of(reader.search("reset_peak_memory_counters", collection=c, tenant=t,
                                  mode="lexical"))[0] == "hooks.md"  # fmt: skip
    assert writer.delete(str(tmp_path / "kb" / "hooks.md"), collection=c, tenant=t)
    assert writer.store.lexical_versions(t, c)[0] == 3  # the delete, applied and published

    for service in (make_service(), reader):  # a restart, and a process that was running
        for mode in ("lexical", "hybrid", "dense"):
            found = service.search("reset_peak_memory_counters sys.flags.safe_path",
                                   collection=c, tenant=t, top_k=10, mode=mode)  # type: ignore[arg-type]  # fmt: skip
            assert "hooks.md" not in names_of(found), mode
            assert all(h.index_version == 3 for h in found)
        assert service.search("reset_peak_memory_counters", collection=c, tenant=t,
                              mode="lexical") == []  # fmt: skip
    restarted = make_service()
    restarted.search("PYTHONSAFEPATH", collection=c, tenant=t)
    assert restarted.indexes.sources["lexical build"] == 0, restarted.indexes.sources


def _flip_a_byte(directory: Path) -> None:
    segment = max((p for p in directory.iterdir() if p.suffix in (".idx", ".term", ".store")),
                  key=lambda p: p.stat().st_size)  # fmt: skip
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))


def _other_format(directory: Path) -> None:
    manifest = directory / MANIFEST
    body = json.loads(manifest.read_text())
    body["format"] = "specrag-lexical-0; an older schema"
    manifest.write_text(json.dumps(body))


def _other_version(directory: Path) -> None:
    manifest = directory / MANIFEST
    body = json.loads(manifest.read_text())
    body["version"] -= 1
    manifest.write_text(json.dumps(body))


def _file_missing(directory: Path) -> None:
    next(p for p in directory.iterdir() if p.suffix == ".idx").unlink()


def _no_manifest(directory: Path) -> None:
    (directory / MANIFEST).unlink()


@pytest.mark.parametrize(
    "damage", [_flip_a_byte, _other_format, _other_version, _file_missing, _no_manifest]
)
def test_a_damaged_or_foreign_directory_is_rebuilt_never_served(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path, damage: object,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    c, t = names["collection"], names["a"]
    writer = make_service()
    ingest_all(writer, tmp_path / "kb", c, t)
    want = hits(writer, c, t)
    directory = writer.store.lexical_dir(t, c, 2)
    damage(directory)  # type: ignore[operator]
    with pytest.raises(LexicalDirectoryError):
        LexicalIndex.open(directory, 2)

    restarted = make_service()
    with caplog.at_level("WARNING", logger="retrieval.host_indexes"):
        assert hits(restarted, c, t) == want
    assert "unusable" in caplog.text
    sources = restarted.indexes.sources
    assert sources["lexical unusable"] == 1 and sources["lexical build"] == 1, sources
    assert sources["build"] == 0  # FAISS from its file: only the lexical leg was rebuilt
    chunks = writer.indexes.current(t, c)[1].ntotal  # type: ignore[index]
    assert LexicalIndex.open(directory, 2).ntotal == chunks  # rebuilt in place, checked
    again = make_service()
    assert hits(again, c, t) == want and again.indexes.sources["lexical build"] == 0


def test_two_writers_of_one_version_on_one_host_publish_one_directory(tmp_path: Path) -> None:
    directory = tmp_path / "v000000001.tantivy"
    ids = list(range(1, 2001))
    terms = [f"common word{i % 97} name{i}" for i in ids]
    built: list[LexicalIndex] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            built.append(LexicalIndex.build(ids, terms, directory=directory, version=1))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert [b.ntotal for b in built] == [2000] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000000001.tantivy"]  # no leftovers
    assert LexicalIndex.open(directory, 1).search(["name17"], 3)[0][0] == 17
    # A snapshot is never changed: the next version is its own directory.
    nxt = built[0].changed(np.asarray([17]), np.asarray([5000]), ["name5000"],
                           tmp_path / "v000000002.tantivy", 2)  # fmt: skip
    assert nxt is not None and nxt.search(["name17"], 3) == []
    assert built[0].search(["name17"], 3)[0][0] == 17
    assert LexicalIndex.open(directory, 1).ntotal == 2000


def test_old_directories_are_pruned_with_their_versions(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    c, t = names["collection"], names["a"]
    service = make_service()
    ingest_all(service, tmp_path / "kb", c, t)
    for i in range(3):
        service.ingest([write(tmp_path / "kb" / f"more{i}.md", f"# More {i}\n\nword{i}")],
                       collection=c, tenant=t)  # fmt: skip
    assert service.index_version(collection=c, tenant=t) == 5
    assert service.store.lexical_versions(t, c) == [5, 4]
    assert service.store.versions(t, c)[0] == 5
