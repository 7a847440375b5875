"""Plugins: the facts a reader needs of a plugin (plugin_facts), recorded when its sweep is registered, so that
reading a results DB never runs the plugin code stored in it

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plugin_facts",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("identity", sa.String(64), primary_key=True),
        sa.Column("facts", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("plugin_facts")
