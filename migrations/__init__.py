"""Alembic migrations of the whole schema (service and retrieval tables); see env.py."""
