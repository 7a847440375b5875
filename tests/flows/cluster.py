"""A lab cluster for the cluster tests, for real: a local Prefect server, `ablate deploy`, a sweep worker and workers
of one trial pool (`ablate worker`, CPU here standing in for GPU machines), and what the tests do to it: deployment
runs, flow runs read back, a machine's whole process tree killed, the trainers of a cluster found.

Heartbeats are 1 s and the stale limit 20 s here (ABLATE_HEARTBEAT_SECONDS, ABLATE_STALE_SECONDS; more on a loaded
machine), so the tests do not wait the 90 s a real cluster would.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import sqlalchemy as sa
import yaml

from ablate import store

from tests.flows.test_deploy import free_port, wait_healthy
from tests.waiting import Deadline, patience

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

SAMPLE = {"source": "ablate:tinystories-sample", "eval": {"holdout": 24}, "packing": "pad"}


def cluster_spec(name: str, budget: dict, hardware: str, grid: list, dataset: dict = SAMPLE) -> dict:
    return {"name": name, "dataset": dataset, "tokenizer": {"vocab_size": 512},
            "budget": {**budget, "hardware": hardware},
            "defaults": {"architecture": "mixer", "d_model": 32, "layers": 2, "context": 64, "lr": 1e-3,
                         "batch_size": 8, "compile": False},
            "grid": grid}



class Cluster:
    """A lab cluster's processes, each logged to proc-N.log in `tmp` (the server proc-0, the sweeps worker proc-1),
    with an environment of 1 s heartbeats and metric writes and a 20 s stale limit; `env` overrides it (the zombie window, Prefect's
    client retries)."""

    def __init__(self, tmp: Path, **env: str):
        self.tmp = tmp
        self.api = f"http://127.0.0.1:{free_port()}/api"
        # a trainer silent this long is taken for dead: 20 s at least, more on a loaded machine (a trainer of one
        # cluster beside another cluster on 2 busy cores went 11 s without a beat, and its run was dispatched twice)
        stale = str(int(max(20, patience(10))))
        self.url = f"sqlite:///{tmp / 'results.db'}"
        self.env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "PREFECT_API_URL": self.api,
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO",
                    "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp / 'prefect.db'}",
                    "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "2",
                    # as docker-compose.yml's server: logs stream to `prefect deployment run --watch`
                    "PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED": "true",
                    "PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED": "true",
                    # a trainer beats and writes its points every second: seen training 1 s in, not 30 s
                    "ABLATE_HEARTBEAT_SECONDS": "1", "ABLATE_FLUSH_SECONDS": "1", "ABLATE_STALE_SECONDS": stale,
                    "ABLATE_DISPATCH_POLL_SECONDS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                    # flow runs beat every 30 s (Prefect's least; default 180); silent for ABLATE_ZOMBIE_SECONDS
                    # they are crashed by `ablate deploy`'s automation: each module sets it (longer than its outages)
                    "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30", "OMP_NUM_THREADS": "1", **env}
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []

    def start(self, *cmd: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.Popen:
        """A process of the cluster (its output in proc-N.log); `env`: the cluster's environment, else this one."""
        log = open(self.tmp / f"proc-{len(self.procs)}.log", "w")  # noqa: SIM115 - open as long as the process; closed at teardown
        self.logs.append(log)
        proc = subprocess.Popen(cmd, env=self.env if env is None else env, stdout=log, stderr=subprocess.STDOUT,
                                cwd=cwd, start_new_session=True)
        self.procs.append(proc)
        return proc

    def run(self, *cmd: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, cwd=REPO, capture_output=True, text=True, timeout=patience(timeout))

    def deployment_run(self, name: str, *params: str) -> str:
        """Start a deployment run (no watch); its flow run id."""
        out = self.run(str(BIN / "prefect"), "deployment", "run", name, *(a for p in params for a in ("--param", p)))
        assert out.returncode == 0, (out.stdout + out.stderr)[-2000:]
        return re.search(r"UUID:\s*([0-9a-f-]{36})", out.stdout).group(1)

    def start_server(self) -> subprocess.Popen:
        proc = self.start(str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
                          self.api.split(":")[-1][:-4])
        self.server = proc
        wait_healthy(self.api)
        return proc

    def trial_flow_runs(self, engine, run_id: int) -> list:
        """The trial flow runs dispatched for a run (found by the tag the sweep flow gives them), oldest first."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from flows.dispatch import run_tag

        with temporary_settings({PREFECT_API_URL: self.api}), get_client(sync_client=True) as client:
            found = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[run_tag(engine)(run_id)])))
        return sorted(found, key=lambda fr: fr.created)

    def trial_flow_runs_of(self, sweep_flow_run_id: str) -> list:
        """The trial flow runs a sweep flow run dispatched."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.api}), get_client(sync_client=True) as client:
            return client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[sweep_flow_run_id])))

    def flow_run(self, flow_run_id: str):
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.api}), get_client(sync_client=True) as client:
            return client.read_flow_run(flow_run_id)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            kill_tree(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                kill_tree(proc.pid, signal.SIGKILL)
        for log in self.logs:
            log.close()



def children() -> dict[int, list[int]]:
    """{parent pid: child pids} of every process on this machine, from /proc."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(entry.name))
    return out


def tree(pid: int) -> list[int]:
    """A process and all its descendants, in whatever session or group they put themselves."""
    parents, todo, found = children(), [pid], []
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(parents.get(p, []))
    return found


def kill_tree(pid: int, sig: int) -> None:
    for p in tree(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def trainers(run_ids: list[int], cluster: Cluster) -> list[int]:
    """Pids of `ablate.train` processes training any of these runs of this cluster (any parent; found by the
    cluster's PREFECT_HOME in their environment: another test session's cluster on this machine has runs of the
    same ids)."""
    found = []
    wanted = {str(r) for r in run_ids}
    home = f"PREFECT_HOME={cluster.env['PREFECT_HOME']}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                args = [a.decode(errors="replace") for a in argv]
                if not ("ablate.train" in args and "--run-id" in args and args[args.index("--run-id") + 1] in wanted):
                    continue
                if home in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found

def sweep_rows(engine, sweep: str) -> list:
    """The sweep's run rows, by id."""
    with engine.connect() as conn:
        return conn.execute(sa.select(store.Run).join(store.Sweep).where(store.Sweep.name == sweep)
                            .order_by(store.Run.id)).all()


def both_training(cluster, engine, sweep: str) -> list[int]:
    """The ids of the sweep's two runs, once both train (a step logged, a trainer process each)."""
    deadline = Deadline(240)
    while True:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(store.Run.id, store.Run.status, store.Run.last_step).join(store.Sweep)
                                .where(store.Sweep.name == sweep)).all()
        ids = [r.id for r in rows]
        if rows and all(r.status == "running" and r.last_step for r in rows) and len(trainers(ids, cluster)) == 2:
            return ids
        deadline.check(rows)
        time.sleep(0.5)


@contextlib.contextmanager
def deployed(tmp: Path, specs: list[dict], **env: str) -> Iterator[Cluster]:
    """A cluster serving `specs` (deployed with 2 slots of pool `lab`): the server, the sweeps worker and two `lab`
    workers (`cluster.workers`); every process stopped at the end."""
    sweeps = tmp / "sweeps"
    sweeps.mkdir()
    for spec in specs:
        (sweeps / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    c = Cluster(tmp, **env)
    try:
        c.start_server()
        deployed = c.run(str(BIN / "ablate"), "deploy", "--sweeps", str(sweeps), "--db", c.url, "--artifacts",
                         str(tmp / "art"), "--slots", "lab=2", timeout=patience(180))
        assert deployed.returncode == 0, deployed.stderr[-3000:]
        c.start(str(BIN / "prefect"), "worker", "start", "--pool", "sweeps", "--name", "sweeps-worker")
        c.workers = [c.start(str(BIN / "ablate"), "worker", "--pool", "lab") for _ in range(2)]
        yield c
    finally:
        c.stop()
