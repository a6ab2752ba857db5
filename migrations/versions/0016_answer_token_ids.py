"""answer_token_ids: each answer's exact prompt and output token ids (draft tuning)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 04:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "answer_token_ids",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("query_id", sa.Uuid(), nullable=False),
        sa.Column("prompt_token_ids", sa.JSON(), nullable=False),
        sa.Column("output_token_ids", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["query_id"],
            ["queries.id"],
            name=op.f("fk_answer_token_ids_query_id_queries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_answer_token_ids")),
        sa.UniqueConstraint("query_id", name=op.f("uq_answer_token_ids_query_id")),
    )


def downgrade() -> None:
    op.drop_table("answer_token_ids")
