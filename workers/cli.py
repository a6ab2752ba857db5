"""The composition root: the ``specrag`` console script and API, with the Celery queue wired in.

app/ owns the CLI and the HTTP API but never imports the queue; here they are handed a
``CeleryDispatcher`` (app/dispatch.py's protocol), and the ``worker`` command, which is Celery
itself, joins the CLI.
"""

from __future__ import annotations

import logging

import click
from fastapi import FastAPI

import workers.runtime as runtime
from app.api import create_app
from app.cli import build_cli
from app.commands.common import Wiring, get_settings, one_line_errors
from app.db import prepare
from app.metrics import start_worker_metrics
from app.requests import QueueName
from app.serving import pool_concurrency
from app.settings import Settings
from workers.app import QUEUES, create_celery
from workers.dispatcher import CeleryDispatcher


def celery_dispatcher(settings: Settings) -> CeleryDispatcher:
    """A dispatcher for ``settings``' broker; its Celery app is built on the first send."""
    return CeleryDispatcher(lambda: create_celery(settings))


def create_api(settings: Settings, *, sweeper: bool = True) -> FastAPI:
    """The HTTP API for ``settings``, sending through the Celery queue."""
    return create_app(settings, celery_dispatcher(settings), sweeper=sweeper)


@click.command("worker")
@click.option(
    "--queues",
    "-Q",
    default="answer,batch",
    show_default=True,
    help=(
        "Comma-separated queues. Ingest runs in its own worker process (`--queues ingest`), so "
        "a large upload never runs in front of an answer on the same engine."
    ),
)
@click.option(
    "--pool",
    type=click.Choice(["solo", "threads", "prefork"]),
    default=None,
    help="Celery pool (default from settings: threads).",
)
@click.option(
    "--concurrency",
    type=int,
    default=None,
    help="Queries in flight (threads pool; default SPECRAG_WORKER_CONCURRENCY or per engine), "
    "or processes (prefork).",
)
@click.option("--hostname", "-n", default=None, help="Worker node name (default: celery@host).")
@click.option("--loglevel", default="INFO", show_default=True)
@click.option(
    "--json", "as_json", is_flag=True, help="Accepted for uniformity; the worker logs as text."
)
@one_line_errors
def worker(
    queues: str,
    pool: str | None,
    concurrency: int | None,
    hostname: str | None,
    loglevel: str,
    as_json: bool,
) -> None:
    """Run a Celery worker that answers (and ingests) queued work until stopped."""
    settings = get_settings()  # tracing starts here (app/commands/common.py)
    names = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = [q for q in names if q not in QUEUES]
    if unknown or not names:
        raise ValueError(
            f"--queues: unknown queue(s) {', '.join(unknown) or '(none)'}; expected some of {', '.join(QUEUES)}"
        )
    if pool is not None:
        settings = settings.model_copy(update={"worker_pool": pool})
    elif "worker_pool" not in settings.model_fields_set and not (
        {QueueName.ANSWER, QueueName.BATCH} & set(names)
    ):
        # Ingest only: no engine loop to feed, and ingest's time limit needs the main thread.
        settings = settings.model_copy(update={"worker_pool": "solo"})
    settings, processes = pool_concurrency(settings, concurrency)
    # Fail fast, before joining the queue, when the database is not migrated.
    prepare(settings)[0].dispose()
    # Bound before joining the queues: a taken port stops the worker here, with the reason.
    start_worker_metrics(settings)
    app = create_celery(settings)
    app.warm = {"answer": "answer" in names or "batch" in names, "ingest": "ingest" in names}
    app.exit_on_engine_death = True  # its supervisor restarts it (workers/engine_guard.py)
    app.freeze_heap = True  # once warm, the loaded heap leaves the collector's scans (app/heap.py)
    if settings.worker_pool != "prefork":
        # What the start logs (resources, prompt format) shows before Celery sets up its logging.
        logging.basicConfig(
            level=loglevel.upper(), format="[%(asctime)s: %(levelname)s] %(message)s"
        )
        # Models load (and the loop's concurrency is checked) before joining the queue: an
        # engine that cannot hold the concurrency is refused here, with the reason.
        try:
            runtime.warm(app)
        except RuntimeError as exc:
            # vLLM missing, or not the build for this device: one line naming what to install.
            from generation.vllm_engine import VLLMUnavailableError

            if isinstance(exc, VLLMUnavailableError):
                raise ValueError(str(exc)) from exc
            raise
    argv = ["worker", "-Q", ",".join(names), "--pool", settings.worker_pool, "--loglevel", loglevel]
    argv += ["--concurrency", str(processes), "--without-gossip", "--without-mingle"]
    if hostname:
        argv += ["--hostname", hostname]
    app.worker_main(argv)


main = build_cli(Wiring(dispatcher=celery_dispatcher, commands=(worker,)))
"""The ``specrag`` console script."""
