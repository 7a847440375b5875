"""Adaptive sweeps: each round's decision per claim cell (race_decisions)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "race_decisions",
        sa.Column("sweep_id", sa.Integer(), sa.ForeignKey("sweeps.id"), primary_key=True),
        sa.Column("round", sa.Integer(), primary_key=True),
        sa.Column("claim_key", sa.String(64), primary_key=True),
        sa.Column("claim", sa.Text(), nullable=False),
        sa.Column("n_better", sa.Integer(), nullable=False),
        sa.Column("n_worse", sa.Integer(), nullable=False),
        sa.Column("statistic", sa.Double(), nullable=True),
        sa.Column("boundary", sa.Double(), nullable=True),
        sa.Column("level", sa.Double(), nullable=False),
        sa.Column("decision", sa.String(200), nullable=False),
        sa.Column("decided_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("race_decisions")
