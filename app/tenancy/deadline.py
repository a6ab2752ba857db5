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


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise IngestTimeLimit in this block after ``seconds`` (main thread only; else no-op)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise IngestTimeLimit(f"took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
