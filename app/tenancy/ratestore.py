"""Rate windows in the service's database: the ``limits`` storage of the embedded default.

It exists because the ``limits`` library has no SQL storage, and its in-memory one is private to
one process: two API processes on one database (SQLite or PostgreSQL, no Redis broker) would each
allow the full rate. Here every process counts in one table, ``rate_windows``, with one atomic
UPSERT per hit, so they share the window. Only the fixed-window strategy is supported (the one
``Enforcer`` uses).

Windows are timed by the API process's wall clock (``time.time()``): the embedded default runs on
one host, so its processes share a clock; across hosts keep clocks in sync (NTP).
"""

from __future__ import annotations

import time

from limits.storage import Storage
from sqlalchemy import Engine, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

SWEEP_SECONDS = 60.0
"""How often one storage deletes windows that have expired (rows are few: tenants x limits)."""

# One statement, atomic on both databases (PostgreSQL locks the conflicting row; SQLite holds the
# database's write lock): an expired window restarts at ``amount``, a live one adds ``amount``.
# SET expressions read the row as it was before the update, in both dialects.
_HIT = text(
    """
    INSERT INTO rate_windows (name, hits, expires_at) VALUES (:name, :amount, :expires)
    ON CONFLICT (name) DO UPDATE SET
        hits = CASE WHEN rate_windows.expires_at <= :now THEN :amount
                    ELSE rate_windows.hits + :amount END,
        expires_at = CASE WHEN rate_windows.expires_at <= :now THEN :expires
                          ELSE rate_windows.expires_at END
    RETURNING hits
    """
)
_LIVE = text("SELECT hits, expires_at FROM rate_windows WHERE name = :name AND expires_at > :now")


class DatabaseStorage(Storage):
    """A ``limits`` storage whose counters are rows of ``rate_windows`` in ``engine``'s database."""

    STORAGE_SCHEME = None  # built from an Engine, not from a storage URI

    def __init__(self, engine: Engine, *, wrap_exceptions: bool = False) -> None:
        super().__init__(wrap_exceptions=wrap_exceptions)
        self.engine = engine
        self._swept = 0.0

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return SQLAlchemyError

    def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        """The window's count after adding ``amount`` (a new window lasts ``expiry`` seconds)."""
        now = time.time()
        with self.engine.begin() as conn:
            _relaxed_commit(conn)
            hits = conn.execute(
                _HIT, {"name": key, "amount": amount, "expires": now + expiry, "now": now}
            ).scalar_one()
            if now - self._swept > SWEEP_SECONDS:
                self._swept = now
                conn.execute(
                    text("DELETE FROM rate_windows WHERE expires_at <= :now"), {"now": now}
                )
        return int(hits)

    def get(self, key: str) -> int:
        """The live window's count (0 when there is none)."""
        with self.engine.connect() as conn:
            row = conn.execute(_LIVE, {"name": key, "now": time.time()}).first()
        return int(row[0]) if row is not None else 0

    def get_expiry(self, key: str) -> float:
        """When the live window ends (epoch seconds); now when there is none."""
        now = time.time()
        with self.engine.connect() as conn:
            row = conn.execute(_LIVE, {"name": key, "now": now}).first()
        return float(row[1]) if row is not None else now

    def check(self) -> bool:
        """Whether the database answers."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except SQLAlchemyError:
            return False
        return True

    def reset(self) -> int | None:
        """Forget every window; the number of windows forgotten."""
        with self.engine.begin() as conn:
            return int(conn.execute(text("DELETE FROM rate_windows")).rowcount)

    def clear(self, key: str) -> None:
        """Forget one window."""
        with self.engine.begin() as conn:
            conn.execute(text("DELETE FROM rate_windows WHERE name = :name"), {"name": key})


def _relaxed_commit(conn: Connection) -> None:
    # A count lost in a database crash only lets a few more submissions through: on PostgreSQL
    # the commit need not wait for its WAL record to reach disk (as app.db.session.skip_fsync).
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL synchronous_commit TO OFF"))
