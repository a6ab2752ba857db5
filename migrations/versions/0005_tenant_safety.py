"""tenant safety: per-tenant limits, upload states, key expiry, bounded re-sends, question form

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 10:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tenant_limits",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("submissions_per_second", sa.Float(), nullable=True),
        sa.Column("max_active_queries", sa.Integer(), nullable=True),
        sa.Column("max_batch_items", sa.Integer(), nullable=True),
        sa.Column("max_upload_bytes", sa.BigInteger(), nullable=True),
        sa.Column("max_upload_bytes_per_day", sa.BigInteger(), nullable=True),
        sa.Column("max_extracted_chars", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id"),
    )
    op.create_table(
        "document_uploads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(length=100), nullable=False),
        sa.Column("collection", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tenant", "collection", "name", name="uq_document_uploads_name"),
    )
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("queries") as batch:
        batch.add_column(sa.Column("sends", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("question_stored", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("queries") as batch:
        batch.drop_column("question_stored")
        batch.drop_column("sends")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("expires_at")
    op.drop_table("document_uploads")
    op.drop_table("tenant_limits")
