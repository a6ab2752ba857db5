"""generation_stats.prompt_format; collection_settings (a collection's own system prompt)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 01:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable: answers recorded before this revision do not say how their prompt was made.
    with op.batch_alter_table("generation_stats") as batch:
        batch.add_column(sa.Column("prompt_format", sa.String(length=8), nullable=True))
    op.create_table(
        "collection_settings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("collection", sa.String(length=128), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_collection_settings_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_collection_settings")),
        sa.UniqueConstraint(
            "tenant_id", "collection", name=op.f("uq_collection_settings_collection")
        ),
    )


def downgrade() -> None:
    op.drop_table("collection_settings")
    with op.batch_alter_table("generation_stats") as batch:
        batch.drop_column("prompt_format")
