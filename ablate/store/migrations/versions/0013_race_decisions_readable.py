"""`ablate sql` reads race_decisions: the reader role may SELECT it on PostgreSQL; and not ablate's own tables

A search used to grant the reader every table in the schema (for Optuna's): on a database where one ran, the
reader could read ablate_meta, the Alembic version and the stored plugin code. Those grants are taken back.

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
NOT_READABLE = ("ablate_meta", "ablate_alembic_version", "plugin_sources", "plugin_facts")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite's `ablate sql` reads every table through its authorizer
    op.execute(f"DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN "
               f"GRANT SELECT ON race_decisions TO {READER_ROLE}; "
               f"REVOKE ALL ON {', '.join(NOT_READABLE)} FROM {READER_ROLE}; END IF; "
               "EXCEPTION WHEN insufficient_privilege THEN NULL; END $$")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN "
               f"REVOKE SELECT ON race_decisions FROM {READER_ROLE}; END IF; "
               "EXCEPTION WHEN insufficient_privilege THEN NULL; END $$")
