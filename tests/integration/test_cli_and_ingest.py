"""`specrag ask` through the queue, and the ingest task on a live ingest worker."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from app.settings import Settings
from tests.integration.helpers import WorkerProcess, settings_env
from workers.cli import main

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_ask_goes_through_the_queue_to_the_live_worker(
    service_settings: Settings, live_worker: Any, ingested: str
) -> None:
    env = {k: v for k, v in settings_env(service_settings).items() if k.startswith("SPECRAG_")}
    result = CliRunner().invoke(
        main,
        [
            "ask",
            "What does del do?",
            "-c",
            ingested,
            "--tenant",
            "acme",
            "--max-tokens",
            "2",
            "--json",
            "--timeout",
            "120",
        ],
        env=env,
    )
    assert result.exit_code == 0, result.output
    view = json.loads(result.output.strip().splitlines()[-1])
    assert view["status"] == "succeeded" and view["sources"]
    assert {"id", "answer", "stats"} <= set(view)


def test_ingest_task_runs_on_an_ingest_worker(
    service_settings: Settings, worker_process: Callable[..., WorkerProcess]
) -> None:
    from app.db import prepare
    from app.resources import Resources
    from workers.cli import celery_dispatcher

    source = str(ROOT / "demo" / "corpus" / "while.md")
    worker_process(service_settings, "ingester", queues="ingest").wait_ready()
    celery_dispatcher(service_settings).send_ingest([source], "ingested-by-task", "acme")
    engine, factory = prepare(service_settings)
    retrieval = Resources(service_settings, factory).retrieval
    deadline = time.monotonic() + 120
    while retrieval.index_version(collection="ingested-by-task", tenant="acme") is None:
        assert time.monotonic() < deadline, "the ingest task never indexed the file"
        time.sleep(0.2)
    hits = retrieval.search("while loop", collection="ingested-by-task", tenant="acme", top_k=1)
    engine.dispose()
    assert hits and hits[0].document == source
