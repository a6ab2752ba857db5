"""``specrag worker`` and ``specrag api``: the two long-running processes."""

from __future__ import annotations

import click

from app.commands.common import get_settings, one_line_errors
from app.settings import Settings


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
    settings, processes = _concurrency(settings, concurrency)
    # Fail fast, before joining the queue, when the database is not migrated.
    from app.db import prepare

    prepare(settings)[0].dispose()
    app = create_celery(settings)
    app.warm = {"answer": "answer" in names or "batch" in names, "ingest": "ingest" in names}
    if settings.worker_pool != "prefork":
        from workers import runtime

        # Models load (and the loop's concurrency is checked) before joining the queue: an
        # engine that cannot hold the concurrency is refused here, with the reason.
        runtime.warm(app)
    argv = ["worker", "-Q", ",".join(names), "--pool", settings.worker_pool, "--loglevel", loglevel]
    argv += ["--concurrency", str(processes), "--without-gossip", "--without-mingle"]
    if hostname:
        argv += ["--hostname", hostname]
    app.worker_main(argv)


def _concurrency(settings: Settings, option: int | None) -> tuple[Settings, int]:
    """Settings whose worker_concurrency is what one process holds, and Celery's --concurrency.

    threads: one loop holding N queries fed by N task threads; solo and prefork: one query per
    process (prefork forks ``option`` processes, each with its own engine).
    """
    from app.serving import worker_concurrency

    if option is not None and option < 1:
        raise ValueError(f"--concurrency: must be >= 1, got {option}")
    if settings.worker_pool == "threads":
        held = option if option is not None else worker_concurrency(settings)
        return settings.model_copy(update={"worker_concurrency": held}), held
    processes = option if option is not None and settings.worker_pool == "prefork" else 1
    return settings.model_copy(update={"worker_concurrency": 1}), processes


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
