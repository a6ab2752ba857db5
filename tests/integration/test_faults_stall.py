"""One attempt owns a query: a stalled worker that resumes can neither stream nor record.

Worker A is stopped (SIGSTOP) mid-answer past its lease; the reaper re-queues its query and
worker B answers it; then A resumes (SIGCONT) and finishes its own generation. The stored answer
must be B's alone, and the stream a client read must add up to it exactly (tokens after the last
``reset``), with nothing of A's interleaved. Also: revoking a key ends its open streams.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

from app.client import SpecragClient, StreamEvent
from app.db import Query
from tests.integration.conftest import Deployment
from tests.integration.helpers import ApiServer, RedisServer, WorkerProcess, stored_rows

pytestmark = pytest.mark.integration


def _streamed_text(events: list[StreamEvent]) -> str:
    text = ""
    for event in events:
        if event.event == "reset":
            text = ""
        elif event.event == "token":
            text += event.data["text"]
    return text


def _row(settings: object, query_id: str) -> Query:
    return stored_rows(settings, [query_id])[query_id][0]  # type: ignore[arg-type]


def test_a_resumed_stale_attempt_neither_streams_nor_records(
    private_deployment: Deployment,
    private_redis: RedisServer,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    keys, collection = private_deployment.keys, private_deployment.collection
    settings = private_deployment.settings.model_copy(
        update={"broker_url": private_redis.url(4), "max_tokens_limit": 1500}
    )
    stalled = worker_process(settings, "stalled")
    stalled.wait_ready()
    assert stalled.proc is not None
    with ApiServer(settings) as api, SpecragClient(api.url, keys["acme"]) as client:
        qid = client.submit("What does assert do?", collection, max_tokens=1500, method="none")
        events: list[StreamEvent] = []
        reader = threading.Thread(
            target=lambda: events.extend(client.stream(qid, timeout=240)), daemon=True
        )
        reader.start()
        deadline = time.monotonic() + 60
        while not any(e.event == "token" for e in events):
            assert time.monotonic() < deadline, f"no token streamed: {stalled.tail()}"
            time.sleep(0.02)
        os.killpg(stalled.proc.pid, signal.SIGSTOP)  # stalled past its lease, not dead
        try:
            second = worker_process(settings, "second")
            second.wait_ready()
            deadline = time.monotonic() + 60
            while _row(settings, qid).attempts < 2:  # the reaper re-queued it, B claimed it
                assert time.monotonic() < deadline, "the stalled worker's query was not re-run"
                time.sleep(0.1)
        finally:
            os.killpg(stalled.proc.pid, signal.SIGCONT)  # A resumes while B answers
        done = client.wait(qid, timeout=180)
        reader.join(timeout=60)
    assert done["status"] == "succeeded", done
    assert events and events[-1].event == "done", [e.event for e in events[-3:]]
    assert _streamed_text(events) == done["answer"], "the stream does not add up to the answer"
    query, answers, stats = stored_rows(settings, [qid])[qid]
    assert (answers, stats) == (1, 1)
    assert query.worker_host is not None and query.worker_host.startswith("second@")
    deadline = time.monotonic() + 60  # A's own generation ends too, and finds the query gone
    while "'outcome': " not in stalled.tail(1 << 20):
        assert time.monotonic() < deadline, stalled.tail()
        time.sleep(0.2)
    assert "'outcome': 'superseded'" in stalled.tail(1 << 20), stalled.tail()


def test_revoking_a_key_ends_its_open_streams(
    private_deployment: Deployment,
    private_redis: RedisServer,
    worker_process: Callable[..., WorkerProcess],
) -> None:
    from app.db import make_engine, make_session_factory
    from app.keys import create_key, revoke_key

    collection = private_deployment.collection
    # An open stream re-checks its key when an event passes (KEY_RECHECK_SECONDS apart); a
    # stream whose worker is silent passes one every keep-alive, here 0.5 s.
    settings = private_deployment.settings.model_copy(
        update={
            "broker_url": private_redis.url(5),
            "max_tokens_limit": 1500,
            "stream_keepalive_seconds": 0.5,
        }
    )
    engine = make_engine(settings)
    sf = make_session_factory(engine)
    with sf() as session:
        key = create_key(session, "acme")
    worker = worker_process(settings, "answer")
    worker.wait_ready()
    with ApiServer(settings) as api, SpecragClient(api.url, key) as client:
        qid = client.submit("What does assert do?", collection, max_tokens=1500, method="none")
        events: list[StreamEvent] = []
        reader = threading.Thread(
            target=lambda: events.extend(client.stream(qid, timeout=120)), daemon=True
        )
        reader.start()
        deadline = time.monotonic() + 60
        while not any(e.event == "token" for e in events):
            assert time.monotonic() < deadline, f"no token streamed: {worker.tail()}"
            time.sleep(0.02)
        # Held mid-answer, so that the answer cannot end the stream first: on a quiet machine
        # the tiny pair wrote all 1,500 tokens within the 2 s before the first re-check.
        assert worker.proc is not None
        os.killpg(worker.proc.pid, signal.SIGSTOP)
        try:
            assert _row(settings, qid).status == "running", "the answer ended before the hold"
            with sf() as session:
                assert revoke_key(session, key[:12]) == 1
            revoked_at = time.monotonic()
            reader.join(timeout=30)
            ended_in = time.monotonic() - revoked_at
        finally:
            os.killpg(worker.proc.pid, signal.SIGCONT)
    engine.dispose()
    assert not reader.is_alive(), "the stream went on after its key was revoked"
    assert events[-1].event == "error" and events[-1].data["status"] == "revoked", events[-1]
    assert ended_in < 10
