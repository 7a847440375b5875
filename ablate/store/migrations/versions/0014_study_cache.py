"""A big sweep's study kept at its end (study_cache), so the dashboard shows it at once (derived data: `ablate sql`
does not read it)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "study_cache",
        sa.Column("sweep_id", sa.Integer(), sa.ForeignKey("sweeps.id"), primary_key=True),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("code", sa.String(64), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("computed_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("study_cache")
