"""What users ask of the SQL views, on SQLite and the real PostgreSQL: docs/database.md's ORDER BY puts runs without a
loss last, run_results carries error/options/attempts/study/precision/accuracy, eval_curve says which eval.at
point a row is, csv ends lines with LF, and a mistyped sweep name is an error, not an empty frame."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import one_seed_smoke
from ablate import results, runner, store
from ablate.cli import main
from ablate.config.errors import AblateError
from tests.train.test_train import make_trial, registered

REPO = Path(__file__).resolve().parents[2]
SMOKE = one_seed_smoke()  # the smoke sweep with one seed per cell: 4 trials


@pytest.fixture(params=["sqlite", "postgres"])
def url(request):
    return request.getfixturevalue(f"{request.param}_url")


def _smoke(url: str) -> list[int]:
    _, _, ids = runner.register(SMOKE, url)
    engine = store.connect(url)
    store.update_run(engine, ids[0], status="completed", final_eval_loss=3.5, options={"expand": 2}, precision="fp32")
    store.update_run(engine, ids[1], status="failed", error="trainer exited with code 1:\nboom", attempts=2)
    store.update_run(engine, ids[2], status="completed", final_eval_loss=3.1)
    return ids


def test_the_documented_order_by_puts_runs_without_a_loss_last(url, capsys):
    ids = _smoke(url)
    query = re.search(r'ablate sql "(SELECT architecture.*?ORDER BY final_eval_loss NULLS LAST LIMIT 20)"',
                      (REPO / "docs" / "database.md").read_text()).group(1)
    assert main(["sql", query.replace("FROM runs", "FROM runs WHERE id IS NOT NULL"), "--db", url, "--format", "csv"]) == 0
    lines = capsys.readouterr().out.split("\n")
    losses = [line.rsplit(",", 1)[1] for line in lines[1:] if line]
    assert losses[:2] == ["3.1", "3.5"] and losses[2:] == ["", ""], losses
    assert "\r" not in "\n".join(lines)  # LF line ends
    assert len(ids) == 4


def test_run_results_carries_error_options_attempts_study_precision_and_accuracy(url, capsys):
    ids = _smoke(url)
    assert main(["sql", "SELECT run_id, status, error, attempts, options, study_name, precision, final_eval_accuracy "
                 "FROM run_results ORDER BY run_id", "--db", url, "--format", "json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["run_id"] == ids[0] and rows[0]["precision"] == "fp32" and "expand" in str(rows[0]["options"])
    assert rows[1]["error"].startswith("trainer exited with code 1") and rows[1]["attempts"] == 2
    assert rows[0]["study_name"] is None and rows[0]["final_eval_accuracy"] is None


def test_eval_rows_record_their_eval_at_point(url, tmp_path, capsys):
    from ablate.train.state import TrainerSettings
    from ablate.train import train

    trial = make_trial(budget={"steps": 12}, eval={"at": [0.25, 0.5]})
    rid = registered(url, trial)
    train(trial, TrainerSettings(artifacts=tmp_path / "art", db_url=url, run_id=rid, progress=False, threads=1))
    assert main(["sql", f"SELECT eval_point, step FROM eval_curve WHERE run_id = {rid} ORDER BY step",
                 "--db", url, "--format", "json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert [r["eval_point"] for r in rows] == [0.25, 0.5, 1.0] and [r["step"] for r in rows] == [3, 6, 12]
    frame = results.metrics(run_ids=[rid], url=url)
    assert set(frame[frame.split == "train"].eval_point.isna()) == {True}


def test_a_mistyped_sweep_name_is_an_error_with_a_suggestion(url):
    _smoke(url)
    assert len(results.runs("smoke", url=url)) == 4
    with pytest.raises(AblateError, match="did you mean 'smoke'"):
        results.runs("smok", url=url)
    with pytest.raises(AblateError, match="did you mean 'smoke'"):
        results.metrics(sweep="smoek", url=url)


def test_the_documented_loss_at_a_point_query_reads_the_eval_point_index(url):
    # at 100,000 runs x 200 points it scanned every eval point (5.6 s on PostgreSQL); the index reads its rows
    import sqlalchemy as sa

    query = re.search(r"`(SELECT run_id, loss FROM eval_curve WHERE eval_point = 0\.5)`",
                      (REPO / "docs" / "database.md").read_text()).group(1)
    _smoke(url)
    engine = store.connect(url)
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text("SET LOCAL enable_seqscan = off"))  # a tiny table: ask whether the index can serve
            plan = "\n".join(r[0] for r in conn.execute(sa.text(f"EXPLAIN {query}")))
        else:
            plan = "\n".join(str(r[-1]) for r in conn.execute(sa.text(f"EXPLAIN QUERY PLAN {query}")))
    assert "ix_metrics_eval_point" in plan, plan
