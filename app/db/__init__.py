"""The service's records: SQLAlchemy models, engine and session factory, schema migrations.

Only the core tables are declared here; ``app.tables`` gathers every room's tables on the shared
metadata (audit, batch and tenancy sit above ``app.db`` and import it, never the other way).
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.db.groundings import AnswerGrounding
from app.db.models import (
    QUERY_STATUSES,
    Answer,
    AnswerSource,
    ApiKey,
    Base,
    CollectionSettings,
    GenerationStatsRecord,
    Query,
    Tenant,
    utcnow,
)
from app.db.schema import SchemaNotCurrentError, check_current, upgrade
from app.db.session import make_engine, make_session_factory
from app.settings import Settings


def prepare(settings: Settings) -> tuple[Engine, sessionmaker[Session]]:
    """An engine and session factory on a database whose schema is current.

    The embedded default (no ``database_url``: SQLite in the data dir) is brought to head here, so
    that ``make demo`` and a first ``specrag ask`` just work. Any configured URL must have been
    migrated as its own step (``specrag db upgrade``); otherwise SchemaNotCurrentError says so.
    """
    engine = make_engine(settings)
    if settings.database_url is None:
        upgrade(engine)
    else:
        check_current(engine)
    return engine, make_session_factory(engine)


__all__ = [
    "QUERY_STATUSES",
    "Answer",
    "AnswerGrounding",
    "AnswerSource",
    "ApiKey",
    "Base",
    "CollectionSettings",
    "GenerationStatsRecord",
    "Query",
    "SchemaNotCurrentError",
    "Tenant",
    "make_engine",
    "make_session_factory",
    "prepare",
    "upgrade",
    "utcnow",
]
