"""The lab cluster when a machine dies or a sweep is cancelled, for real (tests/flows/cluster.py): a worker's whole
process tree is killed mid-trial (a machine dying), a hub dataset is missing offline, a pool has no worker, a sweep
flow run is cancelled, a search flow run's machine dies, a plugin file only the laptop saw, a fused group's machine
dies.

No server outage here (tests/flows/test_cluster_outages.py has them), so `ablate deploy`'s automation crashes a flow
run silent for 60 s: two of its 30 s beats (the dead-machine search test waits that out).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from ablate import store
from tests.flows.cluster import BIN, both_training, cluster_spec, deployed, kill_tree, sweep_rows, trainers, tree
from tests.waiting import Deadline, patience, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    specs = [
        cluster_spec("resume", {"wall_clock": 24}, "lab", [{"d_model": [32]}]),
        cluster_spec("cancel", {"wall_clock": 600}, "lab", [{"d_model": [32, 48]}]),
        cluster_spec("nobody", {"steps": 5}, "idle", [{"d_model": [32, 48]}]),
        {**{k: v for k, v in cluster_spec("zombie", {"wall_clock": 600}, "lab", []).items() if k != "grid"},
         "search": {"parameters": {"lr": {"type": "float", "low": 1e-4, "high": 1e-3, "log": True}}, "n_trials": 1}},
        {**{k: v for k, v in cluster_spec("takeover", {"wall_clock": 20}, "lab", []).items() if k != "grid"},
         "search": {"parameters": {"lr": {"type": "float", "low": 1e-4, "high": 1e-3, "log": True}}, "n_trials": 2}},
        {**cluster_spec("fused", {"wall_clock": 20}, "lab", [{"d_model": [32], "seeds": 3}]), "fuse": "seeds"},
        cluster_spec("hub", {"steps": 5}, "lab", [{"d_model": [32]}],
                     dataset={"source": "roneneldan/TinyStories", "eval": {"split": "validation"}}),
    ]
    with deployed(tmp_path_factory.mktemp("cluster"), specs, ABLATE_ZOMBIE_SECONDS="60") as c:
        yield c


def test_a_machine_that_dies_mid_trial_loses_its_run_to_the_other_worker_which_resumes_it(cluster):
    t0 = time.monotonic()
    flow_run_id = cluster.deployment_run("sweep/resume", "checkpoint_every=2")
    engine = store.connect(cluster.url)

    def run_row():
        with engine.connect() as conn:
            return conn.execute(sa.select(store.Run).join(store.Sweep).where(store.Sweep.name == "resume")).first()

    deadline = Deadline(240)
    while True:  # training, with a checkpoint on disk and points in the DB
        row = run_row()
        if (row is not None and row.status == "running" and row.pid and row.checkpoint_path
                and Path(row.checkpoint_path).exists() and (row.last_step or 0) > 0 and row.train_seconds is None):
            break
        deadline.check(f"the run never trained: {row}")
        time.sleep(0.5)
    time.sleep(2)
    row = run_row()
    victim = next(w for w in cluster.workers if row.pid in tree(w.pid))
    with engine.connect() as conn:
        kept = conn.execute(sa.select(sa.func.max(store.Metric.id)).where(store.Metric.run_id == row.id)).scalar()
    killed_at = time.monotonic()
    kill_tree(victim.pid, signal.SIGKILL)  # the machine dies: worker, flow run process and trainer at once

    deadline = Deadline(300)
    resumed_at = None
    while True:
        state = cluster.flow_run(flow_run_id).state
        now = run_row()
        if resumed_at is None and now.status == "running" and now.attempts == 2 and now.pid and now.pid != row.pid:
            resumed_at = time.monotonic()
        if state.is_final():
            break
        deadline.check(f"the sweep did not finish: {now.status}")
        time.sleep(1)
    done = run_row()
    print(f"timings: first trainer running after {killed_at - t0:.1f} s; resumed on the other worker "
          f"{(resumed_at or float('nan')) - killed_at:.1f} s after the kill; sweep done {time.monotonic() - killed_at:.1f} "
          "s after the kill")
    assert state.is_completed(), state
    assert done.status == "completed" and done.attempts == 2, (done.status, done.error)
    # the run dispatched again was scheduled ahead of every trial the sweep dispatched first (workers take the
    # earliest scheduled flow run): it does not queue behind the whole sweep
    first, again = cluster.trial_flow_runs(engine, done.id)
    assert again.expected_start_time < first.expected_start_time, (first.expected_start_time, again.expected_start_time)
    survivor = next(w for w in cluster.workers if w is not victim)
    assert survivor.poll() is None
    with engine.connect() as conn:
        points = conn.execute(sa.select(store.Metric.id, store.Metric.step).where(
            store.Metric.run_id == done.id, store.Metric.split == "train").order_by(store.Metric.step)).all()
    steps = [p.step for p in points]
    assert steps == sorted(set(steps)) and steps[0] > 0, steps  # one point per step logged, in order
    before = [p for p in points if p.id <= kept]
    assert before and all(p.step <= max(q.step for q in before) for p in before)  # the points up to the checkpoint
    after = [p for p in points if p.id > kept]  # stayed; the resumed trainer logged only past it
    assert after and min(p.step for p in after) > max(p.step for p in before), (before[-3:], after[:3])
    gaps = sorted(b - a for a, b in zip(steps, steps[1:]))
    boundary = min(p.step for p in after) - max(p.step for p in before)
    assert boundary <= 5 * max(1, gaps[len(gaps) // 2]), (boundary, gaps)  # contiguous: no hole where it died
    assert done.train_seconds == pytest.approx(24, abs=3)  # the budget once
    cluster.workers[cluster.workers.index(victim)] = cluster.start(str(BIN / "ablate"), "worker", "--pool", "lab")


def test_an_offline_hub_dataset_fails_the_sweep_before_any_trial_with_one_message(cluster):
    t0 = time.monotonic()
    out = cluster.run(str(BIN / "prefect"), "deployment", "run", "sweep/hub", "--watch", "--watch-timeout", "200",
                      timeout=240)
    took = time.monotonic() - t0
    print(f"timings: offline hub sweep failed in {took:.1f} s (exit {out.returncode})")
    assert out.returncode != 0, out.stdout[-2000:]
    assert "Failed" in out.stdout + out.stderr
    # the reason is in what --watch prints, not only in the flow run's logs
    assert "cannot load 'roneneldan/TinyStories' from the HuggingFace hub" in " ".join(out.stdout.split()), \
        out.stdout[-3000:]
    flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out.stdout).group(1)
    logs = cluster.run(str(BIN / "prefect"), "flow-run", "logs", flow_run_id).stdout
    assert "cannot load 'roneneldan/TinyStories' from the HuggingFace hub (HF_HUB_OFFLINE is set" in logs, logs[-2000:]
    engine = store.connect(cluster.url)
    with engine.connect() as conn:  # nothing registered, nothing dispatched
        assert conn.execute(sa.select(sa.func.count()).select_from(store.Sweep).where(store.Sweep.name == "hub")).scalar() == 0


def test_a_pool_without_a_worker_is_said_in_the_sweep_log_and_a_cancel_reaches_its_trials(cluster):
    """The sweep flow's process is stuck (SIGSTOP) when the cancel comes, so it cannot cancel its trials itself:
    the worker kills it after Prefect's 30 s grace and runs the flow's on_cancellation hook, which does."""
    t0 = time.monotonic()
    flow_run_id = cluster.deployment_run("sweep/nobody")
    deadline = Deadline(60)
    while "has no live worker" not in (logs := cluster.run(str(BIN / "prefect"), "flow-run", "logs", flow_run_id).stdout):
        deadline.check(logs[-2000:])
        time.sleep(1)
    print(f"timings: 'no live worker' in the sweep log {time.monotonic() - t0:.1f} s after the deployment run")
    assert "work pool 'idle' has no live worker" in logs
    engine = store.connect(cluster.url)

    def trials() -> list:
        with engine.connect() as conn:
            return conn.execute(sa.select(store.Run.id, store.Run.status).join(store.Sweep)
                                .where(store.Sweep.name == "nobody")).all()

    runs = wait_until(lambda: len(found := cluster.trial_flow_runs_of(flow_run_id)) == 2 and found, 60,
                      "both trials dispatched")
    assert [r.status for r in trials()] == ["pending", "pending"]
    flow_pid = int(str(cluster.flow_run(flow_run_id).infrastructure_pid).rsplit(":", 1)[-1])
    os.kill(flow_pid, signal.SIGSTOP)
    t1 = time.monotonic()
    assert cluster.run(str(BIN / "prefect"), "flow-run", "cancel", flow_run_id).returncode == 0
    try:
        wait_until(lambda: [r.status for r in trials()] == ["cancelled", "cancelled"], 90, "runs cancelled")
    except AssertionError as exc:  # what the sweep flow and the worker said, for the failure message
        state = cluster.flow_run(flow_run_id).state
        logs = cluster.run(str(BIN / "prefect"), "flow-run", "logs", flow_run_id).stdout
        raise AssertionError(f"{exc}: {trials()}; the sweep flow run is {state.name} ({state.message}); "
                             f"its log ends:\n{logs[-3000:]}") from None
    print(f"timings: a stuck sweep flow's runs cancelled {time.monotonic() - t1:.1f} s after `flow-run cancel`")
    assert not store.pid_alive(flow_pid)
    wait_until(lambda: cluster.flow_run(flow_run_id).state.is_cancelled(), 30, "the sweep flow run Cancelled")
    # its trial flow runs, waiting for a worker that never came, are cancelled too: no worker will start them
    for run in runs:
        assert cluster.flow_run(run.id).state.is_cancelled(), (run.id, cluster.flow_run(run.id).state)
    logs = cluster.run(str(BIN / "prefect"), "flow-run", "logs", flow_run_id).stdout
    assert "sweep nobody cancelled: 2 waiting and 0 running runs marked cancelled" in " ".join(logs.split()), \
        logs[-2000:]


def test_cancelling_a_sweep_flow_run_leaves_no_trainer_running_within_30_s(cluster):
    """...and the sweeps worker's log reads as a cancel: no ERROR, no CancelledRun traceback."""
    sweeps_log = cluster.tmp / "proc-1.log"
    seen = len(sweeps_log.read_text())
    flow_run_id = cluster.deployment_run("sweep/cancel")
    watching = cluster.start(str(BIN / "ablate"), "sweep", "watch", "cancel", "--db", cluster.url, "--poll", "1")
    engine = store.connect(cluster.url)
    ids = both_training(cluster, engine, "cancel")
    t0, stopping = time.monotonic(), Deadline(30)
    assert cluster.run(str(BIN / "prefect"), "flow-run", "cancel", flow_run_id).returncode == 0
    while trainers(ids, cluster):
        stopping.check(f"trainers still running 30 s after the cancel: {trainers(ids, cluster)}")
        time.sleep(0.5)
    gone = time.monotonic() - t0
    deadline = Deadline(60)
    while True:
        with engine.connect() as conn:
            statuses = conn.execute(sa.select(store.Run.status).where(store.Run.id.in_(ids))).scalars().all()
        if statuses == ["cancelled", "cancelled"]:
            break
        if deadline.passed():  # what the sweep flow saw, for the failure message
            state = cluster.flow_run(flow_run_id).state
            logs = cluster.run(str(BIN / "prefect"), "flow-run", "logs", flow_run_id).stdout
            raise AssertionError(f"{statuses}; the sweep flow run is {state.name} ({state.message}); "
                                 f"its log ends:\n{logs[-3000:]}")
        time.sleep(1)
    print(f"timings: both trainers gone {gone:.1f} s after `prefect flow-run cancel`")
    assert watching.wait(timeout=patience(60)) == 3  # `ablate sweep watch`: cancelled, not failed
    said = sweeps_log.read_text()[seen:]
    assert "Traceback" not in said and "| ERROR" not in said and "CancelledRun" not in said, said[-3000:]


