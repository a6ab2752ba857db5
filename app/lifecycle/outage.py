"""Telling a database outage from a query's own failure, and riding one out.

A query whose worker cannot reach the database did nothing wrong: it must neither be failed
(``internal_error``) nor lose its message. ``unreachable`` says whether an exception means the
database (or the connection to it) is away; ``with_database`` retries a unit of work with
exponential backoff while it is, for up to ``seconds``, then raises ``DatabaseUnavailable`` for
the caller to hand the query back (a Celery retry, a release, or the reaper once it returns).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import exc as sa_exc

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_AFTER_SECONDS = 5
"""What the API tells a client to wait (``Retry-After``) while the database is unreachable."""


class DatabaseUnavailable(Exception):
    """The database stayed unreachable for the whole retry window; nothing was written."""


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) means the database cannot be reached right now.

    Connection refused or reset, an administrator shutdown, a server closing the connection, a
    pool timeout: SQLAlchemy raises these as ``OperationalError`` / ``InterfaceError`` or marks
    the error ``connection_invalidated``. Integrity and data errors are the query's, not these.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DatabaseUnavailable):
            return True
        if isinstance(current, sa_exc.DBAPIError) and current.connection_invalidated:
            return True
        if isinstance(
            current, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)
        ):
            return True
        if isinstance(current, sa_exc.DisconnectionError):
            return True
        current = current.__cause__ or current.__context__
    return False


def backoff(retry: int, *, first: float = 0.5, cap: float = 10.0) -> float:
    """Seconds before retry number ``retry`` (0-based): doubling from ``first``, capped, jittered."""
    ceiling = min(cap, first * 2**retry)
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def with_database(
    work: Callable[[], T], *, seconds: float, what: str, sleep: Callable[[float], None] = time.sleep
) -> T:
    """``work()``'s result, retried with backoff while the database is unreachable.

    Raises ``DatabaseUnavailable`` (from the last error) when ``seconds`` pass without success;
    any other exception propagates at once.
    """
    deadline = time.monotonic() + seconds
    retry = 0
    while True:
        try:
            return work()
        except Exception as exc:
            if not unreachable(exc):
                raise
            wait = backoff(retry)
            if time.monotonic() + wait > deadline:
                raise DatabaseUnavailable(
                    f"{what}: database unreachable for {seconds:.0f} s"
                ) from exc
            if retry == 0:
                log.warning("%s: database unreachable, retrying: %s", what, _first_line(exc))
            retry += 1
            sleep(wait)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
