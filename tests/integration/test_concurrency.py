"""One worker process, many queries in flight on its engine loop (threads pool), real Redis and PostgreSQL.

The tests that answer queries start their own ``specrag worker`` subprocesses on a private
redis-server, so killing one cannot disturb the session's shared worker. The last one starts a
worker on the session's settings that must refuse to start: it never consumes a message.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.client import SpecragClient
from app.settings import Settings
from tests.integration.conftest import Deployment
from tests.integration.helpers import (
    ApiServer,
    RedisServer,
    WorkerProcess,
    settings_env,
    stored_rows,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def _rows(settings: Settings, ids: list[str]) -> dict[str, tuple[str, str | None, int, int, int]]:
    """Per query: (status, worker_host, attempts, answers stored, stats stored)."""
    return {
        query_id: (query.status, query.worker_host, query.attempts, answers, stats)
        for query_id, (query, answers, stats) in stored_rows(settings, ids).items()
    }


def _private(deployment: Deployment, redis: RedisServer, **update: object) -> Settings:
    """The test's own deployment on the private Redis, with the threads pool and ``update``."""
    return deployment.settings.model_copy(
        update={"broker_url": redis.url(1), "worker_pool": "threads", **update}
    )


def test_sigkill_of_a_worker_holding_eight_queries_leaves_each_answered_once_by_another(
    private_deployment: Deployment,
    private_redis: RedisServer,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    keys, ingested = private_deployment.keys, private_deployment.collection
    # Long answers (the tiny pair decodes hundreds of tokens a second): all 8 must still be
    # running when the last is claimed, however slowly a loaded machine claims them. With 200
    # tokens the first answers finished before the eighth was claimed in a CI run.
    settings = _private(
        private_deployment, private_redis, worker_concurrency=8, max_tokens_limit=1500
    )
    first = worker_process(settings, "first")
    first.wait_ready()
    with ApiServer(settings) as api, SpecragClient(api.url, keys["acme"]) as client:
        ids = [
            client.submit(f"What does assert do? ({i})", ingested, max_tokens=1500, method="none")
            for i in range(8)
        ]
        deadline = time.monotonic() + 60
        while True:
            rows = _rows(settings, ids)
            held = [
                r for r in rows.values() if r[0] == "running" and r[1] and r[1].startswith("first@")
            ]
            if len(held) == 8:
                break
            assert time.monotonic() < deadline, f"the worker never held all 8 at once: {rows}"
            time.sleep(0.02)
        first.kill()  # SIGKILL: 8 unacknowledged messages, 8 running queries, no clean-up
        second = worker_process(settings, "second")
        second.wait_ready()
        done = [client.wait(query_id, timeout=180) for query_id in ids]
    assert [d["status"] for d in done] == ["succeeded"] * 8, done
    rows = _rows(settings, ids)
    for query_id, (status, host, attempts, answers, stats) in rows.items():
        assert (status, answers, stats) == ("succeeded", 1, 1), query_id
        assert host is not None and host.startswith("second@") and attempts == 2, rows[query_id]
    # Celery logs a task's result once its after-answer hooks ran, after the query became final:
    # on a loaded machine, grounding 8 answers of 1500 tokens takes tens of seconds.
    logged = lambda: second.log.read_text().count("'outcome': 'succeeded'")  # noqa: E731
    wait_until(lambda: logged() >= 8, 120, "the second worker's 8 task results", explain=logged)
    assert logged() == 8


def test_a_burst_is_answered_once_each_with_greedy_answers_identical_to_one_at_a_time(
    private_deployment: Deployment,
    private_redis: RedisServer,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    keys, ingested = private_deployment.keys, private_deployment.collection
    settings = _private(private_deployment, private_redis, worker_concurrency=4)
    worker = worker_process(settings, "burst")
    worker.wait_ready()
    questions = [f"What does {w} do?" for w in ("assert", "pass", "del")] * 4
    with ApiServer(settings) as api, SpecragClient(api.url, keys["acme"]) as client:
        alone = {}
        for q in dict.fromkeys(questions):
            alone[q] = client.wait(client.submit(q, ingested, max_tokens=24), timeout=120)["answer"]
        ids = [client.submit(q, ingested, max_tokens=24) for q in questions]
        done = [client.wait(query_id, timeout=180) for query_id in ids]
    assert [d["status"] for d in done] == ["succeeded"] * len(ids)
    assert [d["answer"] for d in done] == [alone[q] for q in questions]
    rows = _rows(settings, ids)
    assert all(r[3:] == (1, 1) for r in rows.values()), rows
    assert all(d["stats"]["mean_batch_size"] >= 1.0 for d in done)


def test_a_worker_refuses_a_concurrency_its_engine_cannot_hold(service_settings: Settings) -> None:
    env = settings_env(service_settings.model_copy(update={"worker_pool": "threads"}))
    env["SPECRAG_WORKER_CONCURRENCY"] = str(10**9)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "specrag"), "worker", "-Q", "answer"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode != 0
    assert "error: SPECRAG_WORKER_CONCURRENCY:" in proc.stderr + proc.stdout, proc.stderr[-2000:]
