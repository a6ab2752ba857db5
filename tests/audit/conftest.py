"""Audit fixtures: a fresh migrated database per dialect (SQLite file, own PostgreSQL database)
holding seeded traffic in fixed windows, so reports can be checked against numpy."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine

from app.db.schema import upgrade
from testkit.seeding import Seeded, seed

DAY = timedelta(days=1)
# Main window: clean traffic with shadow baselines; its previous day ran twice as fast.
MAIN = datetime(2026, 3, 10, tzinfo=UTC)
# A day whose shadow baselines include token mismatches.
DIRTY = datetime(2026, 3, 20, tzinfo=UTC)
# A day whose acceptance fell far below its trailing week's.
COLLAPSE = datetime(2026, 4, 10, tzinfo=UTC)


@dataclass
class AuditDB:
    """A seeded database and what was seeded in each window."""

    dialect: str
    engine: Engine
    main: Seeded
    previous: Seeded
    dirty: Seeded


def _seed_all(engine: Engine) -> tuple[Seeded, Seeded, Seeded]:
    upgrade(engine)
    main = seed(engine, 3000, start=MAIN, span=DAY, seed=1, shadow_share=0.3)
    previous = seed(engine, 1000, start=MAIN - DAY, span=DAY, seed=2, latency_scale=0.5)
    dirty = seed(engine, 400, start=DIRTY, span=DAY, seed=3, shadow_share=0.5, mismatch_every=4)
    seed(engine, 600, start=COLLAPSE - 7 * DAY, span=7 * DAY, seed=4, accept_p=0.9)
    seed(engine, 600, start=COLLAPSE, span=DAY, seed=5, accept_p=0.6)
    return main, previous, dirty


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def audit_db(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AuditDB]:
    """The seeded database on SQLite, then on a PostgreSQL database made for this module."""
    if request.param == "sqlite":
        path: Path = tmp_path_factory.mktemp("audit") / "audit.db"
        engine = create_engine(f"sqlite:///{path}")
        yield AuditDB("sqlite", engine, *_seed_all(engine))
        engine.dispose()
        return
    import psycopg

    pg_url = request.getfixturevalue("pg_url")
    name = f"specrag_audit_{uuid.uuid4().hex[:8]}"
    raw = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(raw, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = create_engine(pg_url.rsplit("/", 1)[0] + f"/{name}")
    try:
        yield AuditDB("postgresql", engine, *_seed_all(engine))
    finally:
        engine.dispose()
        with psycopg.connect(raw, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Live:
    """A working service in-process: tiny model pair, real MiniLM + FAISS, embedded SQLite."""

    settings: Any
    resources: Any
    collection: str = "docs"
    tenant: str = "acme"

    def ask(self, question: str, **params: Any) -> uuid.UUID:
        """Store a query of ``tenant`` and answer it through app.pipeline; returns its id."""
        from app.evals.hooks import install_hooks
        from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
        from app.pipeline import answer_query

        with self.resources.session_factory() as session:
            tenant = get_or_create_tenant(session, self.tenant)
            request = validate_request(
                self.settings, {"question": question, "collection": self.collection, **params}
            )
            query, _ = create_query(session, tenant, request)
        install_hooks()  # as a worker does: shadow samples hang on the pipeline's hooks
        assert answer_query(self.resources, query.id) == "succeeded"
        return query.id


@pytest.fixture(scope="session")
def live(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """Every query shadow-sampled, questions stored hashed; three demo files ingested."""
    from app.db import prepare
    from app.resources import Resources
    from app.settings import Settings

    settings = Settings(
        data_dir=tmp_path_factory.mktemp("audit_live"),
        target_model=tiny_models["target"],
        draft_model=tiny_models["draft"],
        device="cpu",
        default_max_tokens=12,
        shadow_sample_rate=1.0,
        store_questions="hashed",
    )
    engine, session_factory = prepare(settings)
    resources = Resources(settings, session_factory)
    corpus = Path(__file__).resolve().parents[2] / "demo" / "corpus"
    report = resources.retrieval.ingest(
        [corpus / n for n in ("assert.md", "pass.md", "del.md")], collection="docs", tenant="acme"
    )
    assert report.ok, report.to_dict()
    yield Live(settings, resources)
    engine.dispose()