def test_ablate_sweep_cancel_ends_the_trainers_and_the_sweep_flow_cancelled_without_an_error_logged(cluster):
    """The sweep flow sees its runs cancelled in the DB and ends Cancelled itself: no ERROR and traceback in the
    sweeps worker's log (a Cancelled state with a dict as its data used to be one)."""
    sweeps_log = cluster.tmp / "proc-1.log"
    seen = len(sweeps_log.read_text())
    flow_run_id = cluster.deployment_run("sweep/cancel", "name=cancel-by-ablate")
    engine = store.connect(cluster.url)
    ids = both_training(cluster, engine, "cancel-by-ablate")
    watching = cluster.start(str(BIN / "ablate"), "sweep", "watch", "cancel-by-ablate", "--db", cluster.url,
                             "--poll", "1")
    t0 = time.monotonic()
    cancelled = cluster.run(str(BIN / "ablate"), "sweep", "cancel", "cancel-by-ablate", "--db", cluster.url)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    wait_until(lambda: not trainers(ids, cluster), 60, "trainers still running after `ablate sweep cancel`")
    print(f"timings: both trainers gone {time.monotonic() - t0:.1f} s after `ablate sweep cancel`")
    wait_until(lambda: cluster.flow_run(flow_run_id).state.is_final(), 60, "the sweep flow run ended")
    assert cluster.flow_run(flow_run_id).state.is_cancelled(), cluster.flow_run(flow_run_id).state
    assert watching.wait(timeout=patience(60)) == 3
    said = sweeps_log.read_text()[seen:]
    assert "Unexpected result" not in said and "Traceback" not in said and "| ERROR" not in said, said[-3000:]


