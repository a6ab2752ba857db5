"""Migration 0004 on PostgreSQL: collections from before it keep working, schema only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import sessionmaker

from app.db.schema import downgrade, upgrade
from retrieval import Embedder, RetrievalService
from tests.retrieval.docs import ENGINES, write
from tests.retrieval.hosts import CountingEmbedder


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    """An empty database of its own (migrated by the test), dropped afterwards."""
    import psycopg

    name = f"specrag_m4_{uuid.uuid4().hex[:8]}"
    raw = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(raw, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    made = create_engine(pg_url.rsplit("/", 1)[0] + f"/{name}")
    yield made
    made.dispose()
    with psycopg.connect(raw, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_collections_from_0003_start_their_log_and_are_backfilled(
    engine: Engine, embedder: Embedder, tmp_path: Path
) -> None:
    upgrade(engine, "0003")
    with engine.begin() as conn:  # a collection at version 7 with one chunk, as 0003 stored it
        conn.execute(text(
            "INSERT INTO collection_indexes (tenant, collection, version, kind, num_vectors, dim,"
            " updated_at) VALUES ('t', 'c', 7, 'flat', 1, 384, now())"))  # fmt: skip
        conn.execute(text(
            "INSERT INTO documents (tenant, collection, source, title, content_hash, size_bytes,"
            " num_chunks, created_at, updated_at) VALUES ('t', 'c', 'old.md', 'Old', :h, 1, 1,"
            " now(), now())"), {"h": "0" * 64})  # fmt: skip
        conn.execute(text(
            "INSERT INTO chunks (document_id, position, title, heading, text, token_count)"
            " SELECT id, 0, 'Old', NULL, 'Steam engines use a centrifugal governor.', 8"
            " FROM documents"))  # fmt: skip
    upgrade(engine)
    with engine.connect() as conn:
        got = conn.execute(
            text("SELECT version, layout_version, log_floor, centroids FROM collection_indexes")
        ).one()
        assert tuple(got) == (7, 7, 7, None)
        assert conn.execute(text("SELECT embedding FROM chunks")).scalar_one() is None

    # The collection still serves (its one vector embedded once, then stored), at version 7.
    counting: object = CountingEmbedder(embedder)
    service = RetrievalService(sessionmaker(engine), tmp_path / "idx", counting)  # type: ignore[arg-type]
    hits = service.search("governor", collection="c", tenant="t")
    assert [h.document for h in hits] == ["old.md"] and hits[0].index_version == 7
    assert counting.texts == 2  # type: ignore[attr-defined]  (the chunk, then the question)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT embedding FROM chunks")).scalar_one() is not None
    # New writes log their changes from version 8 on.
    service.ingest([write(tmp_path / "engines.md", ENGINES)], collection="c", tenant="t")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT min(version) FROM index_changes")).scalar_one() == 8
    assert downgrade(engine, "0003") == "0003"
