"""Private services for tests and benchmarks: scratch PostgreSQL databases, Redis, free ports.

Nothing here imports psycopg or redis at import time (the tests' conftest imports this package).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PG_SERVER = "postgres@127.0.0.1:5432"
ADMIN_URL = os.environ.get("SPECRAG_BENCH_PG_ADMIN", f"postgresql://{PG_SERVER}/test")
"""libpq URL of a database the benchmarks connect to in order to create and drop their own."""


def database_url(name: str) -> str:
    """The SQLAlchemy URL of the scratch database ``name``."""
    return f"postgresql+psycopg://{PG_SERVER}/{name}"


def create_database(prefix: str = "specrag_bench") -> str:
    """Create an empty PostgreSQL database with a fresh name; returns the name."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        raise SystemExit(f"PostgreSQL not reachable at {ADMIN_URL}: {exc}") from exc
    return name


def drop_database(name: str) -> None:
    """Drop the scratch database ``name``, closing its connections."""
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def scratch_database(prefix: str = "specrag_bench", *, migrate: bool = True) -> Iterator[str]:
    """The SQLAlchemy URL of a new database (at the migrations' head), dropped on exit."""
    name = create_database(prefix)
    try:
        if migrate:
            from sqlalchemy import create_engine

            from app.db.schema import upgrade

            engine = create_engine(database_url(name))
            try:
                upgrade(engine)
            finally:
                engine.dispose()
        yield database_url(name)
    finally:
        drop_database(name)


def claim_redis_db() -> int:
    """A Redis database number no test session or other benchmark holds (tests/conftest.py's
    claim keys), flushed; the claim expires by itself after an hour."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=6379, db=0)
    for number in range(15, 0, -1):
        if client.set(f"specrag-test-db-claim:{number}", os.getpid(), nx=True, ex=3600):
            redis.Redis(db=number).flushdb()
            return number
    raise SystemExit("no free Redis database number (1-15)")


def release_redis_db(number: int) -> None:
    """Flush the Redis database ``claim_redis_db`` handed out and give its claim back."""
    import redis

    redis.Redis(host="127.0.0.1", port=6379, db=number).flushdb()
    redis.Redis(host="127.0.0.1", port=6379, db=0).delete(f"specrag-test-db-claim:{number}")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private redis-server on a free port that a caller may stop and start again."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        import redis

        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None
