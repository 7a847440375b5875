"""A cluster with broken hosts, for real: a local Prefect server, the results DB on PostgreSQL, `ablate deploy`
without --db (every host reads ABLATE_DB_URL, as a lab's .env gives it), and trial workers on their own host names.
A host that lacks a piece refuses to start; gpu-a, whose artifacts mount goes read-only after it started (its own
mount namespace, remounted read-only), claims runs and fails them: each claim is given back at once, the host is
drained after three such failures, and gpu-b, started later, trains every run once. The sweep ends Completed only
then, never with a run untrained.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
import yaml

from ablate import store
from conftest import throwaway_postgres
from flows.health import DRAIN_AFTER
from tests.flows.cluster import BIN, Cluster, cluster_spec
from tests.waiting import Deadline, patience, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

RUNS = 2  # gpu-a fails them DRAIN_AFTER times in all (a run sent again goes first): two runs are enough


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


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
    spec = cluster_spec("owed", {"steps": 5}, "lab", [{"d_model": [32, 40]}])
    (sweeps / "owed.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    c = Cluster(tmp)
    c.url = results_db
    c.art = tmp / "art"
    c.art.mkdir()
    with_db = {**c.env, "ABLATE_DB_URL": c.url}
    try:
        c.start_server()
        deployed = c.run(str(BIN / "ablate"), "deploy", "--sweeps", str(sweeps), "--artifacts", str(c.art),
                         timeout=patience(180))
        assert deployed.returncode == 0, deployed.stderr[-3000:]
        c.start(str(BIN / "prefect"), "worker", "start", "--pool", "sweeps", "--name", "sweeps-worker", env=with_db)
        c.with_db = with_db
        yield c
    finally:
        c.stop()


def _in_own_mounts(art, *cmd: str, read_only: bool = False) -> tuple[str, ...]:
    """`cmd` in a mount namespace of its own where `art` is a mount of its own (so it can go read-only there alone)."""
    ro = f'mount -o remount,ro,bind "{art}" && ' if read_only else ""
    return ("unshare", "-m", "--propagation", "private", "sh", "-c",
            f'mount --bind "{art}" "{art}" && {ro}exec "$@"', "sh", *cmd)


@contextlib.contextmanager
def _beating_until(cluster, host: str, stop) -> Iterator[None]:
    """A worker record of `host` in pool lab, beaten every second (a 2 s interval) until `stop()` is true: what
    Prefect has of a host whose worker then stops (it lists it online for three intervals more)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    done = threading.Event()

    def beat() -> None:
        with temporary_settings({PREFECT_API_URL: cluster.api}), get_client(sync_client=True) as client:
            while not done.is_set() and not stop():
                client.send_worker_heartbeat("lab", f"{host}-lab-cpu-41", heartbeat_interval_seconds=2)
                time.sleep(1)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        yield
    finally:
        done.set()
        beater.join(timeout=30)


def _runs(engine, sweep: str):
    with engine.connect() as conn:
        return conn.execute(sa.select(store.Run).join(store.Sweep).where(store.Sweep.name == sweep)
                            .order_by(store.Run.id)).all()


def test_a_worker_missing_a_piece_of_its_host_refuses_to_start_naming_it(hosts):
    no_db = {k: v for k, v in hosts.env.items() if k != "ABLATE_DB_URL"}
    out = subprocess.run([str(BIN / "ablate"), "worker", "--pool", "lab", "--host", "gpu-x"], env=no_db,
                         capture_output=True, text=True, timeout=patience(120))
    said = " ".join(out.stderr.split())
    assert out.returncode != 0, out.stdout[-2000:]
    assert "host gpu-x cannot take trials of pool lab: no results database: set ABLATE_DB_URL" in said, said
    dead_db = {**hosts.env, "ABLATE_DB_URL": "postgresql+psycopg://postgres@127.0.0.1:9/nope"}
    out = subprocess.run([str(BIN / "ablate"), "worker", "--pool", "lab", "--host", "gpu-x"], env=dead_db,
                         capture_output=True, text=True, timeout=patience(120))
    assert out.returncode != 0 and "does not answer" in " ".join(out.stderr.split()), out.stderr[-2000:]
    if not _unshare_works():
        pytest.skip("no mount namespaces here (unshare -m): the read-only artifacts case is not run")
    read_only = _in_own_mounts(hosts.art, str(BIN / "ablate"), "worker", "--pool", "lab", "--host", "gpu-x",
                               read_only=True)
    out = subprocess.run(read_only, env=hosts.with_db, capture_output=True, text=True, timeout=patience(120))
    said = " ".join(out.stderr.split())
    assert out.returncode != 0 and f"the artifacts folder {hosts.art} is not writable (Read-only file system)" in said, said


