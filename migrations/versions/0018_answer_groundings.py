"""answer_groundings: each answer's grounding (groundedness, citation shares, per sentence)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07 01:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "answer_groundings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("query_id", sa.Uuid(), nullable=False),
        sa.Column("groundedness", sa.Float(), nullable=True),
        sa.Column("citation_precision", sa.Float(), nullable=True),
        sa.Column("citation_recall", sa.Float(), nullable=True),
        sa.Column("reason", sa.String(length=200), nullable=True),
        sa.Column("scorer", sa.String(length=200), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("num_sentences", sa.Integer(), nullable=False),
        sa.Column("sentences", sa.JSON(), nullable=False),
        sa.Column("grounding_ms", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["query_id"],
            ["queries.id"],
            name=op.f("fk_answer_groundings_query_id_queries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_answer_groundings")),
        sa.UniqueConstraint("query_id", name=op.f("uq_answer_groundings_query_id")),
    )


def downgrade() -> None:
    op.drop_table("answer_groundings")
