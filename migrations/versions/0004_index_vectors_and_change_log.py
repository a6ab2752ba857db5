"""chunk vectors, index change log, shared IVF centroids (indexes across hosts)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 10:40:00

Schema only, and constant time per collection: no chunk is embedded here (a migration must not
load a model or silently run for hours). Chunks ingested before this revision keep
``embedding`` NULL until ``specrag index backfill`` (or the first host that needs them) fills
them from that host's index file, or embeds them with a logged warning (docs/scaleout.md).
Existing collections start their change log at their current version (``log_floor``), so a host
holding an older file rebuilds instead of replaying changes that were never logged.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE on both backends (SQLite >= 3.35 drops columns too): no table rebuilds.
    op.add_column("chunks", sa.Column("embedding", sa.LargeBinary(), nullable=True))
    op.add_column(
        "collection_indexes",
        sa.Column("layout_version", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column(
        "collection_indexes",
        sa.Column("log_floor", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column("collection_indexes", sa.Column("centroids", sa.LargeBinary(), nullable=True))
    op.execute("UPDATE collection_indexes SET layout_version = version, log_floor = version")
    op.create_table(
        "index_changes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("collection_index_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("chunk_id", sa.Integer(), nullable=False),
        sa.Column("added", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["collection_index_id"],
            ["collection_indexes.id"],
            name=op.f("fk_index_changes_collection_index_id_collection_indexes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_index_changes")),
    )
    op.create_index(
        "ix_index_changes_collection_version",
        "index_changes",
        ["collection_index_id", "version"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_index_changes_collection_version", table_name="index_changes")
    op.drop_table("index_changes")
    op.drop_column("collection_indexes", "centroids")
    op.drop_column("collection_indexes", "log_floor")
    op.drop_column("collection_indexes", "layout_version")
    op.drop_column("chunks", "embedding")
