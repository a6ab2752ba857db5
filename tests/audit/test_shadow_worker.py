"""Shadow sampling on a live Celery worker (real Redis, real PostgreSQL, tiny model pair):
the answer task queues the baseline on the batch queue, the worker decodes it, the report sees it."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.audit import render_report
from app.audit.records import ShadowRun
from app.db.models import utcnow
from app.settings import Settings
from testkit.services import RedisServer
from tests.conftest import fresh_pg_database
from tests.integration.helpers import WorkerProcess

pytestmark = pytest.mark.integration
CORPUS = Path(__file__).resolve().parents[2] / "demo" / "corpus"


@pytest.fixture(scope="module")
def settings(tiny_models: dict[str, Path], tmp_path_factory: Any) -> Iterator[Settings]:
    """A deployment of this module's own: a fresh PostgreSQL database and a private
    redis-server (the session's worker, alive here in some test orders, must not take this
    module's messages), every greedy answer sampled."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    with fresh_pg_database(migrated=True) as url:
        broker = RedisServer(tmp_path_factory.mktemp("shadow_redis"))
        broker.start()
        try:
            yield Settings(
                data_dir=tmp_path_factory.mktemp("shadow_worker"), database_url=url,
                broker_url=broker.url(0), target_model=tiny_models["target"],
                draft_model=tiny_models["draft"], device="cpu", default_max_tokens=10,
                shadow_sample_rate=1.0,
                dtype="float32",  # the bit-exact mode: in bf16 a near-tie may differ
            )  # fmt: skip
        finally:
            broker.stop()


def test_live_worker_decodes_the_shadow_baseline(settings: Settings, tmp_path: Path) -> None:
    from app.db import prepare
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request, wait_for
    from app.resources import Resources
    from workers import create_celery, send_query

    engine, sf = prepare(settings)
    report = Resources(settings, sf).retrieval.ingest([CORPUS / "assert.md"], collection="docs")
    assert report.ok
    app = create_celery(settings)
    # A worker subprocess, not an in-process one: stopping an in-process Celery worker sets
    # module-global stop flags that would stop the session's in-process worker too.
    worker = WorkerProcess(settings, tmp_path / "worker.log", "shadow", "answer,batch").start()
    try:
        worker.wait_ready()
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
    finally:
        worker.stop()
    assert run is not None and run.status == "done", run and (run.status, run.error)
    assert run.mismatched_tokens == 0 and run.baseline_token_ids == run.speculative_token_ids
    now = utcnow()
    with sf() as session:
        body = render_report(session, since=now - timedelta(hours=1), until=now)[1]
    r = json.loads(body)
    assert r["requests"] == 1 and r["shadow"]["samples"] == 1
    assert r["shadow"]["exactness_violations"] == 0 and r["shadow"]["speedup"] > 0
    engine.dispose()
