"""queries.traceparent and generation_stats.trace_id: each query's OpenTelemetry trace

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07 01:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable both: tracing is off by default, and rows written before this revision have none.
    with op.batch_alter_table("queries") as batch:
        batch.add_column(sa.Column("traceparent", sa.String(length=55), nullable=True))
    with op.batch_alter_table("generation_stats") as batch:
        batch.add_column(sa.Column("trace_id", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("generation_stats") as batch:
        batch.drop_column("trace_id")
    with op.batch_alter_table("queries") as batch:
        batch.drop_column("traceparent")
