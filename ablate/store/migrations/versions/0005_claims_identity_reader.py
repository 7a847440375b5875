"""Run claims (runs.claimed_by, runs.heartbeat_at), the database's identity (ablate_meta.db_id), and on
PostgreSQL the read-only role `ablate_reader` that `ablate sql` runs as

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

READER_ROLE = "ablate_reader"
READABLE = ("sweeps", "runs", "metrics", "run_results", "best_runs", "eval_curve")


def upgrade() -> None:
    op.add_column("runs", sa.Column("claimed_by", sa.String(200), nullable=True))
    op.add_column("runs", sa.Column("heartbeat_at", sa.DateTime(), nullable=True))
    meta = op.create_table("ablate_meta", sa.Column("key", sa.String(64), primary_key=True),
                           sa.Column("value", sa.Text(), nullable=False))
    # artifacts (checkpoints) are keyed by this id: run ids restart at 1 in every results database
    op.bulk_insert(meta, [{"key": "db_id", "value": uuid.uuid4().hex}])
    if op.get_bind().dialect.name == "postgresql":
        _grant_reader()


def _grant_reader() -> None:
    """Create the role (where the migrating user may) and let it SELECT the results tables and views only."""
    conn = op.get_bind()
    exists = conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": READER_ROLE}).scalar()
    if not exists:
        may = conn.execute(sa.text("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user")).scalar()
        if not may:
            return  # `ablate sql` then runs in a read-only transaction as the connecting user
        conn.execute(sa.text(f"CREATE ROLE {READER_ROLE} NOLOGIN"))
    conn.execute(sa.text(f"GRANT USAGE ON SCHEMA public TO {READER_ROLE}"))
    conn.execute(sa.text(f"GRANT SELECT ON {', '.join(READABLE)} TO {READER_ROLE}"))
    # so this user may SET ROLE to it (a role made by an administrator may already be granted, or not grantable)
    conn.execute(sa.text(f"DO $$ BEGIN GRANT {READER_ROLE} TO current_user; EXCEPTION WHEN OTHERS THEN NULL; END $$"))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        exists = op.get_bind().execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": READER_ROLE}).scalar()
        if exists:
            op.execute(f"REVOKE SELECT ON {', '.join(READABLE)} FROM {READER_ROLE}")
    op.drop_table("ablate_meta")
    op.drop_column("runs", "heartbeat_at")
    op.drop_column("runs", "claimed_by")
