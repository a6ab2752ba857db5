"""lexical terms of chunks (hybrid search), each source's dense and lexical ranks

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 22:30:00

Schema only: no chunk is analysed here. Chunks ingested before this revision keep
``lexical_terms`` NULL; a host building its lexical index analyses those chunks' text itself
(retrieval.changelog), and ``specrag index backfill`` stores their terms once for every host.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("chunks", sa.Column("lexical_terms", sa.Text(), nullable=True))
    op.add_column("answer_sources", sa.Column("dense_rank", sa.Integer(), nullable=True))
    op.add_column("answer_sources", sa.Column("lexical_rank", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("answer_sources", "lexical_rank")
    op.drop_column("answer_sources", "dense_rank")
    op.drop_column("chunks", "lexical_terms")
