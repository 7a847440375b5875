"""The `ablate` command as a user runs it: exit codes, messages, and read-only SQL."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from ablate import store
from ablate.cli import main
from tests.helpers import cli_env, one_seed_smoke
from tests.waiting import patience

REPO = Path(__file__).resolve().parents[2]
SMOKE = str(one_seed_smoke())  # the smoke sweep with one seed per cell: 4 trials
REAL_SMOKE = str(REPO / "sweeps" / "smoke.yaml")


def ablate(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablate.cli", *argv], capture_output=True, text=True, cwd=REPO,
                          timeout=patience(120))


def test_plan_lists_trials_and_total_budget(capsys):
    assert main(["plan", REAL_SMOKE]) == 0
    out = capsys.readouterr().out
    assert "12 trials" in out and "steps 100 on 1x cpu" in out and "total on 1x cpu: 1.20k steps" in out


def test_user_error_exits_2_with_a_message_and_no_traceback(tmp_path):
    bad = yaml.safe_load(Path(SMOKE).read_text())
    bad["grid"][1]["heads"] = 5
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = ablate("plan", str(path))
    assert result.returncode == 2
    assert "heads=5 does not divide d_model=64" in result.stderr
    assert "Traceback" not in result.stderr


def test_invalid_spec_writes_nothing_to_the_db(tmp_path, db_url):
    bad = yaml.safe_load(Path(SMOKE).read_text())
    bad["grid"].append({"architecture": "mixr", "d_model": 32})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["sweep", "register", str(path), "--db", db_url]) == 2
    engine = store.connect(db_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM runs")).scalar() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM sweeps")).scalar() == 0


def test_sql_refuses_writes_and_the_table_is_intact(db_url, capsys):
    assert main(["sweep", "register", SMOKE, "--db", db_url]) == 0
    for statement in ("DROP TABLE runs", "DELETE FROM runs", "UPDATE runs SET status = 'failed'", "INSERT INTO sweeps (name) VALUES ('x')"):
        assert main(["sql", statement, "--db", db_url]) == 2
        assert "read-only" in capsys.readouterr().err
    assert main(["sql", "SELECT status, count(*) AS n FROM runs GROUP BY status", "--db", db_url, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == [{"status": "pending", "n": 4}]


def test_sql_csv_output(sqlite_url, capsys):
    main(["sweep", "register", SMOKE, "--db", sqlite_url])
    capsys.readouterr()
    assert main(["--db", sqlite_url, "sql", "SELECT architecture, d_model FROM runs ORDER BY id", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["architecture,d_model", "mixer,64", "mixer,128", "llama,64", "llama,128"]


def test_sql_writes_csv_when_piped_and_a_table_on_a_terminal(sqlite_url, capsys, monkeypatch):
    from ablate.cli.common import console

    main(["sweep", "register", SMOKE, "--db", sqlite_url])
    capsys.readouterr()
    query = "SELECT architecture, d_model FROM runs ORDER BY id LIMIT 2"
    result = subprocess.run([sys.executable, "-m", "ablate.cli", "sql", query, "--db", sqlite_url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=cli_env(),
                            timeout=patience(120))
    assert result.returncode == 0 and result.stdout.splitlines() == ["architecture,d_model", "mixer,64", "mixer,128"]
    assert main(["sql", query, "--db", sqlite_url]) == 0  # capsys: not a terminal either
    assert capsys.readouterr().out.splitlines() == ["architecture,d_model", "mixer,64", "mixer,128"]
    assert main(["sql", query, "--db", sqlite_url, "--format", "json"]) == 0  # an explicit format wins
    assert json.loads(capsys.readouterr().out)[1] == {"architecture": "mixer", "d_model": 128}
    monkeypatch.setattr(console, "_force_terminal", True)
    assert main(["sql", query, "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert "architecture" in out and "2 rows" in out and "architecture,d_model" not in out
    assert main(["sql", query, "--db", sqlite_url, "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "architecture,d_model"


def test_version_prints_the_installed_version_and_exits_0(capsys):
    from importlib import metadata

    result = subprocess.run([sys.executable, "-m", "ablate.cli", "--version"], capture_output=True, text=True,
                            cwd=REPO, env=cli_env(), timeout=patience(120))
    assert result.returncode == 0 and result.stdout == f"ablate {metadata.version('ablate')}\n", result
    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"ablate {metadata.version('ablate')}"
    assert main(["-h"]) == 0 and "--version" in capsys.readouterr().out


def test_sql_error_is_reported(sqlite_url, capsys):
    assert main(["db", "upgrade", "--db", sqlite_url]) == 0  # `ablate sql` never creates the database it reads
    assert main(["sql", "SELECT * FROM nowhere", "--db", sqlite_url]) == 2
    assert "no such table: nowhere" in capsys.readouterr().err


def test_db_upgrade_and_current(sqlite_url, capsys):
    assert main(["db", "upgrade", "--db", sqlite_url]) == 0
    assert "-> 0014" in capsys.readouterr().out
    assert main(["db", "current", "--db", sqlite_url]) == 0
    assert "schema 0014" in capsys.readouterr().out


def test_dead_database_error_from_the_cli(capsys):
    assert main(["sql", "SELECT 1", "--db", "postgresql+psycopg://postgres@127.0.0.1:1/x"]) == 2
    assert "cannot reach the results database" in capsys.readouterr().err


def test_documented_views_answer_the_common_questions(db_url, capsys):
    assert main(["sweep", "register", SMOKE, "--db", db_url]) == 0
    engine = store.connect(db_url)
    with engine.connect() as conn:
        ids = conn.execute(sa.select(store.Run.id).order_by(store.Run.id)).scalars().all()
    for rid, loss in zip(ids, (3.0, 2.5, 2.8, 2.9)):
        store.update_run(engine, rid, status="completed", final_eval_loss=loss)
        store.write_metrics(engine, rid, [dict(step=int(s * 100 / 15), split="eval", elapsed_seconds=s, tokens=int(40 * s), loss=loss + 1 - s / 15,
                                            lr=None) for s in (3.75, 7.5, 15)])
    capsys.readouterr()
    assert main(["sql", "SELECT architecture, d_model, final_eval_loss FROM best_runs ORDER BY architecture",
                 "--db", db_url, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"architecture": "llama", "d_model": 64, "final_eval_loss": 2.8},
        {"architecture": "mixer", "d_model": 128, "final_eval_loss": 2.5}]
    assert main(["sql", "SELECT run_id, loss FROM eval_curve WHERE budget_fraction = 0.5 ORDER BY run_id",
                 "--db", db_url, "--format", "json"]) == 0  # smoke budget: 100 steps, so step 50 is half
    rows = json.loads(capsys.readouterr().out)
    assert [r["loss"] for r in rows] == [3.5, 3.0, 3.3, 3.4]
    assert main(["sql", "SELECT count(*) AS n FROM run_results WHERE sweep = 'smoke'", "--db", db_url,
                 "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 4}]


def test_sweep_status_and_cancel(sqlite_url, capsys):
    from ablate import runner

    assert main(["sweep", "register", SMOKE, "--db", sqlite_url]) == 0
    engine = store.connect(sqlite_url)
    with engine.connect() as conn:
        ids = conn.execute(sa.select(store.Run.id).order_by(store.Run.id)).scalars().all()
    store.update_run(engine, ids[0], status="completed", final_train_loss=2.5, final_eval_loss=2.75, steps=10)
    capsys.readouterr()
    assert main(["sweep", "status", "smoke", "--db", sqlite_url, "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert out.count("pending") == 3 + 1 and "1 completed, 3 pending" in out and "2.750" in out  # rows + caption
    assert main(["sweep", "status", "smoke", "--db", sqlite_url]) == 0  # not a terminal: csv of every run
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["status"] for r in rows] == ["completed", "pending", "pending", "pending"]
    assert float(rows[0]["eval"]) == 2.75 and rows[0]["steps"] == "10" and rows[1]["eval"] == ""
    assert main(["sweep", "cancel", "smoke", "--db", sqlite_url]) == 0
    assert "3 waiting runs cancelled" in capsys.readouterr().out
    with engine.connect() as conn:
        statuses = conn.execute(sa.select(store.Run.status).order_by(store.Run.id)).scalars().all()
    assert statuses == ["completed", "cancelled", "cancelled", "cancelled"]
    sweep_id = store.get_run(engine, ids[0]).sweep_id
    assert runner.runs_to_do(engine, sweep_id, ids) == []
    assert main(["sweep", "status", "smok", "--db", sqlite_url]) == 2
    assert "did you mean 'smoke'" in capsys.readouterr().err


def test_plan_of_a_search_sweep_describes_the_search(capsys):
    assert main(["plan", str(REPO / "sweeps" / "tinystories-heads-lr.yaml")]) == 0
    out = capsys.readouterr().out
    assert "search: 24 trials sampled by tpe (pruner median)" in out and "heads in {1, 2, 4, 8, 16}" in out
    assert "1 trials" not in out and "total on 1x rtx3060: 288h00m" in out


def test_an_edited_sweep_drops_its_removed_unfinished_runs_and_keeps_results(sqlite_url, tmp_path, capsys):
    spec = yaml.safe_load(Path(SMOKE).read_text())
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["sweep", "register", str(path), "--db", sqlite_url]) == 0
    engine = store.connect(sqlite_url)
    runs = {(r.architecture, r.d_model): r.id for r in __import__("ablate.runner").runner.sweep_runs(engine, "smoke")}
    store.update_run(engine, runs[("mixer", 64)], status="failed", attempts=3, error="boom")
    store.update_run(engine, runs[("mixer", 128)], status="completed", final_eval_loss=3.0)
    store.write_metrics(engine, runs[("mixer", 64)], [dict(step=1, split="train", elapsed_seconds=1, tokens=1, loss=5.0,
                                                         lr=1e-3)])
    spec["grid"] = [{"architecture": "llama", "heads": 4, "d_model": [64, 128]}]  # the mixers are edited out
    path.write_text(yaml.safe_dump(spec))
    capsys.readouterr()
    assert main(["sweep", "register", str(path), "--db", sqlite_url]) == 0
    assert "dropped 1 unfinished run(s) whose trial is no longer in" in capsys.readouterr().out
    with engine.connect() as conn:
        left = dict(conn.execute(sa.select(store.Run.id, store.Run.status)).all())
        points = conn.execute(sa.select(sa.func.count()).select_from(store.Metric)).scalar()
    assert runs[("mixer", 64)] not in left and points == 0  # the failed run and its points are gone
    assert left[runs[("mixer", 128)]] == "completed"  # a result stays


def test_kill_usr1_prints_where_every_thread_of_the_program_is(tmp_path):
    """A hung `ablate` (a sweep that will not stop) can be asked where it is without killing it."""
    import signal
    import time

    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["db", "upgrade", "--db", url]) == 0
    slow = ("WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 1000000000) "
            "SELECT count(*) FROM c")
    proc = subprocess.Popen([sys.executable, "-m", "ablate.cli", "sql", slow, "--db", url, "--timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        time.sleep(patience(4))  # started and inside the query
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        assert proc.poll() is None  # still at work: the signal only printed
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=patience(60))
    assert "Current thread" in err or "Thread 0x" in err, err[-2000:]
    assert "ablate/results/sql.py" in err, err[-2000:]  # the query's frame, named


def test_a_command_line_that_does_not_parse_exits_2_and_says_what_is_wrong(capsys):
    assert main(["plan", SMOKE, "--max-trials", "many"]) == 2
    err = capsys.readouterr().err
    assert "--max-trials" in err and "'many' is not a valid integer" in err and "Usage: ablate plan" in err
    assert main(["sweep", "run"]) == 2
    assert "Missing argument 'SPEC'" in capsys.readouterr().err
    assert main(["sql", "SELECT 1", "--format", "xml"]) == 2
    assert "--format" in capsys.readouterr().err
    assert main(["worker"]) == 2
    assert "--pool" in capsys.readouterr().err
    assert main(["sweep", "run", SMOKE, "--no-such-flag"]) == 2
    assert "--no-such-flag" in capsys.readouterr().err
    assert main(["sweep", "status", "-h"]) == 0 and "--format [table|csv]" in capsys.readouterr().out


def test_report_names_an_unknown_format_and_the_ones_it_knows(sqlite_url, capsys):
    assert main(["report", "anything", "--db", sqlite_url, "--format", "md,pdf"]) == 2
    err = capsys.readouterr().err
    assert "--format: 'pdf' is not a format" in err and "csv, points" in err


def test_flags_are_read_as_they_always_were():
    from ablate.cli import parse

    # --db before or after the command (the last one given wins)
    assert parse(["--db", "a.db", "sql", "SELECT 1"]).params["db"] == "a.db"
    assert parse(["--db", "a.db", "sweep", "--db", "b.db", "status", "x"]).params["db"] == "b.db"
    assert parse(["sweep", "status", "x", "--db", "c.db"]).params["db"] == "c.db"
    assert parse(["sweep", "status", "x"]).params["db"] is None
    # several values after one flag, as `--compare A B`; repeatable flags
    assert parse(["report", "s", "--compare", "a", "b", "--out", "o"]).params["compare"] == ("a", "b")
    assert parse(["retrieval", "s", "--candidates", "1", "10", "--quiet"]).params["candidates"] == (1, 10)
    deploy = parse(["deploy", "--pool", "h100", "--pool", "a100", "--slots", "v100=4", "--slots", "cpu=1"]).params
    assert deploy["pools"] == ("h100", "a100") and deploy["slots"] == ("v100=4", "cpu=1")
    run = parse(["sweep", "run", SMOKE, "--budget", "steps=20", "--vocab-size", "512", "--merge"]).params
    assert run["budget"] == "steps=20" and run["vocab_size"] == 512 and run["merge"] and run["gpu_slots"] is None
    assert run["artifacts"] == "results/artifacts" and run["max_trials"] == 10_000


def test_sweep_run_refuses_a_modified_copy_before_prefect_starts(sqlite_url, tmp_path, capsys, monkeypatch):
    from ablate import runner
    from ablate.runner import localserver

    for name in ("ABLATE_DB_URL", "PREFECT_LOGGING_LEVEL", "PREFECT_SERVER_ANALYTICS_ENABLED", "DO_NOT_TRACK",
                 "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"):  # the command sets them for its process
        # set, then deleted: monkeypatch restores what was there (delenv of an absent name restores nothing, and a
        # PREFECT_LOGGING_LEVEL=CRITICAL left behind silenced every later flow's logs in this test process)
        monkeypatch.setenv(name, os.environ.get(name, ""))
        monkeypatch.delenv(name)
    monkeypatch.setattr(localserver, "launch", lambda: pytest.fail("Prefect was started"))
    _, _, ids = runner.register(SMOKE, sqlite_url)
    store.update_run(store.connect(sqlite_url), ids[0], status="completed", final_eval_loss=3.0)
    copy = yaml.safe_load(Path(SMOKE).read_text())
    copy["budget"]["steps"] = 400  # the same cells, another experiment
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(copy))
    assert main(["sweep", "run", str(path), "--db", sqlite_url, "--artifacts", str(tmp_path / "art")]) == 2
    err = capsys.readouterr().err
    assert "already holds results for the same cells with other settings (1 completed)" in err and "--merge" in err
    with store.connect(sqlite_url).connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(store.Run)).scalar() == 4  # nothing written
