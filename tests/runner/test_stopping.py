"""How trainers stop on a cluster, with real trainers: a cancel from any host (the run row), a runner that is
gone (its flow run killed), SIGTERM during warm-up (compile); what the trial flow's Prefect state says; and
the sweep-side checks: overrides, a modified copy under the same name, data checked before dispatch, one
Prefect worker per GPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from tests.helpers import one_seed_smoke
from ablate import runner, store
from ablate.train import budget
from ablate.cli import main
from ablate.config.errors import SpecError
from ablate.config.overrides import apply_overrides
from tests.train.test_train import make_trial, registered
from tests.waiting import patience, wait_until

REPO = Path(__file__).resolve().parents[2]
SMOKE = one_seed_smoke()  # the smoke sweep with one seed per cell: 4 trials
# beats and metric writes every second: a trainer is seen training (its last step in the DB) 1 s in, not 30 s
FAST = {"ABLATE_HEARTBEAT_SECONDS": "1", "ABLATE_FLUSH_SECONDS": "1", "OMP_NUM_THREADS": "1"}


def _wait(predicate, timeout: float, what: str):
    return wait_until(predicate, timeout, what)


def _training(engine, rid: int):
    return lambda: (r := store.get_run(engine, rid)).status == "running" and (r.last_step or 0) > 0 and r


def test_a_cancel_written_by_another_host_stops_the_trainer_at_its_next_heartbeat(sqlite_url, tmp_path):
    rid = registered(sqlite_url, make_trial(budget={"wall_clock": 120}))
    engine = store.connect(sqlite_url)
    opts = runner.LaunchOptions(db_url=sqlite_url, artifacts=tmp_path / "art", threads=1, extra_env=FAST)
    out: dict[str, str] = {}
    t = threading.Thread(target=lambda: out.update(status=runner.run_trial(rid, opts)))
    t.start()
    _wait(_training(engine, rid), 120, "the trainer never trained")
    t0 = time.monotonic()
    with engine.begin() as conn:  # what `ablate sweep cancel` on another machine writes; no signal reaches us
        conn.execute(sa.update(store.Run).where(store.Run.id == rid).values(status="cancelled"))
    t.join(60)
    took = time.monotonic() - t0
    run = store.get_run(engine, rid)
    print(f"timings: a trainer in training stopped {took:.1f} s after a cancel written by another host")
    assert out["status"] == "cancelled" and run.status == "cancelled" and run.pid is None, (out, run.status)
    assert took < patience(15) and run.steps > 0 and Path(run.checkpoint_path).exists()  # it checkpointed first


def test_a_trainer_whose_runner_is_gone_checkpoints_and_stops(sqlite_url, tmp_path):
    rid = registered(sqlite_url, make_trial(budget={"wall_clock": 120}))
    engine = store.connect(sqlite_url)
    claimant = store.new_claimant()
    assert store.claim_run(engine, rid, claimant)
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # the runner (flow run process)
    env = {**os.environ, **FAST, "ABLATE_CLAIMANT": claimant, "ABLATE_RUNNER_PID": str(stand_in.pid),
           "ABLATE_DB_URL": sqlite_url}
    trainer = subprocess.Popen([sys.executable, "-m", "ablate.train", "--run-id", str(rid), "--artifacts",
                                str(tmp_path / "art"), "--quiet", "--threads", "1"], env=env)
    try:
        _wait(_training(engine, rid), 120, "the trainer never trained")
        stand_in.kill()  # the flow run process is killed (a Prefect cancel, a dead worker): nobody watches the trainer
        stand_in.wait()
        t0 = time.monotonic()
        trainer.wait(30)
        took = time.monotonic() - t0
    finally:
        stand_in.kill()
        trainer.kill()
    run = store.get_run(engine, rid)
    assert run.status == "preempted" and took < patience(15) and Path(run.checkpoint_path).exists(), (run.status, took)


@pytest.mark.slow
def test_sigterm_during_warm_up_stops_the_trainer_at_once(sqlite_url, tmp_path):
    """compile: true makes the untimed warm-up long (about 45 s of torch.compile on CPU), as on a GPU."""
    rid = registered(sqlite_url, make_trial(budget={"steps": 50}, compile=True))
    engine = store.connect(sqlite_url)
    log = tmp_path / "trainer.log"
    with open(log, "w") as fh:
        trainer = subprocess.Popen([sys.executable, "-m", "ablate.train", "--run-id", str(rid), "--artifacts",
                                    str(tmp_path / "art"), "--threads", "1"], stdout=fh, stderr=subprocess.STDOUT,
                                   env={**os.environ, **FAST, "ABLATE_DB_URL": sqlite_url,
                                        # a cold compile: inductor's cache from an earlier run (this machine's
                                        # /tmp) makes the warm-up end within seconds, before the SIGTERM lands
                                        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    try:
        # the optimizer exists once start-up is done; the warm-up steps (and compile) follow
        _wait(lambda: store.get_run(engine, rid).status == "running", 60, "no claim")
        time.sleep(12)  # past data and model (a few seconds), well inside the compile
        assert trainer.poll() is None
        t0 = time.monotonic()
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(60)
        took = time.monotonic() - t0
    finally:
        trainer.kill()
    run = store.get_run(engine, rid)
    print(f"timings: trainer stopped {took:.1f} s after SIGTERM during compile warm-up")
    assert run.status == "preempted" and run.steps == 0 and run.train_seconds == 0.0, (run.status, log.read_text()[-2000:])
    assert took < patience(10)


# Library code in a trainer's start-up that swallows what the SIGTERM handler raises (torch.compile's tracer
# did: a CI run's trainer went on compiling and started training after the signal); the watcher must end it.
SWALLOWING_STARTUP = """
import sys, time
from ablate.train.stopping import StopSignal
stop = StopSignal(grace=float(sys.argv[2]))
stop.install(lambda: open(sys.argv[1], "w").write("recorded by the watcher"))
ready = False
while True:  # start-up work that catches everything, as compile code can
    try:
        if not ready:
            print("ready", flush=True)
            ready = True
        time.sleep(0.05)
    except BaseException:
        pass
