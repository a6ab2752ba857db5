"""generation_stats: dtype (the numerics an answer was computed in: float32, bfloat16)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 01:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable: answers recorded before this revision do not say which numerics they ran in.
    with op.batch_alter_table("generation_stats") as batch:
        batch.add_column(sa.Column("dtype", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("generation_stats") as batch:
        batch.drop_column("dtype")
