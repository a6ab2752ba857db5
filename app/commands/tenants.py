"""``specrag tenants limits``: show or set one tenant's limits (an admin's overrides)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click
from sqlalchemy import select

from app.commands.common import emit, get_settings, json_option, one_line_errors
from app.db import Tenant, prepare
from app.tenancy.limits import set_limits, stored_limits


@click.group("tenants")
def tenants() -> None:
    """Tenants: their limits (rates, quotas, upload sizes)."""


@tenants.command("limits")
@click.option("--tenant", required=True, help="The tenant (must exist: it has a key).")
@click.option("--submissions-per-second", type=float, default=None)
@click.option("--max-active-queries", type=int, default=None)
@click.option("--max-batch-items", type=int, default=None)
@click.option("--max-upload-bytes", type=int, default=None)
@click.option("--max-upload-bytes-per-day", type=int, default=None)
@click.option("--max-extracted-chars", type=int, default=None)
@click.option("--max-collections", type=int, default=None)
@json_option
@one_line_errors
def limits(tenant: str, as_json: bool, **values: Any) -> None:
    """Print the tenant's limits in force; options given set them first (0 = no limit)."""
    settings = get_settings()
    engine, session_factory = prepare(settings)
    try:
        with session_factory() as session:
            found = session.scalar(select(Tenant).where(Tenant.name == tenant))
            if found is None:
                raise ValueError(f"--tenant: no tenant {tenant!r} (create a key for it first)")
            if any(v is not None for v in values.values()):
                try:
                    set_limits(session, found.id, values)
                except ValueError as exc:
                    raise ValueError(f"--{str(exc).replace('_', '-')}") from None
            current = asdict(stored_limits(session, settings, found.id))
    finally:
        engine.dispose()
    text = "\n".join(f"{k}: {v}" for k, v in current.items())
    emit({"tenant": tenant, "limits": current}, as_json, text=text)


COMMANDS = [tenants]
