"""Views for the common questions: run_results, best_runs, eval_curve

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

RUN_RESULTS = """
CREATE VIEW run_results AS
SELECT s.name AS sweep, r.id AS run_id, r.architecture, r.objective, r.d_model, r.layers, r.heads, r.context,
       r.lr, r.batch_size, r.seed, r.status, r.final_train_loss, r.final_eval_loss, r.steps, r.tokens,
       r.train_seconds, r.tokens_per_second, r.mfu, r.params, r.inter_token_params, r.peak_memory_mb,
       r.hardware, r.gpus, r.budget_kind, r.budget_amount, r.finished_at
FROM runs r JOIN sweeps s ON s.id = r.sweep_id
"""

BEST_RUNS = """
CREATE VIEW best_runs AS
SELECT * FROM (
    SELECT rr.*, ROW_NUMBER() OVER (PARTITION BY rr.sweep, rr.architecture ORDER BY rr.final_eval_loss) AS rank
    FROM run_results rr WHERE rr.status = 'completed' AND rr.final_eval_loss IS NOT NULL
) ranked WHERE rank = 1
"""

EVAL_CURVE = """
CREATE VIEW eval_curve AS
SELECT s.name AS sweep, r.id AS run_id, r.architecture, r.d_model, r.layers, r.heads, r.lr, m.step,
       m.elapsed_seconds, m.tokens, m.loss,
       CASE r.budget_kind
           WHEN 'wall_clock' THEN m.elapsed_seconds / r.budget_amount
           WHEN 'steps' THEN m.step / r.budget_amount
           WHEN 'tokens' THEN m.tokens / r.budget_amount
           ELSE m.tokens * r.flops_per_token / r.budget_amount
       END AS budget_fraction
FROM metrics m JOIN runs r ON r.id = m.run_id JOIN sweeps s ON s.id = r.sweep_id
WHERE m.split = 'eval'
"""


def upgrade() -> None:
    op.execute(RUN_RESULTS)
    op.execute(BEST_RUNS)
    op.execute(EVAL_CURVE)


def downgrade() -> None:
    for view in ("eval_curve", "best_runs", "run_results"):
        op.execute(f"DROP VIEW IF EXISTS {view}")
