"""chunks.grounding_vectors and grounding_layout: the grounding scorer's passage vectors

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 08:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Schema only: existing chunks get their vectors from ``specrag grounding backfill`` (or the
    # first answer that cites them), never from a migration that would load a model.
    with op.batch_alter_table("chunks") as batch:
        batch.add_column(sa.Column("grounding_vectors", sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("grounding_layout", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("chunks") as batch:
        batch.drop_column("grounding_layout")
        batch.drop_column("grounding_vectors")
