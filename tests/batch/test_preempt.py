"""Cooperative preemption: a full worker cancels its newest batch request for waiting interactive work.

Unit tests drive ``Preemptor`` with task threads and fake request handles; the Redis tests use the
real announcement channel. Nothing is thrown into any thread: a preempted request is cancelled
through its handle, and the task that owns it sees that at the request's end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from app.batch.preempt import Preemptor
from tests.waiting import wait_until


class FakeHandle:
    """A request in flight: records cancel(), never finishes by itself."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.finished = False

    def cancel(self) -> None:
        self.cancelled.set()

    @property
    def done(self) -> bool:
        return self.finished


@contextmanager
def tasks(preemptor: Preemptor, kinds: list[str]) -> Iterator[list[FakeHandle | None]]:
    """One thread per kind holding a task slot ("batch" threads also submit a request)."""
    handles: list[FakeHandle | None] = [None] * len(kinds)
    entered = threading.Barrier(len(kinds) + 1)
    leave = threading.Event()

    def run(i: int, kind: str, ready: threading.Event) -> None:
        preemptor.enter(preemptible=kind == "batch")
        if kind == "batch":
            handles[i] = FakeHandle()
            preemptor.track(handles[i])
        ready.set()
        entered.wait()
        leave.wait(10)
        preemptor.exit()

    threads = []
    for i, kind in enumerate(kinds):
        # One at a time (each has entered before the next starts): the last one is the newest.
        ready = threading.Event()
        t = threading.Thread(target=run, args=(i, kind, ready))
        t.start()
        assert ready.wait(5), f"task {i} ({kind}) did not enter"
        threads.append(t)
    entered.wait(10)
    try:
        yield handles
    finally:
        leave.set()
        for t in threads:
            t.join(10)


def cancelled(handles: list[FakeHandle | None]) -> list[bool]:
    return [h is not None and h.cancelled.is_set() for h in handles]


def test_a_full_worker_cancels_its_newest_batch_request_for_waiting_interactive_work() -> None:
    waiting = threading.Event()
    preemptor = Preemptor(3, waiting.is_set)
    with tasks(preemptor, ["batch", "batch", "answer"]) as handles:
        assert preemptor.full()
        assert not preemptor.check(), "nothing waits: nothing is cancelled"
        waiting.set()
        assert preemptor.should_yield()
        assert preemptor.check()
        assert cancelled(handles) == [False, True, False]
        # The cancelled task is on its way out: its place counts as free, nothing more goes.
        assert not preemptor.full() and not preemptor.check()
        assert cancelled(handles) == [False, True, False]
    assert preemptor.preemptions == 1


def test_a_worker_with_a_free_slot_or_no_batch_request_preempts_nothing() -> None:
    preemptor = Preemptor(3, lambda: True)
    with tasks(preemptor, ["batch", "answer"]) as handles:
        assert not preemptor.full() and not preemptor.should_yield()
        assert not preemptor.check() and cancelled(handles) == [False, False]
    with tasks(preemptor, ["answer", "answer", "answer"]):
        assert preemptor.full() and not preemptor.check()


def test_a_finished_batch_request_is_not_cancelled() -> None:
    preemptor = Preemptor(2, lambda: True)
    with tasks(preemptor, ["batch", "batch"]) as handles:
        for h in handles:
            assert h is not None
            h.finished = True
        assert not preemptor.check() and cancelled(handles) == [False, False]


def test_a_task_whose_cancel_came_too_late_still_yields_between_items() -> None:
    # The request ended on the step the cancel was waiting for: the task answered its item and
    # is between items, its slot marked preempted (so full() counts it as free). It must leave
    # rather than claim the next item while the interactive query waits for its slot.
    waiting = threading.Event()
    preemptor = Preemptor(1, waiting.is_set)
    seen: dict[str, bool] = {}
    tracked = threading.Event()
    go_on = threading.Event()

    def batch_task() -> None:
        preemptor.enter(preemptible=True)
        handle = FakeHandle()
        preemptor.track(handle)
        tracked.set()
        go_on.wait(10)
        handle.finished = True  # it ended anyway: the cancel came after its last step
        seen["own"] = preemptor.should_yield()
        waiting.clear()  # another worker took the interactive query
        seen["nothing_waits"] = preemptor.should_yield()
        preemptor.exit()

    thread = threading.Thread(target=batch_task)
    thread.start()
    assert tracked.wait(5)
    waiting.set()
    assert preemptor.check()
    assert not preemptor.full()
    go_on.set()
    thread.join(10)
    assert seen == {"own": True, "nothing_waits": False}


