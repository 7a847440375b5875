"""Facts about the host a runner stands on: its cores and how busy they are, its GPUs, whether a pid lives,
each trainer's share of the cores, and its name, trial queue and results DB in a cluster. Light on purpose (no
torch): the runner and the warm helper ask it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from ablate import store
from ablate.config.errors import AblateError
from ablate.config.settings import environment

pid_alive = store.pid_alive


def host_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. a container's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat (Linux)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def busy_cores(sample_seconds: float = 0.5) -> int:
    """Cores other jobs keep busy right now, at most all but one: measured over a short sample of
    /proc/stat (the 1-minute load average would still count a pip install that just ended)."""
    before = _cpu_times()
    if before is not None:
        time.sleep(sample_seconds)
        after = _cpu_times()
        if after is not None and after[1] > before[1]:
            share = (after[0] - before[0]) / (after[1] - before[1])
            return min(host_cores() - 1, int(share * (os.cpu_count() or 1) + 0.5))
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # neither is available here
        return 0
    return min(host_cores() - 1, int(load + 0.5))


def visible_gpus() -> int:
    """CUDA devices this process may use, without importing torch (the runner stays light): the ids in
    CUDA_VISIBLE_DEVICES when set, else the GPUs `nvidia-smi -L` lists (0 without a driver)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for device in visible.split(","):  # CUDA stops at the first invalid id ("-1", "")
            if not device.strip() or device.strip().startswith("-"):
                break
            count += 1
        return count
    import shutil

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def default_threads(concurrent: int, processes_per_trial: int = 1) -> int:
    """Each trainer process's share of the cores left free when `concurrent` trials run at once here.

    torch's default (every core) collapses on a shared host: busy threads wait on each other (measured
    on 2 cores beside a 2-process job: 18 steps in 20 s with 2 threads, 151 with 1, 262 idle with 2).
    Call it before this process starts helpers of its own (the local Prefect server), which would count.
    """
    free = host_cores() - busy_cores()
    return max(1, free // max(1, concurrent * processes_per_trial))


def worker_host() -> str:
    """The name this machine goes by in a cluster's pools: ABLATE_WORKER_HOST (`ablate worker --host`), else its
    hostname."""
    return environment().worker_host or socket.gethostname()


def host_queue(host: str) -> str:
    """The work queue of a host's trials in every pool (`ablate worker` polls it beside the pool's default queue): a
    sweep sends a run there to keep it off the hosts that just failed it."""
    return "host-" + re.sub(r"[^A-Za-z0-9._-]", "-", host)[:90]


def cluster_db_url(db_url: str | None, database: str) -> str:
    """The results DB of a trial a cluster sweep dispatched to this host: `db_url` (the deployment's) or
    ABLATE_DB_URL, which must exist and be the sweep's database (`database`, its id). A host without one fails the
    trial here, before any database is touched: never a default SQLite file made in the worker's directory."""
    url = db_url or environment().db_url
    here = worker_host()
    if not url:
        raise AblateError(f"host {here} has no results database: set ABLATE_DB_URL in its worker's environment (the "
                          f"sweep's database, id {database[:12]}), or deploy with `ablate deploy --db URL`; a cluster "
                          "host never creates a default database")
    url = store.resolve_url(url)
    parsed = make_url(url)
    path = parsed.database if parsed.get_backend_name() == "sqlite" and parsed.database != ":memory:" else None
    if path and not Path(path).exists():
        raise AblateError(f"host {here}: its results database {path} does not exist (ABLATE_DB_URL or the "
                          "deployment's --db must name the sweep's database, on a path every host shares)")
    found = store.database_id(store.connect(url))
    if found != database:
        raise AblateError(f"host {here}: its results database {store.redact(url)} is not the sweep's (id {found[:12]}, "
                          f"the sweep's {database[:12]}): point ABLATE_DB_URL at the sweep's database")
    return url


def slot_devices(slots: int, gpus_per_trial: int, visible: int) -> list[list[int] | None]:
    """The GPUs of each of `slots` trial slots on a host with `visible` GPUs: the slots take the groups of
    `gpus_per_trial` GPUs in turn, so more slots than groups share them (`--trials-per-gpu`: slot s on group s mod
    groups), and never name a GPU this host lacks; None for every slot without GPUs (no CUDA_VISIBLE_DEVICES)."""
    groups = visible // gpus_per_trial
    if groups == 0:
        return [None] * slots
    return [list(range((s % groups) * gpus_per_trial, (s % groups + 1) * gpus_per_trial)) for s in range(slots)]


def mps_running() -> bool:
    """Whether this node runs NVIDIA's MPS control daemon (its pipe directory holds a control socket): trainers that
    share a GPU then run their kernels at once, each on its share of the SMs."""
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")
    return (pipe / "control").exists()


def sharing_env(trials_per_gpu: int) -> dict[str, str]:
    """What a trainer that shares its GPU with others gets in its environment: its share of the SMs under MPS."""
    if trials_per_gpu <= 1 or not mps_running():
        return {}
    return {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, 100 // trials_per_gpu))}

