"""initial schema: sweeps, runs, metrics

Revision ID: 0001
Revises: 
Create Date: 2026-11-22 15:47:18.200464
"""

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('sweeps',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('spec_fingerprint', sa.String(length=32), nullable=False),
    sa.Column('spec_path', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('sweep_id', sa.Integer(), nullable=False),
    sa.Column('fingerprint', sa.String(length=32), nullable=False),
    sa.Column('trial_index', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('architecture', sa.String(length=64), nullable=False),
    sa.Column('objective', sa.String(length=32), nullable=False),
    sa.Column('d_model', sa.Integer(), nullable=False),
    sa.Column('layers', sa.Integer(), nullable=False),
    sa.Column('heads', sa.Integer(), nullable=True),
    sa.Column('context', sa.Integer(), nullable=False),
    sa.Column('lr', sa.Double(), nullable=False),
    sa.Column('batch_size', sa.Integer(), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('options', sa.JSON(), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('hardware', sa.String(length=64), nullable=False),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('budget_kind', sa.String(length=16), nullable=False),
    sa.Column('budget_amount', sa.Double(), nullable=False),
    sa.Column('host', sa.String(length=200), nullable=True),
    sa.Column('device_name', sa.String(length=200), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('started_at', sa.DateTime(), nullable=True),
    sa.Column('finished_at', sa.DateTime(), nullable=True),
    sa.Column('train_seconds', sa.Double(), nullable=True),
    sa.Column('startup_seconds', sa.Double(), nullable=True),
    sa.Column('compile_seconds', sa.Double(), nullable=True),
    sa.Column('eval_seconds', sa.Double(), nullable=True),
    sa.Column('checkpoint_seconds', sa.Double(), nullable=True),
    sa.Column('data_wait_fraction', sa.Double(), nullable=True),
    sa.Column('steps', sa.Integer(), nullable=True),
    sa.Column('tokens', sa.BigInteger(), nullable=True),
    sa.Column('samples', sa.BigInteger(), nullable=True),
    sa.Column('tokens_per_second', sa.Double(), nullable=True),
    sa.Column('flops_per_token', sa.Double(), nullable=True),
    sa.Column('mfu', sa.Double(), nullable=True),
    sa.Column('final_train_loss', sa.Double(), nullable=True),
    sa.Column('final_eval_loss', sa.Double(), nullable=True),
    sa.Column('peak_memory_mb', sa.Double(), nullable=True),
    sa.Column('params', sa.BigInteger(), nullable=True),
    sa.Column('inter_token_params', sa.BigInteger(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('notes', sa.JSON(), nullable=True),
    sa.Column('checkpoint_path', sa.Text(), nullable=True),
    sa.Column('code_version', sa.String(length=64), nullable=True),
    sa.Column('library_versions', sa.JSON(), nullable=True),
    sa.Column('study_name', sa.String(length=200), nullable=True),
    sa.Column('study_trial', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('sweep_id', 'fingerprint', name='uq_runs_sweep_fingerprint')
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_architecture'), ['architecture'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_fingerprint'), ['fingerprint'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_status'), ['status'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_study_name'), ['study_name'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_sweep_id'), ['sweep_id'], unique=False)

    op.create_table('metrics',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('split', sa.String(length=16), nullable=False),
    sa.Column('elapsed_seconds', sa.Double(), nullable=False),
    sa.Column('tokens', sa.BigInteger(), nullable=False),
    sa.Column('loss', sa.Double(), nullable=False),
    sa.Column('lr', sa.Double(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'split', 'step', name='uq_metrics_run_split_step')
    )
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_metrics_run_id'), ['run_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_metrics_run_id'))

    op.drop_table('metrics')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_sweep_id'))
        batch_op.drop_index(batch_op.f('ix_runs_study_name'))
        batch_op.drop_index(batch_op.f('ix_runs_status'))
        batch_op.drop_index(batch_op.f('ix_runs_fingerprint'))
        batch_op.drop_index(batch_op.f('ix_runs_architecture'))

    op.drop_table('runs')
    op.drop_table('sweeps')
