"""Tenant-safety fixtures: a PostgreSQL database of this module's own, and an API app on it.

PostgreSQL, not SQLite, because the findings are PostgreSQL's (a NUL byte in ``text`` is a 500
there); ``send`` is recorded instead of reaching a broker, so the tests see exactly what would be
queued.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session

from app.settings import Settings
from tests.fakes import RecordingDispatcher


@pytest.fixture(scope="module")
def tenancy_pg() -> Iterator[str]:
    """The URL of a PostgreSQL database migrated to head, made for this module and dropped after."""
    import psycopg

    from app.db.schema import upgrade
    from tests.conftest import _pg_admin_url

    admin = _pg_admin_url()
    if admin is None:
        pytest.skip("PostgreSQL not reachable (run scripts/ensure-services.sh)")
    name = f"specrag_tenancy_{uuid.uuid4().hex[:10]}"
    raw = admin.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(raw, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0] + f"/{name}"
    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()
    yield url
    with psycopg.connect(raw, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Api:
    """A TestClient on the app, its recording dispatcher, and the database engine."""

    client: Any
    engine: Engine
    settings: Settings
    dispatcher: Any = field(default_factory=lambda: RecordingDispatcher())

    @property
    def sent(self) -> list[tuple[Any, ...]]:
        """Queries sent to the queue: ``(query id, queue)``."""
        return list(self.dispatcher.of("query"))

    @property
    def tasks(self) -> list[tuple[str, tuple[Any, ...]]]:
        """Every other send (uploads, deletes, batches) as ``(kind, args)``."""
        return [(k, a) for k, a in self.dispatcher.sent if k != "query"]

    def key(self, tenant: str, *, admin: bool = False) -> dict[str, str]:
        """Authorization headers for a new key of ``tenant`` (whose collection 'docs' exists)."""
        from app.keys import create_key
        from retrieval.records import CollectionIndex

        with Session(self.engine) as session:
            key = create_key(session, tenant, admin=admin)
            if not session.scalar(
                select(CollectionIndex.id).where(CollectionIndex.tenant == tenant)
            ):
                session.add(CollectionIndex(tenant=tenant, collection="docs", version=1,
                                            kind="flat", num_vectors=1, dim=4))  # fmt: skip
                session.commit()
        return {"Authorization": f"Bearer {key}"}

    def post(self, path: str, body: Any, headers: dict[str, str]) -> Any:
        """POST ``body`` as ASCII JSON (lone surrogates travel as ``\\udXXX`` escapes, as a
        client in another language would send them)."""
        import json

        return self.client.post(
            path, content=json.dumps(body), headers={**headers, "Content-Type": "application/json"}
        )

    def count(self, table: Any) -> int:
        """Rows in ``table`` (a model class)."""
        with Session(self.engine) as session:
            return int(session.scalar(select(func.count()).select_from(table)) or 0)


@contextmanager
def make_api(url: str, data_dir: Path, **overrides: Any) -> Iterator[Api]:
    """An Api on ``url`` with settings ``overrides``; the app's lifespan runs around the yield."""
    from fastapi.testclient import TestClient

    from app.api import create_app

    settings = Settings(data_dir=data_dir, database_url=url, **overrides)
    engine = create_engine(url)
    api = Api(client=None, engine=engine, settings=settings)
    app = create_app(settings, api.dispatcher, sweeper=False)
    with TestClient(app) as client:
        api.client = client
        yield api
    engine.dispose()


@pytest.fixture
def api(tenancy_pg: str, tmp_path: Path) -> Iterator[Api]:
    """The API on this module's PostgreSQL database with default settings."""
    with make_api(tenancy_pg, tmp_path) as made:
        yield made
