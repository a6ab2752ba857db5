"""queries.source (who asked: traffic or a check), golden baselines' scores, human grades

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 01:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        batch.add_column(
            sa.Column("source", sa.String(length=16), server_default="api", nullable=False)
        )
    # Rows stored before this revision: golden runs are known by their queue, batch items too.
    op.execute("UPDATE queries SET source = 'golden' WHERE queue = 'eval'")
    op.execute("UPDATE queries SET source = 'batch' WHERE queue = 'batch'")
    # Nullable: golden runs stored before this revision scored only the speculative answer.
    with op.batch_alter_table("golden_items") as batch:
        batch.add_column(sa.Column("baseline_exact_match", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("baseline_token_f1", sa.Float(), nullable=True))
        batch.add_column(sa.Column("baseline_faithfulness", sa.Float(), nullable=True))
    op.create_table(
        "golden_grades",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("grader", sa.String(length=100), nullable=False),
        sa.Column("faithful", sa.String(length=8), nullable=False),
        sa.Column("relevance", sa.Integer(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "faithful IN ('faithful', 'partly', 'not')",
            name=op.f("ck_golden_grades_faithful_valid"),
        ),
        sa.CheckConstraint(
            "relevance BETWEEN 1 AND 5", name=op.f("ck_golden_grades_relevance_valid")
        ),
        sa.ForeignKeyConstraint(
            ["item_id"],
            ["golden_items.id"],
            name=op.f("fk_golden_grades_item_id_golden_items"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_golden_grades")),
        sa.UniqueConstraint("item_id", "grader", name="uq_golden_grades_item_grader"),
    )


def downgrade() -> None:
    op.drop_table("golden_grades")
    with op.batch_alter_table("golden_items") as batch:
        batch.drop_column("baseline_faithfulness")
        batch.drop_column("baseline_token_f1")
        batch.drop_column("baseline_exact_match")
    with op.batch_alter_table("queries") as batch:
        batch.drop_column("source")
