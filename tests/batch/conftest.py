"""Batch test fixtures: a migrated PostgreSQL database with an ingested collection, Redis, and
live ``specrag worker`` subprocesses (real Celery, real broker, killable with SIGKILL)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DEMO_CORPUS, REPO_ROOT, claimed_redis_db, fresh_pg_database
from workers import process

COLLECTION = "demo"
CORPUS_FILES = ("assert.md", "assignment.md", "async.md", "atom-identifiers.md")


@pytest.fixture(scope="session")
def batch_env(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """SPECRAG_* environment for the test process and its workers (fast reaping and watchdog).

    A deployment of the batch tests' own (a fresh database, a Redis database number of their
    own): the session's in-process worker, where an earlier test started it, consumes the batch
    queue of the session's broker and would take these tests' chunks.
    """
    with fresh_pg_database(migrated=True) as database_url, claimed_redis_db() as broker_url:
        yield _env(database_url, broker_url, tiny_models, tmp_path_factory.mktemp("batch_data"))


def _env(
    database_url: str, broker_url: str, tiny_models: dict[str, Path], data_dir: Path
) -> dict[str, str]:
    return {
        "SPECRAG_DATA_DIR": str(data_dir),
        "SPECRAG_DATABASE_URL": database_url,
        "SPECRAG_BROKER_URL": broker_url,
        "SPECRAG_TARGET_MODEL": str(tiny_models["target"]),
        "SPECRAG_DRAFT_MODEL": str(tiny_models["draft"]),
        "SPECRAG_DEVICE": "cpu",
        "SPECRAG_HEARTBEAT_SECONDS": "0.5",
        "SPECRAG_STALE_AFTER_SECONDS": "3",
        "SPECRAG_SWEEP_INTERVAL_SECONDS": "0.5",
        "SPECRAG_OUTBOX_GRACE_SECONDS": "0.5",
        "SPECRAG_BATCH_STALE_AFTER_SECONDS": "4",
        "SPECRAG_BATCH_CHUNK_SIZE": "10",
        "SPECRAG_BATCH_MAX_ITEMS": "500",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture(scope="session")
def settings(batch_env: dict[str, str]) -> Any:
    """Settings built from ``batch_env`` (as the workers build theirs)."""
    from app.settings import Settings

    old = {k: os.environ.get(k) for k in batch_env}
    os.environ.update(batch_env)
    try:
        return Settings()
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def session_factory(settings: Any) -> Any:
    """A session factory on the migrated test database."""
    from app.db import prepare

    engine, factory = prepare(settings)
    yield factory
    engine.dispose()


@pytest.fixture(scope="session")
def ingested(settings: Any, session_factory: Any) -> str:
    """The name of a small collection ingested for tenant ``default`` (four demo files)."""
    from retrieval import Embedder, RetrievalService

    service = RetrievalService(
        session_factory, settings.index_dir, Embedder(settings.embedding_model, device="cpu")
    )
    report = service.ingest([DEMO_CORPUS / name for name in CORPUS_FILES], collection=COLLECTION)
    assert all(f["status"] == "added" for f in report.to_dict()["files"]), report.to_dict()
    return COLLECTION


@pytest.fixture(scope="session")
def celery_app(settings: Any) -> Any:
    """A Celery app on the test broker, for sending (the workers are subprocesses)."""
    from workers import create_celery

    return create_celery(settings)


class WorkerProcess(process.WorkerProcess):
    """A ``specrag worker`` subprocess on the batch tests' broker, started at once."""

    def __init__(self, env: dict[str, str], log_path: Path, queues: str = "answer,batch") -> None:
        loglevel = os.environ.get("SPECRAG_TEST_WORKER_LOGLEVEL", "WARNING")
        super().__init__(
            {**os.environ, **env}, log_path, queues=queues, loglevel=loglevel, cwd=REPO_ROOT
        )
        self.start()


@pytest.fixture(scope="session")
def start_worker(
    batch_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., WorkerProcess]]:
    """Starts worker subprocesses; every one still running is stopped at the end."""
    started: list[WorkerProcess] = []
    logs = tmp_path_factory.mktemp("worker_logs")

    def start(**overrides: str) -> WorkerProcess:
        env = {**batch_env, **overrides}
        worker = WorkerProcess(env, logs / f"worker{len(started)}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def wait_until(
    check: Callable[[], Any],
    timeout: float,
    what: str,
    poll: float = 0.2,
    explain: Callable[[], str] | None = None,
) -> Any:
    """``check()``'s first truthy value; fails the test saying ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(poll)


QUESTIONS = (
    "What exception does a failing assert raise?",
    "How does starred assignment collect the remaining items?",
    "How do I loop over an asynchronous iterator?",
    "Which characters may an identifier contain?",
)


def submit_questions(
    session_factory: Any,
    settings: Any,
    celery_app: Any,
    n: int,
    *,
    collection: str = COLLECTION,
    max_tokens: int = 2,
    dispatch: bool = True,
) -> Any:
    """Store and dispatch a JSONL-style batch of ``n`` questions; returns the batch id."""
    import json

    from app.batch import submit as sub
    from app.lifecycle.queries import get_or_create_tenant
    from workers import dispatch_batch as send

    lines = [json.dumps({"question": f"{QUESTIONS[i % len(QUESTIONS)]} (#{i})"}) for i in range(n)]
    with session_factory() as session:
        tenant = get_or_create_tenant(session, "default")
        specs = sub.parse_jsonl(
            lines, settings, tenant.id, collection=collection, overrides={"max_tokens": max_tokens}
        )
        batch = sub.create_batch(
            session, settings, tenant, specs, source="jsonl", source_detail={"items": n}
        )
    if dispatch:
        assert sub.dispatch_new(batch, lambda b, e, k: send(celery_app, b, e, k))
    return batch.id


def batch_row(session_factory: Any, batch_id: Any) -> Any:
    """The batch as stored now."""
    from app.batch.views import get_batch

    with session_factory() as session:
        return get_batch(session, batch_id, None)
