"""``specrag db ...`` (schema migrations) and ``specrag keys create`` (tenant API keys)."""

from __future__ import annotations

import click

from app.commands.common import emit, get_settings, json_option, one_line_errors
from app.db import make_engine, prepare
from app.db.schema import current_revision, downgrade, head_revision, upgrade
from app.keys import create_key


@click.group("db")
def db() -> None:
    """Database schema: apply or inspect the Alembic migrations."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@json_option
@one_line_errors
def db_upgrade(revision: str, as_json: bool) -> None:
    """Apply the migrations up to REVISION on SPECRAG_DATABASE_URL."""

    settings = get_settings()
    engine = make_engine(settings)
    try:
        new = upgrade(engine, revision)
    finally:
        engine.dispose()
    url = engine.url.render_as_string(hide_password=True)
    emit({"database": url, "revision": new}, as_json, text=f"{url}: at revision {new}")


@db.command("current")
@json_option
@one_line_errors
def db_current(as_json: bool) -> None:
    """Print the database's schema revision and the code's head revision."""

    engine = make_engine(get_settings())
    current, head = current_revision(engine), head_revision()
    engine.dispose()
    emit({"current": current, "head": head}, as_json, text=f"current {current}, head {head}")


@db.command("downgrade")
@click.argument("revision")
@json_option
@one_line_errors
def db_downgrade(revision: str, as_json: bool) -> None:
    """Revert the migrations down to REVISION ("base" drops every table)."""

    engine = make_engine(get_settings())
    new = downgrade(engine, revision)
    engine.dispose()
    emit({"revision": new}, as_json, text=f"at revision {new}")


@click.group("keys")
def keys() -> None:
    """Tenant API keys."""


@keys.command("create")
@click.option("--tenant", required=True, help="Tenant the key belongs to (created if new).")
@click.option("--admin", is_flag=True, help="Also allow /v1/admin/* endpoints.")
@json_option
@one_line_errors
def keys_create(tenant: str, admin: bool, as_json: bool) -> None:
    """Create an API key and print it once; only its hash is stored."""

    if not tenant.strip() or len(tenant) > 100:
        raise ValueError("--tenant: must be 1 to 100 characters")
    engine, session_factory = prepare(get_settings())
    with session_factory() as session:
        key = create_key(session, tenant, admin=admin)
    engine.dispose()
    emit({"key": key, "tenant": tenant, "admin": admin}, as_json, text=key)


COMMANDS = [db, keys]
