"""Fixtures of the metrics tests: the embedded database of tests/app, migrated to head."""

from tests.app.conftest import session_factory, sqlite_settings

__all__ = ["session_factory", "sqlite_settings"]
