"""Every table of the service on the one shared metadata: import ``metadata`` from here to see the
whole schema (Alembic's autogenerate and compare, ``create_all`` in tests).

The tables live beside the code that owns them (``app.db.models``, ``app.audit.records``,
``app.batch.records``, ``app.grading.records``, ``app.drafts.records``, ``app.tenancy.records``,
``retrieval.records``). This module sits above all of them, so ``app.db`` need not import the rooms above it to register their tables.
"""

from __future__ import annotations

import app.audit.records
import app.batch.records
import app.db.groundings
import app.db.models
import app.drafts.records
import app.grading.records
import app.tenancy.records
import retrieval.records
from retrieval.records import metadata

MODULES = (
    app.db.models,
    app.db.groundings,
    app.audit.records,
    app.grading.records,
    app.batch.records,
    app.tenancy.records,
    app.drafts.records,
    retrieval.records,
)
"""The modules that declare tables (each registers them on ``metadata`` when imported)."""

__all__ = ["MODULES", "metadata"]
