"""Cluster mode: `ablate worker` (Prefect workers for a pool on this machine, one per GPU group) and `ablate deploy`
(the Prefect deployments on the server at PREFECT_API_URL)."""

from __future__ import annotations

import os
import re
from typing import Any

import click

from ablate.cli.common import about, console, db_option, require_prefect
from ablate.config.errors import AblateError
from ablate.config.settings import environment


@click.command(**about("Prefect workers for a pool here: one trial per GPU"))
@click.option("--pool", required=True, help="the work pool: the hardware class of the sweeps (rtx3060, v100, cpu)")
@click.option("--gpus-per-trial", type=int, default=lambda: environment().gpus_per_trial,
              show_default=False, help="GPUs each trial gets (the sweeps' budget.gpus; default $ABLATE_GPUS_PER_TRIAL "
                                       "or 1)")
@click.option("--slots", type=int, default=1, help="without GPUs: trials at once (default 1)")
@click.option("--trials-per-gpu", type=click.IntRange(1, 64), default=lambda: environment().trials_per_gpu,
              show_default=False, help="trials sharing each GPU group, each capped at its share of the GPU's memory "
                                       "(under MPS, of its SMs too; default $ABLATE_TRIALS_PER_GPU or 1)")
@click.option("--host", default=lambda: environment().worker_host, show_default=False,
              help="the name this machine goes by in the pool (default $ABLATE_WORKER_HOST or its hostname)")
@db_option(expose=False)
def worker(pool: str, gpus_per_trial: int, slots: int, trials_per_gpu: int, host: str | None) -> int:
    """Prefect workers for a work pool on this machine: one per group of --gpus-per-trial GPUs, each running at
    most --trials-per-gpu trials at a time (default one: no two trials share a GPU) on its own CUDA_VISIBLE_DEVICES,
    each trainer capped at its share of the GPU; on a machine without GPUs, one worker running --slots trials at
    once. They poll the pool's default queue and this host's own
    (where a sweep sends a run that another host failed). Stops them all on Ctrl-C / SIGTERM."""
    require_prefect("ablate worker")
    from ablate import runner
    from flows.deploy import ensure_host_queue, wait_for_api
    from flows.health import check_host

    if host is not None:
        os.environ["ABLATE_WORKER_HOST"] = host  # the trials' flow-run processes say it in their errors
    host = runner.worker_host()
    if not re.fullmatch(r"[A-Za-z0-9._]+(-[A-Za-z0-9._]+)*", host) or len(host) > 100:
        raise AblateError(f"--host {host!r}: write letters, digits, '.', '_' and single '-' (at most 100), e.g. gpu-a")
    groups = gpu_groups(gpus_per_trial)
    limit = trials_per_gpu if groups else slots
    os.environ["ABLATE_TRIALS_PER_GPU"] = str(trials_per_gpu if groups else 1)  # its trainers' share (train/device.py)
    wait_for_api(say=lambda line: console.print(line, highlight=False))
    check_host(pool, host)  # refuses, in one line, before taking any work (flows/health.py)
    ensure_host_queue(pool, runner.host_queue(host))
    return _serve(pool, host, groups, limit)


def _serve(pool: str, host: str, groups: list[list[str]], limit: int) -> int:
    """The host's Prefect workers until one ends, or Ctrl-C / SIGTERM, or the host is drained: DRAIN_AFTER trials in
    a row failed here for host reasons (their flow runs say so in the health file). A drained host stops polling,
    says why here and on its queue (`ablate sweep status`), and waits for Ctrl-C; starting it again takes it back."""
    import shutil
    import tempfile
    from pathlib import Path

    from ablate import runner
    from flows.health import DRAIN_AFTER, HEALTH_ENV, faults_in_a_row, mark_drained

    queue = runner.host_queue(host)
    mark_drained(pool, queue, None)  # a restart takes a drained host back
    folder = Path(tempfile.mkdtemp(prefix="ablate-worker-"))
    health = folder / "health"
    try:
        procs = [_start_worker(pool, host, group, limit, {HEALTH_ENV: str(health)}) for group in groups or [None]]
        ended, faults = _wait_for_any(procs, lambda: len(faults_in_a_row(health)) >= DRAIN_AFTER)
        if ended is None and faults:
            last = faults_in_a_row(health)[-1]
            reason = (f"{DRAIN_AFTER} trials in a row failed on this host for host reasons (the last: {last}); "
                      f"fix it and start `ablate worker --pool {pool}` again to take it back")
            console.print(f"host {host} drained: it takes no more trials of pool {pool}: {reason}", highlight=False,
                          markup=False)  # the reason holds "[host NAME]", which is not markup
            try:  # shown under `ablate sweep status`; the drain itself (no polling) holds without it
                mark_drained(pool, queue, reason)
            except Exception as exc:  # noqa: BLE001 - the API away: said, and the host stays drained
                console.print(f"warning: the drain could not be shown on queue {queue}: {type(exc).__name__}: {exc}",
                              highlight=False, markup=False)
            _wait_for_stop()
            return 0
        return 0 if ended is None else abs(ended.returncode or 0)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def gpu_groups(per: int) -> list[list[str]]:
    """This machine's visible GPUs in groups of `per` (none without GPUs)."""
    from ablate import runner

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = runner.visible_gpus()
    ids = [d.strip() for d in visible.split(",")][:count] if visible is not None else [str(i) for i in range(count)]
    groups = [ids[i:i + per] for i in range(0, len(ids) - per + 1, per)]
    if ids and not groups:
        raise AblateError(f"--gpus-per-trial {per}: this machine shows only {len(ids)} GPU(s) ({','.join(ids)})")
    return groups