"""


def test_a_sigterm_that_start_up_code_swallows_still_ends_the_trainer_after_the_grace(tmp_path):
    record = tmp_path / "record"
    proc = subprocess.Popen([sys.executable, "-c", SWALLOWING_STARTUP, str(record), "1.5"], stdout=subprocess.PIPE,
                            text=True, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert code == 128 + signal.SIGTERM and record.read_text() == "recorded by the watcher"
    assert 1.4 <= took < patience(15), took  # the grace (the behaviour: not scaled), then at once


def test_a_sigterm_whose_handler_ran_late_stops_start_up_before_training_begins():
    from ablate.train.stopping import Stopped, StopSignal

    stop = StopSignal()
    stop.flag = True  # the handler ran, but what it raised never reached the trainer's start-up code
    with pytest.raises(Stopped):
        stop.begin_training()
    assert not stop.training
    fresh = StopSignal()
    fresh.begin_training()
    assert fresh.training


def test_checkpoints_come_every_tenth_of_the_run_between_30_s_and_10_min():
    assert budget.checkpoint_interval(5.0, 100.0, 0.5) == 5.0  # given: kept
    assert budget.checkpoint_interval(None, 0.0, 0.0) == 600  # nothing known yet
    assert budget.checkpoint_interval(None, 60.0, 0.1) == 60  # a 10-minute run: every minute
    assert budget.checkpoint_interval(None, 10.0, 0.5) == 30  # a 20-second run: the floor
    assert budget.checkpoint_interval(None, 3600.0, 0.1) == 600  # a 10-hour run: the cap


def test_a_failed_trial_flow_ends_failed_with_the_reason(sqlite_url, tmp_path, prefect_api):
    from flows.sweep import trial

    rid = registered(sqlite_url, make_trial())
    engine = store.connect(sqlite_url)
    run = store.get_run(engine, rid)
    broken = {**run.config, "dataset": {**run.config["dataset"], "source": str(tmp_path / "gone.txt")}}
    store.update_run(engine, rid, config=broken)  # the file went away after the sweep was checked
    state = trial(rid, runner.LaunchOptions(db_url=sqlite_url, artifacts=tmp_path / "art", threads=1), return_state=True)
    assert state.is_failed() and f"run {rid} failed: dataset.source: no such file" in state.message, state.message
    assert store.get_run(engine, rid).status == "failed"


def test_overrides_change_the_trials_and_name_the_sweep_after_themselves(sqlite_url, tmp_path):
    data = yaml.safe_load(SMOKE.read_text())
    changed = apply_overrides(data, {"budget": "steps=7", "vocab_size": 300})
    assert changed["name"] == "smoke-budget-steps-7-vocab-300"
    assert changed["budget"] == {"steps": 7, "hardware": data["budget"]["hardware"]}
    assert changed["tokenizer"]["vocab_size"] == 300 and data["budget"] != changed["budget"]  # the file's dict untouched
    assert apply_overrides(data, {"budget": "90s", "name": "quick"})["budget"]["wall_clock"] == "90s"
    with pytest.raises(SpecError, match="budget"):
        apply_overrides(data, {"budget": "hours=3"})
    with pytest.raises(SpecError, match="did you mean 'budget'"):
        apply_overrides(data, {"budgte": "3m"})
    spec, _, ids = runner.register(SMOKE, sqlite_url, overrides={"budget": "steps=7", "source": "ablate:tinystories-sample"})
    assert spec.name == "smoke-budget-steps-7-data-ablate-tinystories-sample" and len(ids) == 4
    run = store.get_run(store.connect(sqlite_url), ids[0])
    assert run.budget_kind == "steps" and run.budget_amount == 7
    assert run.config["dataset"]["source"] == "ablate:tinystories-sample"


def test_a_modified_copy_under_the_same_name_is_refused_unless_merged(sqlite_url, tmp_path, capsys):
    engine = store.connect(sqlite_url)
    _, _, ids = runner.register(SMOKE, sqlite_url)
    store.update_run(engine, ids[0], status="completed", final_eval_loss=3.0)
    copy = yaml.safe_load(SMOKE.read_text())
    copy["budget"]["steps"] = 400  # the same cells, another experiment
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(copy))
    assert main(["sweep", "register", str(path), "--db", sqlite_url]) == 2
    err = capsys.readouterr().err
    assert "already holds results for the same cells with other settings (1 completed)" in err and "--merge" in err
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(store.Run)).scalar() == 4  # nothing written
    assert main(["sweep", "register", str(path), "--db", sqlite_url, "--merge"]) == 0
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(store.Run)).scalar() == 5  # the unfinished 3 replaced
    # a grid edit that only adds cells is not a conflict
    grown = yaml.safe_load(SMOKE.read_text())
    grown["grid"].append({"architecture": "mixer", "d_model": [96]})
    path.write_text(yaml.safe_dump(grown))
    assert main(["sweep", "register", str(path), "--db", sqlite_url]) == 0


def test_sweep_run_checks_the_data_before_registering_anything(sqlite_url, tmp_path, capsys):
    spec = yaml.safe_load(SMOKE.read_text())
    spec["dataset"] = {"source": "ablate:tinystories-sample", "eval": {"holdout": 24}}
    spec["tokenizer"] = {"vocab_size": 60000}  # more than 221 stories can support
    path = tmp_path / "big-vocab.yaml"
    path.write_text(yaml.safe_dump(spec))
    t0 = time.monotonic()
    assert main(["sweep", "run", str(path), "--db", sqlite_url, "--artifacts", str(tmp_path / "art")]) == 2
    took = time.monotonic() - t0
    assert "tokenizer.vocab_size: the corpus supports only" in capsys.readouterr().err
    with store.connect(sqlite_url).connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(store.Sweep)).scalar() == 0
    assert took < patience(60)


@pytest.mark.parametrize("content", ['{"text": "a story"}\n{"text": broken\n', '{"story": "no text field"}\n'])
def test_a_data_file_that_does_not_parse_fails_with_one_message_and_leaves_nothing(sqlite_url, tmp_path, capsys,
                                                                                     content):
    (tmp_path / "bad.jsonl").write_text(content)
    spec = yaml.safe_load(SMOKE.read_text())
    spec["dataset"] = {"source": "./bad.jsonl", "eval": {"holdout": 1}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    art = tmp_path / "art"
    assert main(["sweep", "run", str(path), "--db", sqlite_url, "--artifacts", str(art)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (exit 2 above: no exception escaped)
    assert last.startswith("error: dataset") and "bad.jsonl" in last, last
    assert sorted(p.relative_to(art) for p in art.rglob("*")) == []  # no cache, tokenizer, lock or folder left
    with store.connect(sqlite_url).connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(store.Sweep)).scalar() == 0


def test_plan_warns_about_a_hub_dataset_it_cannot_load_offline(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["plan", str(REPO / "sweeps" / "tinystories-widths.yaml")]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "HF_HUB_OFFLINE is set" in err and "point dataset.source at that local path" in err


def test_ablate_worker_starts_one_prefect_worker_per_gpu_each_on_its_own_device(tmp_path, prefect_api):
    """`prefect` here is a stand-in that records its arguments and CUDA_VISIBLE_DEVICES (no GPUs on this machine);
    the Prefect API is real (the test process's server): `ablate worker` makes its host's queue there first."""
    from prefect.client.orchestration import get_client

    shim = tmp_path / "bin"
    shim.mkdir()
    record = tmp_path / "workers.txt"
    (shim / "prefect").write_text(f"#!/bin/sh\necho \"$CUDA_VISIBLE_DEVICES $ABLATE_TRIALS_PER_GPU $*\" >> {record}"
                                  "\nsleep 3\n")
    (shim / "prefect").chmod(0o755)
    ablate = str(Path(sys.executable).parent / "ablate")
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "2,3,5,7",
           "PREFECT_API_URL": prefect_api, "ABLATE_DB_URL": f"sqlite:///{tmp_path / 'results.db'}",
           "ABLATE_ARTIFACTS": str(tmp_path / "art")}  # what the host check at start asks for
    started = subprocess.run([ablate, "worker", "--pool", "v100", "--host", "gpu-b"], env=env, capture_output=True,
                             text=True, timeout=patience(60))
    assert started.returncode == 0, started.stderr[-2000:]
    with get_client(sync_client=True) as client:
        queues = {q.name for q in client.read_work_queues(work_pool_name="v100")}
    lines = sorted(record.read_text().splitlines())
    record.unlink()
    subprocess.run([ablate, "worker", "--pool", "v100", "--gpus-per-trial", "4"], env=env, check=True,
                   capture_output=True, timeout=patience(60))
    assert record.read_text().split()[0] == "2,3,5,7"  # torchrun on all four, one trial at a time
    assert queues == {"default", "host-gpu-b"}
    assert [line.split()[:2] for line in lines] == [["2", "1"], ["3", "1"], ["5", "1"], ["7", "1"]]
    assert all("--pool v100 --type process --limit 1 --work-queue default --work-queue host-gpu-b --name gpu-b-v100-"
               in line for line in lines), lines
    record.unlink()  # three trials share each GPU: each worker takes three at a time, its trainers a third of the GPU
    subprocess.run([ablate, "worker", "--pool", "v100", "--trials-per-gpu", "3"], env=env, check=True,
                   capture_output=True, timeout=patience(60))
    packed = sorted(record.read_text().splitlines())
    assert [line.split()[:2] for line in packed] == [["2", "3"], ["3", "3"], ["5", "3"], ["7", "3"]]
    assert all("--limit 3 " in line for line in packed), packed
    env["PREFECT_API_URL"] = ""  # below: refused before the API is asked
    no_api = subprocess.run([ablate, "worker", "--pool", "v100"], env=env, capture_output=True, text=True,
                            timeout=patience(60))
    assert no_api.returncode == 2 and "PREFECT_API_URL is not set" in no_api.stderr, no_api.stderr
    bad = subprocess.run([ablate, "worker", "--pool", "v100", "--gpus-per-trial", "8"], env=env, capture_output=True,
                         text=True, timeout=patience(60))
    assert bad.returncode == 2 and "shows only 4 GPU(s)" in bad.stderr


def test_status_says_when_a_running_row_is_stale(sqlite_url, capsys):
    import csv
    import datetime as dt
    import io

    _, _, ids = runner.register(SMOKE, sqlite_url)
    engine = store.connect(sqlite_url)
    store.update_run(engine, ids[0], status="running", claimed_by="elsewhere:1:x", pid=1234, host="elsewhere",
                  heartbeat_at=store.utcnow() - dt.timedelta(seconds=store.stale_seconds() + 5))
    store.update_run(engine, ids[1], status="running", claimed_by="elsewhere:2:y", pid=1235, host="elsewhere",
                  heartbeat_at=store.utcnow())
    capsys.readouterr()
    assert main(["sweep", "status", "smoke", "--db", sqlite_url, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows[0]["reason"].startswith("stale: its trainer last beat 9") and rows[1]["reason"] == ""


# A trainer that cannot act on SIGTERM (stuck in code that never returns to Python); it beats its heartbeat from
# its Recorder as a real trainer does.
STUCK_TRAINER = """
import signal, sys, time
from ablate.train.recorder import Recorder
from ablate.train.state import TrainerSettings
signal.signal(signal.SIGTERM, signal.SIG_IGN)
Recorder(TrainerSettings(db_url=sys.argv[1], run_id=int(sys.argv[2]), claimant=sys.argv[3]), True)
print("ready", flush=True)
time.sleep(600)
"""


def test_a_cancelled_trainer_that_does_not_stop_shows_cancelling_and_is_killed_after_its_grace(sqlite_url, capsys):
    import csv
    import io

    spec, _, ids = runner.register(SMOKE, sqlite_url)
    name, rid = spec.name, ids[0]
    engine = store.connect(sqlite_url)
    claimant = store.new_claimant()
    assert store.claim_run(engine, rid, claimant)
    env = {**os.environ, "ABLATE_HEARTBEAT_SECONDS": "0.5", "ABLATE_CANCEL_GRACE_SECONDS": "4"}
    proc = subprocess.Popen([sys.executable, "-c", STUCK_TRAINER, sqlite_url, str(rid), claimant], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "ready"
        store.update_run(engine, rid, claimant=claimant, pid=proc.pid)
        t0 = time.monotonic()
        waiting, stopping, left = runner.cancel(engine, name, wait=1.0)
        assert stopping == 1 and left == 1  # SIGTERM sent (from this host) but the trainer is still there
        capsys.readouterr()
        assert main(["sweep", "status", name, "--db", sqlite_url, "--format", "csv"]) == 0
        row = next(r for r in csv.DictReader(io.StringIO(capsys.readouterr().out)) if r["run"] == str(rid))
        assert row["status"] == "cancelled" and row["reason"].startswith("cancelling: trainer still running"), row
        code = proc.wait(60)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert code == -signal.SIGKILL and 3.5 <= took < patience(30), (code, took)  # not before its 4 s grace
    assert "killed" in proc.stdout.read()
    assert not store.trainer_running(store.get_run(engine, rid))  # its pid is gone: `sweep status` stops saying so


def test_waits_scale_with_the_load_and_a_timeout_says_the_machine_was_busy():
    from tests import waiting

    assert waiting.scale(load=0.5, cores=2, setting="") == 1.0  # idle: as written
    assert waiting.scale(load=20.0, cores=2, setting="") == 10.0  # load 10 per core: ten times longer
    assert waiting.scale(load=20.0, cores=2, setting="3") == 30.0  # and the user's factor on top
    with pytest.raises(ValueError, match="ABLATE_TEST_TIME_SCALE='x' is not a number"):
        waiting.scale(setting="x")
    said = waiting.busy("no claim", 130.4, load=(24.5, 30.1, 12.0), cores=2)
    assert said == ("no claim (after 130 s; load average 24.5, 30.1 over 5 min, on 2 cores: the machine was busy, which "
                    "may be all that is wrong; ABLATE_TEST_TIME_SCALE=N waits N times longer)")
    assert "busy" not in waiting.busy("no claim", 3, load=(0.2, 0.3, 0.1), cores=2)
    # the 0.3 s wait itself scales with the load (two CI runs side by side made it 3 s): any whole seconds
    with pytest.raises(AssertionError, match=r"never true \(after \d+ s; load average"):
        waiting.wait_until(lambda: False, 0.3, "never true", every=0.05)
    assert waiting.wait_until(lambda: 42, 0.1, "at once") == 42


def test_a_deadline_grows_while_the_machine_is_busy_and_says_so_when_it_passes(monkeypatch):
    from tests import waiting

    load = [0.5]
    monkeypatch.setattr(os, "getloadavg", lambda: (load[0], load[0], load[0]))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.delenv(waiting.SCALE_ENV, raising=False)
    deadline = waiting.Deadline(0.2)
    time.sleep(0.3)
    load[0] = 20.0  # the machine became busy before the wait ran out: 10 x 0.2 s now
    assert not deadline.passed()
    deadline.check("still waiting")
    load[0] = 0.5  # calmer again: the wait it was granted stays
    assert not deadline.passed()
    time.sleep(1.9)
    with pytest.raises(AssertionError, match=r"^the run never trained \(after 2 s; load average 0.5"):
        deadline.check("the run never trained")


def test_a_sweep_whose_token_caches_are_built_checks_them_without_importing_torch(tmp_path):
    from ablate.config import load_trials

    spec = yaml.safe_load(SMOKE.read_text())
    spec["dataset"], spec["tokenizer"] = {"source": "ablate:tinystories-sample", "eval": {"holdout": 24}}, {"vocab_size": 320}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    art = tmp_path / "art"
    runner.prepare_data(load_trials(path)[1], art, progress=False)  # built here (this process has torch anyway)
    probe = ("import sys; from pathlib import Path; from ablate import runner; from ablate.config import load_trials; "
             f"said = []; runner.prepare_data(load_trials({str(path)!r})[1], Path({str(art)!r}), say=said.append); "
             "print(said, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=patience(120), cwd=REPO)
    assert out.stdout.strip().endswith("cached'] False"), out.stdout + out.stderr[-2000:]
