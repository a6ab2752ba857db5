"""``specrag worker`` and ``specrag api``: the two long-running processes."""

from __future__ import annotations

import click

from app.commands.common import get_settings, one_line_errors


@click.command("worker")
@click.option(
    "--queues",
    "-Q",
    default="answer,batch,ingest",
    show_default=True,
    help="Comma-separated queues.",
)
@click.option(
    "--pool",
    type=click.Choice(["solo", "threads", "prefork"]),
    default=None,
    help="Celery pool (default from settings: solo).",
)
@click.option(
    "--concurrency", type=int, default=1, show_default=True, help="Tasks at once (threads/prefork)."
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
    concurrency: int,
    hostname: str | None,
    loglevel: str,
    as_json: bool,
) -> None:
    """Run a Celery worker that answers (and ingests) queued work until stopped."""
    from workers import QUEUES, create_celery

    settings = get_settings()
    names = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = [q for q in names if q not in QUEUES]
    if unknown or not names:
        raise ValueError(
            f"--queues: unknown queue(s) {', '.join(unknown) or '(none)'}; expected some of {', '.join(QUEUES)}"
        )
    if pool is not None:
        settings = settings.model_copy(update={"worker_pool": pool})
    # Fail fast, before joining the queue, when the database is not migrated.
    from app.db import prepare

    prepare(settings)[0].dispose()
    # Bound before joining the queues: a taken port stops the worker here, with the reason.
    from app.metrics import start_worker_metrics

    start_worker_metrics(settings)
    app = create_celery(settings)
    app.warm = {"answer": "answer" in names or "batch" in names, "ingest": "ingest" in names}
    argv = ["worker", "-Q", ",".join(names), "--pool", settings.worker_pool, "--loglevel", loglevel]
    argv += ["--concurrency", str(concurrency), "--without-gossip", "--without-mingle"]
    if hostname:
        argv += ["--hostname", hostname]
    app.worker_main(argv)


@click.command("api")
@click.option("--host", default=None, help="Address to bind (default from settings).")
@click.option("--port", type=int, default=None, help="Port to bind (default from settings).")
@click.option(
    "--json", "as_json", is_flag=True, help="Accepted for uniformity; the server logs as text."
)
@one_line_errors
def api(host: str | None, port: int | None, as_json: bool) -> None:
    """Serve the HTTP API (FastAPI on uvicorn)."""
    import uvicorn

    from app.api import create_app

    settings = get_settings()
    uvicorn.run(
        create_app(settings), host=host or settings.api_host, port=port or settings.api_port
    )


COMMANDS = [worker, api]
