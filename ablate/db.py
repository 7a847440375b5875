"""The results database: SQLAlchemy models, engine from URL, migrations, and the few writes the chain needs.

SQLite file by default (`results/ablate.db`, WAL, busy timeout); any SQLAlchemy URL through
`ABLATE_DB_URL` or `--db`. The schema is owned by Alembic (`ablate/migrations`); `connect`
brings a database to the current revision under a lock, so concurrent processes may all call it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import socket
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from ablate.errors import AblateError

DEFAULT_URL = "sqlite:///results/ablate.db"
RUN_STATUSES = ("pending", "running", "completed", "oom", "diverged", "failed", "preempted", "cancelled", "pruned")
FINISHED = ("completed", "oom", "diverged", "pruned")  # results: a re-run of the sweep skips these (pruned: by a search)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: sa.JSON}


class Sweep(Base):
    __tablename__ = "sweeps"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), unique=True)
    description: Mapped[str] = mapped_column(sa.Text, default="")
    spec: Mapped[dict[str, Any]] = mapped_column(sa.JSON)  # the validated spec, as JSON
    spec_fingerprint: Mapped[str] = mapped_column(sa.String(32))
    spec_path: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Run(Base):
    """One trial of a sweep. The sweep axes are real columns so SQL can group and filter on them."""

    __tablename__ = "runs"
    __table_args__ = (sa.UniqueConstraint("sweep_id", "fingerprint", name="uq_runs_sweep_fingerprint"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(sa.ForeignKey("sweeps.id", ondelete="CASCADE"))  # uq_runs_sweep_fingerprint
    fingerprint: Mapped[str] = mapped_column(sa.String(32))
    trial_index: Mapped[int] = mapped_column(default=0)
    status: Mapped[str] = mapped_column(sa.String(16), default="pending", index=True)
    # axes
    architecture: Mapped[str] = mapped_column(sa.String(64), index=True)
    objective: Mapped[str] = mapped_column(sa.String(32))
    d_model: Mapped[int]
    layers: Mapped[int]
    heads: Mapped[int | None]
    context: Mapped[int]
    lr: Mapped[float]
    batch_size: Mapped[int]
    seed: Mapped[int]
    options: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    config: Mapped[dict[str, Any]] = mapped_column(sa.JSON)  # the full frozen trial config
    # where and how
    hardware: Mapped[str] = mapped_column(sa.String(64))
    gpus: Mapped[int] = mapped_column(default=1)
    budget_kind: Mapped[str] = mapped_column(sa.String(16))
    budget_amount: Mapped[float]  # seconds, tokens, steps or FLOPs
    host: Mapped[str | None] = mapped_column(sa.String(200))
    device_name: Mapped[str | None] = mapped_column(sa.String(200))
    attempts: Mapped[int] = mapped_column(default=0)
    pid: Mapped[int | None]  # the trainer process while running (cancel signals it)
    claimed_by: Mapped[str | None] = mapped_column(sa.String(200))  # host:pid:nonce of the process that trains it
    heartbeat_at: Mapped[dt.datetime | None]  # the claimant's last sign of life (UTC); stale: the run is owed again
    threads: Mapped[int | None]  # torch intra-op threads of the trainer (CPU share of this trial)
    precision: Mapped[str | None] = mapped_column(sa.String(8))  # what ran: bf16, fp16 (with a scaler) or fp32
    # timings (seconds); train_seconds is the budget clock
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    train_seconds: Mapped[float | None]
    startup_seconds: Mapped[float | None]
    compile_seconds: Mapped[float | None]
    eval_seconds: Mapped[float | None]
    checkpoint_seconds: Mapped[float | None]
    data_wait_fraction: Mapped[float | None]
    # outcome
    steps: Mapped[int | None]
    tokens: Mapped[int | None] = mapped_column(sa.BigInteger)
    samples: Mapped[int | None] = mapped_column(sa.BigInteger)
    tokens_per_second: Mapped[float | None]
    flops_per_token: Mapped[float | None]
    mfu: Mapped[float | None]
    final_train_loss: Mapped[float | None]
    final_eval_loss: Mapped[float | None]
    final_eval_accuracy: Mapped[float | None]  # classification runs: the fraction of eval rows classified right
    # the latest logged points, kept by write_metrics so status tables never aggregate the metrics table
    last_step: Mapped[int | None]
    last_elapsed_seconds: Mapped[float | None]
    last_train_loss: Mapped[float | None]
    last_eval_loss: Mapped[float | None]
    epochs: Mapped[float | None]  # passes over the training rows (> 1: the run saw its data more than once)
    peak_memory_mb: Mapped[float | None]
    params: Mapped[int | None] = mapped_column(sa.BigInteger)
    inter_token_params: Mapped[int | None] = mapped_column(sa.BigInteger)
    error: Mapped[str | None] = mapped_column(sa.Text)
    notes: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)  # e.g. on_oom shrink events
    checkpoint_path: Mapped[str | None] = mapped_column(sa.Text)
    # reproducibility
    code_version: Mapped[str | None] = mapped_column(sa.String(64))
    library_versions: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    # search linkage (Optuna study name and trial number)
    study_name: Mapped[str | None] = mapped_column(sa.String(200), index=True)
    study_trial: Mapped[int | None]


class Metric(Base):
    """One logged point of a run's curve. (run, split, step) is unique: a resumed run never duplicates a point."""

    __tablename__ = "metrics"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "split", "step", name="uq_metrics_run_split_step"),  # also serves run_id alone
        sa.Index("ix_metrics_eval", "run_id", "step", sqlite_where=sa.text("split = 'eval'"),
                 postgresql_where=sa.text("split = 'eval'")),  # eval curves without scanning train points
        sa.Index("ix_metrics_eval_point", "eval_point", sqlite_where=sa.text("split = 'eval'"),
                 postgresql_where=sa.text("split = 'eval'")),  # "the loss at 50%" of every run (eval_curve)
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int]
    split: Mapped[str] = mapped_column(sa.String(16))  # train | eval
    elapsed_seconds: Mapped[float]  # budget clock at this point
    tokens: Mapped[int] = mapped_column(sa.BigInteger)
    loss: Mapped[float]
    lr: Mapped[float | None]
    eval_point: Mapped[float | None]  # eval rows: the eval.at budget fraction this eval is for (1.0: the final eval)


