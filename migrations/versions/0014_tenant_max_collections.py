"""tenant_limits: max_collections (an admin's per-tenant collection limit)

Revision ID: 0014
Revises: 0012
Create Date: 2026-12-05 01:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable: NULL means SPECRAG_TENANT_MAX_COLLECTIONS applies, as for every other limit.
    with op.batch_alter_table("tenant_limits") as batch:
        batch.add_column(sa.Column("max_collections", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenant_limits") as batch:
        batch.drop_column("max_collections")
