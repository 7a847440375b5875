"""The precision a run trained in (runs.precision): a trial may ask for `auto`, which the trainer resolves by the
hardware profile and the device (bf16 where supported, fp16 with a loss scaler on V100, fp32 on CPU); and the
eval accuracy of classification runs (runs.final_eval_accuracy)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("precision", sa.String(8), nullable=True))
    op.add_column("runs", sa.Column("final_eval_accuracy", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "final_eval_accuracy")
    op.drop_column("runs", "precision")
