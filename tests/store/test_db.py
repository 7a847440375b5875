"""The results database on SQLite and on the real PostgreSQL server."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.helpers import one_seed_smoke
from ablate import store
from ablate.config.errors import AblateError
from ablate.config import load_trials

REPO = Path(__file__).resolve().parents[2]
SMOKE = one_seed_smoke()  # the smoke sweep with one seed per cell: 4 trials


def test_schema_is_created_at_head_and_matches_the_models(db_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    engine = store.connect(db_url)
    assert store.current_revision(engine) == store.head_revision(engine) == store.SCHEMA_HEAD == store.stored_revision(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"version_table": store.VERSION_TABLE}), store.Base.metadata)
    assert diff == [], f"models and migrations disagree: {diff}"
    assert {"sweeps", "runs", "metrics", "ablate_alembic_version"} <= set(sa.inspect(engine).get_table_names())


def test_register_sweep_is_idempotent_by_fingerprint(db_url):
    engine = store.connect(db_url)
    spec, trials = load_trials(SMOKE)
    sweep_id, ids = store.register_sweep(engine, spec, trials)
    store.update_run(engine, ids[0], status="completed", final_eval_loss=2.5)
    again_id, again = store.register_sweep(engine, spec, trials)
    assert (again_id, again) == (sweep_id, ids)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(store.Run.architecture, store.Run.d_model, store.Run.status).order_by(store.Run.id)).all()
    assert len(rows) == len(trials) == 4
    assert rows[0].status == "completed"  # a second registration keeps results
    assert [(r.architecture, r.d_model) for r in rows] == [(t.architecture, t.d_model) for t in trials]


def test_postgres_registers_by_copy_the_same_rows_sqlite_inserts(sqlite_url, postgres_url):
    spec, trials = load_trials(SMOKE)
    rows = {}
    for url in (sqlite_url, postgres_url):
        engine = store.connect(url)
        _, ids = store.register_sweep(engine, spec, trials)
        with engine.connect() as conn:
            found = conn.execute(sa.select(store.Run.__table__).where(store.Run.id.in_(ids))).mappings().all()
        by_id = {r["id"]: dict(r) for r in found}
        assert all(by_id[i].pop("created_at") is not None for i in ids)
        rows[url] = [{c: v for c, v in by_id[i].items() if c != "id"} for i in ids]  # in trial order
    sqlite_rows, pg_rows = rows[sqlite_url], rows[postgres_url]
    assert pg_rows == sqlite_rows and pg_rows[0]["config"] == trials[0].model_dump(mode="json")
    assert pg_rows[0]["library_versions"]["torch"] and [r["fingerprint"] for r in pg_rows] == [t.fingerprint() for t in trials]
    with pytest.raises(sa.exc.IntegrityError):  # a row that is there already fails like an INSERT would (a race)
        engine = store.connect(postgres_url)
        with engine.begin() as conn:
            conn.exec_driver_sql("SELECT 1")
            store.copy_rows(conn, store.Run.__table__, [dict(pg_rows[0], trial_index=99)])


def test_axes_are_typed_columns_usable_in_sql(db_url):
    engine = store.connect(db_url)
    spec, trials = load_trials(SMOKE)
    _, ids = store.register_sweep(engine, spec, trials)
    with engine.connect() as conn:
        n = conn.execute(sa.text("SELECT count(*) FROM runs WHERE d_model >= 128 AND lr < 0.01")).scalar()
        config = conn.execute(sa.select(store.Run.config).where(store.Run.id == ids[0])).scalar()
    assert n == 2
    assert config["architecture"] == trials[0].architecture and config["budget"]["steps"] == 100


def test_metric_points_are_never_duplicated(db_url):
    engine = store.connect(db_url)
    spec, trials = load_trials(SMOKE)
    _, ids = store.register_sweep(engine, spec, trials)
    rows = [dict(step=s, split="train", elapsed_seconds=s / 10, tokens=s * 100, loss=3.0 - s / 100, lr=1e-3) for s in range(10)]
    assert store.write_metrics(engine, ids[0], rows[:6]) == 6
    assert store.write_metrics(engine, ids[0], rows[4:]) == 4  # a resumed run re-sends steps 4, 5
    with engine.connect() as conn:
        steps = conn.execute(sa.select(store.Metric.step).where(store.Metric.run_id == ids[0]).order_by(store.Metric.step)).scalars().all()
    assert steps == list(range(10))


def test_library_and_code_versions_are_recorded(sqlite_url):
    engine = store.connect(sqlite_url)
    spec, trials = load_trials(SMOKE)
    _, ids = store.register_sweep(engine, spec, trials)
    run = store.get_run(engine, ids[0])
    assert run.library_versions["torch"].startswith("2.")
    assert "sqlalchemy" in run.library_versions


def test_dead_database_gives_a_clear_error():
    with pytest.raises(AblateError, match=r"cannot reach the results database .*127\.0\.0\.1:1/.*Start the server"):
        store.connect("postgresql+psycopg://postgres@127.0.0.1:1/nothing")


def test_unknown_driver_gives_a_clear_error():
    with pytest.raises(AblateError, match="cannot use database URL"):
        store.connect("nosuchdb://x/y")


def test_bare_path_means_a_sqlite_file(tmp_path):
    engine = store.connect(str(tmp_path / "sub" / "r.db"))
    assert engine.dialect.name == "sqlite"
    assert (tmp_path / "sub" / "r.db").exists()


def test_an_older_database_is_upgraded(tmp_path):
    """A DB stamped at an older revision (here: empty, revision None) is migrated by `connect`."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = store.make_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE unrelated (x INTEGER)"))
    assert store.current_revision(engine) is None
    store.connect(url)
    assert store.current_revision(engine) == store.head_revision(engine)
    assert not list(tmp_path.glob("*lock*"))  # no lock file left beside the database
    from ablate.store.migrate import migrate_lock

    assert migrate_lock(tmp_path / "old.db") == migrate_lock(tmp_path / "." / "old.db")  # one lock per file


