"""Waiting in tests for something to happen: a poll with a deadline, never a fixed sleep.

A fixed sleep is either too short on a loaded host (the test fails by chance) or too long on a
quiet one (every run pays it). ``wait_until`` returns as soon as its predicate holds and fails
the test, naming what it waited for, only when the deadline passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    message: str,
    interval: float = 0.02,
    explain: Callable[[], object] | None = None,
) -> T:
    """``predicate()``'s first truthy value; AssertionError naming ``message`` after ``timeout`` s.

    ``explain`` (optional) is called on failure and its value appended, to show the state that
    did not come (say, the last value seen or a worker's log tail).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = f": {explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {message}{detail}")
        time.sleep(interval)


def settled(
    read: Callable[[], T], quiet: float, timeout: float, message: str, interval: float = 0.05
) -> T:
    """``read()``'s value once it has not changed for ``quiet`` s; AssertionError after ``timeout``.

    For a quantity that drifts to a steady state on its own clock (threads that notice a stop
    flag at their next poll): ``quiet`` is one such poll period, so a value unchanged that long
    is the steady one.
    """
    deadline = time.monotonic() + timeout
    value = read()
    since = time.monotonic()
    while True:
        time.sleep(interval)
        now = time.monotonic()
        current = read()
        if current != value:
            value, since = current, now
        elif now - since >= quiet:
            return value
        if now >= deadline:
            raise AssertionError(
                f"{message} still changing after {timeout:g} s (last value {value!r})"
            )