def test_a_search_flow_run_on_a_dead_machine_is_marked_crashed(cluster):
    """Search flow runs have no sweep flow watching them: the automation `ablate deploy` makes marks one whose
    heartbeats stopped Crashed (freeing its pool slot); its trial resumes with the next search flow run."""
    flow_run_id = cluster.deployment_run("search/zombie")
    engine = store.connect(cluster.url)
    deadline = Deadline(240)
    while True:
        with engine.connect() as conn:
            row = conn.execute(sa.select(store.Run).join(store.Sweep).where(store.Sweep.name == "zombie")).first()
        if row is not None and row.status == "running" and row.pid and (row.last_step or 0) > 0:
            break
        deadline.check(row)
        time.sleep(1)
    victim = next(w for w in cluster.workers if row.pid in tree(w.pid))
    kill_tree(victim.pid, signal.SIGKILL)  # the machine dies with the search flow run on it
    killed = time.monotonic()
    deadline = Deadline(300)
    while not (state := cluster.flow_run(flow_run_id).state).is_final():
        deadline.check(f"the search flow run is still {state.name} {time.monotonic() - killed:.0f} s after its "
                       "machine died")
        time.sleep(2)
    print(f"timings: search flow run {state.name} {time.monotonic() - killed:.0f} s after its machine died")
    assert state.is_crashed() and "no heartbeat" in (state.message or ""), state
    cluster.workers[cluster.workers.index(victim)] = cluster.start(str(BIN / "ablate"), "worker", "--pool", "lab")


