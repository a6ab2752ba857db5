"""Preemption of a batch item's generation (no services: plain threads and Python work)."""

from __future__ import annotations

import threading
import time

import pytest

from app.batch.preempt import Preempted, armed


def busy(seconds: float) -> int:
    """Python-level work (the exception can only land between bytecodes, as between forwards)."""
    end, n = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        n += 1
    return n


def test_generation_is_preempted_soon_after_interactive_work_arrives() -> None:
    flag = threading.Event()
    threading.Timer(0.2, flag.set).start()
    started = time.monotonic()
    with pytest.raises(Preempted), armed(flag.is_set, poll=0.01):
        busy(5.0)
    assert time.monotonic() - started < 1.0


def test_finished_work_is_kept_and_nothing_fires_later() -> None:
    with armed(lambda: False, poll=0.01):
        assert busy(0.1) > 0
    # Waiting work that shows up after the block has ended must not hit this thread.
    flag = threading.Event()
    with armed(flag.is_set, poll=0.01):
        busy(0.05)
    flag.set()
    busy(0.2)


def test_an_exception_fired_at_the_very_end_is_withdrawn() -> None:
    # waiting() is true at once, but the block is too short to see it delivered: either it is
    # raised inside the block, or withdrawn; never later.
    outcomes = []
    for _ in range(30):
        try:
            with armed(lambda: True, poll=0.0005):
                busy(0.0005)
            outcomes.append("kept")
        except Preempted:
            outcomes.append("preempted")
        busy(0.01)
    assert set(outcomes) <= {"kept", "preempted"}


def test_answer_waiting_sees_interactive_messages_on_real_redis(redis_url: str) -> None:
    import redis

    from app.settings import Settings
    from workers import create_celery, send_query
    from workers.batch_tasks import answer_waiting, chunk_signature

    app = create_celery(Settings(broker_url=redis_url))
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    chunk_signature(app, "00000000-0000-0000-0000-000000000000", 0).apply_async()
    send_query(app, "00000000-0000-0000-0000-000000000001", "batch")
    assert not answer_waiting(app), "batch work must not count as interactive"
    send_query(app, "00000000-0000-0000-0000-000000000002", "answer")
    assert answer_waiting(app)
    client.flushdb()
    assert not answer_waiting(app)
