"""An index of eval points by their `eval.at` fraction (metrics.eval_point), so "the loss at 50%" over a lab's
whole history (`SELECT ... FROM eval_curve WHERE eval_point = 0.5`) reads its rows, not every eval point:
5.6 s at 100,000 runs x 200 points on PostgreSQL before it

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

EVAL_ONLY = "split = 'eval'"


def upgrade() -> None:
    op.create_index("ix_metrics_eval_point", "metrics", ["eval_point"],
                    sqlite_where=sa.text(EVAL_ONLY), postgresql_where=sa.text(EVAL_ONLY))


def downgrade() -> None:
    op.drop_index("ix_metrics_eval_point", table_name="metrics")
