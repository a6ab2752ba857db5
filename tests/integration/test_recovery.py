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
from tests.waiting import wait_until

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
    # Celery logs a task's result once its after-answer hooks ran, after the query became final.
    wait_until(lambda: _any_answer_log(second) >= 1, 30, "the second worker's task result")
    assert _any_answer_log(second) == 1


def _any_answer_log(worker: WorkerProcess) -> int:
    """How many times the second worker reported answering a query."""
    return worker.log.read_text().count("'outcome': 'succeeded'")


def test_a_redis_restart_that_loses_its_data_strands_no_query(
    private_deployment: Deployment,
    private_redis: RedisServer,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    from sqlalchemy import func, select

    from app.db import make_engine, make_session_factory, utcnow
    from workers.broker_epoch import MARKER

    keys, ingested = private_deployment.keys, private_deployment.collection
    # One tenant, more queries than its fair share: 8 go on the broker, 4 wait stored. The
    # re-send of a lost message (resend_after_seconds) stays at its default of 15 minutes.
    settings = private_deployment.settings.model_copy(
        update={"broker_url": private_redis.url(3), "tenant_max_in_flight": 8}
    )
    assert settings.resend_after_seconds >= 900
    broker = redis.Redis(port=private_redis.port, db=3)
    engine = make_engine(settings)
    sent = select(func.count()).select_from(Query).where(Query.enqueued_at.is_not(None))
    try:
        with ApiServer(settings) as api, SpecragClient(api.url, keys["acme"]) as client:
            deadline = time.monotonic() + 30
            while not broker.exists(MARKER):  # the API's sweeper has looked at the broker once
                assert time.monotonic() < deadline, "the sweeper never marked the broker"
                time.sleep(0.1)
            ids = [client.submit(f"What does assert do? ({i})", ingested, max_tokens=2)
                   for i in range(12)]  # fmt: skip
            with make_session_factory(engine)() as session:
                assert session.scalar(sent) == 8  # no worker: all 8 messages wait on the broker
            run_id = broker.info("server")["run_id"]
            private_redis.stop()  # SIGKILL, no persistence: it comes back empty
            private_redis.start()
            back, back_at = time.monotonic(), utcnow()
            # A new server without the old data. (Not dbsize() == 0: the API's sweeper may
            # already have marked the new broker and sent messages again by now.)
            assert broker.info("server")["run_id"] != run_id
            assert broker.info("persistence")["aof_enabled"] == 0
            # Sent again (8: the tenant's fair share; the other 4 still wait their turn).
            resent = sent.where(Query.enqueued_at >= back_at)
            while True:
                with make_session_factory(engine)() as session:
                    if session.scalar(resent) == 8:
                        break
                assert time.monotonic() - back < 60, "the lost messages were never sent again"
                time.sleep(0.2)
            resent_in = time.monotonic() - back
            # The worker starts only now (so that nothing could be answered before the loss);
            # its start-up on a loaded machine is not part of the recovery time.
            worker_process(settings, "after-restart").wait_ready()
            ready = time.monotonic()
            views = [client.wait(qid, timeout=150) for qid in ids]
            answered_in = time.monotonic() - ready
    finally:
        engine.dispose()
    assert [v["status"] for v in views] == ["succeeded"] * 12, views
    assert resent_in < 60, resent_in
    assert answered_in < 120, f"the last query was answered {answered_in:.0f} s after the worker"
    rows = stored_rows(settings, ids)
    assert all((answers, stats) == (1, 1) for _, answers, stats in rows.values()), rows
