"""A database outage with queries in flight: nothing stranded, nothing failed, 503 meanwhile.

The database is a private PostgreSQL cluster of the test's own (tests/integration/pg_server.py),
stopped and started again while a live ``specrag worker`` answers and the API takes submissions;
the machine's shared cluster is never touched. The broker is a Redis database of the test's own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from app.client import RetryPolicy, SpecragClient
from app.settings import Settings
from tests.conftest import migrate
from tests.integration.conftest import Deployment, ingest_corpus, make_keys
from tests.integration.helpers import ApiServer, WorkerProcess, stored_rows
from tests.integration.pg_server import PostgresServer, available

pytestmark = pytest.mark.integration


@pytest.fixture
def private_pg() -> Iterator[PostgresServer]:
    """A started private PostgreSQL cluster, always stopped and deleted after the test."""
    if not available():
        pytest.skip("initdb / pg_ctl not installed: cannot stop a database of the test's own")
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture
def pg_deployment(
    private_pg: PostgresServer, service_settings: Settings, private_redis_db: str, tmp_path: Path
) -> Deployment:
    """The service's settings on the private cluster and a Redis database of this test."""
    url = private_pg.create_database("specrag")
    migrate(url)
    settings = service_settings.model_copy(
        update={
            "database_url": url,
            "broker_url": private_redis_db,
            "data_dir": tmp_path / "deployment",
            "max_tokens_limit": 400,
        }
    )
    return Deployment(settings, make_keys(settings), ingest_corpus(settings))


@pytest.mark.parametrize("down_seconds", [2.5, 10.0])
def test_a_database_outage_strands_no_query_and_the_api_answers_503_meanwhile(
    down_seconds: float,
    pg_deployment: Deployment,
    private_pg: PostgresServer,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    settings, keys, collection = (
        pg_deployment.settings,
        pg_deployment.keys,
        pg_deployment.collection,
    )
    worker = worker_process(settings, "answer")
    worker.wait_ready()
    patient = RetryPolicy(max_attempts=12, max_backoff=4.0)
    with ApiServer(settings) as api, SpecragClient(api.url, keys["acme"], retry=patient) as client:
        ids = [
            client.submit(f"What does assert do? ({n})", collection, max_tokens=300, method="none")
            for n in range(12)
        ]
        deadline = time.monotonic() + 60
        while not any(client.get(q)["status"] == "running" for q in ids):
            assert time.monotonic() < deadline, f"nothing ran: {worker.tail()}"
            time.sleep(0.05)
        private_pg.stop()  # fast shutdown: the worker's connections are cut mid-query
        down_at = time.monotonic()
        late: list[str] = []
        # A submission during the outage: the client retries the 503s until the database is back.
        submitter = threading.Thread(
            target=lambda: late.append(client.submit("What does pass do?", collection)),
            daemon=True,
        )
        submitter.start()
        raw = httpx.post(
            f"{api.url}/v1/queries",
            json={"question": "What does del do?", "collection": collection},
            headers={"Authorization": f"Bearer {keys['acme']}"},
            timeout=30,
        )
        read = httpx.get(
            f"{api.url}/v1/queries/{ids[0]}",
            headers={"Authorization": f"Bearer {keys['acme']}"},
            timeout=30,
        )
        # The outage itself: the database stays down for down_seconds, whatever the requests did.
        time.sleep(max(0.0, down_seconds - (time.monotonic() - down_at)))
        private_pg.start()
        back_at = time.monotonic()
        assert raw.status_code == 503, raw.text
        assert raw.headers.get("Retry-After") and raw.json()["error"]["field"] == "database"
        assert read.status_code == 503 and read.headers.get("Retry-After"), read.text
        submitter.join(timeout=120)
        assert late, "the submission made during the outage never went through"
        done = {q: client.wait(q, timeout=150) for q in [*ids, *late]}
        recovered_in = time.monotonic() - back_at
    failed = {q: d.get("error") for q, d in done.items() if d["status"] != "succeeded"}
    assert not failed, f"queries failed after a {down_seconds} s outage: {failed}"
    assert recovered_in < 120, f"last answer {recovered_in:.0f} s after the database came back"
    rows = stored_rows(settings, list(done))
    assert all((answers, stats) == (1, 1) for _, answers, stats in rows.values()), rows
    print(f"\ndatabase down {down_seconds} s: all {len(done)} answered {recovered_in:.1f} s after")


def test_a_message_taken_by_a_worker_that_died_before_claiming_is_sent_again_within_a_minute(
    pg_deployment: Deployment,
    private_pg: PostgresServer,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    import redis
    from sqlalchemy import update

    from app.db import Query, make_engine, make_session_factory, utcnow
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
    from workers import create_celery
    from workers.dispatcher import send_query

    # Sent again after unclaimed_resend_seconds, under a minute by default; the sweeper's rule is
    # the same at any age, so the test waits 5 s of it, not the default's 45.
    assert Settings.model_fields["unclaimed_resend_seconds"].default < 60
    settings = pg_deployment.settings.model_copy(update={"unclaimed_resend_seconds": 5.0})
    collection = pg_deployment.collection
    first = worker_process(settings, "first")
    first.wait_ready()
    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        asked = {"question": "What does assert do?", "collection": collection, "max_tokens": 4}
        req = validate_request(settings, asked)
        qid = create_query(session, get_or_create_tenant(session, "acme"), req)[0].id
        session.execute(update(Query).where(Query.id == qid).values(enqueued_at=utcnow(), sends=1))
        session.commit()
    engine.dispose()
    private_pg.stop()  # the worker takes the message and cannot claim the query
    send_query(create_celery(settings), qid)
    broker = redis.Redis.from_url(settings.resolved_broker_url)
    deadline = time.monotonic() + 30
    while broker.hlen("unacked") == 0:
        assert time.monotonic() < deadline, f"the worker never took the message: {first.tail()}"
        time.sleep(0.05)
    first.kill()  # dies holding the message, unacknowledged, the query still queued
    private_pg.start()
    back_at = time.monotonic()
    worker_process(settings, "second").wait_ready()
    engine = make_engine(settings)
    sf = make_session_factory(engine)
    status = None
    while status != "succeeded":
        assert time.monotonic() - back_at < 120, f"query still {status} after 120 s"
        time.sleep(0.5)
        with sf() as session:
            status = session.get(Query, qid).status  # type: ignore[union-attr]
    answered_in = time.monotonic() - back_at
    with sf() as session:
        query = session.get(Query, qid)
        assert query is not None and (query.sends, query.attempts) == (2, 1)
    engine.dispose()
    assert stored_rows(settings, [str(qid)])[str(qid)][1:] == (1, 1)
    print(f"\nconsumed, never claimed: answered {answered_in:.1f} s after the database returned")
