"""The FastAPI app factory: one Settings in, routes, error handlers and the outbox sweeper wired."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from app.api import errors
from app.api.routes import admin, batches, documents, health, queries, stream
from app.outbox import Send, Sweeper
from app.settings import Settings


def create_app(settings: Settings, *, send: Send | None = None, sweeper: bool = True) -> FastAPI:
    """The HTTP API for ``settings``.

    ``send`` puts a query id on a queue (default: the Celery app's ``send_query``; the API never
    loads an engine). With ``sweeper`` the app re-sends queries stored while the broker was down
    and re-queues those whose worker died, for as long as it runs.
    """
    from app.db import prepare

    engine, session_factory = prepare(settings)
    celery_app: list[Any] = []

    def celery() -> Any:
        # Built on first use: an API given its own ``send`` (tests) may never need Celery.
        if not celery_app:
            from workers import create_celery

            celery_app.append(create_celery(settings))
        return celery_app[0]

    if send is None:
        from workers import send_query

        def send(query_id, queue):  # type: ignore[no-untyped-def]
            send_query(celery(), query_id, queue)

    def send_task(name: str, args: list[Any]) -> None:
        celery().send_task(name, args=args, retry=False)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        running = Sweeper(session_factory, settings, app.state.send).start() if sweeper else None
        try:
            yield
        finally:
            if running is not None:
                running.stop()
            await stream.close_stream_source(app)
            engine.dispose()

    app = FastAPI(
        title="specrag",
        version="0.1.0",
        description="Document Q&A with speculative decoding: submit questions, read answers.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.session_factory = session_factory
    app.state.send = send
    app.state.send_task = send_task
    errors.install(app)
    app.include_router(health.router)
    app.include_router(queries.router)
    app.include_router(stream.router)
    app.include_router(admin.router)
    app.include_router(batches.router)
    app.include_router(documents.router)
    return app