def test_a_plugin_file_trains_on_a_worker_that_never_saw_it_and_a_missing_package_fails_the_trial(cluster):
    """The laptop registers a sweep naming a plugin file, then the file is gone: a trial worker (whose working
    directory never held it) trains from the source the results DB keeps. A run whose plugin is an installed
    package the worker lacks ends Failed in Prefect with what to install, before any training."""
    from tests.plugins.test_plugins import MIXER

    laptop = cluster.tmp / "laptop"
    laptop.mkdir()
    plugin = laptop / "convmix.py"
    plugin.write_text(MIXER.replace("{name}", "conv-cluster").replace("{tag}", "cluster"))
    spec = cluster_spec("plugged", {"steps": 6}, "lab", [{"architecture": ["conv-cluster"], "d_model": [32, 48]}])
    (laptop / "plugged.yaml").write_text(yaml.safe_dump({**spec, "plugins": ["./convmix.py"]}, sort_keys=False))
    registered = subprocess.run([str(BIN / "ablate"), "sweep", "register", "plugged.yaml", "--db", cluster.url],
                                env=cluster.env, cwd=laptop, capture_output=True, text=True, timeout=patience(120))
    assert registered.returncode == 0, registered.stderr[-2000:]
    plugin.unlink()
    engine = store.connect(cluster.url)
    with engine.connect() as conn:
        runs = conn.execute(sa.select(store.Run.id, store.Run.code_version).join(store.Sweep)
                            .where(store.Sweep.name == "plugged").order_by(store.Run.id)).all()
    trained, missing = runs
    assert trained.code_version.split()[-1].startswith("file:")
    config = {**store.get_run(engine, missing.id).config, "architecture": "conv-absent",
              "code": "conv-absent@package:ablate-convabsent==9.9"}
    store.update_run(engine, missing.id, config=config, architecture="conv-absent")

    flow_runs = {run.id: cluster.deployment_run("trial/lab", f"run_id={run.id}") for run in runs}
    deadline = Deadline(300)
    while not all(cluster.flow_run(f).state.is_final() for f in flow_runs.values()):
        deadline.check("the trial flow runs did not finish")
        time.sleep(1)
    ok, failed = (cluster.flow_run(flow_runs[run.id]).state for run in runs)
    assert ok.is_completed(), ok
    assert store.get_run(engine, trained.id).status == "completed"
    assert failed.is_failed() and "ablate-convabsent==9.9, which is not installed here" in failed.message
    row = store.get_run(engine, missing.id)
    assert row.status == "failed" and row.steps is None and "EXTRA_REQUIREMENTS" in row.error


