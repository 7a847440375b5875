"""A sweep never ends Completed with a run untrained, and a cluster host never makes a database of its own: the
pieces, without a cluster (tests/flows/test_cluster_hosts.py runs them on one)."""

from __future__ import annotations

import os
import socket

import pytest

from ablate import runner, store
from ablate.config.errors import AblateError
from flows.dispatch import Dispatched
from flows.hosts import first_error, host_of, owed_report
from flows.sweep import TrialsFailed, _final


def _done(results, failures=None, dispatches=None) -> Dispatched:
    done = Dispatched()
    done.results.update(results)
    done.failures.update(failures or {})
    done.dispatches.update(dispatches or {})
    return done


def test_a_sweep_with_an_owed_run_fails_naming_the_run_its_hosts_and_their_first_errors(sqlite_url):
    engine = store.connect(sqlite_url)
    failures = {7: ["[host gpu-a] run 7: no database"] * 4 + ["[host gpu-c] run 7: CUDA driver missing"]}
    with pytest.raises(TrialsFailed) as caught:
        _final(_done({6: "completed", 7: "pending"}, failures, {7: 5}), engine, "widths")
    said = str(caught.value)
    assert ("sweep widths: 1 run(s) still owed, never finished: run 7 (pending, dispatched 5x; failed 4x on gpu-a: "
            "run 7: no database; failed 1x on gpu-c: run 7: CUDA driver missing)") in said, said
    assert "`ablate sweep status widths`" in said


def test_a_sweep_with_every_run_finished_or_stopped_by_its_user_does_not_fail(sqlite_url):
    engine = store.connect(sqlite_url)
    assert _final(_done({1: "completed", 2: "oom", 3: "diverged"}), engine, "w") == {1: "completed", 2: "oom",
                                                                                     3: "diverged"}
    cancelled = _final(_done({1: "completed", 2: "cancelled"}), engine, "w")
    assert cancelled.is_cancelled() and cancelled.data is None  # no dict as data: Prefect reads it as a result record
    runner.STOP.set()  # Ctrl-C: the runs left go to the next run of the sweep, not a failure
    try:
        assert _final(_done({1: "preempted"}), engine, "w") == {1: "preempted"}
    finally:
        runner.STOP.clear()


def test_owed_report_says_a_run_never_started_and_a_failure_without_a_host():
    said = owed_report({3: "pending", 4: "preempted"}, {4: ["Crashed: the process exited"]}, {4: 2})
    assert said == ("run 3 (pending, never started); run 4 (preempted, dispatched 2x; failed 1x on a host that did "
                    "not say: Crashed: the process exited)")


def test_a_failed_trial_flow_run_says_its_host_and_its_reason_in_one_line():
    class State:
        name, message = "Failed", "Flow run encountered an exception: TrialFailed: [host gpu-a] run 3: boom\nmore"

    assert first_error(State()) == "[host gpu-a] run 3: boom"
    assert host_of(first_error(State())) == "gpu-a" and host_of("Crashed") is None


def test_a_host_without_a_results_database_fails_the_trial_before_making_one(tmp_path, monkeypatch, sqlite_url):
    host = tmp_path / "host"
    host.mkdir()
    monkeypatch.chdir(host)
    monkeypatch.delenv("ABLATE_DB_URL", raising=False)
    monkeypatch.setenv("ABLATE_WORKER_HOST", "gpu-a")
    database = store.database_id(store.connect(sqlite_url))
    with pytest.raises(AblateError, match=r"host gpu-a has no results database: set ABLATE_DB_URL .*never creates"):
        runner.cluster_db_url(None, database)
    missing = host / "elsewhere.db"
    with pytest.raises(AblateError, match="elsewhere.db does not exist"):
        runner.cluster_db_url(str(missing), database)
    assert os.listdir(host) == []  # no default results/ablate.db, no other file
    other = f"sqlite:///{tmp_path / 'other.db'}"
    store.connect(other)
    with pytest.raises(AblateError, match="is not the sweep's"):
        runner.cluster_db_url(other, database)
    monkeypatch.setenv("ABLATE_DB_URL", sqlite_url)
    assert runner.cluster_db_url(None, database) == sqlite_url


def test_a_worker_host_is_its_hostname_unless_named(monkeypatch):
    monkeypatch.delenv("ABLATE_WORKER_HOST", raising=False)
    assert runner.worker_host() == socket.gethostname()
    monkeypatch.setenv("ABLATE_WORKER_HOST", "gpu b/1")
    assert runner.worker_host() == "gpu b/1" and runner.host_queue(runner.worker_host()) == "host-gpu-b-1"


