"""Plugins: a file plugin's source stored by the identity of its code (plugin_sources), so that a worker that
never saw the file runs exactly the code a sweep was registered with

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plugin_sources",
        sa.Column("identity", sa.String(64), primary_key=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("plugin_sources")
