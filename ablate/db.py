"""The results database: SQLAlchemy models, engine from URL, migrations, and the few writes the chain needs.

SQLite file by default (`results/ablate.db`, WAL, busy timeout); any SQLAlchemy URL through
`ABLATE_DB_URL` or `--db`. The schema is owned by Alembic (`ablate/migrations`); `connect`
brings a database to the current revision under a lock, so concurrent processes may all call it.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
    sweep_id: Mapped[int] = mapped_column(sa.ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    fingerprint: Mapped[str] = mapped_column(sa.String(32), index=True)
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
    pid: Mapped[int | None]  # the trainer process while running (cancel signals it; stale rows are detected)
    threads: Mapped[int | None]  # torch intra-op threads of the trainer (CPU share of this trial)
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
    __table_args__ = (sa.UniqueConstraint("run_id", "split", "step", name="uq_metrics_run_split_step"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int]
    split: Mapped[str] = mapped_column(sa.String(16))  # train | eval
    elapsed_seconds: Mapped[float]  # budget clock at this point
    tokens: Mapped[int] = mapped_column(sa.BigInteger)
    loss: Mapped[float]
    lr: Mapped[float | None]


# ---------------------------------------------------------------- engine


def resolve_url(url: str | None = None) -> str:
    """--db beats ABLATE_DB_URL beats the default SQLite file; a bare path means a SQLite file."""
    url = url or os.environ.get("ABLATE_DB_URL") or DEFAULT_URL
    if "://" not in url:
        url = f"sqlite:///{url}"
    return url


def _sqlite_path(url: sa.URL) -> Path | None:
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


def make_engine(url: str | None = None, read_only: bool = False) -> sa.Engine:
    url_obj = sa.make_url(resolve_url(url))
    path = _sqlite_path(url_obj)
    if path is not None:
        if read_only:
            if not path.exists():
                raise AblateError(f"no results database at {path}; run a sweep first or pass --db URL")
            # mode=ro: SQLite itself refuses writes on this connection
            url_obj = sa.make_url(f"sqlite:///file:{path.resolve()}?mode=ro&uri=true")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url_obj, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # noqa: ANN001
            cur = dbapi_conn.cursor()
            if not read_only:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.execute("PRAGMA foreign_keys=ON")
            if read_only:
                cur.execute("PRAGMA query_only=ON")
            cur.close()

        return engine
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if read_only and url_obj.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"options": "-c default_transaction_read_only=on"}
    try:
        return sa.create_engine(url_obj, **kwargs)
    except (SQLAlchemyError, ImportError) as exc:
        raise AblateError(f"cannot use database URL {url_obj.render_as_string(hide_password=True)}: {exc}") from None


def _describe(url: str) -> str:
    return sa.make_url(url).render_as_string(hide_password=True)


_ENGINES: dict[str, sa.Engine] = {}


def connect(url: str | None = None, upgrade: bool = True) -> sa.Engine:
    """An engine on a reachable database at the current schema revision (upgrading it if needed).

    Engines are kept per URL for the life of the process: reachability and the schema are checked once.
    """
    url = resolve_url(url)
    if upgrade and url in _ENGINES:
        return _ENGINES[url]
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise AblateError(
            f"cannot reach the results database {_describe(url)}: {reason}. "
            "Start the server (or fix ABLATE_DB_URL / --db), or use the default SQLite file by unsetting ABLATE_DB_URL."
        ) from None
    if upgrade:
        upgrade_schema(engine)
        _ENGINES[url] = engine
    return engine


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


def _alembic_config(engine: sa.Engine):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def current_revision(engine: sa.Engine) -> str | None:
    from alembic.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def head_revision(engine: sa.Engine) -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config(engine)).get_current_head()


def upgrade_schema(engine: sa.Engine) -> str:
    """Bring the database to the newest schema; returns the revision it is at."""
    head = head_revision(engine)
    if current_revision(engine) == head:
        return head
    from alembic import command

    with _schema_lock(engine):
        if current_revision(engine) != head:
            cfg = _alembic_config(engine)
            with engine.begin() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
    return head


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
    """The git commit of the ablate checkout, with '+dirty' when the tree has changes."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        return sha.stdout.strip()[:12] + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def register_sweep(engine: sa.Engine, spec: Any, trials: Iterable[Any], spec_path: str | None = None) -> tuple[int, list[int]]:
    """Insert (or update) the sweep and one pending run per new trial fingerprint, atomically.

    Idempotent: trials already registered keep their row and status. Returns (sweep id, run ids in trial order).
    """
    trials = list(trials)
    versions = library_versions()
    code = code_version()
    with session_factory(engine)() as session, session.begin():
        sweep = session.scalar(sa.select(Sweep).where(Sweep.name == spec.name))
        if sweep is None:
            sweep = Sweep(name=spec.name)
            session.add(sweep)
        sweep.description = spec.description
        sweep.spec = spec.model_dump(mode="json")
        sweep.spec_fingerprint = spec.fingerprint()
        sweep.spec_path = spec_path
        session.flush()
        existing = {r.fingerprint: r for r in session.scalars(sa.select(Run).where(Run.sweep_id == sweep.id))}
        ids = []
        for index, trial in enumerate(trials):
            fp = trial.fingerprint()
            run = existing.get(fp)
            if run is None:
                run = new_run(trial, sweep.id, index, code, versions)
                session.add(run)
                session.flush()
            ids.append(run.id)
    return sweep.id, ids