class Meta(Base):
    """Facts about the database itself: `db_id`, the identity that keys its runs' artifacts."""

    __tablename__ = "ablate_meta"
    key: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    value: Mapped[str] = mapped_column(sa.Text)


# ---------------------------------------------------------------- engine


def resolve_url(url: str | None = None) -> str:
    """--db beats ABLATE_DB_URL beats the default SQLite file; a bare path means a SQLite file."""
    url = url or os.environ.get("ABLATE_DB_URL") or DEFAULT_URL
    if "://" not in url:  # a path may hold URL syntax (`%`, `?`, `#`): escaped, the URL names that very file
        url = "sqlite:///" + url.replace("%", "%25").replace("?", "%3F").replace("#", "%23")
    return url


def _sqlite_path(url: sa.URL) -> Path | None:
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


def _wal(cur: Any, patience: float = 60.0) -> None:
    """Switch a SQLite file to WAL. On a new file that needs an exclusive lock, and SQLite answers "locked" at
    once (no busy wait) while another process creates or migrates the same file: wait for it here."""
    import sqlite3

    deadline = time.monotonic() + patience
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def make_engine(url: str | None = None, read_only: bool = False) -> sa.Engine:
    url_obj = sa.make_url(resolve_url(url))
    path = _sqlite_path(url_obj)
    if path is not None:
        if read_only:
            if not path.exists():
                raise AblateError(f"no results database at {path}; run a sweep first or pass --db URL")
            # mode=ro: SQLite itself refuses writes on this connection. The path is percent-encoded for SQLite's
            # URI (a `#` or `?` in it would start a fragment or the options) and passed as is, not re-parsed
            url_obj = sa.URL.create("sqlite", database=f"file:{urllib.parse.quote(str(path.resolve()))}",
                                    query={"mode": "ro", "uri": "true"})
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url_obj, connect_args={"timeout": 60}, json_deserializer=_json_loads)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # noqa: ANN001
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=60000")
            if not read_only:
                _wal(cur)
            cur.execute("PRAGMA foreign_keys=ON")
            if read_only:
                cur.execute("PRAGMA query_only=ON")
            cur.close()

        return engine
    kwargs: dict[str, Any] = {"pool_pre_ping": True, "json_deserializer": _json_loads}
    if read_only and url_obj.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"options": "-c default_transaction_read_only=on"}
    try:
        return sa.create_engine(url_obj, **kwargs)
    except (SQLAlchemyError, ImportError) as exc:
        raise AblateError(f"cannot use database URL {url_obj.render_as_string(hide_password=True)}: {exc}") from None


