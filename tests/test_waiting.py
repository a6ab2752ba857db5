"""The tests' waiting helpers: they return as soon as the state comes and fail, saying what they
waited for, when it does not."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from tests.waiting import settled, wait_until


def test_wait_until_returns_the_first_truthy_value_as_soon_as_it_comes() -> None:
    done = threading.Event()
    threading.Timer(0.05, done.set).start()
    started = time.monotonic()
    assert wait_until(lambda: done.is_set() and "yes", 5, "the timer") == "yes"
    assert time.monotonic() - started < 2


def test_wait_until_fails_naming_what_it_waited_for_and_the_state_seen() -> None:
    with pytest.raises(AssertionError, match=r"after 0\.1 s waiting for the moon: 41"):
        wait_until(lambda: False, 0.1, "the moon", explain=lambda: 41)


def test_settled_returns_the_value_once_it_stops_changing() -> None:
    values = iter([5, 4, 3])
    last = [3]

    def read() -> int:
        last[0] = next(values, last[0])
        return last[0]

    assert settled(read, quiet=0.1, timeout=5, message="the count", interval=0.01) == 3


def test_settled_fails_on_a_value_that_keeps_changing() -> None:
    counter = itertools.count()
    with pytest.raises(AssertionError, match="the counter still changing"):
        settled(lambda: next(counter), quiet=0.1, timeout=0.3, message="the counter", interval=0.01)
