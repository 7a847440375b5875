"""One status row for the terminal and the dashboard (results/status.py): the same progress, reason and column
order in `ablate sweep status --format csv` and in the dashboard's rows, on a real database (SQLite and
PostgreSQL); and one seed band (results/bands.py) for the report and the dashboard, checked on known curves."""

from __future__ import annotations

import csv
import datetime as dt
import io
from pathlib import Path

import numpy as np
import pytest

from ablate import store
from ablate.cli import print_status_csv
from ablate.cli.status import STATUS_HEADER
from ablate.config import load_trials
from ablate.config.axes import AXIS_FIELDS
from ablate.results import live
from ablate.results.bands import group_curve, mean_band
from ablate.results.status import FIRST, LAST, status_counts, status_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sweep(db_url):
    """The smoke sweep (8 runs, a 100-step budget) as it may stand mid-sweep: completed, running with a fresh
    heartbeat, running with a stale one (its trainer gone), failed with a traceback, pending."""
    spec, trials = load_trials(REPO / "sweeps" / "smoke.yaml")
    engine = store.connect(db_url)
    _, ids = store.register_sweep(engine, spec, trials)
    now = store.utcnow()
    store.update_run(engine, ids[0], status="completed", steps=100, last_step=100, final_eval_loss=3.5,
                     final_train_loss=3.4, finished_at=now)
    store.update_run(engine, ids[1], status="running", last_step=40, last_eval_loss=4.0, heartbeat_at=now,
                     claimed_by="elsewhere:1:x")
    store.update_run(engine, ids[2], status="running", last_step=70, claimed_by="elsewhere:2:y",
                     heartbeat_at=now - dt.timedelta(seconds=store.stale_seconds() + 60))
    store.update_run(engine, ids[3], status="failed", last_step=25, error="RuntimeError: boom\nTraceback ...",
                     finished_at=now)
    return engine, ids


def test_the_terminal_and_the_dashboard_show_one_status_row(sweep, capsys):
    engine, ids = sweep
    print_status_csv(status_rows(engine, "smoke"))
    terminal = {int(r["run"]): r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    board = {r["run"]: r for r in live.run_rows(engine, store.sweep_named(engine, "smoke", store.Sweep.id).id)}
    assert set(terminal) == set(board) == set(ids)
    for rid in ids:
        for key in ("status", "progress", "steps", "eval", "reason"):
            shown = board[rid][key]
            assert terminal[rid][key] == ("" if shown is None else str(shown)), (rid, key)
    assert [board[rid]["progress"] for rid in ids[:5]] == [1.0, 0.4, 0.7, 0.25, None]  # of 100 steps
    assert board[ids[2]]["reason"].startswith("stale: its trainer last beat")  # said on the dashboard too now
    assert board[ids[1]]["reason"] == "" and board[ids[3]]["reason"] == "RuntimeError: boom"
    assert status_counts(engine, "smoke") == {"completed": 1, "failed": 1, "pending": len(ids) - 4, "running": 2}


def test_one_column_order_in_the_terminal_and_the_dashboard(sweep):
    """run, status, progress; the axes in AXIS_FIELDS' order; options; then steps to reason: the csv's header,
    and the dashboard's columns (those that vary in this sweep) in the same order."""
    from ablate.ui import table

    engine, _ = sweep
    assert STATUS_HEADER == (*FIRST, *AXIS_FIELDS, "options", *LAST)
    columns = table.columns(live.run_rows(engine, store.sweep_named(engine, "smoke", store.Sweep.id).id))
    terminal_order = [c for c in STATUS_HEADER if c in columns]
    assert columns[:len(FIRST)] == list(FIRST) and columns[-len(LAST):] == list(LAST)
    assert [c for c in columns if c in STATUS_HEADER] == terminal_order and "architecture" in columns


def test_a_seed_band_is_the_mean_min_and_max_on_the_x_every_seed_reached():
    """Two seeds logged at different x (as a wall-clock budget's seeds are, in tokens): loss = x and loss = 2x.
    On their common range [1, 10] the mean is 1.5x, the band [x, 2x], whatever points each logged."""
    a = (np.arange(0.0, 11.0, 2.0), np.arange(0.0, 11.0, 2.0))
    b = (np.array([1.0, 4.0, 7.0, 11.0]), 2 * np.array([1.0, 4.0, 7.0, 11.0]))
    x, mean, low, high = mean_band([a, b])
    assert x[0] == 1.0 and x[-1] == 10.0 and len(x) == 6  # as many points as the longest seed logged
    np.testing.assert_allclose(mean, 1.5 * x)
    np.testing.assert_allclose(low, x)
    np.testing.assert_allclose(high, 2 * x)
    assert mean_band([a]) is None and mean_band([a, (np.array([20.0]), np.array([1.0]))]) is None  # no common range
    curve = group_curve("d_model=64", [1, 2], {1: a, 2: b})
    assert curve["label"] == "d_model=64 (n=2)" and curve["mean"] == pytest.approx((1.5 * x).tolist())


def test_a_sweep_says_how_long_its_owed_runs_will_take_from_those_finished(sqlite_url):
    """`sweep run`'s live view: 'trial 5/12, ~9 min left, 1 at a time' (a sweep on a busy machine ran 57 min with
    no estimate). Two runs took 60 s each; one has run 20 s of its 60; three wait: 3 x 60 + 40 = 220 s at once."""
    from ablate.cli.status import sweep_view
    from ablate.results.status import eta

    spec, trials = load_trials(REPO / "sweeps" / "smoke.yaml")
    engine = store.connect(sqlite_url)
    _, ids = store.register_sweep(engine, spec, trials[:6])
    assert eta(engine, spec.name, 1) == ""  # nothing finished: no estimate
    now = store.utcnow()
    for rid in ids[:2]:
        store.update_run(engine, rid, status="completed", started_at=now - dt.timedelta(seconds=100),
                         finished_at=now - dt.timedelta(seconds=40))
    store.update_run(engine, ids[2], status="running", started_at=now - dt.timedelta(seconds=20), heartbeat_at=now)
    assert eta(engine, spec.name, 1) == "~4 min left · 1 at a time"  # 220 s
    assert eta(engine, spec.name, 2) == "~2 min left · 2 at a time"  # 110 s
    for rid in ids[3:]:
        store.update_run(engine, rid, status="completed", started_at=now - dt.timedelta(seconds=61), finished_at=now)
    store.update_run(engine, ids[2], started_at=now - dt.timedelta(seconds=59))
    assert eta(engine, spec.name, 1) == "<1 min left · 1 at a time"
    assert sweep_view(engine, spec.name)().title.startswith("sweep smoke: 5/6 finished · <1 min left · 1 at a time")