def _json_loads(text: str | bytes) -> Any:
    """A JSON column's value (each run's config, options and notes) with orjson: a fifth of Python's json's CPU over
    100,000 runs. What orjson refuses (NaN, which Python's json.dumps writes) is read by Python's json."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _describe(url: str) -> str:
    return sa.make_url(url).render_as_string(hide_password=True)


_PASSWORD = re.compile(r"(\w[\w+.-]*://[^:/@\s]*:)([^@\s]+)(@)")


def redact(text: str) -> str:
    """Text with the password of every database URL in it replaced by ***."""
    return _PASSWORD.sub(r"\1***\3", text)


def explain(exc: BaseException, url: str | None = None) -> str | None:
    """A user-facing sentence for a database error that is about the environment (read-only, full disk), else None."""
    reason = str(getattr(exc, "orig", None) or exc).strip()
    lowered = reason.lower().replace("-", "").replace(" ", "")
    where = _describe(resolve_url(url))
    if "readonly" in lowered:
        return (f"the results database {where} is read-only ({reason.splitlines()[0]}): point --db / ABLATE_DB_URL at a "
                "writable database; reading commands (sql, report, sweep status) work on a read-only one")
    if "diskisfull" in lowered or "nospaceleft" in lowered or "diskfull" in lowered:
        return (f"the disk is full ({reason.splitlines()[0]}): free space and run the same command "
                "again; finished runs are kept and unfinished ones resume from their last checkpoint")
    return None


_ENGINES: dict[str, sa.Engine] = {}
_READERS: dict[str, sa.Engine] = {}


def _check_reachable(engine: sa.Engine, url: str) -> None:
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise AblateError(
            f"cannot reach the results database {_describe(url)}: {redact(reason)}. "
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


def close_engines() -> None:
    """Close the connections of every engine this process keeps (before leaving without the interpreter's teardown)."""
    for engine in [*_ENGINES.values(), *_READERS.values()]:
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
        raise AblateError(f"{_describe(url)} is not an ablate results database" + (
            f" (it has tables {', '.join(sorted(foreign)[:6])} but no {VERSION_TABLE})" if foreign else " (it is empty)")
            + "; run a sweep first, or point --db / ABLATE_DB_URL at the results database")
    if current != head:
        _check_known_revision(engine, current, head)
        raise AblateError(f"{_describe(url)} is at schema revision {current}, older than this ablate's {head}: "
                          "run `ablate db upgrade` once (reading commands never migrate)")
    _READERS[url] = engine
    return engine


def _check_known_revision(engine: sa.Engine, current: str, head: str) -> None:
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    try:
        ScriptDirectory.from_config(_alembic_config(engine)).get_revision(current)
    except CommandError:
        raise AblateError(f"{_describe(str(engine.url))} is at schema revision {current}, newer than this ablate knows "
                          f"(its newest is {head}): it was written by a newer ablate; upgrade ablate "
                          "(pip install -U ablate, or pull) to use it") from None


@contextmanager
def _schema_lock(engine: sa.Engine) -> Iterator[None]:
    """Serialise migrations across processes: a file lock for SQLite, an advisory lock for Postgres."""
    path = _sqlite_path(engine.url)
    if path is not None:
        from filelock import FileLock

        with FileLock(str(path) + ".migrate.lock", timeout=120):
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


SCHEMA_HEAD = "0009"  # the newest migration (a test checks it against Alembic's head)


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
    if _sqlite_path(engine.url) is None:
        return engine
    mig = sa.create_engine(engine.url, connect_args={"timeout": 60})

    @event.listens_for(mig, "connect")
    def _manual(dbapi_conn, _record):  # noqa: ANN001
        dbapi_conn.isolation_level = None  # we say BEGIN ourselves

    @event.listens_for(mig, "begin")
    def _begin(conn):  # noqa: ANN001
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
                    raise AblateError(f"{_describe(str(engine.url))} already has table(s) {', '.join(clash)} that ablate "
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
                raise AblateError(hint or f"migrating {_describe(str(engine.url))} from {current or 'empty'} to {head} "
                                          f"failed and was rolled back: {redact(reason)}") from None
            finally:
                if mig is not engine:
                    mig.dispose()
    return head


READER_ROLE = "ablate_reader"  # `ablate sql` runs as this role on PostgreSQL (migration 0005)


def grant_reader(engine: sa.Engine) -> None:
    """On PostgreSQL, let the reader role SELECT every table here, Optuna's too (made after the migrations)."""
    if engine.dialect.name != "postgresql":
        return
    with engine.begin() as conn:
        conn.execute(sa.text(
            f"DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN "
            f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READER_ROLE}; END IF; "
            "EXCEPTION WHEN insufficient_privilege THEN NULL; END $$"))


_IDS: dict[str, str] = {}  # database id per URL, read once per process


def database_id(engine: sa.Engine) -> str:
    """The database's own identity (made by its migration), which keys its runs' artifacts."""
    key = str(engine.url)
    if key not in _IDS:
        with engine.connect() as conn:
            _IDS[key] = conn.execute(sa.select(Meta.value).where(Meta.key == "db_id")).scalar_one()
    return _IDS[key]


def session_factory(engine: sa.Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


# ---------------------------------------------------------------- writes


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "datasets", "tokenizers", "prefect", "optuna", "sqlalchemy", "ablate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def code_version() -> str | None:
    """The git commit of the ablate checkout, with '+dirty' when the tree has changes; without a checkout (a
    container image), the version stamped at build time (ABLATE_CODE_VERSION)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    stamp = os.environ.get("ABLATE_CODE_VERSION") or None
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return stamp
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        return sha.stdout.strip()[:12] + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return stamp


def register_sweep(engine: sa.Engine, spec: Any, trials: Iterable[Any], spec_path: str | None = None,
                   merge: bool = False) -> tuple[int, list[int]]:
    """Insert (or update) the sweep and one pending run per new trial fingerprint, atomically.

    Idempotent: trials already registered keep their row and status. Returns (sweep id, run ids in trial order).
    Processes registering the same sweep at the same moment all succeed (the loser of a race retries).
    A spec that would leave results (finished or running runs) of trials it no longer has under its name (a
    modified copy, or an edit of a sweep that has results) is refused unless `merge`: one name, one experiment.
    """
    trials = list(trials)
    for attempt in range(5):
        try:
            return _register_once(engine, spec, trials, spec_path, merge)
        except sa.exc.IntegrityError:  # another process inserted the sweep or a run first: read theirs
            if attempt == 4:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _register_once(engine: sa.Engine, spec: Any, trials: list[Any], spec_path: str | None,
                   merge: bool = False) -> tuple[int, list[int]]:
    from ablate.spec import trial_fingerprint

    versions = library_versions()
    code = code_version()
    configs = [t.model_dump(mode="json") for t in trials]  # each trial dumped once: its fingerprint and row
    fps = [trial_fingerprint(c) for c in configs]
    with session_factory(engine)() as session, session.begin():
        sweep = session.scalar(sa.select(Sweep).where(Sweep.name == spec.name))
        if sweep is None:
            sweep = Sweep(name=spec.name)
            session.add(sweep)
        elif not merge and spec.search is None and sweep.spec_fingerprint != spec.fingerprint():
            _refuse_mixing(session, sweep, trials, set(fps), spec_path)
        sweep.description = spec.description
        sweep.spec = spec.model_dump(mode="json")
        sweep.spec_fingerprint = spec.fingerprint()
        sweep.spec_path = spec_path
        session.flush()
        ids = dict(session.execute(sa.select(Run.fingerprint, Run.id).where(Run.sweep_id == sweep.id)).all())
        rows, seen = [], set(ids)
        for index, (trial, config, fp) in enumerate(zip(trials, configs, fps)):
            if fp not in seen:
                seen.add(fp)
                rows.append(run_row(trial, config, fp, sweep.id, index, code, versions))
        if rows and engine.dialect.driver == "psycopg":  # COPY: 10,000 rows in ~0.2 CPU-s instead of ~2.4
            copy_rows(session.connection(), Run.__table__, rows)
            ids.update(session.execute(sa.select(Run.fingerprint, Run.id).where(Run.sweep_id == sweep.id)).all())
        else:  # one multi-row INSERT .. RETURNING per chunk, not a flush per row
            for start in range(0, len(rows), 5000):
                result = session.execute(sa.insert(Run).returning(Run.fingerprint, Run.id), rows[start:start + 5000])
                ids.update(result.all())
    if len(rows) >= 1000 and engine.dialect.name == "sqlite":
        analyze(engine)  # PostgreSQL's autovacuum does this by itself
    return sweep.id, [ids[fp] for fp in fps]


def copy_rows(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """Insert `rows` (dicts of the same columns) with PostgreSQL's COPY, inside `conn`'s transaction (psycopg 3).

    A multi-row INSERT is mostly client work there: psycopg parses each statement's hundreds of thousands of
    placeholders in Python. A unique violation is raised as SQLAlchemy's IntegrityError, as an INSERT's would be."""
    import psycopg

    columns = list(rows[0])
    as_json = {c for c in columns if isinstance(table.c[c].type, sa.JSON)}
    quote = conn.dialect.identifier_preparer.quote
    statement = f"COPY {quote(table.name)} ({', '.join(quote(c) for c in columns)}) FROM STDIN"
    try:
        with conn.connection.driver_connection.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row([json.dumps(row[c]) if c in as_json and row[c] is not None else row[c]
                                for c in columns])
    except psycopg.IntegrityError as exc:
        raise sa.exc.IntegrityError(statement, None, exc) from exc


CELL_COLUMNS = ("architecture", "objective", "d_model", "layers", "heads", "context", "lr", "batch_size", "seed")


def _cell(values: Any) -> tuple[Any, ...]:
    """The table cell a run fills: its axis columns (an object with those attributes)."""
    return (*(getattr(values, c) for c in CELL_COLUMNS), json.dumps(dict(values.options or {}), sort_keys=True))


def _refuse_mixing(session: Session, sweep: Sweep, trials: list[Any], fps: set[str], spec_path: str | None) -> None:
    """An AblateError when the sweep holds results (finished or running runs) of other trials in the same cells as
    `trials`: the same axes with another budget, dataset, tokenizer or recipe. Reports would pick either.
    Removing or adding cells (an edited grid) is fine: the results of removed cells stay as results."""
    cells = {_cell(t): t for t in trials}
    clashes: dict[str, int] = {}
    for run in session.execute(sa.select(Run.fingerprint, Run.status, Run.options, *(getattr(Run, c) for c in CELL_COLUMNS))
                               .where(Run.sweep_id == sweep.id, Run.study_name.is_(None),
                                      Run.status.not_in(OWED_UNSTARTED))):
        if run.fingerprint not in fps and _cell(run) in cells:
            clashes[run.status] = clashes.get(run.status, 0) + 1
    if clashes:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(clashes.items()))
        where = f" (registered from {sweep.spec_path})" if sweep.spec_path and sweep.spec_path != spec_path else ""
        raise AblateError(
            f"sweep {sweep.name!r} already holds results for the same cells with other settings ({counts}){where}: "
            f"{spec_path or 'this spec'} changes something besides the grid axes (budget, dataset, tokenizer, "
            "recipe ...), and registering it would mix two experiments under one name, so reports would pick cells "
            "from either. Give this spec another `name:` (a deployment run: --param name=NEW, or an override, which "
            "names the sweep after itself), or add --merge (flow parameter merge=true) to add its trials on purpose")


def analyze(engine: sa.Engine) -> None:
    """Refresh SQLite's planner statistics after a large write (stale ones can pick a full scan)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")


OWED_UNSTARTED = ("pending", "failed", "cancelled", "preempted")  # owed work that holds no result


def drop_stale_runs(engine: sa.Engine, sweep_id: int, keep: set[int]) -> int:
    """Delete the sweep's grid runs not in `keep` (run ids of the trials its spec holds now) that hold no result
    (pending, failed, cancelled, preempted), with their metrics; finished runs stay as results. Returns how many."""
    with engine.begin() as conn:
        stale = [rid for rid in conn.execute(
            sa.select(Run.id).where(Run.sweep_id == sweep_id, Run.study_name.is_(None),
                                    Run.status.in_(OWED_UNSTARTED))).scalars() if rid not in keep]
        if stale:
            conn.execute(sa.delete(Metric).where(Metric.run_id.in_(stale)))
            conn.execute(sa.delete(Run).where(Run.id.in_(stale)))
    return len(stale)


def run_row(trial: Any, config: dict[str, Any], fp: str, sweep_id: int, index: int, code: str | None,
            versions: dict[str, str]) -> dict[str, Any]:
    """The columns of a new pending run of `trial` (`config`: its JSON dump, `fp`: its fingerprint)."""
    return dict(
        sweep_id=sweep_id, fingerprint=fp, trial_index=index, status="pending", attempts=0, gpus=trial.budget.gpus,
        architecture=trial.architecture, objective=trial.objective, d_model=trial.d_model, layers=trial.layers,
        heads=trial.heads, context=trial.context, lr=trial.lr, batch_size=trial.batch_size, seed=trial.seed,
        options=dict(trial.options), config=config, hardware=trial.budget.hardware,
        budget_kind=trial.budget.kind, budget_amount=trial.budget.amount, created_at=utcnow(),
        code_version=code, library_versions=versions,
    )


def update_run(engine: sa.Engine, run_id: int, claimant: str | None = None, **fields: Any) -> bool:
    """Set columns of a run; with `claimant`, only while that process still holds the run's claim.
    Returns whether the row was updated."""
    unknown = set(fields) - set(Run.__table__.columns.keys())
    if unknown:
        raise ValueError(f"not columns of runs: {sorted(unknown)}")
    where = [Run.id == run_id] + ([Run.claimed_by == claimant] if claimant is not None else [])
    with engine.begin() as conn:
        return conn.execute(sa.update(Run).where(*where).values(**fields)).rowcount == 1


# ---------------------------------------------------------------- claims: exactly one trainer per run

# how often a claimant says it is alive, and how long a silent `running` row takes to count as a dead process's (any
# host): it is owed again. ABLATE_HEARTBEAT_SECONDS / ABLATE_STALE_SECONDS change them (every host must agree).
HEARTBEAT_SECONDS = STALE_SECONDS = 0.0


def read_timing_env() -> None:
    """Set HEARTBEAT_SECONDS and STALE_SECONDS from the environment (at import, and in a forked trainer)."""
    global HEARTBEAT_SECONDS, STALE_SECONDS
    HEARTBEAT_SECONDS = float(os.environ.get("ABLATE_HEARTBEAT_SECONDS", "10"))
    STALE_SECONDS = float(os.environ.get("ABLATE_STALE_SECONDS", "90"))


read_timing_env()


def new_claimant() -> str:
    """An id for one claiming process: host, pid and a nonce (pids are reused)."""
    import uuid

    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def stale_before() -> dt.datetime:
    return utcnow() - dt.timedelta(seconds=STALE_SECONDS)


def is_live(run: Any) -> bool:
    """A running row whose claimant beat recently and, if it claimed on this host, still exists: some
    process (on any host) is training it. Anything else `running` belongs to a dead process."""
    return (run.status == "running" and run.heartbeat_at is not None and run.heartbeat_at >= stale_before()
            and not _dead_here(run.claimed_by, run.pid))


def trainer_running(run: Any) -> bool:
    """Whether the trainer of a row (whatever its status says, e.g. `cancelled` a moment ago) still runs: its
    pid exists when it was claimed on this host, else its heartbeat is fresh. A trainer clears `pid` as it ends."""
    if not run.pid:
        return False
    host, _, rest = (run.claimed_by or "").partition(":")
    if host == socket.gethostname():
        return pid_alive(run.pid)
    fresh = utcnow() - dt.timedelta(seconds=max(3 * HEARTBEAT_SECONDS, 5.0))
    return run.heartbeat_at is not None and run.heartbeat_at >= fresh


def _dead_here(claimed_by: str | None, pid: int | None) -> bool:
    """Whether a claim was made on this host by a process that is gone, and its trainer too."""
    host, _, rest = (claimed_by or "").partition(":")
    if host != socket.gethostname() or not rest.partition(":")[0].isdigit():
        return False
    return not pid_alive(int(rest.partition(":")[0])) and not pid_alive(pid)


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this id runs on this machine (a zombie counts until it is reaped)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim_run(engine: sa.Engine, run_id: int, claimant: str, statuses: Iterable[str] | None = None) -> bool:
    """Atomically take a run to train it: one conditional UPDATE, so of processes racing for the same run
    exactly one wins. A run may be taken from `statuses` (default: owed work that holds no result) or from a
    `running` row whose claimant is dead: its heartbeat is stale (any host), or it was made on this host by
    processes that no longer exist. The winner's row is `running`, attempt + 1."""
    allowed = tuple(statuses) if statuses is not None else OWED_UNSTARTED
    now = utcnow()
    takeable = sa.or_(Run.status.in_(allowed),
                      sa.and_(Run.status == "running", sa.or_(Run.heartbeat_at.is_(None), Run.heartbeat_at < stale_before())))
    with engine.connect() as conn:
        row = conn.execute(sa.select(Run.status, Run.claimed_by, Run.pid).where(Run.id == run_id)).first()
    if row is not None and row.status == "running" and _dead_here(row.claimed_by, row.pid):
        # its processes are gone from this host: take it over unless someone else did first (compare-and-set)
        takeable = sa.or_(takeable, sa.and_(Run.status == "running", Run.claimed_by == row.claimed_by))
    with engine.begin() as conn:
        won = conn.execute(sa.update(Run).where(Run.id == run_id, takeable).values(
            status="running", claimed_by=claimant, heartbeat_at=now, started_at=now, finished_at=None, error=None,
            host=socket.gethostname(), pid=None, attempts=Run.attempts + 1)).rowcount
    return won == 1


def heartbeat(engine: sa.Engine, run_id: int, claimant: str) -> str | None:
    """Say the claimant is alive; the run's status (`cancelled` when a user cancelled it meanwhile, from any
    host), or None when the claim was lost (another process took the run as stale)."""
    with engine.begin() as conn:
        if conn.execute(sa.update(Run).where(Run.id == run_id, Run.claimed_by == claimant)
                        .values(heartbeat_at=utcnow())).rowcount != 1:
            return None
        return conn.execute(sa.select(Run.status).where(Run.id == run_id)).scalar()


def write_metrics(engine: sa.Engine, run_id: int, rows: list[dict[str, Any]]) -> int:
    """Insert metric points in one transaction; points already present (same run, split, step) are skipped."""
    if not rows:
        return 0
    with engine.begin() as conn:
        have = {
            (s, st) for s, st in conn.execute(
                sa.select(Metric.split, Metric.step).where(
                    Metric.run_id == run_id, Metric.step >= min(r["step"] for r in rows)
                )
            )
        }
        fresh = [{"eval_point": None, **r, "run_id": run_id} for r in rows if (r["split"], r["step"]) not in have]
        if fresh:
            conn.execute(sa.insert(Metric), fresh)
        latest = _latest_fields(rows)
        if latest:
            conn.execute(sa.update(Run).where(Run.id == run_id).values(**latest))
    return len(fresh)


def _latest_fields(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run-row columns that mirror the newest train and eval points among `rows`."""
    out: dict[str, Any] = {}
    train = [r for r in rows if r["split"] == "train"]
    if train:
        last = max(train, key=lambda r: r["step"])
        out.update(last_step=last["step"], last_elapsed_seconds=last["elapsed_seconds"], last_train_loss=last["loss"])
    evals = [r for r in rows if r["split"] == "eval"]
    if evals:
        out["last_eval_loss"] = max(evals, key=lambda r: r["step"])["loss"]
    return out


def get_run(engine: sa.Engine, run_id: int) -> Run:
    with session_factory(engine)() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise AblateError(f"no run with id {run_id} in {_describe(str(engine.url))}")
        return run
