"""generation_stats: num_cached_prompt_tokens (prompt tokens whose KV was reused)

Revision ID: 0010
Revises: 0008
Create Date: 2026-12-01 22:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable: answers recorded before this revision do not say what their prefill reused.
    with op.batch_alter_table("generation_stats") as batch:
        batch.add_column(sa.Column("num_cached_prompt_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("generation_stats") as batch:
        batch.drop_column("num_cached_prompt_tokens")
