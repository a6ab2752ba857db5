"""shadow_judgment: the dtype a shadow baseline ran in and the judgment of a mismatch

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 06:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    ("dtype", sa.String(length=16)),
    ("judgment", sa.String(length=16)),
    ("divergence_gap", sa.Float()),
    ("divergence_tolerance", sa.Float()),
    ("judged_dtype", sa.String(length=16)),
)


def upgrade() -> None:
    with op.batch_alter_table("shadow_runs") as batch:
        for name, type_ in COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("shadow_runs") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
