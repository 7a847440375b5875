"""`ablate export` into MLflow, TensorBoard and W&B (offline), each read back with that tracker's own reader: every
run's parameters, status, final metrics and curves at their steps; exporting again after a trainer wrote more
points adds exactly those, never a duplicate run or point."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from ablate import store
from ablate.config.errors import AblateError
from ablate.export import export_sweep
from ablate.export.runs import flatten
from tests.export.readers import tensorboard_scalars, tensorboard_texts, wandb_runs
from tests.ui.conftest import build, write_curve

TARGETS = ("mlflow", "tensorboard", "wandb")


def _uri(to: str, tmp: Path) -> str:
    return f"sqlite:///{tmp / 'mlflow.db'}" if to == "mlflow" else str(tmp / to)


def read_back(to: str, tmp: Path) -> dict[str, dict]:
    """Per run fingerprint, what the tracker holds: curves {split: [(step, loss)]}, params, status, final, copies."""
    uri = _uri(to, tmp)
    out: dict[str, dict] = {}
    if to == "mlflow":
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name("widths")
        for run in client.search_runs([exp.experiment_id], max_results=1000):
            fp = run.data.tags["ablate.fingerprint"]
            curves = {split: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, f"{split}_loss")]
                      for split in ("train", "eval")}
            prior = out.get(fp, {}).get("copies", 0)
            out[fp] = {"curves": curves, "params": run.data.params, "status": run.data.tags["ablate.status"],
                       "final": {k: v for k, v in run.data.metrics.items() if k.startswith("final_")},
                       "copies": prior + 1, "state": run.info.status}
    elif to == "tensorboard":
        for folder in sorted(p for p in (tmp / "tensorboard" / "widths").iterdir() if p.is_dir() and p.name[0] != "."):
            fp = folder.name.rsplit("-", 1)[1]
            scalars, texts = tensorboard_scalars(folder), tensorboard_texts(folder)
            out[fp] = {"curves": {split: scalars.get(f"loss/{split}", []) for split in ("train", "eval")},
                       "params": texts["config/text_summary"][0], "status": texts["status/text_summary"][-1],
                       "final": {k.removeprefix("final/"): v[-1][1] for k, v in scalars.items() if k.startswith("final/final_")},
                       "copies": len(texts["config/text_summary"])}
    else:
        for fp, run in wandb_runs(tmp / "wandb").items():
            out[fp] = {"curves": {split: run["history"].get(f"{split}/loss", []) for split in ("train", "eval")},
                       "params": run["config"], "status": run["summary"]["status"],
                       "final": {k: v for k, v in run["summary"].items() if k.startswith("final_")}, "copies": 1}
    return out


def db_curves(url: str) -> dict[str, dict]:
    engine = store.reader(url)
    with engine.connect() as conn:
        runs = {r.id: r for r in conn.execute(sa.select(store.Run).join(store.Sweep).where(store.Sweep.name == "widths"))}
        points = conn.execute(sa.select(store.Metric.run_id, store.Metric.split, store.Metric.step, store.Metric.loss)
                              .where(store.Metric.run_id.in_(list(runs))).order_by(store.Metric.step)).all()
    out = {r.fingerprint: {"row": r, "curves": {"train": [], "eval": []}} for r in runs.values()}
    for run_id, split, step, loss in points:
        out[runs[run_id].fingerprint]["curves"][split].append((step, loss))
    return out


def check(to: str, tmp: Path, url: str) -> None:
    held, want = read_back(to, tmp), db_curves(url)
    assert set(held) == set(want)
    for fp, w in want.items():
        h, row = held[fp], w["row"]
        assert h["copies"] == 1, (to, fp)  # one tracker run per ablate run, however often exported
        for split in ("train", "eval"):
            steps = [s for s, _ in h["curves"][split]]
            assert steps == [s for s, _ in w["curves"][split]], (to, fp, split)  # every point, once, in order
            assert [v for _, v in h["curves"][split]] == pytest.approx([v for _, v in w["curves"][split]], rel=1e-6)
        assert h["status"].startswith(row.status)
        if row.final_eval_loss is not None:
            assert h["final"]["final_eval_loss"] == pytest.approx(row.final_eval_loss, rel=1e-6)
        params = flatten(row.config)
        if to == "tensorboard":
            assert f"| d_model | {row.d_model} |" in h["params"] and f"| seed | {row.seed} |" in h["params"]
        else:
            assert {k: str(v) for k, v in h["params"].items() if k in params} == {k: str(v) for k, v in params.items()}


@pytest.mark.slow
@pytest.mark.parametrize("to", TARGETS)
def test_an_export_read_back_by_the_trackers_own_reader_then_updated_without_duplicates(to, tmp_path):
    pytest.importorskip({"mlflow": "mlflow", "tensorboard": "tensorboard", "wandb": "wandb"}[to])
    db = build(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    first = export_sweep("widths", to, _uri(to, tmp_path), db["url"])
    assert (first.runs, first.updated) == (8, 8) and first.points == sum(
        len(c) for w in db_curves(db["url"]).values() for c in w["curves"].values())
    check(to, tmp_path, db["url"])
    again = export_sweep("widths", to, _uri(to, tmp_path), db["url"])
    assert (again.runs, again.updated, again.points) == (8, 0, 0)

    # the running run trains on and finishes: the next export adds exactly its new points and its new status
    running = db["runs"][db["ids"][-1]]
    engine = store.connect(db["url"])
    write_curve(engine, running.id, running.architecture, running.d_model, running.seed, range(202, 401, 2))
    store.update_run(engine, running.id, status="completed", final_eval_loss=1.5, final_train_loss=1.4)
    later = export_sweep("widths", to, _uri(to, tmp_path), db["url"])
    assert (later.updated, later.points) == (1, 100 + 5)  # 100 train points, 5 evals (240 ... 400)
    check(to, tmp_path, db["url"])
    if to == "mlflow":
        assert read_back(to, tmp_path)[running.fingerprint]["state"] == "FINISHED"


def test_exported_runs_are_named_by_what_sets_them_apart_and_a_pending_run_is_dated_when_registered(tmp_path):
    """A tracker shows run names and start times: 'run-12' told nothing, and a run pending at export time showed as
    created 26 years ago (its start was taken as 2000-01-01)."""
    import datetime as dt

    from ablate.export.runs import export_runs

    db = build(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    engine = store.connect(db["url"])
    pending = db["ids"][0]
    store.update_run(engine, pending, status="pending")
    with engine.begin() as conn:
        conn.execute(sa.update(store.Run).where(store.Run.id == pending).values(started_at=None))
    runs = {r.run_id: r for r in export_runs(engine, "widths")}
    for rid, row in db["runs"].items():  # heads too: null for the mixer, set for llama
        heads = flatten(row.config)["heads"]
        assert runs[rid].name == (f"architecture={row.architecture} d_model={row.d_model} heads={heads} "
                                  f"seed={row.seed} · run {rid}"), runs[rid].name
    assert len({r.name for r in runs.values()}) == len(runs)
    registered = store.get_run(engine, pending).created_at.replace(tzinfo=dt.timezone.utc).timestamp() * 1000
    assert abs(runs[pending].start_ms() - registered) < 1000


def test_the_export_command_says_where_and_how_to_look(tmp_path, capsys):
    from ablate.cli import main

    db = build(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    assert main(["export", "widths", "--to", "tensorboard", "--uri", str(tmp_path / "tb"), "--db", db["url"]]) == 0
    out = capsys.readouterr()
    assert "widths: 8 runs in tensorboard" in out.out and f"tensorboard --logdir {tmp_path / 'tb' / 'widths'}" in out.out
    assert "exported 8/8 runs" in out.err
    assert main(["export", "nosuch", "--to", "tensorboard", "--db", db["url"]]) == 2
    assert "no sweep named 'nosuch'" in capsys.readouterr().err
    assert not (Path("results") / "tensorboard" / "nosuch").exists()


def test_a_tracker_that_is_not_installed_is_named_with_its_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as on a machine without the extra
    with pytest.raises(AblateError, match=r"needs the mlflow package: pip install 'ablate\[mlflow\]'"):
        export_sweep("widths", "mlflow", None, f"sqlite:///{tmp_path / 'none.db'}")


def test_a_hostile_sweep_name_never_leaves_the_export_folder(tmp_path):
    from ablate.export.runs import slug

    assert slug("../../etc") == "_.._etc" and slug("a/b c") == "a_b_c" and slug("..") == "sweep"
    db = build(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    out = export_sweep(db["hostile"], "tensorboard", str(tmp_path / "tb"), db["url"])
    assert out.runs == 8 and Path(out.where["logdir"]).parent == tmp_path / "tb"


@pytest.mark.slow
def test_follow_keeps_the_tracker_up_to_date_until_every_run_has_finished(tmp_path):
    """`--follow`: the running run's new points reach TensorBoard while it trains, and the export ends by itself
    when the run finishes."""
    import threading

    db = build(f"sqlite:///{tmp_path / 'r.db'}", tmp_path)
    said: list[str] = []
    result: dict = {}
    follower = threading.Thread(target=lambda: result.update(out=export_sweep(
        "widths", "tensorboard", _uri("tensorboard", tmp_path), db["url"], follow=0.2, say=said.append)))
    follower.start()
    running = db["runs"][db["ids"][-1]]
    engine = store.connect(db["url"])
    import time

    time.sleep(1.0)
    write_curve(engine, running.id, running.architecture, running.d_model, running.seed, range(202, 301, 2))
    deadline = time.monotonic() + 30
    while not said and time.monotonic() < deadline:
        time.sleep(0.1)
    assert said == ["1 run(s) moved: 52 new points sent"], said  # 50 train points, evals at 240 and 280
    assert follower.is_alive()  # the run is still training: the export follows on
    write_curve(engine, running.id, running.architecture, running.d_model, running.seed, range(302, 401, 2))
    store.update_run(engine, running.id, status="completed", final_eval_loss=1.5, final_train_loss=1.4)
    follower.join(30)
    assert not follower.is_alive() and result["out"].runs == 8  # ended by itself once every run had finished
    check("tensorboard", tmp_path, db["url"])  # every point once, the last status
