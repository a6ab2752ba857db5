"""One API process holds 500 open streams of running queries without a thread each, answers other
requests meanwhile, and delivers every stream's tokens and done (500 clients on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from app.db import Answer, Query, make_engine, make_session_factory, utcnow
from app.settings import Settings
from tests.integration.streaming import api_server, chars

pytestmark = pytest.mark.integration
STREAMS = 500


def _running_queries(settings: Settings, tenant: str, n: int) -> list[uuid.UUID]:
    from app.lifecycle.queries import get_or_create_tenant

    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        owner = get_or_create_tenant(session, tenant)
        ids = [uuid.uuid4() for _ in range(n)]
        session.add_all(
            Query(id=i, tenant_id=owner.id, collection="docs", question="Why?", params={},
                  status="running", queue="answer", attempts=1,
                  heartbeat_at=utcnow() + timedelta(hours=1))
            for i in ids
        )  # fmt: skip
        session.commit()
    engine.dispose()
    return ids


def _answer_all(settings: Settings, ids: list[uuid.UUID]) -> None:
    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        session.add_all(
            Answer(query_id=i, text=f"answer {i.hex[:8]}", model_pair="t/d", engine="torch")
            for i in ids
        )
        session.execute(update(Query).where(Query.id.in_(ids)).values(status="succeeded"))
        session.commit()
    engine.dispose()


async def _follow(
    client: httpx.AsyncClient, url: str, opened: asyncio.Event, counter: list[int]
) -> list[tuple[str, Any]]:
    import json

    events: list[tuple[str, Any]] = []
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        name = None
        async for line in response.aiter_lines():
            if line.startswith("retry:"):
                counter[0] += 1
                if counter[0] == STREAMS:
                    opened.set()
            elif line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((str(name), json.loads(line[6:])))
                if name in ("done", "error"):
                    break
    return events


def test_one_api_process_keeps_500_streams_open_and_still_answers(
    keys: dict[str, str], service_settings: Settings
) -> None:
    settings = service_settings
    ids = _running_queries(settings, "acme", STREAMS)
    headers = {"Authorization": f"Bearer {keys['acme']}"}

    from app.streams import QueryStream, publisher

    url = settings.resolved_stream_url
    assert url is not None
    pub = publisher(url, settings.stream_maxlen, settings.stream_ttl_seconds)

    async def scenario(base: str) -> tuple[list[list[tuple[str, Any]]], int, int]:
        threads_before = threading.active_count()
        limits = httpx.Limits(max_connections=STREAMS + 10, max_keepalive_connections=0)
        timeout = httpx.Timeout(120.0)
        async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as client:
            opened, counter = asyncio.Event(), [0]
            tasks = [
                asyncio.create_task(
                    _follow(client, f"{base}/v1/queries/{i}/stream", opened, counter)
                )
                for i in ids
            ]
            await asyncio.wait_for(opened.wait(), timeout=120)
            threads_open = threading.active_count() - threads_before
            # Other requests are still served while all 500 streams are open.
            async with httpx.AsyncClient(headers=headers, timeout=30) as other:
                assert (await other.get(f"{base}/healthz")).status_code == 200
                got = await other.get(f"{base}/v1/queries/{ids[0]}")
                assert got.status_code == 200 and got.json()["status"] == "running"
            streams = [QueryStream(pub, i, chars) for i in ids]
            for i, stream in zip(ids, streams, strict=True):
                stream.on_delta([ord(c) for c in "answer "])
                stream.finish(f"answer {i.hex[:8]}", [])
            await asyncio.to_thread(_answer_all, settings, ids)
            for stream in streams:
                stream.end("succeeded")
            results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
        return results, threads_open, counter[0]

    with api_server(settings) as base:
        results, threads_open, opened = asyncio.run(scenario(base))
    print(f"threads added while {STREAMS} streams were open: {threads_open}")
    assert opened == STREAMS
    # anyio's thread pool (40) at most: no thread per open stream.
    assert threads_open <= 60, f"{threads_open} new threads for {STREAMS} open streams"
    for qid, events in zip(ids, results, strict=True):
        names = [name for name, _ in events]
        assert names[-1] == "done" and set(names[:-1]) == {"token"}, names
        text = "".join(data["text"] for name, data in events if name == "token")
        assert text == events[-1][1]["answer"] == f"answer {qid.hex[:8]}"
