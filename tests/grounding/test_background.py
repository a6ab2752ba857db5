"""The grounding thread: order, a full backlog waits, close grounds what is queued or cancels it,
and ``when_done`` runs its continuation once, after the last of its futures."""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future
from typing import Any

from app.grounding.background import GroundingBacklog
from app.hooks import when_done


def test_work_runs_in_order_on_one_thread_and_failures_stay_in_their_future() -> None:
    backlog = GroundingBacklog()
    ran: list[tuple[int, str]] = []

    def work(i: int) -> Any:
        ran.append((i, threading.current_thread().name))
        if i == 1:
            raise ValueError("bad answer")
        return i

    futures = [backlog.submit(functools.partial(work, i)) for i in range(4)]
    assert [f.exception(10) is None for f in futures] == [True, False, True, True]
    assert [i for i, _ in ran] == [0, 1, 2, 3]
    assert {name for _, name in ran} == {"specrag-grounding"}
    assert futures[3].result() == 3
    backlog.close()


def test_a_full_backlog_makes_the_submitter_wait() -> None:
    backlog = GroundingBacklog(maxsize=1)
    gate = threading.Event()
    first = backlog.submit(gate.wait)  # taken by the thread, held there
    while backlog.pending():
        time.sleep(0.01)
    backlog.submit(lambda: None)  # the one place
    waited = threading.Event()

    def third() -> None:
        backlog.submit(lambda: None)
        waited.set()

    threading.Thread(target=third, daemon=True).start()
    assert not waited.wait(0.3)  # no place: the submitter waits
    gate.set()
    assert waited.wait(10) and first.result(10) is True
    backlog.close()


def test_close_grounds_what_is_queued_within_its_timeout_and_cancels_the_rest() -> None:
    backlog = GroundingBacklog()
    quick = [backlog.submit(lambda: "done") for _ in range(3)]
    backlog.close(timeout=10)
    assert [f.result() for f in quick] == ["done"] * 3
    assert backlog.submit(lambda: "late").cancelled()

    slow = GroundingBacklog()
    gate = threading.Event()
    held = slow.submit(lambda: gate.wait(10))
    while slow.pending():
        time.sleep(0.01)
    queued = slow.submit(lambda: "never")
    ended: list[bool] = []
    when_done([queued], lambda: ended.append(queued.cancelled()))
    slow.close(timeout=0.2)
    assert queued.cancelled() and ended == [True]  # a cancelled grounding still ends its stream
    gate.set()
    assert held.result(10) is True


def test_when_done_runs_once_after_the_last_future() -> None:
    calls: list[str] = []
    when_done([], lambda: calls.append("at once"))
    assert calls == ["at once"]
    a, b = Future[Any](), Future[Any]()
    when_done([a, b], lambda: calls.append("after both"))
    a.set_result(1)
    assert calls == ["at once"]
    b.set_exception(RuntimeError("failed"))
    assert calls == ["at once", "after both"]
