"""The FastAPI app factory: one Settings in, routes, error handlers and the outbox sweeper wired."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import app.api.errors as errors
from app.api.guard import RequestGuard
from app.api.routes import admin, batches, collections, documents, health, queries, stream
from app.db import prepare
from app.dispatch import Dispatcher, NoQueue
from app.lifecycle.outbox import Sweeper
from app.metrics import install as install_metrics
from app.settings import Settings
from app.tenancy.limits import Enforcer
from app.tracing import flush as flush_traces
from app.tracing import instrument_app


def create_app(
    settings: Settings, dispatcher: Dispatcher | None = None, *, sweeper: bool = True
) -> FastAPI:
    """The HTTP API for ``settings``, sending its work through ``dispatcher``.

    The composition root (``workers.cli.create_api``) passes the Celery dispatcher; without one
    the API stores queries but sends nothing (they wait in the outbox) and refuses uploads. With
    ``sweeper`` the app re-sends queries stored while the broker was down and re-queues those
    whose worker died, for as long as it runs. The API never loads an engine.
    """
    engine, session_factory = prepare(settings)
    queue: Dispatcher = dispatcher if dispatcher is not None else NoQueue()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        lost = getattr(queue, "broker_lost", None)  # a queue that can tell it lost its data
        running = (
            Sweeper(session_factory, settings, queue.send_query, lost).start() if sweeper else None
        )
        try:
            yield
        finally:
            if running is not None:
                running.stop()
            await stream.close_stream_source(app)
            engine.dispose()
            flush_traces()  # the last requests' spans: no exit handler runs after uvicorn stops

    app = FastAPI(
        title="specrag",
        version="0.1.0",
        description="Document Q&A with speculative decoding: submit questions, read answers.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.session_factory = session_factory
    app.state.dispatcher = queue
    # /healthz reports the broker where the dispatcher can ping it (a process without a queue
    # has no broker to report).
    app.state.check_broker = getattr(queue, "ping", None)
    app.state.enforcer = Enforcer(settings, engine)
    errors.install(app)
    app.add_middleware(
        RequestGuard,  # type: ignore[arg-type]
        max_bytes=settings.max_request_bytes,
        max_query_bytes=min(settings.max_query_request_bytes, settings.max_request_bytes),
        max_depth=settings.max_json_depth,
    )
    app.include_router(health.router)
    app.include_router(queries.router)
    app.include_router(stream.router)
    app.include_router(admin.router)
    app.include_router(batches.router)
    app.include_router(documents.router)
    app.include_router(collections.router)
    install_metrics(app, session_factory, queue)
    instrument_app(app)  # server spans, children of an inbound traceparent (no-op when off)
    return app
