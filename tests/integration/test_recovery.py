"""Nothing lost, nothing twice: a broker down at submit time, a worker killed mid-answer.

Both tests use a private redis-server of their own, so that stopping it (or the worker on it)
cannot disturb the session's shared worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

from app.client import SpecragClient
from app.db import Query
from app.settings import Settings
from tests.integration.conftest import Deployment
from tests.integration.helpers import ApiServer, RedisServer, WorkerProcess, stored_rows

pytestmark = pytest.mark.integration


def _row(settings: Settings, query_id: str) -> tuple[Query, int, int]:
    return stored_rows(settings, [query_id])[query_id]


def test_broker_down_at_submit_gives_202_and_the_query_is_answered_later(
    private_deployment: Deployment,
    private_redis: RedisServer,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    keys, ingested = private_deployment.keys, private_deployment.collection
    settings = private_deployment.settings.model_copy(update={"broker_url": private_redis.url(1)})
    with ApiServer(settings) as api, SpecragClient(api.url, keys["acme"]) as client:
        private_redis.stop()
        started = time.monotonic()
        query_id = client.submit("What does assert do?", ingested, max_tokens=2)
        assert time.monotonic() - started < 10, "submit must not hang on a dead broker"
        stored, _, _ = _row(settings, query_id)
        assert stored.status == "queued" and stored.attempts == 0
        private_redis.start()  # same port: the API's sweeper finds the broker again
        broker = redis.Redis(port=private_redis.port, db=1)
        deadline = time.monotonic() + 30
        # No worker yet: a message on the queue can only have come from the sweeper.
        while broker.llen("answer") == 0:
            assert time.monotonic() < deadline, "the sweeper never enqueued the stored query"
            time.sleep(0.2)
        worker_process(settings, "late").wait_ready()
        done = client.wait(query_id, timeout=120)
    assert done["status"] == "succeeded", done
    query, answers, stats = _row(settings, query_id)
    assert (answers, stats, query.attempts) == (1, 1, 1)


def test_worker_killed_mid_answer_is_requeued_and_completes_once(
    private_deployment: Deployment,
    private_redis: RedisServer,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    keys, ingested = private_deployment.keys, private_deployment.collection
    # A long answer (the tiny pair decodes hundreds of tokens a second): still running when the
    # kill lands, however slowly a loaded machine polls.
    settings = private_deployment.settings.model_copy(
        update={"broker_url": private_redis.url(2), "max_tokens_limit": 1500}
    )
    first = worker_process(settings, "first")
    first.wait_ready()
    with ApiServer(settings) as api, SpecragClient(api.url, keys["acme"]) as client:
        query_id = client.submit("What does assert do?", ingested, max_tokens=1500, method="none")
        deadline = time.monotonic() + 60
        while client.get(query_id)["status"] != "running":
            assert time.monotonic() < deadline, "the worker never started the query"
            time.sleep(0.02)
        first.kill()  # SIGKILL: no chance to clean up, the message stays unacknowledged
        killed_at = time.monotonic()
        assert client.get(query_id)["status"] == "running"
        second = worker_process(settings, "second")
        second.wait_ready()
        done = client.wait(query_id, timeout=120)
        recovered_in = time.monotonic() - killed_at
    assert done["status"] == "succeeded", done
    assert recovered_in < 120, f"re-queued and answered {recovered_in:.0f} s after the kill"
    query, answers, stats = _row(settings, query_id)
    assert (answers, stats) == (1, 1)
    assert query.attempts == 2 and query.worker_host and query.worker_host.startswith("second@")
    assert _any_answer_log(second) == 1


def _any_answer_log(worker: WorkerProcess) -> int:
    """How many times the second worker reported answering a query."""
    return worker.log.read_text().count("'outcome': 'succeeded'")