def test_a_run_dispatched_again_is_not_judged_by_the_dead_trainer_before_its_new_one_claims_it():
    """The race of a machine that died: the run's row still holds the dead trainer (its pid gone from this host)
    while the trial flow run dispatched again is Running but has not claimed it yet. That flow run is dead only
    if its trainer never claims the run within the stale limit; a claimed run is judged by its trainer."""
    import datetime as dt

    from prefect.states import Running

    from flows.dispatch import _dead

    now = store.utcnow()
    dead_pid = 2 ** 22 + 7  # above pid_max's default: no such process
    row = store.Run(id=1, status="running", heartbeat_at=now - dt.timedelta(seconds=2), pid=dead_pid,
                    claimed_by=f"{socket.gethostname()}:{dead_pid}:x")
    assert not store.is_live(row)
    started = Running()  # the new trial flow run, Running since now
    started.timestamp = dt.datetime.now(dt.timezone.utc)
    assert not _dead(row, started)  # its trainer is starting: not dispatched again
    long_ago = Running()
    long_ago.timestamp = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=store.stale_seconds() + 5)
    assert _dead(row, long_ago)  # it never claimed the run within the stale limit
    before = Running()
    before.timestamp = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=30)
    assert _dead(row, before)  # the run's own trainer, claimed under this flow run, is gone


def _one_run(sqlite_url):
    engine, ids = _seeds(sqlite_url, 1)
    return engine, ids[0]


def _seeds(sqlite_url, seeds: int):
    from ablate.config import expand_grid, parse_spec

    spec = parse_spec({"name": "o", "dataset": {"source": "ablate:tinystories-sample", "eval": {"holdout": 16}},
                       "tokenizer": {"vocab_size": 384}, "budget": {"steps": 5, "hardware": "cpu"},
                       "defaults": {"architecture": "mixer", "d_model": 32, "layers": 1, "context": 64,
                                    "batch_size": 8, "lr": 1e-3}, "grid": [{"seeds": seeds}]})
    engine = store.connect(sqlite_url)
    _, ids = store.register_sweep(engine, spec, expand_grid(spec))
    return engine, ids


def test_a_trial_whose_log_cannot_be_made_after_the_claim_gives_the_run_back(sqlite_url, tmp_path, monkeypatch):
    """A host whose artifacts folder is unusable (here a file where the folder must be: the same OSError path as a
    read-only or full disk) fails after claiming the run: the claim is released at once, not left `running`."""
    engine, rid = _one_run(sqlite_url)
    monkeypatch.setenv("ABLATE_WORKER_HOST", "gpu-a")
    blocked = tmp_path / "artifacts"
    blocked.write_text("not a folder")
    with pytest.raises(OSError):
        runner.run_trial(rid, runner.LaunchOptions(db_url=sqlite_url, artifacts=blocked))
    run = store.get_run(engine, rid)
    assert (run.status, run.attempts, run.pid, run.heartbeat_at) == ("pending", 0, None, None)  # not an attempt
    assert run.error.startswith("host gpu-a could not start its trainer: ") and "artifacts" in run.error, run.error
    assert runner.owed(run) and runner.runs_to_do(engine, run.sweep_id, [rid]) == [rid]
    for _ in range(runner.MAX_ATTEMPTS + 1):  # a host's fault never spends the run's attempts
        with pytest.raises(OSError):
            runner.run_trial(rid, runner.LaunchOptions(db_url=sqlite_url, artifacts=blocked))
    assert (store.get_run(engine, rid).status, store.get_run(engine, rid).attempts) == ("pending", 0)
    store.update_run(engine, rid, checkpoint_path=str(tmp_path / "ckpt.pt"))
    with pytest.raises(OSError):
        runner.run_trial(rid, runner.LaunchOptions(db_url=sqlite_url, artifacts=blocked))
    assert store.get_run(engine, rid).status == "preempted"  # it has a checkpoint to resume
    assert store.claim_run(engine, rid, "another-host:1:x")  # any host takes it at once, no stale wait
    # held elsewhere: left alone, and the trial never says it claimed it (so it says nothing of this host's health)
    claimed: list[bool] = []
    status = runner.run_trial(rid, runner.LaunchOptions(db_url=sqlite_url, artifacts=blocked),
                              on_claimed=lambda: claimed.append(True))
    assert status == "running" and claimed == []
    store.update_run(engine, rid, status="pending", claimed_by=None, heartbeat_at=None)
    with pytest.raises(OSError):  # taken, then failed: it did claim
        runner.run_trial(rid, runner.LaunchOptions(db_url=sqlite_url, artifacts=blocked),
                         on_claimed=lambda: claimed.append(True))
    assert claimed == [True]


