"""runs.threads (torch intra-op threads the trainer used) and runs.epochs (passes over the training rows)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        batch_op.add_column(sa.Column("threads", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("epochs", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch_op:
        batch_op.drop_column("epochs")
        batch_op.drop_column("threads")
