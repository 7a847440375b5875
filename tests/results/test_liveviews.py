"""A sweep's views held between reads (results/liveviews.py): after every kind of change a sweep sees while it
trains (runs that start, finish, fail, come back, are added by a merge, are deleted) a read gives what reading the
whole sweep gives, and reads in full only the runs that changed. On SQLite and on the real PostgreSQL server."""

from __future__ import annotations

import sqlalchemy as sa

from ablate import store
from ablate.results.equal import RowAt, parse_at, read_runs_at
from ablate.results.liveviews import LiveViews
from ablate.results.study import study
from ablate.results.views import load_views
from tests.ui.conftest import build, write_curve


def same_as_whole(engine, live: LiveViews) -> int:
    """The held views equal the whole sweep read now: rows, axes, references and read-at values, in one order; the
    runs that read read in full."""
    spec, views = load_views(engine, "widths")
    views = read_runs_at(engine, views, parse_at(spec.report.at))
    held_spec, held = live(engine)
    changed = live.changed
    assert held_spec == spec
    assert [v.row.id for v in held] == [v.row.id for v in views]
    for a, b in zip(held, views):
        row = lambda v: tuple(v.row.row if isinstance(v.row, RowAt) else v.row)  # noqa: E731 - the run's own
        assert row(a) == row(b) and a.axes == b.axes and a.reference == b.reference
        assert (a.row.final_eval_loss, a.row.status) == (b.row.final_eval_loss, b.row.status)  # read at `at`
    computed = {k: v for k, v in study(engine, "widths").items() if k != "read_at"}
    assert {k: v for k, v in study(engine, "widths", live).items() if k != "read_at"} == computed
    return changed


def test_each_read_equals_the_whole_sweep_and_reads_only_what_changed(db_url, tmp_path):
    db = build(db_url, tmp_path)
    engine = store.connect(db_url)
    ids = db["ids"]
    live = LiveViews("widths")
    assert same_as_whole(engine, live) == len(ids)
    live(engine)
    assert live.changed == 1  # nothing changed: only the run that is still training is read again

    store.update_run(engine, ids[-1], status="completed", steps=400, final_train_loss=1.9, final_eval_loss=1.4,
                     finished_at=store.utcnow())  # the training run finishes
    store.update_run(engine, ids[0], status="failed", error="RuntimeError: gone", final_eval_loss=None)
    assert same_as_whole(engine, live) == 2

    store.update_run(engine, ids[1], status="running", finished_at=None)  # back in training (a retry)
    assert same_as_whole(engine, live) == 1  # it alone (the run that trained before has finished)
    store.update_run(engine, ids[1], status="completed", finished_at=store.utcnow(), final_eval_loss=9.0)
    same_as_whole(engine, live)
    assert any(v.row.final_eval_loss == 9.0 for v in live(engine)[1])

    with engine.begin() as conn:  # a run deleted
        conn.execute(sa.delete(store.Metric).where(store.Metric.run_id == ids[2]))
        conn.execute(sa.delete(store.Run).where(store.Run.id == ids[2]))
    same_as_whole(engine, live)
    assert ids[2] not in {v.row.id for v in live(engine)[1]}


def test_runs_a_merge_adds_and_a_new_spec_are_read(db_url, tmp_path):
    """A merge adds runs of a new configuration (their axes make another field vary) and changes the spec."""
    from ablate import runner
    from tests.ui.conftest import spec_file

    build(db_url, tmp_path)
    engine = store.connect(db_url)
    live = LiveViews("widths")
    same_as_whole(engine, live)
    import yaml

    path = spec_file(tmp_path, "widths")
    data = yaml.safe_load(path.read_text())
    data["grid"].append({"architecture": "mixer", "d_model": 32, "weight_decay": 0.3, "seeds": 2})
    path.write_text(yaml.safe_dump(data))
    _, _, ids = runner.register(path, db_url, merge=True)
    new = [i for i in ids if store.get_run(engine, i).status == "pending"]
    assert len(new) == 2
    for rid in new:
        write_curve(engine, rid, "mixer", 32, store.get_run(engine, rid).seed, range(0, 401, 2))
        store.update_run(engine, rid, status="completed", steps=400, final_train_loss=1.7, final_eval_loss=1.75,
                         finished_at=store.utcnow())
    same_as_whole(engine, live)
    assert any("weight_decay" in v.axes for v in live(engine)[1])


def test_a_spec_read_at_a_budget_reads_the_curves_of_the_runs_that_finished(db_url, tmp_path):
    build(db_url, tmp_path)
    engine = store.connect(db_url)
    with engine.begin() as conn:  # the report read at 100 steps, as `report.at: {steps: 100}` says
        spec = conn.execute(sa.select(store.Sweep.spec).where(store.Sweep.name == "widths")).scalar()
        spec["report"]["at"] = {"steps": 100}
        conn.execute(sa.update(store.Sweep).where(store.Sweep.name == "widths").values(spec=spec))
    live = LiveViews("widths")
    same_as_whole(engine, live)
    held = {v.row.id: v.row for v in live(engine)[1]}
    assert all(r.status in ("completed", "running") for r in held.values())
    assert any(r.final_eval_loss is not None and r.final_eval_loss != r.row.final_eval_loss for r in held.values())
    rid = next(i for i, r in held.items() if r.status == "running")
    write_curve(engine, rid, "llama", 64, 1, range(202, 401, 2))
    store.update_run(engine, rid, status="completed", steps=400, final_eval_loss=1.3, finished_at=store.utcnow())
    same_as_whole(engine, live)


def test_a_read_that_fails_leaves_nothing_half_read(sqlite_url, tmp_path, monkeypatch):
    """A read refused half-way (here: two runs of one configuration with one seed, as load_views refuses them) is
    refused again by the next read, and once mended the views are the whole sweep's."""
    import ablate.results.liveviews as lv
    from ablate.config.errors import AblateError

    db = build(sqlite_url, tmp_path)
    engine = store.connect(sqlite_url)
    live = LiveViews("widths")
    same_as_whole(engine, live)
    checked = lv.check_seeds

    def refuse(views):
        raise AblateError("runs 1 and 2 are one configuration with one seed")

    monkeypatch.setattr(lv, "check_seeds", refuse)
    with engine.begin() as conn:  # a run deleted: the axes are made again, and refused
        conn.execute(sa.delete(store.Metric).where(store.Metric.run_id == db["ids"][0]))
        conn.execute(sa.delete(store.Run).where(store.Run.id == db["ids"][0]))
    for _ in range(2):
        try:
            live(engine)
        except AblateError:
            pass
        else:
            raise AssertionError("a read after the refused one returned the views held before it")
    monkeypatch.setattr(lv, "check_seeds", checked)
    assert same_as_whole(engine, live) == len(db["ids"]) - 1  # read whole again
