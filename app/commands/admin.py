"""``specrag db ...`` (schema migrations) and ``specrag keys create|list|revoke`` (API keys)."""

from __future__ import annotations

from datetime import timedelta

import click

from app.commands.common import emit, get_settings, json_option, one_line_errors
from app.db import make_engine, prepare, utcnow
from app.db.schema import current_revision, downgrade, head_revision, upgrade
from app.keys import create_key, list_keys, revoke_key


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
@click.option(
    "--expires-in-days", type=float, default=None, help="Refuse the key after this many days."
)
@json_option
@one_line_errors
def keys_create(tenant: str, admin: bool, expires_in_days: float | None, as_json: bool) -> None:
    """Create an API key and print it once; only its hash is stored."""
    if not tenant.strip() or len(tenant) > 100:
        raise ValueError("--tenant: must be 1 to 100 characters")
    if expires_in_days is not None and not 0 < expires_in_days <= 3650:
        raise ValueError("--expires-in-days: must be more than 0 and at most 3650")
    expires = utcnow() + timedelta(days=expires_in_days) if expires_in_days else None
    engine, session_factory = prepare(get_settings())
    with session_factory() as session:
        key = create_key(session, tenant, admin=admin, expires_at=expires)
    engine.dispose()
    data = {"key": key, "tenant": tenant, "admin": admin,
            "expires_at": expires.isoformat() if expires else None}  # fmt: skip
    emit(data, as_json, text=key)


@keys.command("list")
@click.option("--tenant", default=None, help="Only this tenant's keys.")
@json_option
@one_line_errors
def keys_list(tenant: str | None, as_json: bool) -> None:
    """List keys by prefix (never the secret): tenant, admin, created, expiry, revoked, active."""

    engine, session_factory = prepare(get_settings())
    with session_factory() as session:
        rows = list_keys(session, tenant)
    engine.dispose()
    lines = [
        f"{r['prefix']}  {r['tenant']}{'  admin' if r['admin'] else ''}  "
        f"{'active' if r['active'] else 'revoked' if r['revoked_at'] else 'expired'}"
        f"{'  expires ' + r['expires_at'] if r['expires_at'] else ''}"
        for r in rows
    ]
    emit({"keys": rows}, as_json, text="\n".join(lines) or "no keys")


@keys.command("revoke")
@click.argument("prefix")
@json_option
@one_line_errors
def keys_revoke(prefix: str, as_json: bool) -> None:
    """Revoke the key whose prefix `keys list` shows; it is refused (401) from now on."""

    engine, session_factory = prepare(get_settings())
    try:
        with session_factory() as session:
            n = revoke_key(session, prefix)
    finally:
        engine.dispose()
    emit({"revoked": n, "prefix": prefix}, as_json, text=f"revoked {n} key(s) {prefix}")


COMMANDS = [db, keys]
