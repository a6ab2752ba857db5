"""Schema management: Alembic upgrade/downgrade and the "is this database current?" check."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

# The migrations package sits beside ``app`` (in the repository and in site-packages alike).
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


class SchemaNotCurrentError(RuntimeError):
    """The database's schema is not at the migrations' head; ``specrag db upgrade`` fixes it."""


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` that works from any working directory (no alembic.ini)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = url
    return cfg


def head_revision() -> str:
    """The single head revision of the migrations (there is exactly one)."""
    heads = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations must have exactly one head, found {heads}")
    return heads[0]


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None for an empty database)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Apply the migrations up to ``revision`` on ``engine``'s database; returns the new revision."""
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
    return current_revision(engine)


def downgrade(engine: Engine, revision: str = "base") -> str | None:
    """Revert the migrations down to ``revision``; returns the new revision."""
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
    return current_revision(engine)


def check_current(engine: Engine) -> None:
    """Raise SchemaNotCurrentError (saying what to run) unless the database is at head."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        url = engine.url.render_as_string(hide_password=True)
        raise SchemaNotCurrentError(
            f"database {url} is at schema revision {current or 'none (empty)'}, "
            f"the code needs {head}: run `specrag db upgrade`"
        )
