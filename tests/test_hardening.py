"""Hardening: one trainer per run (atomic claims, heartbeats), artifacts keyed by database, checkpoints that
cannot run code, restarts, signals, full disks, read-only and foreign databases, secrets.

(The read-only `ablate sql` is in test_hardening_sql.py, spec validation in test_hardening_spec.py.)
"""

from __future__ import annotations

import datetime as dt
import os
import pickle
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch
import yaml

from ablate import runner, store
from ablate.config.errors import AblateError
from ablate.train import Settings, train
from test_train import make_trial, metric_rows, registered
from tests.waiting import Deadline, patience

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "sweeps" / "smoke.yaml"


@pytest.fixture(params=["sqlite", "postgres"])
def any_url(request):
    return request.getfixturevalue(f"{request.param}_url")


def grid_spec(tmp_path: Path, name: str = "claims", d_models=(32, 48, 64), steps: int = 20) -> Path:
    data = {
        "name": name,
        "dataset": {"source": "ablate:tinystories-sample", "eval": {"holdout": 16}, "packing": "pad"},
        "tokenizer": {"vocab_size": 384},
        "budget": {"steps": steps, "hardware": "cpu"},
        "eval": {"at": [0.5]},
        "defaults": {"architecture": "mixer", "layers": 1, "context": 64, "batch_size": 8, "lr": 3e-3,
                     "precision": "fp32"},
        "grid": [{"d_model": list(d_models)}],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ABLATE_DB_URL"}
    return {**env, "PYTHONPATH": str(REPO), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(int(patience(120))),
            **extra}


def at_once(fn, n: int) -> tuple[list, list[Exception]]:
    """Call `fn(i)` from n threads released together; (results, errors)."""
    barrier = threading.Barrier(n)
    results, errors = [], []

    def one(i: int) -> None:
        barrier.wait()
        try:
            results.append(fn(i))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


# ---------------------------------------------------------------- claims


def test_racing_claims_on_one_run_have_exactly_one_winner(any_url, tmp_path):
    _, _, ids = runner.register(grid_spec(tmp_path), any_url)
    engine = store.connect(any_url)
    outcomes, errors = at_once(lambda i: (f"contender-{i}", store.claim_run(engine, ids[0], f"contender-{i}")), 8)
    wins = [who for who, won in outcomes if won]
    assert not errors and len(wins) == 1
    run = store.get_run(engine, ids[0])
    assert run.claimed_by == wins[0] and run.status == "running" and run.attempts == 1


def test_a_stale_claim_is_taken_over_and_the_old_claimant_is_fenced_off(any_url, tmp_path):
    _, _, ids = runner.register(grid_spec(tmp_path), any_url)
    engine = store.connect(any_url)
    assert store.claim_run(engine, ids[0], "host-a:1:x")
    assert not store.claim_run(engine, ids[0], "host-b:1:y")  # live: refused
    stale = store.utcnow() - dt.timedelta(seconds=store.STALE_SECONDS + 5)
    store.update_run(engine, ids[0], heartbeat_at=stale)  # host-a died
    assert store.claim_run(engine, ids[0], "host-b:1:y")
    assert not store.heartbeat(engine, ids[0], "host-a:1:x")  # a back-from-the-dead host learns it lost the run
    assert not store.update_run(engine, ids[0], claimant="host-a:1:x", status="completed")
    run = store.get_run(engine, ids[0])
    assert run.status == "running" and run.claimed_by == "host-b:1:y" and run.attempts == 2


def test_claims_do_not_take_finished_or_cancelled_runs(sqlite_url, tmp_path):
    _, _, ids = runner.register(grid_spec(tmp_path), sqlite_url)
    engine = store.connect(sqlite_url)
    store.update_run(engine, ids[0], status="completed")
    store.update_run(engine, ids[1], status="cancelled")
    assert not store.claim_run(engine, ids[0], "a", runner.CLAIMABLE)
    assert not store.claim_run(engine, ids[1], "a", runner.CLAIMABLE)
    assert store.claim_run(engine, ids[1], "a", runner.CLAIMABLE + ("cancelled",))  # --retry-failed


def test_concurrent_registration_of_one_sweep_does_not_fail(any_url, tmp_path):
    spec = grid_spec(tmp_path, d_models=(32, 48, 64, 80, 96, 112))
    results, errors = at_once(lambda _: runner.register(spec, any_url)[2], 4)
    assert not errors
    assert len({tuple(r) for r in results}) == 1 and len(results[0]) == 6


@pytest.mark.slow
def test_two_runners_and_a_search_at_once_train_each_trial_exactly_once(any_url, tmp_path):
    from test_search import tiny, write_spec

    spec = grid_spec(tmp_path, d_models=(32, 48, 64))
    # a search whose two workers sample the same config: one trains it, the other follows that run
    search_spec = write_spec(tmp_path, tiny(n_trials=2, sampler="random",
                                            parameters={"heads": {"type": "categorical", "choices": [2]}}))
    art = tmp_path / "art"
    runner.register(spec, any_url)  # the caches, once, so the race is about runs rather than tokenizing
    from ablate.data import prepare
    from ablate.config import load_trials

    trial = load_trials(spec)[1][0]
    prepare(trial.dataset, trial.tokenizer, trial.context, art, progress=False)
    env = cli_env()
    common = ["--db", any_url, "--artifacts", str(art), "--threads", "1"]
    procs = [subprocess.Popen([sys.executable, "-m", "ablate.cli", "sweep", "run", str(spec), *common], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    procs.append(subprocess.Popen([sys.executable, "-m", "ablate.cli", "search", "run", str(search_spec), "--workers",
                                   "2", *common], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=patience(540))[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n\n".join(  # each process's own ending, whole
        f"--- process {i} exited {p.returncode}:\n{out[-4000:]}" for i, (p, out) in enumerate(zip(procs, outputs)))
    engine = store.connect(any_url)
    with engine.connect() as conn:
        runs = conn.execute(sa.select(store.Run.id, store.Run.status, store.Run.attempts)).all()
        points = conn.execute(sa.select(store.Metric.run_id, store.Metric.split, store.Metric.step)).all()
    assert len(runs) == 4  # three grid trials and the search's one config
    assert all(r.status == "completed" and r.attempts == 1 for r in runs), runs  # each trained exactly once
    assert len(points) == len(set(points))


# ---------------------------------------------------------------- artifacts, checkpoints, restarts


def test_a_fresh_database_never_resumes_another_databases_checkpoint(tmp_path):
    trial = make_trial(budget={"steps": 20})
    art = tmp_path / "art"
    urls = [f"sqlite:///{tmp_path / name}" for name in ("a.db", "b.db")]
    outs = []
    for url in urls:
        run_id = registered(url, trial)
        assert run_id == 1  # the same run id in both databases
        outs.append(train(trial, Settings(artifacts=art, db_url=url, run_id=run_id, progress=False)))
    paths = [store.get_run(store.connect(url), 1).checkpoint_path for url in urls]
    assert paths[0] != paths[1] and all(Path(p).exists() for p in paths)
    assert outs[1]["steps"] == 20 and len(metric_rows(urls[1], 1, "train")) == len(metric_rows(urls[0], 1, "train"))
    assert outs[1]["train_seconds"] > 0.5 * outs[0]["train_seconds"]  # trained, not resumed at its end


class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoints_load_weights_only_and_a_crafted_one_runs_no_code(tmp_path, capsys):
    from ablate.cli import main
    from ablate.train.generate import load_run_model
    from ablate.train.checkpoint import load_checkpoint

    url = f"sqlite:///{tmp_path / 'r.db'}"
    trial = make_trial(budget={"steps": 5})
    run_id = registered(url, trial)
    art = tmp_path / "art"
    train(trial, Settings(artifacts=art, db_url=url, run_id=run_id, progress=False))
    path = Path(store.get_run(store.connect(url), run_id).checkpoint_path)
    state = torch.load(path, weights_only=True)  # plain tensors and values
    assert set(state) >= {"model", "optimizer", "progress", "rng", "identity"}
    assert load_run_model(run_id, url, art)[0].fingerprint() == trial.fingerprint()
    # a crafted file in place of the checkpoint: refused, and its payload never runs
    marker = tmp_path / "pwned"
    with open(path, "wb") as f:
        pickle.dump({"model": _Exploit(marker)}, f)
    with pytest.raises(AblateError, match="cannot be read safely"):
        load_checkpoint(path)
    assert main(["generate", str(run_id), "--prompt", "Once", "--db", url, "--artifacts", str(art)]) == 2
    assert not marker.exists()
    # a row that names a file outside the artifacts folder is not opened
    store.update_run(store.connect(url), run_id, checkpoint_path=str(tmp_path / "elsewhere" / "checkpoint.pt"))
    with pytest.raises(AblateError, match="outside the artifacts folder"):
        load_run_model(run_id, url, art)


def test_a_new_attempt_from_step_zero_replaces_the_killed_attempts_points(sqlite_url):
    trial = make_trial(budget={"steps": 30})
    run_id = registered(sqlite_url, trial)
    # a first attempt killed before its first checkpoint left points behind
    stale = [dict(step=s, split="train", elapsed_seconds=0.1 * s, tokens=s, loss=123.0, lr=None) for s in range(1, 40)]
    store.write_metrics(store.connect(sqlite_url), run_id, stale)
    train(trial, Settings(artifacts=Path(sqlite_url.removeprefix("sqlite:///")).parent / "art", db_url=sqlite_url,
                          run_id=run_id, progress=False, log_points=10))
    rows = metric_rows(sqlite_url, run_id)
    assert rows and all(r.loss != 123.0 for r in rows)
    assert max(r.step for r in rows if r.split == "train") <= 30


# ---------------------------------------------------------------- signals, full disks


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


@pytest.mark.slow
def test_ctrl_c_stops_the_sweep_cleanly_and_says_how_to_resume(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    data = yaml.safe_load(grid_spec(tmp_path, d_models=(32, 48)).read_text())
    data["budget"] = {"wall_clock": "10m", "hardware": "cpu"}
    spec = tmp_path / "long.yaml"
    spec.write_text(yaml.safe_dump(data))
    # Ctrl-C as on a terminal: SIGINT at its default in the child, whatever this process inherited (a shell's
    # background job, as CI may start the suite, ignores SIGINT, and the child would inherit that)
    cli = subprocess.Popen([sys.executable, "-m", "ablate.cli", "sweep", "run", str(spec), "--db", url, "--artifacts",
                            str(tmp_path / "art"), "--threads", "1", "--checkpoint-every", "5"], env=cli_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = Deadline(240)
    trainer = None
    while not deadline.passed() and trainer is None:
        time.sleep(1)
        if Path(url.removeprefix("sqlite:///")).exists():
            with store.connect(url).connect() as conn:
                trainer = conn.execute(sa.select(store.Run.pid).where(store.Run.status == "running",
                                                                    store.Run.steps.is_(None), store.Run.pid.isnot(None))).scalar()
        assert cli.poll() is None, cli.communicate()
    assert trainer is not None, "no trainer started"
    time.sleep(8)  # past warm-up, into training
    helpers = _children(cli.pid)  # the local Prefect server, the trainer's runner threads' processes
    cli.send_signal(signal.SIGINT)
    try:
        out, err = cli.communicate(timeout=patience(200))
    except subprocess.TimeoutExpired:  # where it hangs: every thread's stack (`kill -USR1`), for the failure message
        cli.send_signal(signal.SIGUSR1)
        time.sleep(3)
        cli.kill()
        out, err = cli.communicate()
        raise AssertionError(f"`ablate sweep run` still running 200 s after Ctrl-C; its stacks and output:\n"
                             f"{err[-8000:]}\n{out[-2000:]}") from None
    assert cli.returncode == 130, (out, err)
    assert "resume it with: ablate sweep run" in err
    assert not runner.pid_alive(trainer)
    time.sleep(2)
    assert not [p for p in helpers if runner.pid_alive(p) and Path(f"/proc/{p}").exists()
                and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]], "a helper outlived the sweep"
    statuses = runner.sweep_runs(store.connect(url), "claims")
    assert sorted(r.status for r in statuses) == ["pending", "preempted"]  # the second trial never started
    preempted = next(r for r in statuses if r.status == "preempted")
    assert Path(preempted.checkpoint_path).exists() and preempted.steps > 0


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_killed_sweep_run_leaves_no_prefect_server_behind(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    cli = subprocess.Popen([sys.executable, "-m", "ablate.cli", "sweep", "run", str(SMOKE), "--db", url, "--artifacts",
                            str(tmp_path / "art"), "--threads", "1"], env=cli_env(ABLATE_HEARTBEAT_SECONDS="1"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    server = None
    try:
        deadline = Deadline(240)
        while server is None and not deadline.passed() and cli.poll() is None:
            time.sleep(0.5)
            server = next((p for p in _children(cli.pid) if b"prefect.server.api.server" in
                           Path(f"/proc/{p}/cmdline").read_bytes()), None) if Path(f"/proc/{cli.pid}").exists() else None
        assert server is not None, "no local Prefect server started"
        cli.kill()  # SIGKILL: no atexit, no signal handler
        cli.wait()
        deadline = Deadline(30)
        while _running(server) and not deadline.passed():
            time.sleep(0.5)
        assert not _running(server), "the local Prefect server outlived its killed `ablate sweep run`"
    finally:
        cli.kill()
        if server is not None and _running(server):
            os.kill(server, signal.SIGKILL)


def _train_under_a_file_size_limit(tmp_path, budget: dict, *args: str):
    """A real write failure (a file-size limit on the trainer, EFBIG like ENOSPC) for a run's checkpoints."""
    from ablate.data import prepare

    url = f"sqlite:///{tmp_path / 'r.db'}"
    trial = make_trial(d_model=128, budget=budget)  # a checkpoint of several MB
    run_id = registered(url, trial)
    art = tmp_path / "art"
    prepare(trial.dataset, trial.tokenizer, trial.context, art, progress=False)  # caches written before the limit

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failing write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    proc = subprocess.run([sys.executable, "-m", "ablate.train", "--run-id", str(run_id), "--artifacts", str(art),
                           "--quiet", "--threads", "1", *args], env=cli_env(ABLATE_DB_URL=url), preexec_fn=limit,
                          capture_output=True, text=True, timeout=patience(300))
    return proc, store.get_run(store.connect(url), run_id), art


def test_a_checkpoint_that_cannot_be_written_fails_the_run_cleanly(tmp_path):
    """Mid-run: a message, no partial checkpoint, no run left `running`."""
    proc, run, art = _train_under_a_file_size_limit(tmp_path, {"steps": 100_000}, "--checkpoint-every", "0.5")
    assert proc.returncode == 2, proc.stderr
    assert "cannot write checkpoint" in proc.stderr
    assert run.status == "failed" and "cannot write checkpoint" in run.error and run.steps < 100_000
    assert not list(art.glob("runs/**/*.tmp"))


def test_a_finished_run_whose_final_checkpoint_cannot_be_written_keeps_its_result(tmp_path):
    """Training and the final eval are done and recorded: the run is not failed and trained again for a file."""
    proc, run, art = _train_under_a_file_size_limit(tmp_path, {"steps": 5})
    assert proc.returncode == 0, proc.stderr
    assert "final checkpoint was not written" in proc.stderr and "cannot write checkpoint" in proc.stderr
    assert run.status == "completed" and run.steps == 5 and run.final_eval_loss is not None, (run.status, run.error)
    assert run.notes["final_checkpoint"].startswith("not written: cannot write checkpoint")
    assert not list(art.glob("runs/**/*.tmp"))


# ---------------------------------------------------------------- databases: read-only, foreign, newer, migrations


def test_a_read_only_database_says_read_only(postgres_url, tmp_path, capsys):
    from ablate.cli import main

    spec = grid_spec(tmp_path)
    runner.register(spec, postgres_url)
    store.migrate._ENGINES.clear()
    name = sa.make_url(postgres_url).database
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on'))
    admin.dispose()
    spec.write_text(spec.read_text().replace("- 64", "- 64\n  - 80"))  # one more trial to write
    assert main(["sweep", "register", str(spec), "--db", postgres_url]) == 2
    err = capsys.readouterr().err
    assert "read-only" in err and "start the server" not in err.lower()


def test_a_newer_schema_and_a_foreign_database_get_one_clear_message(tmp_path, capsys):
    from ablate.cli import main

    url = f"sqlite:///{tmp_path / 'newer.db'}"
    engine = store.connect(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {store.VERSION_TABLE} SET version_num = '0099'"))
    store.migrate._ENGINES.clear()
    for argv in (["sweep", "status", "x"], ["sweep", "register", str(grid_spec(tmp_path))]):
        assert main([*argv, "--db", url]) == 2
        assert "newer than this ablate" in capsys.readouterr().err
    foreign = tmp_path / "foreign.db"
    with sa.create_engine(f"sqlite:///{foreign}").begin() as conn:
        conn.execute(sa.text("CREATE TABLE runs (id INTEGER PRIMARY KEY, what TEXT)"))
    assert main(["sweep", "register", str(grid_spec(tmp_path)), "--db", str(foreign)]) == 2
    assert "did not create" in capsys.readouterr().err
    with sa.create_engine(f"sqlite:///{foreign}").connect() as conn:
        assert set(sa.inspect(conn).get_table_names()) == {"runs"}  # nothing added


def test_a_sqlite_migration_that_fails_half_way_leaves_the_database_as_it_was(tmp_path):
    from test_db import at_revision

    engine = at_revision(f"sqlite:///{tmp_path / 'm.db'}", "0004")
    with engine.begin() as conn:  # something in the way of 0005's second step
        conn.execute(sa.text("CREATE TABLE ablate_meta (x INTEGER)"))
    with pytest.raises(AblateError, match="rolled back"):
        store.upgrade_schema(engine)
    assert store.current_revision(engine) == "0004"
    with engine.connect() as conn:
        assert "claimed_by" not in {c["name"] for c in sa.inspect(conn).get_columns("runs")}  # step one undone


def test_reading_commands_never_create_a_database(tmp_path, monkeypatch, capsys):
    from ablate.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "status", "smoke"]) == 2
    assert main(["report", "smoke"]) == 2
    assert main(["generate", "1", "--prompt", "x"]) == 2
    assert "no results database" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_a_damaged_token_cache_is_detected_and_rebuilt(tmp_path):
    from ablate.data import cache_intact, prepare

    trial = make_trial()
    first = prepare(trial.dataset, trial.tokenizer, trial.context, tmp_path, progress=False)
    rows = first.train.batch(list(range(4)))[0].clone()
    target = first.cache_dir / "train.bin"
    data = bytearray(target.read_bytes())
    data[10] ^= 0xFF
    target.write_bytes(bytes(data))
    assert not cache_intact(first.cache_dir)
    again = prepare(trial.dataset, trial.tokenizer, trial.context, tmp_path, progress=False)
    assert cache_intact(again.cache_dir)
    assert torch.equal(again.train.batch(list(range(4)))[0], rows)


# ---------------------------------------------------------------- secrets


def test_the_database_password_stays_out_of_argv_logs_and_deployments(tmp_path):
    secret = "postgresql+psycopg://ablate:s3cret-pw@db.example:5432/ablate"
    cmd = runner.trainer_command(make_trial(), 7, runner.RunOptions(db_url=secret))
    assert not any("s3cret" in part for part in cmd)
    assert "s3cret" not in store.redact(f"cannot reach {secret}: refused")
    assert store.redact(f"url={secret}") == "url=postgresql+psycopg://ablate:***@db.example:5432/ablate"
    from flows.deploy import deploy_all

    with pytest.raises(AblateError, match="plain text"):
        deploy_all(REPO / "sweeps", db_url=secret)


def test_sql_as_the_reader_role_may_join_runs_with_optunas_trials(postgres_url, capsys):
    """Optuna makes its tables after the migrations: creating a study grants the reader role SELECT on them."""
    from test_search import tiny

    from ablate import search
    from ablate.cli import main
    from ablate.config import parse_spec

    search.create_study(parse_spec(tiny()), postgres_url)
    query = ("SELECT current_user AS who, count(t.trial_id) AS n FROM studies s "
             "LEFT JOIN trials t ON t.study_id = s.study_id")
    assert main(["sql", query, "--db", postgres_url, "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"{store.READER_ROLE},0"


def test_processes_opening_a_new_sqlite_file_at_once_all_get_it(tmp_path):
    """Switching a new file to WAL answers "locked" at once to all but one opener (seen 3 in 40 rounds)."""
    for round_ in range(20):
        url = f"sqlite:///{tmp_path / f'fresh-{round_}.db'}"
        _, errors = at_once(lambda _: store.connect(url), 6)
        store.migrate._ENGINES.pop(url, None)
        assert not errors, errors
