"""``specrag api``: the HTTP API process (``specrag worker`` is wired in by workers/cli.py)."""

from __future__ import annotations

import click

from app.api import create_app
from app.commands.common import get_dispatcher, get_settings, one_line_errors
from app.heap import freeze_startup_heap


@click.command("api")
@click.option("--host", default=None, help="Address to bind (default from settings).")
@click.option("--port", type=int, default=None, help="Port to bind (default from settings).")
@click.option(
    "--json", "as_json", is_flag=True, help="Accepted for uniformity; the server logs as text."
)
@one_line_errors
def api(host: str | None, port: int | None, as_json: bool) -> None:
    """Serve the HTTP API (FastAPI on uvicorn)."""
    import uvicorn  # server only

    settings = get_settings()
    app = create_app(settings, get_dispatcher(settings))
    freeze_startup_heap()  # what the process loaded, out of the collector's scans (app/heap.py)
    uvicorn.run(app, host=host or settings.api_host, port=port or settings.api_port)


COMMANDS = [api]
