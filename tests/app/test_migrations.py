"""Migrations on a real PostgreSQL: upgrade head, schema equals the models, downgrade base."""

from __future__ import annotations

import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from app.db.schema import (
    SchemaNotCurrentError,
    alembic_config,
    check_current,
    current_revision,
    downgrade,
    head_revision,
    upgrade,
)
from app.tables import metadata


def test_one_head_and_file_names_follow_revision_ids() -> None:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1
    for rev in script.walk_revisions():
        assert rev.path is not None and rev.path.split("/")[-1].startswith(f"{rev.revision}_")


def test_upgrade_compare_downgrade_on_postgresql(pg_url: str) -> None:
    import psycopg

    # A database of its own: the session's shared database is left to the other tests.
    name = f"specrag_mig_{uuid.uuid4().hex[:8]}"
    raw = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(raw, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = create_engine(pg_url.rsplit("/", 1)[0] + f"/{name}")
    try:
        with pytest.raises(SchemaNotCurrentError, match="specrag db upgrade"):
            check_current(engine)
        assert upgrade(engine) == head_revision()
        check_current(engine)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        assert diff == [], f"models and migrations differ: {diff}"
        assert downgrade(engine, "base") is None
        assert current_revision(engine) is None
        leftover = set(inspect(engine).get_table_names()) - {"alembic_version"}
        assert leftover == set(), f"downgrade left tables behind: {leftover}"
        # And back up again: downgrade must leave a database the upgrade can rebuild.
        assert upgrade(engine) == head_revision()
    finally:
        engine.dispose()
        with psycopg.connect(raw, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
