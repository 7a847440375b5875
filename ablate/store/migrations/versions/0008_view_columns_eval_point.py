"""Views that answer what users asked of them: `run_results` gains error, options, attempts, study_name,
precision and final_eval_accuracy; eval metric points record which `eval.at` budget fraction they are
(metrics.eval_point; 1.0 for the final eval), which `eval_curve` shows, so "the loss at 50%" is one row per run
however coarse its steps

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

import importlib.util
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

READER_ROLE = "ablate_reader"
VIEWS = ("run_results", "best_runs", "eval_curve")

RUN_RESULTS = """
CREATE VIEW run_results AS
SELECT s.name AS sweep, r.id AS run_id, r.architecture, r.objective, r.options, r.d_model, r.layers, r.heads,
       r.context, r.lr, r.batch_size, r.seed, r.status, r.error, r.attempts, r.final_train_loss, r.final_eval_loss,
       r.final_eval_accuracy, r.steps, r.tokens, r.train_seconds, r.tokens_per_second, r.mfu, r.params,
       r.inter_token_params, r.peak_memory_mb, r.precision, r.hardware, r.gpus, r.budget_kind, r.budget_amount,
       r.study_name, r.study_trial, r.finished_at
FROM runs r JOIN sweeps s ON s.id = r.sweep_id
"""



def _views_0003():
    """The 0003 migration's view definitions (best_runs is unchanged; a downgrade restores the others)."""
    spec = importlib.util.spec_from_file_location("views_0003", Path(__file__).with_name("0003_views.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _replace(run_results: str, eval_curve: str) -> None:
    for view in reversed(VIEWS):  # best_runs reads run_results
        op.execute(f"DROP VIEW IF EXISTS {view}")
    op.execute(run_results)
    op.execute(_views_0003().BEST_RUNS)
    op.execute(eval_curve)
    if op.get_bind().dialect.name == "postgresql":  # new views: the reader role's SELECT again, where it exists
        op.execute(f"DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN "
                   f"GRANT SELECT ON {', '.join(VIEWS)} TO {READER_ROLE}; END IF; "
                   "EXCEPTION WHEN insufficient_privilege THEN NULL; END $$")


def upgrade() -> None:
    op.add_column("metrics", sa.Column("eval_point", sa.Double(), nullable=True))
    # eval_curve as 0003 made it, with the eval.at point of each row
    eval_curve = _views_0003().EVAL_CURVE.replace("m.loss,", "m.loss, m.eval_point,")
    assert "m.eval_point" in eval_curve
    _replace(RUN_RESULTS, eval_curve)


def downgrade() -> None:
    old = _views_0003()
    for view in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {view}")
    with op.batch_alter_table("metrics") as batch:
        batch.drop_column("eval_point")
    _replace(old.RUN_RESULTS, old.EVAL_CURVE)