def test_a_run_still_claimed_is_owed_only_once_its_claimant_is_gone(sqlite_url):
    """One rule (runner.owed) for the sweep flow, its end and the watch: a fresh claim on another host is live
    (not owed), a stale one is owed, and the sweep's end fails naming it."""
    import datetime as dt

    engine, rid = _one_run(sqlite_url)
    assert store.claim_run(engine, rid, "gpu-b:4242:x")
    assert not runner.owed(store.get_run(engine, rid))
    assert _final(_done({rid: "running"}), engine, "o") == {rid: "running"}  # training under another runner
    store.update_run(engine, rid, heartbeat_at=store.utcnow() - dt.timedelta(seconds=store.stale_seconds() + 1))
    assert runner.owed(store.get_run(engine, rid))
    with pytest.raises(TrialsFailed, match=rf"1 run\(s\) still owed, never finished: run {rid} \(running"):
        _final(_done({rid: "running"}, dispatches={rid: 1}), engine, "o")


def test_a_trial_flow_run_left_pending_by_a_stopped_worker_is_crashed_and_dispatched_again(sqlite_url, prefect_api,
                                                                                            monkeypatch):
    """A drain (or a kill) that stops a Prefect worker while it is starting a flow run leaves that flow run Pending
    for ever, and no worker takes a Pending one: the sweep flow waited on it without end. Against a real Prefect API:
    Pending for less than the stale limit it is waiting for its process; past the limit, with its run unclaimed, it
    is Crashed and the run sent again."""
    import logging
    import time

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Pending

    from flows.dispatch import _watch_once

    @flow(name="trial-stand-in")
    def stand_in() -> None:  # never run: a flow run needs a flow to belong to
        pass

    engine, rid = _one_run(sqlite_url)
    sent: list[int] = []
    with get_client(sync_client=True) as client:
        fid = client.create_flow_run(stand_in, state=Pending()).id
        live, done = {rid: fid}, Dispatched()
        assert _watch_once(client, engine, live, done, sent.append, "cpu", logging.getLogger("t")) == 1
        assert sent == [] and client.read_flow_run(fid).state.is_pending()  # its process may be starting
        monkeypatch.setenv("ABLATE_STALE_SECONDS", "1")
        time.sleep(1.5)
        assert _watch_once(client, engine, live, done, sent.append, "cpu", logging.getLogger("t")) == 0
        assert sent == [[rid]]
        crashed = client.read_flow_run(fid).state
        assert crashed.is_crashed() and f"run {rid}" in crashed.message


def test_a_fused_groups_one_trial_flow_run_is_watched_for_all_its_members(sqlite_url, prefect_api):
    """A fused group's runs share one trial flow run (flows/dispatch.py), against a real Prefect API: a member that
    ended long ago does not get the group's Running flow run marked Crashed while the others train, a member
    cancelled does not cancel it (the group's trainer stops that member alone), and once it ends the members still
    owed go out again as one group while the ended ones are settled."""
    import datetime as dt
    import logging

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed, Running

    from flows.dispatch import _watch_once

    @flow(name="trial-stand-in")
    def stand_in() -> None:  # never run: a flow run needs a flow to belong to
        pass

    engine, ids = _seeds(sqlite_url, 4)
    early, cancelled, c, d = ids
    for rid in ids:  # the group's trainer holds and beats them all
        assert store.claim_run(engine, rid, "gpu-a:1:x")
    long_ago = store.utcnow() - dt.timedelta(seconds=store.stale_seconds() + 30)
    store.update_run(engine, early, status="completed", finished_at=long_ago)
    store.update_run(engine, cancelled, status="cancelled")
    sent: list[list[int]] = []
    with get_client(sync_client=True) as client:
        fid = client.create_flow_run(stand_in, state=Running()).id
        live, done = dict.fromkeys(ids, fid), Dispatched()
        assert _watch_once(client, engine, live, done, lambda ids, host=None: sent.append(ids), "cpu", logging.getLogger("t")) == 0
        assert client.read_flow_run(fid).state.is_running() and sent == [] and list(live) == ids, live
        for rid in (c, d):  # the worker stopped: both checkpointed
            store.update_run(engine, rid, status="preempted", claimed_by=None)
        client.set_flow_run_state(fid, Crashed(message="the worker stopped"), force=True)
        _watch_once(client, engine, live, done, lambda ids, host=None: sent.append(ids), "cpu", logging.getLogger("t"))
    assert sent == [[c, d]], sent
    assert done.results == {early: "completed", cancelled: "cancelled"} and set(live) == {c, d}
    assert done.failures == {c: ["the worker stopped"], d: ["the worker stopped"]}, done.failures
