"""The latest logged point on the run row (runs.last_step, last_elapsed_seconds, last_train_loss, last_eval_loss),
so status tables never aggregate the metrics table; indexes: drop the prefixes of unique indexes
(ix_metrics_run_id, ix_runs_sweep_id) and the unused ix_runs_fingerprint, add a partial index of eval points

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

EVAL_ONLY = "split = 'eval'"


def _latest(column: str, split: str) -> str:
    return (f"(SELECT m.{column} FROM metrics m WHERE m.run_id = runs.id AND m.split = '{split}' "
            "ORDER BY m.step DESC LIMIT 1)")


def upgrade() -> None:
    op.add_column("runs", sa.Column("last_step", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("last_elapsed_seconds", sa.Double(), nullable=True))
    op.add_column("runs", sa.Column("last_train_loss", sa.Double(), nullable=True))
    op.add_column("runs", sa.Column("last_eval_loss", sa.Double(), nullable=True))
    op.execute(f"UPDATE runs SET last_step = {_latest('step', 'train')}, "
               f"last_elapsed_seconds = {_latest('elapsed_seconds', 'train')}, "
               f"last_train_loss = {_latest('loss', 'train')}, last_eval_loss = {_latest('loss', 'eval')}")
    # (run_id, split, step) and (sweep_id, fingerprint) are unique indexes that already serve these prefixes
    op.drop_index("ix_metrics_run_id", table_name="metrics")
    op.drop_index("ix_runs_sweep_id", table_name="runs")
    op.drop_index("ix_runs_fingerprint", table_name="runs")
    op.create_index("ix_metrics_eval", "metrics", ["run_id", "step"],
                    sqlite_where=sa.text(EVAL_ONLY), postgresql_where=sa.text(EVAL_ONLY))


def downgrade() -> None:
    op.drop_index("ix_metrics_eval", table_name="metrics")
    op.create_index("ix_runs_fingerprint", "runs", ["fingerprint"])
    op.create_index("ix_runs_sweep_id", "runs", ["sweep_id"])
    op.create_index("ix_metrics_run_id", "metrics", ["run_id"])
    for column in ("last_eval_loss", "last_train_loss", "last_elapsed_seconds", "last_step"):
        op.drop_column("runs", column)
