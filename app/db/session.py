"""Database engine and session factory, built from Settings at a process's entry point."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from app.settings import Settings
from app.tracing import trace_engine


def make_engine(settings: Settings) -> Engine:
    """An SQLAlchemy engine for the configured database (SQLite in the data dir by default)."""
    url = settings.resolved_database_url
    if url.startswith("sqlite"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            # WAL lets the API read while a worker writes; foreign keys are off by default in SQLite.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return trace_engine(engine, statements=settings.trace_sql)
    return trace_engine(create_engine(url, pool_pre_ping=True), statements=settings.trace_sql)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes after commit (results are read after the write)."""
    return sessionmaker(engine, expire_on_commit=False)


def skip_fsync(session: Session) -> None:
    """Let this transaction's commit return before its WAL record reaches disk (PostgreSQL only).

    Only for writes whose loss in a database crash is harmless and self-healing: a claim (the query
    is queued again and its message is still unacknowledged), a heartbeat, an "enqueued" mark (the
    sweeper sends again; duplicates are no-ops). Answers and submissions stay fully durable.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL synchronous_commit TO OFF"))
