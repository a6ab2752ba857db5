"""Fixtures for the service's integration tests: settings on real PostgreSQL and Redis, an ingested
collection, a live Celery worker (in-process or as a ``specrag worker`` subprocess), the API served
by uvicorn on a loopback port, and private ``redis-server`` processes that tests may stop.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings
from tests.conftest import fresh_pg_database
from tests.integration.helpers import ApiServer, RedisServer, WorkerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS_FILES = ["assert.md", "pass.md", "del.md"]
COLLECTION = "docs"


@pytest.fixture(scope="session")
def service_pg_url() -> Iterator[str]:
    """A migrated PostgreSQL database of the session's live services alone.

    Their sweepers (stale after 4 s) re-queue any running query without a fresh heartbeat and
    send any unsent one in the database they watch, so no other test's queries may live there:
    a test that answers in-process on ``migrated_pg_url`` with the default heartbeat (every 5 s)
    would otherwise see its query handed to a newer attempt whenever the session's API had
    started before it on the same xdist worker.
    """
    with fresh_pg_database(migrated=True) as url:
        yield url


@pytest.fixture(scope="session")
def service_settings(
    service_pg_url: str, redis_url: str, tiny_models: dict[str, Path], tmp_path_factory: Any
) -> Settings:
    """Settings on the live services' own PostgreSQL database and the session's Redis, with the
    tiny pair and fast recovery."""
    return Settings(
        data_dir=tmp_path_factory.mktemp("service_data"),
        database_url=service_pg_url,
        broker_url=redis_url,
        target_model=tiny_models["target"],
        draft_model=tiny_models["draft"],
        device="cpu",
        default_max_tokens=8,
        grounding=True,  # the live service grounds every answer (tests/integration/test_grounding_live.py)
        heartbeat_seconds=0.5,
        stale_after_seconds=4.0,
        sweep_interval_seconds=0.5,
        outbox_grace_seconds=0.5,
        # Bursts of concurrent submissions are what these tests are about; the per-tenant rate
        # limit has its own tests (tests/tenancy/test_limits.py).
        tenant_submissions_per_second=0,
    )


def make_keys(settings: Settings) -> dict[str, str]:
    """API keys: tenant ``acme`` (owns the collection), tenant ``globex``, and an admin of acme."""
    from app.db import make_engine, make_session_factory
    from app.keys import create_key

    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        made = {
            "acme": create_key(session, "acme"),
            "globex": create_key(session, "globex"),
            "admin": create_key(session, "acme", admin=True),
        }
    engine.dispose()
    return made


def ingest_corpus(settings: Settings) -> str:
    """Ingest three demo corpus files as tenant ``acme``'s collection ``docs``; return its name."""
    from app.db import prepare
    from app.resources import Resources

    engine, session_factory = prepare(settings)
    corpus = REPO_ROOT / "demo" / "corpus"
    report = Resources(settings, session_factory).retrieval.ingest(
        [corpus / name for name in CORPUS_FILES], collection=COLLECTION, tenant="acme"
    )
    engine.dispose()
    assert report.ok, report.to_dict()
    return COLLECTION


@pytest.fixture(scope="session")
def keys(service_settings: Settings) -> dict[str, str]:
    """API keys of the session's deployment (``make_keys``)."""
    return make_keys(service_settings)


@pytest.fixture(scope="session")
def ingested(service_settings: Settings) -> str:
    """The collection ``docs`` of tenant ``acme``, ingested from three demo corpus files."""
    return ingest_corpus(service_settings)


@dataclass
class Deployment:
    """A deployment of a test's own: settings on a fresh database, its keys and collection."""

    settings: Settings
    keys: dict[str, str]
    collection: str


@pytest.fixture
def private_deployment(
    service_settings: Settings, private_redis_db: str, tmp_path: Path
) -> Iterator[Deployment]:
    """``service_settings`` on a fresh migrated PostgreSQL database, a Redis database (broker and
    streams) and a data dir of this test's own.

    For tests that run their own workers. One database and one broker are one deployment: on the
    session's database, the sweepers of the session's API and worker (alive once an earlier test
    started them) would re-queue this test's stale queries; on the session's broker, the
    session's in-process worker would take this test's tasks, find no such query in its own
    database and drop them, leaving them queued here for ever. Whether either happens depends on
    test order, so neither is shared.
    """
    with fresh_pg_database(migrated=True) as url:
        settings = service_settings.model_copy(
            update={
                "database_url": url,
                "broker_url": private_redis_db,
                "data_dir": tmp_path / "deployment",
            }
        )
        yield Deployment(settings, make_keys(settings), ingest_corpus(settings))


@pytest.fixture(scope="session")
def live_worker(service_settings: Settings, ingested: str) -> Iterator[Any]:
    """A live Celery worker (solo pool, in this process) consuming answer and batch on Redis."""
    from celery.contrib.testing.worker import start_worker

    from workers import create_celery

    app = create_celery(service_settings)
    with start_worker(
        app,
        pool="solo",
        concurrency=1,
        perform_ping_check=False,
        queues=["answer", "batch"],
        shutdown_timeout=30,
    ) as worker:
        yield worker


@pytest.fixture(scope="session")
def api(service_settings: Settings) -> Iterator[ApiServer]:
    """The API for ``service_settings``, served over HTTP for the whole session."""
    with ApiServer(service_settings) as server:
        yield server


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A started private Redis (skips when redis-server is not installed)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed: cannot stop and restart a broker in this test")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def worker_process(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Factory of started ``specrag worker`` subprocesses; all are stopped after the test.

    Subprocesses, not a second in-process worker: Celery keeps its stop flags in module globals,
    so stopping one in-process worker would stop the session's ``live_worker`` too.
    """
    started: list[WorkerProcess] = []

    def make(settings: Settings, name: str, queues: str = "answer") -> WorkerProcess:
        worker = WorkerProcess(settings, tmp_path / f"{name}.log", name, queues).start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()
