"""generation_stats: mean_batch_size and mean_chosen_k

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 10:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable: answers recorded before this revision have neither figure.
    with op.batch_alter_table("generation_stats") as batch:
        batch.add_column(sa.Column("mean_batch_size", sa.Float(), nullable=True))
        batch.add_column(sa.Column("mean_chosen_k", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("generation_stats") as batch:
        batch.drop_column("mean_chosen_k")
        batch.drop_column("mean_batch_size")
