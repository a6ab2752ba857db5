"""Fixtures for the service's unit tests: an embedded SQLite database migrated to head."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.settings import Settings


@pytest.fixture
def sqlite_settings(tmp_path: Path) -> Settings:
    """Embedded defaults in a fresh data dir (no database_url: SQLite, migrated on prepare)."""
    return Settings(data_dir=tmp_path / "data", stale_after_seconds=5.0)


@pytest.fixture
def session_factory(sqlite_settings: Settings) -> sessionmaker[Session]:
    """Sessions on the fresh embedded database."""
    from app.db import prepare

    engine, factory = prepare(sqlite_settings)
    yield factory
    engine.dispose()
