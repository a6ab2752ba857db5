"""A time limit for ingest work that holds on the solo pool, where Celery's own does not.

Celery enforces ``task_time_limit`` only on the prefork pool (it kills the child). The solo pool
runs the task in the worker's main thread, where a ``SIGALRM`` timer can interrupt pure-Python
work such as PDF text extraction (a C call finishes first). On the threads pool neither works;
ingest workers run solo or prefork (docs/tenants.md).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class IngestTimeLimit(Exception):
    """Ingest work ran past its time limit."""


DRIVERS = ("sqlalchemy.", "psycopg.", "psycopg_pool.")
"""Modules inside which the limit never strikes: an exception raised in the middle of psycopg's
protocol code (a query sent, its answer not read) leaves the connection "busy", and the
session's rollback on the way out then fails with "another command is already in progress",
an OperationalError that hides the time limit. The limit strikes as soon as the call returns."""
RETRY_SECONDS = 0.005
"""How soon the limit strikes again after a database call put it off."""


def in_driver(frame: FrameType | None) -> bool:
    """Whether ``frame`` or any frame that called it runs code of a database driver (DRIVERS)."""
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(DRIVERS):
            return True
        frame = frame.f_back
    return False


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise IngestTimeLimit in this block after ``seconds`` (main thread only; else no-op);
    inside a database driver's call, as soon as that call returns."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum: int, frame: FrameType | None) -> None:
        if in_driver(frame):
            signal.setitimer(signal.ITIMER_REAL, RETRY_SECONDS)
            return
        raise IngestTimeLimit(f"took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
