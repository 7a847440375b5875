"""`ablate sql` reads race_decisions: the reader role may SELECT it on PostgreSQL

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

READER_ROLE = "ablate_reader"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite's `ablate sql` reads every table through its authorizer
    op.execute(f"DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN "
               f"GRANT SELECT ON race_decisions TO {READER_ROLE}; END IF; "
               "EXCEPTION WHEN insufficient_privilege THEN NULL; END $$")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN "
               f"REVOKE SELECT ON race_decisions FROM {READER_ROLE}; END IF; "
               "EXCEPTION WHEN insufficient_privilege THEN NULL; END $$")
