"""Database tables owned by retrieval (documents, chunks, index versions) and the shared metadata.

The service's own tables (app/db) are declared on the same ``metadata`` so that Alembic sees one
schema, while retrieval still imports nothing from ``app``.
"""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

# Stable constraint names so that migrations can drop what they create, on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RecordBase(DeclarativeBase):
    """Declarative base for retrieval's tables."""

    metadata = metadata
