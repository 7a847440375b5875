"""The lab cluster through Prefect server outages, for real (tests/flows/cluster.py): a sweep rides out a restart of
the server and trains nothing twice, a sweep that lived through one still cancels its trainers, and an adaptive sweep
races on the pool round by round.

Prefect's own client retries 2 times here (about 6 s; 5 by default, about a minute) and the outages last 25 s: longer
than the retries, as a real outage is longer than a minute, so the same rules are tested without waiting minutes. Flow
runs silent for 120 s are crashed by `ablate deploy`'s automation: longer than an outage, a restart and a beat.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from ablate import store
from tests.flows.cluster import BIN, both_training, cluster_spec, deployed, kill_tree, trainers
from tests.runner.test_adaptive_sweep import SPEC as RACE
from tests.runner.test_adaptive_sweep import check_the_race, race_of
from tests.waiting import Deadline, patience, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

OUTAGE_SECONDS = 25


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    specs = [
        cluster_spec("cancel", {"wall_clock": 600}, "lab", [{"d_model": [32, 48]}]),
        cluster_spec("outage", {"wall_clock": 20}, "lab", [{"d_model": [32, 48, 64]}]),
        {**RACE, "budget": {**RACE["budget"], "hardware": "lab"}},  # the local race (tests/runner/test_adaptive_sweep.py)
    ]
    with deployed(tmp_path_factory.mktemp("outages"), specs, ABLATE_ZOMBIE_SECONDS="120",
                  PREFECT_CLIENT_MAX_RETRIES="2") as c:
        yield c


def test_a_sweep_that_lived_through_a_server_restart_still_cancels_its_trainers(cluster):
    """Prefect's cancellation observer (in the process worker) gives up for good once a poll fails past its client's
    retries (about 30 s by default, 6 s here), so after this outage Prefect never stops the sweep flow's process: the
    flow finds itself Cancelling and cancels its trials, and the trainers stop all the same (an outage shorter than
    the retries reached them through Prefect on an idle machine and never on a busy one, where the server took as
    long again to come back)."""
    sweeps_log = cluster.tmp / "proc-1.log"
    flow_run_id = cluster.deployment_run("sweep/cancel", "name=cancel-after-outage")
    engine = store.connect(cluster.url)
    ids = both_training(cluster, engine, "cancel-after-outage")
    kill_tree(cluster.server.pid, signal.SIGKILL)
    cluster.server.wait()
    time.sleep(OUTAGE_SECONDS)
    cluster.start_server()
    time.sleep(5)
    watching = cluster.start(str(BIN / "ablate"), "sweep", "watch", "cancel-after-outage", "--db", cluster.url,
                             "--poll", "1")
    t0 = time.monotonic()
    assert cluster.run(str(BIN / "prefect"), "flow-run", "cancel", flow_run_id).returncode == 0
    wait_until(lambda: not trainers(ids, cluster), 90, "trainers still running after the cancel")
    by = "the flow itself" if "was not stopped: cancelling its trials here" in sweeps_log.read_text() else "Prefect"
    print(f"timings: after a server restart, both trainers gone {time.monotonic() - t0:.1f} s after the cancel "
          f"(cancelled by {by})")
    assert watching.wait(timeout=patience(90)) == 3
    with engine.connect() as conn:
        statuses = conn.execute(sa.select(store.Run.status).where(store.Run.id.in_(ids))).scalars().all()
    assert statuses == ["cancelled", "cancelled"], statuses


def test_a_prefect_server_restart_mid_sweep_is_ridden_out_and_nothing_is_trained_twice(cluster):
    """The server is down longer than Prefect's own client retries (2 here, about 6 s): the sweep flow rides it
    out, trials that ended meanwhile are read from the DB, the waiting one runs after; a second run of the
    deployment trains nothing again."""
    flow_run_id = cluster.deployment_run("sweep/outage")
    watching = cluster.start(str(BIN / "ablate"), "sweep", "watch", "outage", "--db", cluster.url, "--poll", "1")
    engine = store.connect(cluster.url)

    def rows():
        with engine.connect() as conn:
            return conn.execute(sa.select(store.Run.id, store.Run.status, store.Run.attempts, store.Run.last_step).join(store.Sweep)
                                .where(store.Sweep.name == "outage").order_by(store.Run.id)).all()

    deadline = Deadline(240)
    while sum(r.status == "running" and (r.last_step or 0) > 0 for r in rows()) < 2:
        deadline.check(rows())
        time.sleep(0.5)
    kill_tree(cluster.server.pid, signal.SIGKILL)
    cluster.server.wait()
    down = time.monotonic()
    time.sleep(OUTAGE_SECONDS)
    cluster.start_server()
    print(f"timings: Prefect server down {time.monotonic() - down:.0f} s")
    deadline = Deadline(400)
    while not (state := cluster.flow_run(flow_run_id).state).is_final():
        deadline.check((state, rows()))
        time.sleep(2)
    logs = cluster.run(str(BIN / "prefect"), "flow-run", "logs", flow_run_id).stdout
    assert state.is_completed(), (state, logs[-3000:])
    # seen by ride_out (said once back: its "unreachable" lines, logged while the server was down, may never reach
    # it), or hidden inside Prefect's own client retries (a call started mid-outage) and said once back
    seen = "the Prefect API is back after" in logs
    assert seen or "the Prefect API answered only after" in logs, logs[-3000:]
    assert "has no live worker" not in logs  # both workers lived through it: no false alarm once it is back
    assert watching.wait(timeout=patience(60)) == 0  # `ablate sweep watch` rode it out: completed
    watched = Path(cluster.logs[cluster.procs.index(watching)].name).read_text()
    assert "the Prefect API went away" in watched and "the Prefect API is back after" in watched, watched
    assert "sweep outage: 3/3 finished (3 completed); flow run" in watched, watched
    final = rows()
    assert [(r.status, r.attempts) for r in final] == [("completed", 1)] * 3, final
    again = cluster.run(str(BIN / "prefect"), "deployment", "run", "sweep/outage", "--watch", "--watch-timeout",
                        "300", timeout=360)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert [(r.status, r.attempts) for r in rows()] == [("completed", 1)] * 3  # nothing trained again


def test_an_adaptive_sweep_races_on_the_pool_round_by_round_and_a_second_run_trains_nothing(cluster):
    """`adaptive:` through the deployment: the sweep flow sends each round's seeds to the pool's workers as trial
    flow runs, decides from the DB between rounds, and ends when the race is over. The obvious claim is decided
    at `min`, the null one runs on; every seed is dispatched once; a second run of the deployment reads the
    finished race and dispatches nothing."""
    flow_run_id = cluster.deployment_run("sweep/race")
    deadline = Deadline(900)
    while not (state := cluster.flow_run(flow_run_id).state).is_final():
        deadline.check(state)
        time.sleep(2)
    logs = cluster.run(str(BIN / "prefect"), "flow-run", "logs", flow_run_id).stdout
    assert state.is_completed(), (state, logs[-3000:])
    decisions, seeds = race_of(cluster.url)
    check_the_race(decisions, seeds)
    runs = sum(map(len, seeds.values()))
    assert len(cluster.trial_flow_runs_of(flow_run_id)) == runs  # each seed dispatched to the pool once
    assert "more seed run(s) for the undecided claims" in logs and "sweep race: race over:" in logs, logs[-3000:]
    again = cluster.deployment_run("sweep/race")
    deadline = Deadline(300)
    while not (state := cluster.flow_run(again).state).is_final():
        deadline.check(state)
        time.sleep(2)
    assert state.is_completed() and cluster.trial_flow_runs_of(again) == [], state
    assert race_of(cluster.url) == (decisions, seeds)  # no run, no decision added