def _writer(url: str, run_id: int, worker: int, n: int) -> None:
    engine = store.connect(url)
    for start in range(0, n, 100):  # batches, as the trainer writes them
        rows = [dict(step=worker * 1_000_000 + s, split="train", elapsed_seconds=float(s), tokens=s, loss=1.0, lr=None)
                for s in range(start, start + 100)]
        store.write_metrics(engine, run_id, rows)
    engine.dispose()


def test_four_processes_writing_into_one_sqlite_file_lose_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    engine = store.connect(url)
    spec, trials = load_trials(SMOKE)
    _, ids = store.register_sweep(engine, spec, trials)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(url, ids[0], w, 2000)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM metrics")).scalar() == 8000
        assert conn.execute(sa.text("PRAGMA journal_mode")).scalar() == "wal"


def at_revision(url: str, revision: str):
    """An engine on a database migrated to `revision` only (an older ablate's schema)."""
    from alembic import command

    engine = store.make_engine(url)
    cfg = store.migrate._alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
    return engine


def test_a_database_made_at_the_first_schema_keeps_its_rows_through_upgrade(tmp_path):
    url = f"sqlite:///{tmp_path / 'v1.db'}"
    engine = at_revision(url, "0001")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO sweeps (name, description, spec, spec_fingerprint, created_at, updated_at) "
                             "VALUES ('old', '', '{}', 'x', '2026-01-01', '2026-01-01')"))
    assert store.current_revision(engine) == "0001"
    store.connect(url)
    assert store.current_revision(engine) == store.head_revision(engine) != "0001"
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT name FROM sweeps")).scalar() == "old"
        assert "pid" in {c["name"] for c in sa.inspect(conn).get_columns("runs")}