def _start_worker(pool: str, host: str, group: list[str] | None, limit: int, extra_env: dict[str, str]) -> Any:
    """`prefect worker start` for the pool's default queue and the host's, on the GPUs of `group` (None: no GPU).
    Its name, HOST-POOL-GPUS-PID, says the host (flows/hosts.py reads it)."""
    import subprocess

    from ablate import runner

    env = {**os.environ, **extra_env}
    label = "cpu"
    if group is not None:
        env["CUDA_VISIBLE_DEVICES"] = label = ",".join(group)
    cmd = [_prefect_command(), "worker", "start", "--pool", pool, "--type", "process", "--limit", str(limit),
           "--work-queue", "default", "--work-queue", runner.host_queue(host),
           "--name", f"{host}-{pool}-{label.replace(',', '+')}-{os.getpid()}"]
    console.print(f"worker on pool {pool}: {'GPUs ' + label if group else 'no GPU'}, at most {limit} trial(s) "
                  f"at once: {' '.join(cmd)}")
    return subprocess.Popen(cmd, env=env, start_new_session=True)  # its own group: a drain can end all of it


DRAIN_GRACE = 20.0  # seconds a drained host's Prefect workers get to stop before their process groups are killed


def _wait_for_any(procs: list[Any], drained: Any) -> tuple[Any, bool]:
    """Until a worker ends, or Ctrl-C / SIGTERM, or `drained()`: then every worker is stopped (so a restart policy
    restarts them all). (The one that ended first or None, whether the host was drained.) A drained host's workers
    that have not stopped DRAIN_GRACE seconds after SIGTERM are killed with their process group: a Prefect worker
    told to stop while it submits a flow run went on polling (and failing trials) until killed."""
    import signal
    import subprocess
    import time

    told = {"stop": False}

    def stop(*_: Any) -> None:
        told["stop"] = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    faults = False
    try:
        while not told["stop"] and all(p.poll() is None for p in procs) and not (faults := drained()):
            time.sleep(1)
    except KeyboardInterrupt:
        told["stop"] = True
    ended = next((p for p in procs if p.poll() is not None), None)
    stop()
    deadline = time.monotonic() + DRAIN_GRACE
    for p in procs:
        if not faults:
            p.wait()
            continue
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(p)
    return ended, faults


def _kill_group(proc: Any) -> None:
    """SIGKILL a worker and everything under it (its process worker and flow runs, in whatever group they put
    themselves: read from /proc), then its process group."""
    import signal
    from pathlib import Path

    below: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        try:
            below.setdefault(int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    todo, found = [proc.pid], []
    while todo:
        found.append(pid := todo.pop())
        todo += below.get(pid, [])
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _wait_for_stop() -> None:
    """A drained host's `ablate worker` stays up, taking nothing (a restart policy would start it again at once),
    until Ctrl-C / SIGTERM."""
    import signal
    import threading

    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        while not stopped.wait(1):
            pass
    except KeyboardInterrupt:
        pass


def _prefect_command() -> str:
    """`prefect` on PATH, else the one installed beside this Python (a venv used without activating it)."""
    import shutil
    import sys
    from pathlib import Path

    beside = Path(sys.executable).parent / "prefect"
    return shutil.which("prefect") or (str(beside) if beside.exists() else "prefect")


@click.command(**about("register Prefect deployments sweep/<name> and trial/<hardware>"))
@click.option("--sweeps", default="sweeps", help="folder of sweep files")
@click.option("--pool", "pools", multiple=True, metavar="HARDWARE",
              help="also a work pool and trial deployment for this hardware (for --param hardware=... overrides)")
@click.option("--artifacts", default=None, help="shared artifacts path the workers use")
@click.option("--slots", multiple=True, metavar="HARDWARE=N", help="GPU slots (pool concurrency) per hardware class; "
              "default 1")
@db_option()
def deploy(sweeps: str, pools: tuple[str, ...], artifacts: str | None, slots: tuple[str, ...], db: str | None) -> int:
    """Register Prefect deployments on the server at PREFECT_API_URL."""
    require_prefect("ablate deploy")
    from pathlib import Path

    from flows.deploy import deploy_all

    names = deploy_all(Path(sweeps), db_url=db, artifacts=artifacts, slots=_slots(slots), pools=list(pools),
                       say=lambda line: console.print(line, highlight=False))
    console.print(f"registered {len(names)} deployments")
    # `ablate worker`, not a plain Prefect worker, for the trial pools: it polls its host's own queue, where a run that
    # another host failed is sent (a plain one has none, so a re-dispatch could not avoid the failed host)
    console.print("start workers with: prefect worker start --pool sweeps  and  ablate worker --pool HARDWARE")
    return 0


def _slots(items: tuple[str, ...]) -> dict[str, int]:
    """{hardware: N} from --slots HARDWARE=N ..."""
    slots = {}
    for item in items:
        hardware, _, n = item.partition("=")
        if not n.isdigit():
            raise AblateError(f"--slots {item!r}: write HARDWARE=N, e.g. --slots rtx3060=1 --slots v100=4")
        slots[hardware] = int(n)
    return slots