def test_a_search_worker_takes_over_the_trial_of_one_that_died(cluster):
    """Two search flow runs share a study of 2 trials, one per worker; one machine dies mid-trial. The survivor,
    its own trial done and n_trials counted, does not end the search with the dead trial RUNNING: the run's
    heartbeat goes stale (20 s here) and the survivor trains it from its checkpoint."""
    first = cluster.deployment_run("search/takeover", "checkpoint_every=2")
    second = cluster.deployment_run("search/takeover", "checkpoint_every=2")
    engine = store.connect(cluster.url)

    deadline = Deadline(240)
    while not (len(now := sweep_rows(engine, "takeover")) == 2
               and all(r.status == "running" and r.pid and r.checkpoint_path for r in now)):
        deadline.check(now)
        time.sleep(0.5)
    victim_run = now[0]
    victim = next(w for w in cluster.workers if victim_run.pid in tree(w.pid))
    dead_flow = next(f for f in (first, second)
                     if str(cluster.flow_run(f).infrastructure_pid or "").rsplit(":", 1)[-1].isdigit()
                     and int(str(cluster.flow_run(f).infrastructure_pid).rsplit(":", 1)[-1]) in tree(victim.pid))
    survivor_flow = second if dead_flow == first else first
    kill_tree(victim.pid, signal.SIGKILL)
    killed = time.monotonic()
    deadline = Deadline(300)
    while not (state := cluster.flow_run(survivor_flow).state).is_final():
        deadline.check(f"the surviving search flow run is still {state.name}: {sweep_rows(engine, 'takeover')}")
        time.sleep(2)
    print(f"timings: the survivor ended {time.monotonic() - killed:.0f} s after the other machine died")
    assert state.is_completed(), state
    done = sweep_rows(engine, "takeover")
    assert [r.status for r in done] == ["completed", "completed"], [(r.status, r.error) for r in done]
    assert done[0].attempts == 2  # resumed by the survivor
    logs = cluster.run(str(BIN / "prefect"), "flow-run", "logs", survivor_flow).stdout
    assert "search takeover: 2 trials run here" in logs, logs[-2000:]
    cluster.workers[cluster.workers.index(victim)] = cluster.start(str(BIN / "ablate"), "worker", "--pool", "lab")


def test_a_fused_group_trains_on_one_worker_and_goes_again_as_one_group_when_its_machine_dies(cluster):
    """`fuse: seeds` on the pool: the cell's three seeds are one trial flow run, one trainer on one worker; that
    machine is killed mid-group, its flow run is Crashed, and the three go out again as one group (one flow run),
    which resumes each member from its checkpoint on the other worker: each trained once, to its budget."""
    flow_run_id = cluster.deployment_run("sweep/fused", "checkpoint_every=2")
    engine = store.connect(cluster.url)

    deadline = Deadline(240)
    while True:  # the group trains: one trainer for the three, each with a checkpoint on disk
        now = sweep_rows(engine, "fused")
        if len(now) == 3 and all(r.status == "running" and r.pid and (r.last_step or 0) > 0 and r.checkpoint_path
                                 and Path(r.checkpoint_path).exists() for r in now) and len({r.pid for r in now}) == 1:
            break
        deadline.check(f"the group never trained: {[(r.status, r.pid, r.last_step) for r in now]}")
        time.sleep(0.5)
    ids = [r.id for r in now]
    victim = next(w for w in cluster.workers if now[0].pid in tree(w.pid))
    kill_tree(victim.pid, signal.SIGKILL)  # the machine dies: worker, flow run process and the group's trainer

    deadline = Deadline(300)
    while not (state := cluster.flow_run(flow_run_id).state).is_final():
        now = sweep_rows(engine, "fused")
        deadline.check(f"the sweep did not finish: {[(r.status, r.pid, r.last_step) for r in now]}")
        time.sleep(1)
    done = sweep_rows(engine, "fused")
    assert state.is_completed(), state
    assert [(r.status, r.attempts) for r in done] == [("completed", 2)] * 3, [(r.status, r.error) for r in done]
    dispatched = [[fr.id for fr in cluster.trial_flow_runs(engine, rid)] for rid in ids]
    assert len(dispatched[0]) == 2 and dispatched == [dispatched[0]] * 3, dispatched  # one flow run per dispatch
    again = cluster.trial_flow_runs(engine, ids[0])[1]
    assert again.parameters["run_ids"] == ids and again.state.is_completed(), (again.parameters, again.state)
    for r in done:  # each member resumed where it stood, as a member of a group of three, and ran its budget
        assert r.notes["fused"]["members"] == 3, r.notes
        read = r.notes["budget_read"]
        assert r.last_step == read["steps"], (r.last_step, read)
    cluster.workers[cluster.workers.index(victim)] = cluster.start(str(BIN / "ablate"), "worker", "--pool", "lab")
