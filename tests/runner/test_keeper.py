"""A big sweep's study kept while it trains (runner/keeper.py): the keeper thread keeps it at once and again after a
run finishes, a dashboard then shows the kept one as the sweep's own, a stopped sweep's keeper ends at once, and
one that cannot compute the study says why once and ends. On SQLite and on the real PostgreSQL server."""

from __future__ import annotations

import json
import time

from ablate import runner, store
from ablate.results import study as st
from ablate.runner import keeper as kp
from tests.ui.conftest import build
from tests.ui.test_study_kept import Said, shown


def kept_row(engine):
    with engine.connect() as conn:
        return conn.execute(store.StudyCache.__table__.select()).first()


def wait_for(check, seconds: float = 20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("not within the time")


def test_the_keeper_keeps_the_study_as_runs_finish_and_the_dashboard_shows_it(db_url, tmp_path, monkeypatch):
    db = build(db_url, tmp_path)
    engine = store.connect(db_url)
    log = Said()
    assert kp.StudyKeeper.start_for(engine, "widths", log) is None  # 8 runs: under KEEP_RUNS
    monkeypatch.setattr(st, "KEEP_RUNS", 8)
    monkeypatch.setattr(kp, "EVERY", 0.05)
    keeper = kp.StudyKeeper.start_for(engine, "widths", log)
    try:
        first = wait_for(lambda: kept_row(engine))
        sweep_id = store.sweep_named(engine, "widths", store.Sweep.id).id
        assert first.key == st.study_key(engine, sweep_id)
        assert shown(db_url)["read_at"] == json.loads(first.payload)["read_at"]  # the sweep's own: no note

        store.update_run(engine, db["ids"][-1], status="completed", steps=400, final_train_loss=1.2,
                         final_eval_loss=1.25, finished_at=store.utcnow())  # the run that trained finishes
        again = wait_for(lambda: (row := kept_row(engine)).key != first.key and row)
        assert again.key == st.study_key(engine, sweep_id)
        computed = st.study(engine, "widths")
        assert json.loads(again.payload)["tables"] == computed["tables"] != json.loads(first.payload)["tables"]
        assert keeper.kept == 2 and keeper.live.changed == 1  # the second read read the finished run alone
    finally:
        keeper.stop()
    assert not keeper._thread.is_alive()
    kp.keep_final(log, engine, "widths", keeper)  # nothing moved since: kept as it is
    assert keeper.kept == 2 and log.lines[-1].startswith("sweep widths: its study kept for the dashboard (8 runs; kept 2")


def test_a_stopped_sweeps_keeper_ends_and_a_failing_one_says_why_once(sqlite_url, tmp_path, monkeypatch):
    build(sqlite_url, tmp_path)
    engine = store.connect(sqlite_url)
    monkeypatch.setattr(st, "KEEP_RUNS", 8)
    monkeypatch.setattr(kp, "EVERY", 0.05)
    runner.STOP.set()  # the user stopped the sweep: the keeper computes nothing more
    try:
        keeper = kp.StudyKeeper.start_for(engine, "widths", Said())
        keeper._thread.join(timeout=10)
        assert not keeper._thread.is_alive() and keeper.kept == 0 and kept_row(engine) is None
    finally:
        runner.STOP.clear()

    def broken(*_):
        raise ValueError("no study today")

    monkeypatch.setattr(st, "study", broken)
    log = Said()
    keeper = kp.StudyKeeper.start_for(engine, "widths", log)
    keeper._thread.join(timeout=10)
    assert not keeper._thread.is_alive()
    assert log.lines == ["sweep widths: its study was not kept for the dashboard (ValueError: no study today); the "
                         "dashboard computes it"]