OWED_UNSTARTED = ("pending", "failed", "cancelled", "preempted")  # owed work that holds no result


def drop_stale_runs(engine: sa.Engine, sweep_id: int, keep: set[str]) -> int:
    """Delete the sweep's grid runs whose trial is no longer in its spec and that hold no result (pending,
    failed, cancelled, preempted), with their metrics; finished runs stay as results. Returns how many."""
    with engine.begin() as conn:
        stale = [rid for rid, fp in conn.execute(
            sa.select(Run.id, Run.fingerprint).where(Run.sweep_id == sweep_id, Run.study_name.is_(None),
                                                     Run.status.in_(OWED_UNSTARTED))) if fp not in keep]
        if stale:
            conn.execute(sa.delete(Metric).where(Metric.run_id.in_(stale)))
            conn.execute(sa.delete(Run).where(Run.id.in_(stale)))
    return len(stale)


def new_run(trial: Any, sweep_id: int, index: int, code: str | None, versions: dict[str, str]) -> Run:
    return Run(
        sweep_id=sweep_id, fingerprint=trial.fingerprint(), trial_index=index, status="pending",
        architecture=trial.architecture, objective=trial.objective, d_model=trial.d_model, layers=trial.layers,
        heads=trial.heads, context=trial.context, lr=trial.lr, batch_size=trial.batch_size, seed=trial.seed,
        options=dict(trial.options), config=trial.model_dump(mode="json"), hardware=trial.budget.hardware,
        gpus=trial.budget.gpus, budget_kind=trial.budget.kind, budget_amount=trial.budget.amount,
        code_version=code, library_versions=versions,
    )


def update_run(engine: sa.Engine, run_id: int, **fields: Any) -> None:
    unknown = set(fields) - set(Run.__table__.columns.keys())
    if unknown:
        raise ValueError(f"not columns of runs: {sorted(unknown)}")
    with engine.begin() as conn:
        conn.execute(sa.update(Run).where(Run.id == run_id).values(**fields))


def mark_running(engine: sa.Engine, run_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.update(Run).where(Run.id == run_id).values(
                status="running", started_at=utcnow(), finished_at=None, error=None,
                host=socket.gethostname(), attempts=Run.attempts + 1,
            )
        )


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
        fresh = [dict(r, run_id=run_id) for r in rows if (r["split"], r["step"]) not in have]
        if fresh:
            conn.execute(sa.insert(Metric), fresh)
    return len(fresh)


def get_run(engine: sa.Engine, run_id: int) -> Run:
    with session_factory(engine)() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise AblateError(f"no run with id {run_id} in {_describe(str(engine.url))}")
        return run
