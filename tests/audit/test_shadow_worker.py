"""Shadow sampling on a live Celery worker (real Redis, real PostgreSQL, tiny model pair):
the answer task queues the baseline on the batch queue, the worker decodes it, the report sees it."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from app.audit import render_report
from app.audit.records import ShadowRun
from app.db.models import utcnow
from app.settings import Settings

pytestmark = pytest.mark.integration
CORPUS = Path(__file__).resolve().parents[2] / "demo" / "corpus"


@pytest.fixture(scope="module")
def settings(
    pg_url: str, redis_url: str, tiny_models: dict[str, Path], tmp_path_factory: Any
) -> Iterator[Settings]:
    """Settings on a PostgreSQL database of this module's own, every greedy answer sampled."""
    import psycopg

    from app.db.schema import upgrade

    name = f"specrag_shadow_{uuid.uuid4().hex[:8]}"
    raw = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(raw, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = pg_url.rsplit("/", 1)[0] + f"/{name}"
    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()
    yield Settings(
        data_dir=tmp_path_factory.mktemp("shadow_worker"), database_url=url, broker_url=redis_url,
        target_model=tiny_models["target"], draft_model=tiny_models["draft"], device="cpu",
        default_max_tokens=10, shadow_sample_rate=1.0,
    )  # fmt: skip
    with psycopg.connect(raw, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_live_worker_decodes_the_shadow_baseline(settings: Settings) -> None:
    from celery.contrib.testing.worker import start_worker

    from app.db import prepare
    from app.queries import create_query, get_or_create_tenant, validate_request, wait_for
    from app.resources import Resources
    from workers import create_celery, send_query

    engine, sf = prepare(settings)
    report = Resources(settings, sf).retrieval.ingest([CORPUS / "assert.md"], collection="docs")
    assert report.ok
    app = create_celery(settings)
    with start_worker(app, pool="solo", concurrency=1, perform_ping_check=False,
                      queues=["answer", "batch"], shutdown_timeout=30):  # fmt: skip
        with sf() as session:
            tenant = get_or_create_tenant(session, "default")
            request = validate_request(settings, {"question": "What does assert do?",
                                                  "collection": "docs"})  # fmt: skip
            query, _ = create_query(session, tenant, request)
        send_query(app, query.id, "answer")
        assert wait_for(sf, query.id, timeout=120).status == "succeeded"
        deadline = time.monotonic() + 120
        while True:
            with sf() as session:
                run = session.scalar(select(ShadowRun).where(ShadowRun.query_id == query.id))
            if run is not None and run.status in ("done", "failed") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert run is not None and run.status == "done", run and (run.status, run.error)
    assert run.mismatched_tokens == 0 and run.baseline_token_ids == run.speculative_token_ids
    now = utcnow()
    with sf() as session:
        body = render_report(session, since=now - timedelta(hours=1), until=now)[1]
    r = json.loads(body)
    assert r["requests"] == 1 and r["shadow"]["samples"] == 1
    assert r["shadow"]["exactness_violations"] == 0 and r["shadow"]["speedup"] > 0
    engine.dispose()
