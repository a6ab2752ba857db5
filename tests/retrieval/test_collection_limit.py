"""The per-tenant collection limit where a write creates a collection (worker, CLI), on the real
databases: one collection more is refused naming ``max_collections``, and nothing is stored."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, select

from retrieval.records import CollectionIndex, Document
from tests.retrieval.conftest import ServiceFactory
from tests.retrieval.docs import FRUIT, write


def _counts(service, tenant: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    with service.session_factory() as session:
        rows = session.scalar(
            select(func.count())
            .select_from(CollectionIndex)
            .where(CollectionIndex.tenant == tenant)
        )
        docs = session.scalar(
            select(func.count()).select_from(Document).where(Document.tenant == tenant)
        )
    return int(rows or 0), int(docs or 0)


def test_one_collection_over_the_limit_is_refused_and_nothing_stored(
    make_service: ServiceFactory, tmp_path: Path, names: dict[str, str]
) -> None:
    limits = {names["a"]: 2}
    service = make_service(max_collections=lambda tenant: limits.get(tenant, 0))
    doc = write(tmp_path / "fruit.md", FRUIT)
    for i in range(2):
        report = service.ingest([doc], collection=f"c{i}", tenant=names["a"])
        assert report.files[0].status == "added"
    before = _counts(service, names["a"])
    refused = service.ingest([doc], collection="c2", tenant=names["a"])
    (result,) = refused.files
    assert result.status == "failed"
    assert result.error is not None and "max_collections is 2" in result.error
    assert _counts(service, names["a"]) == before == (2, 2)
    assert service.index_version(collection="c2", tenant=names["a"]) is None
    # Existing collections still take writes; other tenants have their own limit.
    assert service.ingest([write(tmp_path / "b.md", FRUIT + "\nMore.")], collection="c0",
                          tenant=names["a"]).files[0].status == "added"  # fmt: skip
    assert service.ingest([doc], collection="c2", tenant=names["b"]).files[0].status == "added"
