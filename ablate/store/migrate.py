"""Schema revisions (Alembic, `migrations/`) and the two ways to open a database at this code's revision:
`connect` (brings it there, under a lock, so concurrent processes may all call it) and `reader` (never
creates, migrates or writes)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from ablate.config.errors import AblateError
from ablate.store.engine import describe_url, sqlite_path, explain, make_engine, redact, resolve_url

_ENGINES: dict[str, sa.Engine] = {}
_READERS: dict[str, sa.Engine] = {}


def _check_reachable(engine: sa.Engine, url: str) -> None:
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise AblateError(
            f"cannot reach the results database {describe_url(url)}: {redact(reason)}. "
            "Start the server (or fix ABLATE_DB_URL / --db), or use the default SQLite file by unsetting ABLATE_DB_URL."
        ) from None


def connect(url: str | None = None, upgrade: bool = True) -> sa.Engine:
    """An engine on a reachable database at the current schema revision (upgrading it if needed).

    Engines are kept per URL for the life of the process: reachability and the schema are checked once.
    """
    url = resolve_url(url)
    if upgrade and url in _ENGINES:
        return _ENGINES[url]
    engine = make_engine(url)
    _check_reachable(engine, url)
    if upgrade:
        upgrade_schema(engine)
        _ENGINES[url] = engine
    return engine


def opened_engines() -> list[sa.Engine]:
    """Every engine this process keeps open, writers first."""
    return [*_ENGINES.values(), *_READERS.values()]


def close_engines() -> None:
    """Close the connections of every engine this process keeps (before leaving without the interpreter's teardown)."""
    for engine in opened_engines():
        engine.dispose()


def reader(url: str | None = None) -> sa.Engine:
    """An engine for reading commands: it never creates, migrates or writes the database it opens.

    The database must exist and hold ablate's schema at this code's revision; otherwise one clear message.
    """
    url = resolve_url(url)
    if url in _READERS:
        return _READERS[url]
    engine = make_engine(url, read_only=True)
    _check_reachable(engine, url)
    if stored_revision(engine) == SCHEMA_HEAD:
        _READERS[url] = engine
        return engine
    current, head = current_revision(engine), head_revision(engine)
    if current is None:
        foreign = set(sa.inspect(engine).get_table_names())
        raise AblateError(f"{describe_url(url)} is not an ablate results database" + (
            f" (it has tables {', '.join(sorted(foreign)[:6])} but no {VERSION_TABLE})" if foreign else " (it is empty)")
            + "; run a sweep first, or point --db / ABLATE_DB_URL at the results database")
    if current != head:
        _check_known_revision(engine, current, head)
        raise AblateError(f"{describe_url(url)} is at schema revision {current}, older than this ablate's {head}: "
                          "run `ablate db upgrade` once (reading commands never migrate)")
    _READERS[url] = engine
    return engine


# ---------------------------------------------------------------- schema revisions (Alembic)


def _check_known_revision(engine: sa.Engine, current: str, head: str) -> None:
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    try:
        ScriptDirectory.from_config(_alembic_config(engine)).get_revision(current)
    except CommandError:
        raise AblateError(f"{describe_url(str(engine.url))} is at schema revision {current}, newer than this ablate knows "
                          f"(its newest is {head}): it was written by a newer ablate; upgrade ablate "
                          "(pip install -U ablate, or pull) to use it") from None


def migrate_lock(db: Path) -> Path:
    """Where the processes migrating a SQLite file meet: in the temporary folder, named by the file's resolved path,
    not beside the database (a lock file there outlives the lock and litters the user's results folder)."""
    import hashlib
    import tempfile

    key = hashlib.sha256(str(db.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"ablate-migrate-{key}.lock"


@contextmanager
def _schema_lock(engine: sa.Engine) -> Iterator[None]:
    """Serialise migrations across processes: a file lock for SQLite, an advisory lock for Postgres."""
    path = sqlite_path(engine.url)
    if path is not None:
        from filelock import FileLock

        with FileLock(str(migrate_lock(path)), timeout=120):
            yield
    elif engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(727101)"))
            try:
                yield
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(727101)"))
                conn.commit()
    else:
        yield


# Ablate's Alembic revision lives in its own table: Optuna's storage (searches share the results DB)
# keeps its own schema revision in Alembic's default `alembic_version`.
VERSION_TABLE = "ablate_alembic_version"
OWN_TABLES = ("sweeps", "runs", "metrics", "ablate_meta", "run_results", "best_runs", "eval_curve")


def _alembic_config(engine: sa.Engine):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


SCHEMA_HEAD = "0014"  # the newest migration (a test checks it against Alembic's head)


def stored_revision(engine: sa.Engine) -> str | None:
    """The database's schema revision by one plain query (None: no ablate schema, or not readable)."""
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    except SQLAlchemyError:
        return None


def current_revision(engine: sa.Engine) -> str | None:
    from alembic.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def head_revision(engine: sa.Engine) -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config(engine)).get_current_head()


def _migration_engine(engine: sa.Engine) -> sa.Engine:
    """SQLite: an engine whose transactions really hold DDL (pysqlite commits before each CREATE/ALTER by
    itself), so a migration that fails half-way leaves the database as it was; foreign keys off, as
    SQLite's table rebuilds require."""
    if sqlite_path(engine.url) is None:
        return engine
    mig = sa.create_engine(engine.url, connect_args={"timeout": 60})

    @event.listens_for(mig, "connect")
    def _manual(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # we say BEGIN ourselves

    @event.listens_for(mig, "begin")
    def _begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return mig


def upgrade_schema(engine: sa.Engine) -> str:
    """Bring the database to the newest schema; returns the revision it is at."""
    if stored_revision(engine) == SCHEMA_HEAD:  # the common case, without loading Alembic (trainers, readers)
        return SCHEMA_HEAD
    head = head_revision(engine)
    current = current_revision(engine)
    if current == head:
        return head
    if current is not None:
        _check_known_revision(engine, current, head)
    from alembic import command

    with _schema_lock(engine):
        current = current_revision(engine)
        if current != head:
            if current is None:
                clash = sorted(set(sa.inspect(engine).get_table_names()) & set(OWN_TABLES))
                if clash:
                    raise AblateError(f"{describe_url(str(engine.url))} already has table(s) {', '.join(clash)} that ablate "
                                      f"did not create (no {VERSION_TABLE}); point --db / ABLATE_DB_URL at another "
                                      "database (or a new SQLite file)")
            cfg = _alembic_config(engine)
            mig = _migration_engine(engine)
            try:
                with mig.begin() as conn:
                    cfg.attributes["connection"] = conn
                    command.upgrade(cfg, "head")
            except SQLAlchemyError as exc:
                hint = explain(exc, str(engine.url))
                reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
                raise AblateError(hint or f"migrating {describe_url(str(engine.url))} from {current or 'empty'} to {head} "
                                          f"failed and was rolled back: {redact(reason)}") from None
            finally:
                if mig is not engine:
                    mig.dispose()
    return head


READER_ROLE = "ablate_reader"  # `ablate sql` runs as this role on PostgreSQL (migration 0005)


def grant_reader(engine: sa.Engine, names: Iterable[str]) -> None:
    """On PostgreSQL, let the reader role SELECT these tables (Optuna's, made after the migrations by a search),
    those of them that exist, and nothing more: ablate's own tables it may read were granted by the migrations
    (ablate_meta and the stored plugin code stay out of its reach)."""
    if engine.dialect.name != "postgresql":
        return
    tables = sorted(set(names) & set(sa.inspect(engine).get_table_names()))
    if not tables:
        return
    with engine.begin() as conn:
        conn.execute(sa.text(
            f"DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN "
            f"GRANT SELECT ON {', '.join(tables)} TO {READER_ROLE}; END IF; "
            "EXCEPTION WHEN insufficient_privilege THEN NULL; END $$"))
