"""The warm trainer (ablate/runner/warm.py): trials forked from a helper that imported torch once train exactly what a
cold `python -m ablate.train` trains, stop on the same signals, and survive the helper's death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ablate import runner, store
from ablate.runner import warm
from tests.train.test_train import make_trial, metric_rows, registered
from tests.helpers import REPO
from tests.waiting import patience, wait_until

FAST = {"ABLATE_HEARTBEAT_SECONDS": "1"}


def _losses(url: str, rid: int) -> list[tuple]:
    return [(m.split, m.step, m.loss) for m in metric_rows(url, rid)]


def _trial_in_thread(url: str, tmp_path, seconds: float, **kwargs):
    """A wall-clock trial run by `runner.run_trial` on a thread: (engine, run id, thread, {"status": outcome})."""
    rid = registered(url, make_trial(budget={"wall_clock": seconds}))
    opts = runner.LaunchOptions(db_url=url, artifacts=tmp_path / "art", threads=1, extra_env=FAST)
    out: dict[str, str] = {}
    t = threading.Thread(target=lambda: out.update(status=runner.run_trial(rid, opts, poll_seconds=0.2, **kwargs)))
    t.start()
    return store.connect(url), rid, t, out


def test_a_forked_trainer_records_the_same_run_as_a_cold_one(tmp_path, monkeypatch):
    trial = make_trial(budget={"steps": 6}, eval={"at": [0.5]})
    urls = [f"sqlite:///{tmp_path / name}.db" for name in ("warm", "cold")]
    rids = [registered(url, trial) for url in urls]
    opts = [runner.LaunchOptions(db_url=url, artifacts=tmp_path / "art", threads=1) for url in urls]
    assert warm.enabled()
    assert runner.run_trial(rids[0], opts[0]) == "completed"
    monkeypatch.setenv("ABLATE_WARM_TRAINER", "0")
    assert runner.run_trial(rids[1], opts[1]) == "completed"
    warm_run, cold_run = (store.get_run(store.connect(u), r) for u, r in zip(urls, rids))
    assert _losses(urls[0], rids[0]) == _losses(urls[1], rids[1]) and len(_losses(urls[0], rids[0])) >= 2
    assert warm_run.final_eval_loss == cold_run.final_eval_loss and warm_run.steps == cold_run.steps == 6 and warm_run.threads == cold_run.threads == 1
    for run in (warm_run, cold_run):  # each attempt's own CPU, the number bench/trial_cost.py reports
        cpu = run.notes["process_cpu"]
        assert 0 < cpu["before_training"] <= cpu["total"]


def test_single_process_trainers_are_forked_and_torchrun_or_an_opt_out_are_not(tmp_path, monkeypatch):
    log_path = tmp_path / "t.log"
    env = {**os.environ, "ABLATE_WARM_TRAINER": "1"}
    with open(log_path, "ab") as log:
        child = runner.start_trainer([os.sys.executable, "-m", "ablate.train", "--help"], env, log, log_path, tmp_path)
        assert isinstance(child, warm.Child) and child.wait(60) == 0
        assert "train one run to its budget" in log_path.read_text()  # argparse's help, printed into the trial's log
        assert child.cpu_seconds is not None
        torchrun = [os.sys.executable, "-m", "torch.distributed.run", "--help"]
        proc = runner.start_trainer(torchrun, env, log, log_path, tmp_path)
        assert isinstance(proc, subprocess.Popen)
        proc.wait(60)
        alone = runner.start_trainer([os.sys.executable, "-m", "ablate.train", "--help"], env, log, log_path, tmp_path,
                                     warm_ok=False)  # LaunchOptions(warm=False): a process with one trial to run
        assert isinstance(alone, subprocess.Popen) and alone.wait(60) == 0
        monkeypatch.setenv("ABLATE_WARM_TRAINER", "0")
        proc = runner.start_trainer([os.sys.executable, "-m", "ablate.train", "--help"], env, log, log_path, tmp_path)
        assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0


def test_the_helper_forks_from_a_single_thread_and_reports_exit_codes(tmp_path):
    helper = warm.helper()
    assert helper is not None and helper.ready["threads"] == 1, helper.ready  # no pool exists to be broken by a fork
    assert len(helper.ready["thread_names"]) == 1
    log = tmp_path / "child.log"
    child = helper.spawn(["--run-id", "x"], dict(os.environ), log)  # argparse rejects it: exit 2, message in the log
    assert child.wait(60) == 2 and "invalid int value" in log.read_text()


def test_the_helpers_environment_keeps_the_libraries_a_preload_may_pull_in_single_threaded(monkeypatch):
    """transformers imports pyarrow where pandas or scikit-learn is installed (the lent H200 image): its jemalloc
    then starts a background thread, and the node check found the helper with 2 threads. Under the helper's
    environment, numpy's and pyarrow's imports start none; the script names any thread it finds."""
    pytest.importorskip("pyarrow")
    monkeypatch.delenv("JE_ARROW_MALLOC_CONF", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    script = ("import os, numpy, pyarrow; pyarrow.array([1, 2, 3]); t = '/proc/self/task'; "
              "print(*[open(f'{t}/{x}/comm').read().strip() for x in os.listdir(t)])")
    out = subprocess.run([sys.executable, "-c", script], env=warm.helper_env(), capture_output=True, text=True,
                         timeout=120, check=True)
    assert len(out.stdout.split()) == 1, out.stdout


def test_stopping_a_forked_trainer_checkpoints_it_as_preempted(sqlite_url, tmp_path):
    stop = threading.Event()
    engine, rid, t, out = _trial_in_thread(sqlite_url, tmp_path, 120, should_stop=stop.is_set)
    wait_until(lambda: store.get_run(engine, rid).startup_seconds is not None, 120,  # written when the timed loop starts
               "the trainer never trained")
    time.sleep(1.0)
    pid = store.get_run(engine, rid).pid
    assert os.getpgid(pid) == pid != os.getpgid(0)  # a session of its own, signalled as a group like a cold trainer
    stop.set()  # the runner SIGTERMs the trainer's process group
    t.join(60)
    run = store.get_run(engine, rid)
    assert out["status"] == "preempted" == run.status and run.steps > 0 and os.path.exists(run.checkpoint_path)


def test_a_trainer_outlives_its_helper_and_its_outcome_is_still_recorded(sqlite_url, tmp_path):
    helper = warm.helper()
    engine, rid, t, out = _trial_in_thread(sqlite_url, tmp_path, 4)
    wait_until(lambda: store.get_run(engine, rid).pid is not None, 120, "the trainer never started", every=0.1)
    os.kill(helper.proc.pid, signal.SIGKILL)  # the helper dies (OOM killer); its child goes on under init
    t.join(120)
    assert out["status"] == "completed" == store.get_run(engine, rid).status
    again = warm.helper()
    assert again is not None and again.proc.pid != helper.proc.pid  # the next trial gets a fresh helper


def test_a_helper_that_does_not_answer_is_stopped_and_the_trainer_starts_cold(tmp_path, monkeypatch, capsys):
    helper = warm.helper()
    monkeypatch.setattr("ablate.runner.warm.ANSWER_SECONDS", 1.0)  # where WarmTrainer.spawn reads it
    os.kill(helper.proc.pid, signal.SIGSTOP)  # hung (or starved): it must not fork this trial after the runner gave up
    log_path = tmp_path / "t.log"
    with open(log_path, "ab") as log:
        proc = runner.start_trainer([os.sys.executable, "-m", "ablate.train", "--help"], dict(os.environ), log,
                                    log_path, tmp_path)
        assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0
    assert helper.proc.wait(10) == -signal.SIGKILL and "did not answer in 1 s" in capsys.readouterr().err
    assert log_path.read_text().count("train one run to its budget") == 1  # one trainer, the cold one


def test_closing_a_hung_helper_kills_and_reaps_it():
    helper = warm.helper()
    pid = helper.proc.pid
    os.kill(pid, signal.SIGSTOP)  # it cannot read the closed stdin and exit
    helper.close(grace=0.5)
    assert helper.proc.returncode == -signal.SIGKILL  # waited for: no zombie, its CPU counted by its parent
    assert not os.path.exists(f"/proc/{pid}")
    assert warm.helper().proc.pid != pid  # the next trial gets a fresh one


@pytest.fixture(autouse=True)
def _warm_on(monkeypatch):
    monkeypatch.delenv("ABLATE_WARM_TRAINER", raising=False)


def test_the_helper_loads_what_a_familys_build_imports_when_first_asked():
    """A family whose build() imports a heavy library names it in `preload()`: the helper loads it before it forks
    the first trainer of that family (a forked trainer does not import it again), and not for a sweep that has
    none; the built-in families import no model library (llama and gpt are our own modules: a helper never pays
    transformers' 3.4 CPU-s for them); a family it cannot load leaves the helper serving (the trainer says what)."""
    models = ("'transformers.models.llama.modeling_llama', 'transformers.models.gpt2.modeling_gpt2', "
              "'transformers.models.openai.modeling_openai'")
    probe = ("import sys; from ablate.config import registry; from ablate.runner import warm; "
             "registry.families(); registry.register_architecture('heavy', 'tests.runner.heavy_family', "
             "'tests.plugins.leaky', 'test: a heavy import'); "
             "warm._preload(); print(warm._load(['mixer', 'llama', 'gpt', 'no-such-family'])); "
             f"print(sorted(m for m in ({models}) if m in sys.modules)); "
             "print(warm._load(['heavy', 'llama']), warm._load(['heavy'])); "
             f"print(sorted(m for m in ({models}) if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=patience(300),
                         check=True, cwd=REPO)
    assert out.stdout.splitlines() == [
        "True", "[]", "True False", "['transformers.models.llama.modeling_llama']"], out.stdout + out.stderr[-2000:]
