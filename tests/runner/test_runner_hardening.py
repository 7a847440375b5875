"""Hardening of running sweeps: one trainer per run with two runners and a search at once, Ctrl-C and a killed
`sweep run`, the database password kept out of argv, logs and deployments.

(A campaign across the house: `pytest -m hardening` runs all of it.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from ablate import runner, store
from ablate.config.errors import AblateError
from tests.train.test_train import make_trial
from tests.waiting import Deadline, patience

from tests.helpers import cli_env, grid_spec, one_seed_smoke

REPO = Path(__file__).resolve().parents[2]
SMOKE = one_seed_smoke()  # the smoke sweep with one seed per cell: 4 trials

pytestmark = pytest.mark.hardening


@pytest.mark.slow
def test_two_runners_and_a_search_at_once_train_each_trial_exactly_once(any_url, tmp_path, prefect_api):
    from tests.search.test_search import tiny, write_spec

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
    env = cli_env(PREFECT_API_URL=prefect_api)  # the runs are claimed in the DB: one Prefect API is enough
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
    # background job, as CI may start the suite, ignores SIGINT, and the child would inherit that), sent to the
    # whole foreground process group (a server started in it got the SIGINT too, and the flow then waited minutes)
    cli = subprocess.Popen([sys.executable, "-m", "ablate.cli", "sweep", "run", str(spec), "--db", url, "--artifacts",
                            str(tmp_path / "art"), "--threads", "1", "--checkpoint-every", "5"], env=cli_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
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
    os.killpg(cli.pid, signal.SIGINT)
    try:  # a step, a checkpoint and at most FLOW_END_SECONDS for the flow: seconds (it took 140 s, idle, before)
        out, err = cli.communicate(timeout=patience(60))
    except subprocess.TimeoutExpired:  # where it hangs: every thread's stack (`kill -USR1`), for the failure message
        cli.send_signal(signal.SIGUSR1)
        time.sleep(3)
        cli.kill()
        out, err = cli.communicate()
        raise AssertionError(f"`ablate sweep run` still running 60 s after Ctrl-C; its stacks and output:\n"
                             f"{err[-8000:]}\n{out[-2000:]}") from None
    assert cli.returncode == 130, (out, err)
    assert "resume it with: ablate sweep run" in err
    assert "stopping: waiting for 1 trainer(s) to checkpoint and stop (runs 1;" in err  # what it waits for
    assert "ERROR" not in err and "EventsWorker" not in err and "Traceback" not in err, err  # nothing like a crash
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


def test_the_database_password_stays_out_of_argv_logs_and_deployments(tmp_path):
    secret = "postgresql+psycopg://ablate:s3cret-pw@db.example:5432/ablate"
    cmd = runner.trainer_command(make_trial(), 7, runner.LaunchOptions(db_url=secret))
    assert not any("s3cret" in part for part in cmd)
    assert "s3cret" not in store.redact(f"cannot reach {secret}: refused")
    assert store.redact(f"url={secret}") == "url=postgresql+psycopg://ablate:***@db.example:5432/ablate"
    from flows.deploy import deploy_all

    with pytest.raises(AblateError, match="plain text"):
        deploy_all(REPO / "sweeps", db_url=secret)
