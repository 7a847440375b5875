"""The results database: SQLAlchemy models, engine from URL, migrations, and the few writes the chain needs.

SQLite file by default (`results/ablate.db`, WAL, busy timeout); any SQLAlchemy URL through
`ABLATE_DB_URL` or `--db`. The schema is owned by Alembic (`migrations/`); `connect`
brings a database to the current revision under a lock, so concurrent processes may all call it.
Torch-free: of ablate it imports only `ablate.config` (errors; the trial fingerprint, when registering).

- `schema.py`: the tables (Sweep, Run, Metric, Meta) and the run statuses.
- `engine.py`: URLs, engines, sessions, the database's identity, errors in a user's words.
- `migrate.py`: schema revisions and upgrades; `connect` (migrates) and `reader` (never writes).
- `register.py`: a sweep and its pending runs, with the code and library versions they ran.
- `plugins.py`: the plugin rows registration writes (sources, facts; its caller finds them) and their lookups.
- `claims.py`: runs while they train: claims, heartbeats, liveness, updates, metric points.
- `readlogin.py`: the read-only PostgreSQL login that `ablate sql` uses.
- `lookup.py`: a sweep by its name, with the one error for a name that is not there.
"""

from __future__ import annotations

from ablate.store.claims import (
    claim_run,
    get_run,
    heartbeat,
    heartbeat_seconds,
    is_live,
    new_claimant,
    pid_alive,
    stale_before,
    stale_seconds,
    trainer_running,
    update_run,
    write_metrics,
)
from ablate.store.engine import (
    DEFAULT_URL,
    database_id,
    describe_url,
    explain,
    make_engine,
    redact,
    resolve_url,
    session_factory,
)
from ablate.store.lookup import sweep_named
from ablate.store.migrate import (
    OWN_TABLES,
    READER_ROLE,
    SCHEMA_HEAD,
    VERSION_TABLE,
    close_engines,
    connect,
    current_revision,
    grant_reader,
    head_revision,
    reader,
    stored_revision,
    upgrade_schema,
)
from ablate.store.plugins import PluginRecords
from ablate.store.register import (
    analyze,
    code_version,
    copy_rows,
    drop_stale_runs,
    library_versions,
    register_sweep,
    run_row,
)
from ablate.store.race import read_decisions, record_decisions
from ablate.store.study import keep_study
from ablate.store.schema import (FINISHED, OWED_UNSTARTED, RUN_STATUSES, Base, Meta, Metric, RaceDecision, Run,
                                 StudyCache, Sweep, utcnow)

__all__ = [
    "DEFAULT_URL", "FINISHED", "OWED_UNSTARTED", "OWN_TABLES", "PluginRecords", "READER_ROLE",
    "RUN_STATUSES", "SCHEMA_HEAD", "VERSION_TABLE", "Base", "Meta", "Metric", "RaceDecision", "Run", "StudyCache", "Sweep",
    "analyze", "claim_run", "close_engines", "code_version", "connect", "copy_rows", "current_revision",
    "database_id", "describe_url", "drop_stale_runs", "explain", "get_run", "grant_reader", "head_revision", "heartbeat",
    "heartbeat_seconds", "is_live", "keep_study",
    "library_versions", "make_engine", "new_claimant", "pid_alive", "read_decisions", "reader", "record_decisions", "redact",
    "register_sweep", "resolve_url", "run_row", "session_factory", "stale_before", "stale_seconds", "stored_revision",
    "sweep_named",
    "trainer_running", "update_run", "upgrade_schema", "utcnow", "write_metrics",
]
