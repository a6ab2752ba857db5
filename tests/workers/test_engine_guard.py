"""The engine guard on fakes and a real (SQLite) database: a dead engine stops consumption,
hands back exactly the queries this process holds (the attempt it holds), then exits 70."""

from __future__ import annotations

from pathlib import Path

from app.db import Query
from app.lifecycle.lease import claim, heartbeat
from app.lifecycle.queries import create_query, get_or_create_tenant
from app.requests import validate_request
from app.settings import Settings
from tests.fakes import FakeResources, memory_session_factory
from workers.engine_guard import EXIT_ENGINE_DEAD, EngineGuard


def test_a_dead_engine_releases_what_the_process_holds_and_exits_70(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    resources = FakeResources(settings, memory_session_factory())
    sf = resources.session_factory
    with sf() as session:
        tenant = get_or_create_tenant(session, "acme")
        asked = validate_request(settings, {"question": "Why?", "collection": "docs"})
        ids = [create_query(session, tenant, asked)[0].id for _ in range(3)]
    held_here = claim(sf, ids[0], "answer@host")
    elsewhere = claim(sf, ids[1], "answer@other")
    assert held_here is not None and elsewhere is not None
    with heartbeat(sf, ids[1], elsewhere.attempt, interval=60, deadline=60):
        pass  # no longer held here (as another process's query): the guard leaves it alone
    calls: list[str] = []
    guard = EngineGuard(
        resources,  # type: ignore[arg-type]
        stop_consuming=lambda: calls.append("stop"),
        exit=lambda status: calls.append(f"exit {status}"),
        drain_seconds=0,
    )
    with heartbeat(sf, ids[0], held_here.attempt, interval=60, deadline=60):
        guard.tick()
        assert calls == []  # alive: nothing happens
        resources.dead = True
        guard.tick()
    assert calls == ["stop", f"exit {EXIT_ENGINE_DEAD}"]
    with sf() as session:
        states = [session.get(Query, q).status for q in ids]  # type: ignore[union-attr]
    assert states == ["queued", "running", "queued"]
