"""``specrag audit report`` and ``specrag eval golden | compare``: audits from the shell."""

from __future__ import annotations

import json
from pathlib import Path

import click

from app.commands.common import emit, get_settings, json_option, one_line_errors


@click.group("audit")
def audit_group() -> None:
    """Reports on speed, acceptance and exactness of stored answers."""


@audit_group.command("report")
@click.option(
    "--since", default=None, help="ISO 8601 start of the window (default: until - 1 day)."
)
@click.option("--until", default=None, help="ISO 8601 end of the window (default: now).")
@click.option("--format", "fmt", default="json", show_default=True, help="json, csv or html.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the report here instead of to stdout.")  # fmt: skip
@click.option(
    "--group-by",
    default=None,
    help="Comma-separated groupings (default tenant,collection,method,model_pair; "
    "also num_speculative_tokens).",
)
@json_option
@one_line_errors
def report(
    since: str | None,
    until: str | None,
    fmt: str,
    out: Path | None,
    group_by: str | None,
    as_json: bool,
) -> None:
    """The audit report over [since, until): requests, latency percentiles, acceptance, alerts."""
    from app.audit import render_report
    from app.audit.window import check_format, parse_group_by, parse_window
    from app.db import prepare

    # Bad input is refused before the database is touched.
    check_format(fmt)
    parse_window(since, until)
    parse_group_by(group_by)
    settings = get_settings()
    engine, session_factory = prepare(settings)
    try:
        with session_factory() as session:
            _, body = render_report(
                session, since=since, until=until, fmt=fmt, group_by=group_by, settings=settings
            )
    finally:
        engine.dispose()
    if out is None:
        click.echo(body, nl=not body.endswith("\n"))
        return
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(body, encoding="utf-8")
    tmp.replace(out)  # never leave a half-written report behind
    summary = {"out": str(out), "format": fmt, "bytes": len(body.encode("utf-8"))}
    if fmt == "json":
        data = json.loads(body)
        summary.update(requests=data["requests"], alerts=len(data["alerts"]))
    emit(summary, as_json, f"wrote {fmt} report to {out} ({summary['bytes']} bytes)")


COMMANDS = [audit_group]
