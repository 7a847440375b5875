"""Large sweeps stay interactive: the latest points on the run row, bounded status tables, bulk registration,
light migrations checks, and the per-trial work a trainer no longer does (issue 16). Counts, not timings."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from ablate import runner, store
from ablate.cli import STATUS_ROWS, main, runs_table
from ablate.results.status import status_rows, status_view
from tests.helpers import cli_env, grid_spec
from tests.waiting import patience

pytestmark = pytest.mark.scale  # a campaign across the house: `pytest -m scale`

REPO = Path(__file__).resolve().parents[2]


class Statements:
    """Every SQL statement an engine runs while inside the block."""

    def __init__(self, engine: sa.Engine):
        self.engine, self.seen = engine, []

    def _log(self, _conn, _cursor, statement, _params, _context, _many) -> None:
        self.seen.append(" ".join(statement.split()))

    def __enter__(self) -> list[str]:
        event.listen(self.engine, "before_cursor_execute", self._log)
        return self.seen

    def __exit__(self, *_) -> None:
        event.remove(self.engine, "before_cursor_execute", self._log)


def points(n: int, split: str = "train", loss0: float = 5.0) -> list[dict]:
    return [{"step": 10 * (i + 1), "split": split, "elapsed_seconds": float(i), "tokens": 100 * (i + 1),
             "loss": loss0 - 0.1 * i, "lr": 1e-3} for i in range(n)]


def registered_grid(tmp_path: Path, url: str, n: int) -> list[int]:
    _, _, ids = runner.register(grid_spec(tmp_path, "big", d_models=range(8, 8 + 8 * n, 8)), url)
    return ids


def test_registration_inserts_all_runs_in_one_statement_and_again_inserts_nothing(tmp_path, db_url, monkeypatch):
    from ablate.store import register

    engine = store.connect(db_url)
    copies: list[int] = []  # PostgreSQL (psycopg) writes them with one COPY, which SQLAlchemy's events do not see
    copy = register.copy_rows
    monkeypatch.setattr(register, "copy_rows",
                        lambda conn, table, rows: (copies.append(len(rows)), copy(conn, table, rows)))
    with Statements(engine) as seen:
        ids = registered_grid(tmp_path, db_url, 300)
    inserts = [s for s in seen if s.startswith("INSERT INTO runs")]
    assert len(ids) == len(set(ids)) == 300, ids[:3]
    assert (len(inserts), copies) == ((0, [300]) if db_url.startswith("postgresql") else (1, [])), inserts[:3]
    with engine.connect() as conn:
        rows = conn.execute(sa.select(store.Run.id, store.Run.trial_index, store.Run.d_model).order_by(store.Run.id)).all()
    assert [r.id for r in rows] == ids and [r.trial_index for r in rows] == list(range(300))
    assert [r.d_model for r in rows] == list(range(8, 8 + 8 * 300, 8))
    with Statements(engine) as seen:
        assert registered_grid(tmp_path, db_url, 300) == ids
    assert not [s for s in seen if s.startswith("INSERT INTO runs")] and len(copies) <= 1  # nothing new to copy


def test_the_run_row_keeps_the_latest_points_and_status_never_reads_the_metrics(tmp_path, db_url):
    ids = registered_grid(tmp_path, db_url, 3)
    engine = store.connect(db_url)
    store.write_metrics(engine, ids[0], points(5))
    store.write_metrics(engine, ids[0], points(2, "eval", loss0=4.0) + points(8)[5:])
    run = store.get_run(engine, ids[0])
    assert (run.last_step, run.last_elapsed_seconds) == (80, 7.0)
    assert run.last_train_loss == pytest.approx(4.3) and run.last_eval_loss == pytest.approx(3.9)
    reader = store.reader(db_url)
    with Statements(reader) as seen:
        rows = status_rows(reader, "big")
        table = runs_table(rows)
    assert not [s for s in seen if "metrics" in s.lower()], seen
    assert len(table.rows) == 3
    assert main(["sweep", "status", "big", "--db", db_url, "--format", "csv"]) == 0


def test_a_new_attempt_from_step_0_clears_the_latest_points(tmp_path, sqlite_url):
    from ablate.train.recorder import Recorder
    from ablate.train.state import TrainerSettings

    ids = registered_grid(tmp_path, sqlite_url, 1)
    engine = store.connect(sqlite_url)
    store.write_metrics(engine, ids[0], points(3))
    Recorder(TrainerSettings(run_id=ids[0], db_url=sqlite_url, artifacts=tmp_path), True).forget_after(-1)
    run = store.get_run(engine, ids[0])
    assert run.last_step is None and run.last_train_loss is None


@pytest.mark.bare_database  # migrated from an older revision
def test_migration_0006_fills_the_latest_points_of_existing_runs(tmp_path, db_url):
    from tests.store.test_db import at_revision

    from ablate.config import load_trials, trial_fingerprint

    engine = at_revision(db_url, "0005")
    runs = sa.Table("runs", sa.MetaData(), autoload_with=engine)
    _, trials = load_trials(grid_spec(tmp_path, "old", d_models=(32, 48)))
    with engine.begin() as conn:
        sweep_id = conn.execute(sa.text("INSERT INTO sweeps (name, description, spec, spec_fingerprint, created_at, "
                                        "updated_at) VALUES ('old', '', '{}', 'x', :t, :t) RETURNING id"),
                                {"t": store.utcnow()}).scalar()
        for i, t in enumerate(trials):
            config = t.model_dump(mode="json")
            conn.execute(sa.insert(runs).values(store.run_row(t, config, trial_fingerprint(config), sweep_id, i, None, {})))
        first = conn.execute(sa.select(runs.c.id).order_by(runs.c.id)).scalars().first()
        conn.execute(sa.insert(store.Metric.__table__), [dict(p, run_id=first) for p in points(4) + points(2, "eval")])
    store.upgrade_schema(engine)
    rows = {r.id: r for r in status_rows(engine, "old")}
    assert (rows[first].last_step, rows[first].last_train_loss, rows[first].last_eval_loss) == (40, pytest.approx(4.7),
                                                                                                pytest.approx(4.9))
    assert all(r.last_step is None for rid, r in rows.items() if rid != first)
    names = {ix["name"] for table in ("runs", "metrics") for ix in sa.inspect(engine).get_indexes(table)}
    assert "ix_metrics_eval" in names and not names & {"ix_metrics_run_id", "ix_runs_sweep_id", "ix_runs_fingerprint"}


def test_a_big_status_table_shows_the_unfinished_and_latest_runs_and_counts_the_rest(tmp_path, sqlite_url):
    ids = registered_grid(tmp_path, sqlite_url, STATUS_ROWS + 150)
    engine = store.connect(sqlite_url)
    for rid in ids[:100]:
        store.update_run(engine, rid, status="completed", finished_at=store.utcnow(), final_eval_loss=3.0)
    store.update_run(engine, ids[100], status="oom")  # finished without a finish time (an older row): still sortable
    store.update_run(engine, ids[-1], status="running")
    store.update_run(engine, ids[-2], status="failed", error="trainer exited with code 1:\nTraceback ...")
    rows = status_rows(engine, "big")
    table = runs_table(rows)
    shown = [int(c) for c in table.columns[0]._cells]
    assert len(shown) == STATUS_ROWS and ids[-1] in shown and ids[-2] in shown and shown == sorted(shown)
    assert set(ids[:100]) <= set(shown)  # finished ones before waiting ones
    assert f"showing {STATUS_ROWS} of {len(ids)} runs" in table.caption and "100 completed" in table.caption
    assert len(runs_table(rows, limit=None).rows) == len(ids)
    # `sweep status` reads only the candidates (at most 3 x STATUS_ROWS rows, however big the sweep): the same table
    few, counts = status_view(engine, "big", STATUS_ROWS)
    assert len(few) < len(ids) and counts == {"completed": 100, "oom": 1, "running": 1, "failed": 1, "pending": 247}
    again = runs_table(few, counts=counts)
    assert [c._cells for c in again.columns] == [c._cells for c in table.columns] and again.caption == table.caption
    reason = str(table.columns[-1]._cells[shown.index(ids[-2])])
    assert reason == "trainer exited with code 1:"
    out = io.StringIO()
    sys_stdout, sys.stdout = sys.stdout, out
    try:
        assert main(["sweep", "status", "big", "--db", sqlite_url]) == 0  # not a terminal: csv of every run
    finally:
        sys.stdout = sys_stdout
    rows_csv = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert len(rows_csv) == len(ids) and rows_csv[-2]["reason"] == "trainer exited with code 1:"


def test_the_runner_counts_gpus_without_torch(monkeypatch):
    for visible, n in (("0,1,2,3", 4), ("", 0), ("1", 1), ("0,-1,2", 1), ("GPU-abc,GPU-def", 2)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert runner.visible_gpus() == n, visible
    code = "import sys; from ablate.runner import visible_gpus; visible_gpus(); print('torch' in sys.modules)"
    env = {k: v for k, v in cli_env().items() if k != "CUDA_VISIBLE_DEVICES"}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_a_local_prefect_api_that_does_not_start_gives_a_clear_error(tmp_path):
    spec = grid_spec(tmp_path, "slowstart", d_models=(32,))
    env = cli_env(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="0", PREFECT_HOME=str(tmp_path / "prefect"))
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run([sys.executable, "-m", "ablate.cli", "sweep", "run", str(spec), "--db",
                           f"sqlite:///{tmp_path / 'r.db'}", "--artifacts", str(tmp_path / "art")],
                          env=env, capture_output=True, text=True, timeout=patience(300), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "did not start within 0 s" in proc.stderr and "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in proc.stderr
    status = store.get_run(store.connect(f"sqlite:///{tmp_path / 'r.db'}"), 1).status
    assert status == "pending"  # registered, nothing trained


def test_warm_up_steps_teach_the_model_nothing(tmp_path):
    from tests.train.test_train import make_trial

    from ablate.train import TrainerSettings, train

    trial = make_trial(budget={"steps": 12}, eval={"at": [0.5]})
    outs = [train(trial, TrainerSettings(artifacts=tmp_path / "art", warmup_steps=w, log_points=12, progress=False))
            for w in (0, 3)]
    assert outs[0]["final_train_loss"] == pytest.approx(outs[1]["final_train_loss"], rel=1e-6)
    assert outs[0]["final_eval_loss"] == pytest.approx(outs[1]["final_eval_loss"], rel=1e-6)
    assert outs[1]["startup_seconds"] >= 0


def test_plan_of_a_big_grid_lists_the_first_trials_and_counts_the_rest(tmp_path, capsys):
    spec = grid_spec(tmp_path, "wide", d_models=range(8, 8 + 8 * (STATUS_ROWS + 50), 8))
    assert main(["plan", str(spec)]) == 0
    out = capsys.readouterr().out
    assert f"the first {STATUS_ROWS} of {STATUS_ROWS + 50} trials" in out and f"{STATUS_ROWS + 50} trials;" in out
    assert main(["plan", str(spec), "--all"]) == 0
    assert "the first" not in capsys.readouterr().out
