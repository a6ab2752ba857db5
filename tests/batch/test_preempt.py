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
    from workers import chunk_signature, create_celery, send_query
    from workers.batch_tasks import answer_waiting

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


def test_an_announcement_preempts_long_before_the_next_poll(redis_url: str) -> None:
    """Real Redis pub/sub: send_query on 'answer' announces; the watcher checks at once."""
    import redis

    from app.settings import Settings
    from workers import create_celery, send_query
    from workers.batch_tasks import answer_waiting
    from workers.wakeup import listener

    app = create_celery(Settings(broker_url=redis_url))
    redis.Redis.from_url(redis_url).flushdb()
    wake = listener(redis_url)
    assert wake is not None and listener(redis_url) is wake  # one subscriber per process
    time.sleep(0.3)  # the subscriber thread is connected
    delays = []
    for i in range(5):
        timer = threading.Timer(
            0.2, send_query, args=(app, f"00000000-0000-0000-0000-00000000000{i}", "answer")
        )
        timer.start()
        started = time.monotonic()
        # A 10 s poll: only the announcement can make this fire within the block.
        with pytest.raises(Preempted), armed(lambda: answer_waiting(app), poll=10.0, wakeup=wake):
            busy(5.0)
        delays.append(time.monotonic() - started - 0.2)
        redis.Redis.from_url(redis_url).flushdb()
    assert max(delays) < 0.25, delays


def test_an_announcement_without_waiting_work_preempts_nothing(redis_url: str) -> None:
    """Announced, but the message was already taken (queue empty): the item keeps running."""
    from workers.wakeup import announce, listener

    wake = listener(redis_url)
    time.sleep(0.3)
    with armed(lambda: False, poll=10.0, wakeup=wake):
        threading.Timer(0.05, announce, args=(redis_url,)).start()
        assert busy(0.3) > 0
    started = time.monotonic()
    with armed(lambda: False, poll=10.0, wakeup=wake):
        pass
    assert time.monotonic() - started < 0.1, "the block's end must not wait for the poll"


def test_each_redis_database_has_its_own_announcement_channel() -> None:
    from workers.wakeup import channel

    assert channel("redis://127.0.0.1:6379/3") != channel("redis://127.0.0.1:6379/4")
    assert channel("redis://127.0.0.1:6379") == channel("redis://127.0.0.1:6379/0")
