"""The study a big sweep's runner keeps (results/study.py, runner/keeper.py, store.keep_study): a dashboard shows it
while the sweep is as it was kept, or for FRESH seconds after runs started or finished (saying so), and computes the
study itself after that, or when a run failed or the code differs. On SQLite and on the real PostgreSQL server."""

from __future__ import annotations

import json

import datetime as dt

from ablate import runner, store
from ablate.results import study as st
from ablate.runner import keeper as kp
from tests.ui.conftest import build


def keep(url: str, sweep: str, marker: str) -> dict:
    """Keep the sweep's study as the flow does, its read_at set to `marker` (to tell the kept one from one computed)."""
    engine = store.connect(url)
    sweep_id = store.sweep_named(engine, sweep, store.Sweep.id).id
    key = st.study_key(engine, sweep_id)
    kept = {**st.study(engine, sweep), "read_at": marker}
    assert store.keep_study(engine, sweep_id, key, st.study_code(), json.dumps(kept))
    return kept


def shown(url: str) -> dict:
    """What a fresh dashboard (nothing in its memory) shows as the study of `widths`."""
    from ablate.ui.app import Dashboard

    return Dashboard(store.reader(url), None).study("widths")


def age_kept(url: str, seconds: float) -> None:
    """The kept study as if it had been kept `seconds` ago."""
    with store.connect(url).begin() as conn:
        conn.execute(store.StudyCache.__table__.update().values(
            computed_at=store.utcnow() - dt.timedelta(seconds=seconds)))


def test_a_dashboard_shows_the_kept_study_until_a_run_finishes(db_url, tmp_path):
    db = build(db_url, tmp_path)
    kept = keep(db_url, "widths", "kept")
    assert shown(db_url) == {**kept, "kept": True}  # the kept one, as it was kept (JSON and back)
    computed = st.study(store.connect(db_url), "widths")
    assert {k: v for k, v in computed.items() if k != "read_at"} == {k: v for k, v in kept.items() if k != "read_at"}

    running = db["ids"][-1]  # the run still training finishes: the kept study is no longer the sweep's
    store.update_run(store.connect(db_url), running, status="completed", final_eval_loss=1.5)
    recent = shown(db_url)  # kept a moment ago: shown, saying that runs finished since
    assert recent["read_at"].startswith("kept (kept by the sweep's runner ") and "finished since" in recent["read_at"]
    assert recent["tables"] == kept["tables"]
    age_kept(db_url, st.FRESH + 1)  # older than FRESH: computed here, with the run that finished
    now = shown(db_url)
    assert now["read_at"] != "kept" and "kept" not in now and now["tables"] != kept["tables"]

    keep(db_url, "widths", "kept again")  # kept again: shown again; a second keep replaced the first
    assert shown(db_url)["read_at"] == "kept again"
    with store.connect(db_url).connect() as conn:
        assert len(conn.execute(store.StudyCache.__table__.select()).all()) == 1


def test_one_dashboard_shows_a_study_kept_behind_the_runs_until_the_runner_catches_up(sqlite_url, tmp_path):
    """A kept study shown while runs had finished since it was kept is read again at the next request (the runner
    keeps the sweep's own in a few seconds), not held until the next run finishes."""
    from ablate.ui.app import Dashboard

    db = build(sqlite_url, tmp_path)
    board = Dashboard(store.reader(sqlite_url), None)
    keep(sqlite_url, "widths", "kept")
    store.update_run(store.connect(sqlite_url), db["ids"][-1], status="completed", final_eval_loss=1.5,
                     finished_at=store.utcnow())  # the sweep's last run finishes
    behind = board.study("widths")
    assert behind["behind"] and "finished since" in behind["read_at"]
    keep(sqlite_url, "widths", "caught up")  # the runner keeps the study of the finished sweep
    now = board.study("widths")  # no run finished since the read before: still read again
    assert now["read_at"] == "caught up" and "behind" not in now
    assert board.study("widths") is now  # the sweep's own: kept in memory until a run finishes


def test_a_study_kept_by_other_code_or_before_a_run_failed_is_computed_again(db_url, tmp_path):
    db = build(db_url, tmp_path)
    engine = store.connect(db_url)
    keep(db_url, "widths", "kept")
    with engine.begin() as conn:
        conn.execute(store.StudyCache.__table__.update().values(code="0123abcd4567"))
    assert shown(db_url)["read_at"] != "kept"

    keep(db_url, "widths", "kept")
    sweep_id = store.sweep_named(engine, "widths", store.Sweep.id).id
    before = st.study_key(engine, sweep_id)
    store.write_metrics(engine, db["ids"][-1], [{"step": 202, "split": "train", "elapsed_seconds": 10.1,
                                                 "tokens": 202 * 1024, "loss": 2.5, "lr": 1e-3}])
    assert st.study_key(engine, sweep_id) == before  # a run's progress while it trains: not in the study
    store.update_run(engine, db["ids"][-1], status="failed", error="RuntimeError: gone")  # no finish time, no loss
    assert st.study_key(engine, sweep_id) != before
    age_kept(db_url, st.FRESH + 1)
    assert shown(db_url)["read_at"] != "kept"


class Said:
    """The flow's logger, as lines (Prefect's logging configuration keeps records from pytest's caplog)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: object) -> None:
        self.lines.append(message % args)

    warning = info


def test_the_sweep_flow_keeps_a_big_sweeps_study_and_says_why_when_it_cannot(sqlite_url, tmp_path, monkeypatch):
    build(sqlite_url, tmp_path)
    engine = store.connect(sqlite_url)
    log = Said()
    kp.keep_final(log, engine, "widths")  # 8 runs: below KEEP_RUNS, nothing kept
    with engine.connect() as conn:
        assert conn.execute(store.StudyCache.__table__.select()).first() is None

    monkeypatch.setattr(st, "KEEP_RUNS", 8)
    runner.STOP.set()  # a sweep the user stopped exits at once: nothing computed
    try:
        kp.keep_final(log, engine, "widths")
    finally:
        runner.STOP.clear()
    with engine.connect() as conn:
        assert conn.execute(store.StudyCache.__table__.select()).first() is None

    def broken(*_):
        raise ValueError("no study today")

    with monkeypatch.context() as m:
        m.setattr(st, "study", broken)
        kp.keep_final(log, engine, "widths")
    assert log.lines == ["sweep widths: its study was not kept for the dashboard (ValueError: no study today); the "
                         "dashboard computes it"]

    kp.keep_final(log, engine, "widths")
    assert log.lines[-1].startswith("sweep widths: its study kept for the dashboard (8 runs; kept 1 times")
    row = engine.connect().execute(store.StudyCache.__table__.select()).one()
    computed = json.loads(json.dumps(st.study(engine, "widths")))
    assert row.code == st.study_code() and json.loads(row.payload)["tables"] == computed["tables"]
    assert shown(sqlite_url)["read_at"] == json.loads(row.payload)["read_at"]
