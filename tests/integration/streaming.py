"""Helpers of the streaming tests: synthetic running queries, a worker-side stream, raw SSE reads,
and an API server on other settings (no sweeper, nothing sent)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import update

from app.db import Answer, Query, make_engine, make_session_factory, utcnow
from app.settings import Settings
from tests.integration.helpers import free_port


def chars(ids: list[int]) -> str:
    """A decoder where token id = code point (so tests choose the text exactly)."""
    return "".join(chr(i) for i in ids)


def running_query(settings: Settings, tenant: str, status: str = "running") -> uuid.UUID:
    """A stored query of ``tenant`` in ``status``, as if a worker had claimed it."""
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request

    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        request = validate_request(settings, {"question": "Why?", "collection": "docs"})
        query, _ = create_query(session, get_or_create_tenant(session, tenant), request)
        # A heartbeat in the future: the API's reaper leaves this worker-less query alone.
        beat = utcnow() + timedelta(hours=1) if status == "running" else None
        session.execute(
            update(Query).where(Query.id == query.id).values(status=status, heartbeat_at=beat)
        )
        session.commit()
        qid = query.id
    engine.dispose()
    return qid


def finish_query(settings: Settings, qid: uuid.UUID, text: str | None) -> None:
    """Record ``text`` as the answer (succeeded), or fail the query when ``text`` is None."""
    engine = make_engine(settings)
    with make_session_factory(engine)() as session:
        if text is None:
            values: dict[str, Any] = {"status": "failed", "error": "RuntimeError: boom"}
        else:
            session.add(Answer(query_id=qid, text=text, model_pair="t/d", engine="torch"))
            values = {"status": "succeeded"}
        session.execute(update(Query).where(Query.id == qid).values(**values))
        session.commit()
    engine.dispose()


def worker_stream(settings: Settings, qid: uuid.UUID) -> Any:
    """The stream a worker would write for ``qid``, decoding ids as code points."""
    from app.streams import QueryStream, publisher

    url = settings.resolved_stream_url
    assert url is not None
    pub = publisher(url, settings.stream_maxlen, settings.stream_ttl_seconds)
    return QueryStream(pub, qid, chars), pub


def read_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """Raw SSE blocks of a streaming response: {"id", "event", "data", "comments"}."""
    import json

    block: dict[str, Any] = {"comments": []}
    for line in response.iter_lines():
        if line == "":
            if "data" in block:
                block["data"] = json.loads(block["data"])
            yield block
            block = {"comments": []}
        elif line.startswith(":"):
            block["comments"].append(line)
        else:
            name, _, value = line.partition(": ")
            block[name] = value


@contextmanager
def api_server(settings: Settings) -> Iterator[str]:
    """The API on ``settings`` served on a loopback port, without sweeper or broker; its URL."""
    import uvicorn

    from app.api import create_app

    port = free_port()
    app = create_app(settings, sweeper=False)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", backlog=2048)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "API server did not start in 30 s"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
