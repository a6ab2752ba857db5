"""Rate windows on the embedded default live in the database, so API processes share them.

Each "process" here is an ``Enforcer`` (or an app) with its own engine, hence its own connections
and no Python state in common with the other: all they share is the database. The same over
HTTP, two API apps on each broker: tests/tenancy/test_limits.py.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine

from app.lifecycle.queries import get_or_create_tenant
from app.settings import Settings
from app.tenancy.limits import Enforcer, LimitExceeded
from app.tenancy.ratestore import DatabaseStorage


@contextmanager
def _engines(settings: Settings, n: int) -> Iterator[list[Engine]]:
    from app.db.session import make_engine

    made = [make_engine(settings) for _ in range(n)]
    try:
        yield made
    finally:
        for engine in made:
            engine.dispose()


def _tenant_id(engine: Engine) -> int:
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        return get_or_create_tenant(session, f"t-{uuid.uuid4().hex[:8]}").id


def _two_enforcers_share_one_window(settings: Settings) -> None:
    """One submission per 5 s: the first process's passes, the second process's is refused."""
    from sqlalchemy.orm import Session

    assert not settings.resolved_broker_url.startswith("redis")
    with _engines(settings, 2) as (one, two):
        first, second = Enforcer(settings, one), Enforcer(settings, two)
        assert isinstance(first.storage, DatabaseStorage)
        tenant = _tenant_id(one)
        with Session(one) as s1, Session(two) as s2:
            first.submission(s1, tenant)
            with pytest.raises(LimitExceeded) as refused:
                second.submission(s2, tenant)
            assert refused.value.status == 429 and refused.value.field == "submissions_per_second"
            assert 1 <= refused.value.retry_after <= 5
            # A new Enforcer (a restarted process) still sees the window.
            with pytest.raises(LimitExceeded):
                Enforcer(settings, one).submission(s1, tenant)
            # Another tenant has its own window.
            second.submission(s2, _tenant_id(two))


def test_two_limiters_on_one_sqlite_database_share_the_window(tmp_path: Path) -> None:
    from app.db.schema import upgrade

    settings = Settings(
        data_dir=tmp_path, tenant_submissions_per_second=0.2, tenant_submission_burst=0
    )
    with _engines(settings, 1) as (engine,):
        upgrade(engine)
    _two_enforcers_share_one_window(settings)


def test_two_limiters_on_one_postgresql_database_share_the_window(
    tenancy_pg: str, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path, database_url=tenancy_pg,
                        tenant_submissions_per_second=0.2, tenant_submission_burst=0)  # fmt: skip
    _two_enforcers_share_one_window(settings)


def test_concurrent_hits_from_two_engines_are_counted_exactly(tenancy_pg: str) -> None:
    """The UPSERT is atomic: 4 threads on 2 engines, 200 hits, every count seen exactly once."""
    engines = [create_engine(tenancy_pg, pool_size=2) for _ in range(2)]
    stores = [DatabaseStorage(engine) for engine in engines]
    key = f"test/{uuid.uuid4().hex}"
    seen: list[int] = []
    lock = threading.Lock()

    def hit(store: DatabaseStorage) -> None:
        for _ in range(50):
            count = store.incr(key, 60)
            with lock:
                seen.append(count)

    threads = [threading.Thread(target=hit, args=(stores[i % 2],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert sorted(seen) == list(range(1, 201))
        assert stores[0].get(key) == stores[1].get(key) == 200
    finally:
        stores[0].clear(key)
        for engine in engines:
            engine.dispose()


def test_an_expired_window_restarts_and_is_swept(
    tenancy_pg: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.tenancy.ratestore as ratestore

    clock = [1_000_000.0]
    monkeypatch.setattr(ratestore.time, "time", lambda: clock[0])
    engine = create_engine(tenancy_pg)
    store = DatabaseStorage(engine)
    key, other = f"test/{uuid.uuid4().hex}", f"test/{uuid.uuid4().hex}"
    try:
        assert store.incr(key, 10, amount=3) == 3
        assert store.incr(other, 10) == 1
        clock[0] += 5
        assert store.incr(key, 10) == 4
        assert store.get(key) == 4 and store.get_expiry(key) == 1_000_010.0
        clock[0] += 6  # both windows have ended
        assert store.get(key) == 0 and store.get_expiry(key) == clock[0]
        clock[0] += ratestore.SWEEP_SECONDS
        assert store.incr(key, 10) == 1  # a new window, not 5
        assert store.get_expiry(key) == clock[0] + 10
        with engine.connect() as conn:  # the expired window of ``other`` was deleted
            from sqlalchemy import text

            names = conn.execute(text("SELECT name FROM rate_windows")).scalars().all()
        assert key in names and other not in names
    finally:
        store.clear(key)
        engine.dispose()