def test_a_host_that_breaks_after_its_claims_gives_them_back_is_drained_and_every_run_trains_once(hosts):
    """The read-only artifacts fault after the claim (the trial cannot open the run's log): the run goes back at
    once, never counted as trained elsewhere; DRAIN_AFTER such failures drain gpu-a, and the sweep waits, Running,
    until gpu-b starts and trains every run. On the way, the run gpu-a failed first is sent to host gpu-c, which
    Prefect lists online but which stopped right then (its worker record, beaten by this test until that moment, is
    what a stopped worker leaves): it is moved to any worker within seconds, not left waiting on gpu-c's queue.
    Adds about a minute and a half: three real failed trial flow runs on gpu-a, then two real trainings."""
    if not _unshare_works():
        pytest.skip("no mount namespaces here (unshare -m)")
    engine = store.connect(hosts.url)
    broken = hosts.start(*_in_own_mounts(hosts.art, str(BIN / "ablate"), "worker", "--pool", "lab", "--host",
                                         "gpu-a"), env=hosts.with_db)
    broken_log = hosts.tmp / f"proc-{len(hosts.procs) - 1}.log"
    wait_until(lambda: "worker on pool lab" in broken_log.read_text(), 120, "gpu-a's worker never started")
    gone_ro = subprocess.run(["nsenter", "-t", str(broken.pid), "-m", "mount", "-o", "remount,ro,bind",
                              str(hosts.art)], capture_output=True, text=True, timeout=30)
    assert gone_ro.returncode == 0, gone_ro.stderr  # its NFS mount went read-only: the host still takes work
    sweep_log = hosts.tmp / "proc-1.log"  # the sweeps worker's: the sweep flow's own lines
    with _beating_until(hosts, "gpu-c", lambda: "dispatched again to host gpu-c" in sweep_log.read_text()):
        flow_run_id = hosts.deployment_run("sweep/owed")
        wait_until(lambda: "dispatched again to host gpu-c" in sweep_log.read_text(), 300,
                   "no run was sent to gpu-c, a live host that had not failed it")
    wait_until(lambda: "on the queue of host gpu-c, which went quiet" in sweep_log.read_text(), 120,
               "the run sent to gpu-c, which stopped, was never moved")
    wait_until(lambda: "drained" in broken_log.read_text(), 300, "gpu-a was never drained")
    said = " ".join(broken_log.read_text().split())
    assert f"host gpu-a drained: it takes no more trials of pool lab: {DRAIN_AFTER} trials in a row failed" in said
    assert "(the last: [host gpu-a] run " in said and "Read-only file system" in said, said[-3000:]
    status = hosts.run(str(BIN / "ablate"), "sweep", "status", "owed", "--db", hosts.url, "--format", "table")
    assert "host gpu-a is drained (pool lab)" in " ".join(status.stdout.split()), status.stdout
    assert not hosts.flow_run(flow_run_id).state.is_final()  # not Completed: the runs gpu-a gave back are owed
    rows = _runs(engine, "owed")
    # pending, or `running` for a moment: a trial the drain stopped between its claim and its trainer's start is
    # watched until its claim goes stale, never taken as trained
    assert all(r.status in ("pending", "running") and r.last_step is None for r in rows), [
        (r.id, r.status, r.error) for r in rows]
    given_back = [r for r in rows if r.error and r.status == "pending"]  # a `running` one: a claim the drain killed
    assert given_back and all(r.attempts == 0 and r.pid is None and r.heartbeat_at is None for r in given_back)
    assert "host gpu-a could not start its trainer: OSError: [Errno 30] Read-only file system" in given_back[0].error

    hosts.start(str(BIN / "ablate"), "worker", "--pool", "lab", "--host", "gpu-b", env=hosts.with_db)
    deadline = Deadline(400)
    while not (state := hosts.flow_run(flow_run_id).state).is_final():
        deadline.check(f"the sweep flow run did not end: {state.name}")
        time.sleep(1)
    assert state.is_completed(), state.message
    rows = _runs(engine, "owed")
    assert len(rows) == RUNS
    # each trained once, by gpu-b, the only host not drained: one attempt, as gpu-a's claims were given back, or two
    # where the drain killed gpu-a's trial between its claim and its give-back (the claim went stale, gpu-b took it)
    assert [r.status for r in rows] == ["completed"] * RUNS and all(r.attempts in (1, 2) for r in rows), [
        (r.id, r.status, r.attempts, r.host, r.error) for r in rows]
    # gpu-a's trial flow runs: each Failed with the host's line, but the one whose fault drained the host may have
    # been stopped with the host's workers before its state was written (Crashed, or left Running): never Completed
    flow_runs = [fr for r in rows for fr in hosts.trial_flow_runs(engine, r.id)]
    moved = [fr for fr in flow_runs if fr.state.is_cancelled()]  # sent to gpu-c, moved: gpu-c's line
    assert moved and all("host gpu-c went quiet" in fr.state.message for fr in moved), [
        (fr.state.name, fr.state.message) for fr in moved]
    on_a = [fr for fr in flow_runs if not (fr.state.is_completed() or fr.state.is_cancelled())]
    failed = [fr for fr in on_a if fr.state.is_failed()]
    assert len(on_a) >= DRAIN_AFTER and len(failed) >= DRAIN_AFTER - 1, [(fr.state.name, fr.state.message) for fr in on_a]
    assert all("[host gpu-a]" in fr.state.message for fr in failed), [fr.state.message for fr in failed]
    watched = hosts.run(str(BIN / "ablate"), "sweep", "watch", "owed", "--db", hosts.url, "--poll", "1")
    assert watched.returncode == 0, watched.stdout[-2000:]
