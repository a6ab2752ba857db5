"""Alembic environment: the URL comes from Settings, the target schema from the shared metadata.

A caller may hand over an open connection in ``config.attributes["connection"]`` (tests, and
``app.db.prepare`` for the embedded SQLite database); otherwise the URL is
``config.attributes["url"]``, else ``Settings().resolved_database_url``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from app.settings import Settings
from app.tables import metadata  # every room's tables, on retrieval's shared metadata

config = context.config
target_metadata = metadata


def _url() -> str:
    url = config.attributes.get("url")
    if url:
        return str(url)
    return Settings().resolved_database_url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _configure(conn)
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