def test_the_watcher_cancels_within_a_poll_of_work_arriving() -> None:
    waiting = threading.Event()
    asked: list[bool] = []

    def ask() -> bool:
        asked.append(waiting.is_set())
        return asked[-1]

    preemptor = Preemptor(1, ask, poll=0.01).start()
    try:
        with tasks(preemptor, ["batch"]) as handles:
            # Polls that find nothing waiting cancel nothing.
            wait_until(lambda: len(asked) >= 5, 5, "five polls of a full worker")
            assert cancelled(handles) == [False]
            waiting.set()
            assert handles[0] is not None and handles[0].cancelled.wait(2.0)
    finally:
        preemptor.stop()


def subscribed(wake: Any, url: str) -> None:
    """Return once ``wake``'s subscriber thread receives announcements on ``url``'s channel."""
    from workers.wakeup import announce

    heard = threading.Event()
    wake.register(heard)
    try:

        def hears() -> bool:
            announce(url)
            return heard.wait(0.05)

        wait_until(hears, 10, "the wake-up subscriber to hear an announcement")
    finally:
        wake.unregister(heard)


def test_an_announcement_preempts_long_before_the_next_poll(private_redis_db: str) -> None:
    """Real Redis pub/sub: send_query on 'answer' announces; the watcher checks at once."""
    import redis

    from app.settings import Settings
    from workers import create_celery, send_query
    from workers.batch_tasks import answer_waiting
    from workers.wakeup import listener

    app = create_celery(Settings(broker_url=private_redis_db))
    redis.Redis.from_url(private_redis_db).flushdb()
    wake = listener(private_redis_db)
    assert wake is not None and listener(private_redis_db) is wake  # one subscriber per process
    subscribed(wake, private_redis_db)
    # A 10 s poll: only the announcement can make this cancel within the test.
    preemptor = Preemptor(1, lambda: answer_waiting(app), poll=10.0, wakeup=wake).start()
    delays = []
    try:
        for i in range(5):
            with tasks(preemptor, ["batch"]) as handles:
                handle = handles[0]
                assert handle is not None
                sent = time.monotonic()
                send_query(app, f"00000000-0000-0000-0000-00000000000{i}", "answer")
                assert handle.cancelled.wait(5.0), "the announcement did not preempt"
                delays.append(time.monotonic() - sent)
            redis.Redis.from_url(private_redis_db).flushdb()
    finally:
        preemptor.stop()
    # Well under the 10 s poll: only the announcement can have preempted. How fast interactive
    # work gets a batch worker's slot is benchmarks/batch.py's figure, not a bound here (a
    # loaded host delays a thread by more than any tight bound would allow).
    assert max(delays) < 2.0, delays


def test_an_announcement_without_waiting_work_preempts_nothing(private_redis_db: str) -> None:
    """Announced, but the message was already taken (queue empty): the item keeps running."""
    from workers.wakeup import announce, listener

    wake = listener(private_redis_db)
    assert wake is not None
    subscribed(wake, private_redis_db)
    checks: list[float] = []

    def waiting() -> bool:
        checks.append(time.monotonic())
        return False

    # A 10 s poll, and the task enters before the watcher starts: the watcher's first look (at
    # the signal its entry left) is its only one until something announces.
    preemptor = Preemptor(1, waiting, poll=10.0, wakeup=wake)
    try:
        with tasks(preemptor, ["batch"]) as handles:
            preemptor.start()
            wait_until(lambda: checks, 5, "the watcher's look at the task's start")
            checks.clear()
            announce(private_redis_db)
            wait_until(lambda: checks, 5, "the watcher's look after the announcement")
            assert cancelled(handles) == [False]
    finally:
        preemptor.stop()


def test_answer_waiting_sees_interactive_messages_on_real_redis(private_redis_db: str) -> None:
    import redis

    from app.settings import Settings
    from workers import chunk_signature, create_celery, send_query
    from workers.batch_tasks import answer_waiting

    app = create_celery(Settings(broker_url=private_redis_db))
    client = redis.Redis.from_url(private_redis_db)
    client.flushdb()
    chunk_signature(app, "00000000-0000-0000-0000-000000000000", 0).apply_async()
    send_query(app, "00000000-0000-0000-0000-000000000001", "batch")
    assert not answer_waiting(app), "batch work must not count as interactive"
    send_query(app, "00000000-0000-0000-0000-000000000002", "answer")
    assert answer_waiting(app)
    client.flushdb()
    assert not answer_waiting(app)


def test_each_redis_database_has_its_own_announcement_channel() -> None:
    from workers.wakeup import channel

    assert channel("redis://127.0.0.1:6379/3") != channel("redis://127.0.0.1:6379/4")
    assert channel("redis://127.0.0.1:6379") == channel("redis://127.0.0.1:6379/0")
