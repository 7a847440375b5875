"""A cluster with a broken host, for real: a local Prefect server, the results DB on PostgreSQL, `ablate deploy`
without --db (every host reads ABLATE_DB_URL, as a lab's .env gives it), and two trial workers on two host names:
gpu-a, whose environment lacks ABLATE_DB_URL, and gpu-b, which has it. A sweep never ends Completed with a run untrained, and a run that gpu-a
failed goes to gpu-b.
"""

from __future__ import annotations

import signal
import time

import pytest
import sqlalchemy as sa
import yaml

from ablate import store
from conftest import throwaway_postgres
from tests.flows.cluster import BIN, Cluster, cluster_spec, kill_tree
from tests.waiting import Deadline, patience, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture(scope="module")
def results_db():
    """The results DB a lab shares: a throwaway database on the real PostgreSQL server (dropped afterwards)."""
    for url in throwaway_postgres("ablate_hosts"):
        yield url
        store.close_engines()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory, results_db):
    tmp = tmp_path_factory.mktemp("hosts")
    sweeps = tmp / "sweeps"
    sweeps.mkdir()
    spec = cluster_spec("owed", {"steps": 5}, "lab", [{"d_model": [32]}])
    (sweeps / "owed.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    c = Cluster(tmp)
    c.url = results_db
    with_db = {**c.env, "ABLATE_DB_URL": c.url}
    try:
        c.start_server()
        deployed = c.run(str(BIN / "ablate"), "deploy", "--sweeps", str(sweeps), "--artifacts", str(tmp / "art"),
                         timeout=patience(180))
        assert deployed.returncode == 0, deployed.stderr[-3000:]
        c.start(str(BIN / "prefect"), "worker", "start", "--pool", "sweeps", "--name", "sweeps-worker", env=with_db)
        (tmp / "a").mkdir()
        c.broken = c.start(str(BIN / "ablate"), "worker", "--pool", "lab", "--host", "gpu-a", cwd=tmp / "a")
        c.with_db = with_db
        yield c
    finally:
        c.stop()


def _run(engine, sweep: str):
    with engine.connect() as conn:
        return conn.execute(sa.select(store.Run).join(store.Sweep).where(store.Sweep.name == sweep)).one()


def _final(cluster, flow_run_id: str, seconds: float = 300):
    deadline = Deadline(seconds)
    while not (state := cluster.flow_run(flow_run_id).state).is_final():
        deadline.check(f"the sweep flow run did not end: {state.name}")
        time.sleep(1)
    return state


def test_a_sweep_whose_only_host_has_no_database_ends_failed_naming_the_run_the_host_and_its_error(hosts):
    state = _final(hosts, hosts.deployment_run("sweep/owed"))
    engine = store.connect(hosts.url)
    run = _run(engine, "owed")
    assert run.status == "pending" and run.attempts == 0  # never claimed, never trained
    assert state.is_failed(), state  # not Completed with a run untrained
    message = state.message
    assert f"run {run.id} (pending, dispatched 5x; failed 5x on gpu-a: " in message, message
    assert "host gpu-a has no results database: set ABLATE_DB_URL" in message, message
    flows = hosts.trial_flow_runs(engine, run.id)
    assert len(flows) == 5 and all(f.state.is_failed() for f in flows), [f.state.name for f in flows]
    assert "[host gpu-a]" in flows[0].state.message and "ABLATE_DB_URL" in flows[0].state.message


def test_a_run_the_broken_host_failed_goes_to_the_other_host_and_trains_once(hosts):
    engine = store.connect(hosts.url)
    good = hosts.start(str(BIN / "ablate"), "worker", "--pool", "lab", "--host", "gpu-b", env=hosts.with_db)
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.hosts import live_hosts

    def both_online() -> bool:
        with temporary_settings({PREFECT_API_URL: hosts.api}), get_client(sync_client=True) as client:
            return live_hosts(client, "lab") == ["gpu-a", "gpu-b"]

    wait_until(both_online, 120, "gpu-b's worker never came online")
    kill_tree(good.pid, signal.SIGSTOP)  # gpu-b looks away: gpu-a, free first, takes the run (and fails it)
    try:
        run = _run(engine, "owed")
        before = len(hosts.trial_flow_runs(engine, run.id))
        flow_run_id = hosts.deployment_run("sweep/owed")

        def failed_on_a() -> bool:
            new = hosts.trial_flow_runs(engine, run.id)[before:]
            return bool(new) and new[0].state.is_failed()

        wait_until(failed_on_a, 120, "gpu-a never failed the run")
    finally:
        kill_tree(good.pid, signal.SIGCONT)
    state = _final(hosts, flow_run_id)
    done = _run(engine, "owed")
    assert state.is_completed(), state.message
    assert done.status == "completed" and done.attempts == 1, (done.status, done.error)
    first, again = hosts.trial_flow_runs(engine, run.id)[before:]
    assert "[host gpu-a]" in first.state.message
    assert again.work_queue_name == "host-gpu-b" and again.state.is_completed()
    sweep_log = (hosts.tmp / "proc-1.log").read_text()
    assert (f"run {run.id} is owed (pending) after its trial flow run ended Failed ([host gpu-a] run {run.id}: "
            "host gpu-a has no results database") in sweep_log
    assert "dispatched again to host gpu-b, which has not failed it; it has no checkpoint" in sweep_log
