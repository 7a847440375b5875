"""A worker host's health: what `ablate worker` checks before it takes any work, and how a host that keeps failing
trials for host reasons stops taking them (drained, as Slurm drains a node that fails its health check).

- At start (`check_host`): the results DB the pool's trials use is configured and reachable, the artifacts folder
  is writable, the checkout sits at the path the deployments run from, and a GPU pool's host shows a GPU. The worker
  refuses to start with one line naming what is missing.
- While it runs: each trial flow on the host says how it went in the worker's health file (ABLATE_HOST_HEALTH, set
  by `ablate worker` for its Prefect workers and so for their flow-run processes): `ok` when its trainer started
  (or another process had the run), `fault` with the error when the host failed it (no DB, a read-only or full
  disk: flows/sweep.py `trial`). DRAIN_AFTER faults in a row drain the host: `ablate worker` stops its Prefect
  workers and pauses the host's queue with the reason as its description, so `ablate sweep status` says it; the host
  is taken back by starting `ablate worker` again.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ablate.config.errors import AblateError
from ablate.config.settings import environment

DRAIN_AFTER = 3  # trials in a row that this host failed for host reasons before it takes no more work
HEALTH_ENV = "ABLATE_HOST_HEALTH"
DRAINED = "drained: "  # how a drained host's queue description begins


def check_host(pool: str, host: str) -> None:
    """Whether this host can take the trials of `pool` (its trial deployment's parameters and working directory,
    when it is deployed), or an AblateError in one line naming each missing piece and its fix."""
    from ablate import runner

    deployment = _trial_deployment(pool)
    launch = (deployment.parameters or {}).get("launch") or {} if deployment is not None else {}
    checkout = _working_directory(deployment)
    problems = []
    if checkout is not None and not (checkout / "flows" / "sweep.py").is_file():
        problems.append(f"the deployments run from {checkout} (their set_working_directory step), which holds no "
                        "ablate checkout here: put the checkout at that same absolute path on every host, or deploy "
                        "from the image's")
    problems += _database_problems(launch.get("db_url") or environment().db_url)
    artifacts = Path(launch.get("artifacts") or environment().artifacts)
    if not artifacts.is_absolute():
        artifacts = (checkout or Path.cwd()) / artifacts
    problem = _not_writable(artifacts)
    if problem:
        problems.append(problem)
    from ablate.config.units import HARDWARE_PROFILES

    profile = HARDWARE_PROFILES.get(pool)
    if profile is not None and profile.device != "cpu" and runner.visible_gpus() == 0:
        problems.append(f"pool {pool} is a GPU pool but this host shows no GPU (CUDA_VISIBLE_DEVICES="
                        f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}, or no driver)")
    if problems:
        raise AblateError(f"host {host} cannot take trials of pool {pool}: " + "; ".join(problems))


def _trial_deployment(pool: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_deployment_by_name(f"trial/{pool}")
        except ObjectNotFound:  # not deployed yet (workers may start first): its parameters are checked by the trials
            return None


def _working_directory(deployment: Any) -> Path | None:
    """Where the deployment's flow runs start (its set_working_directory pull step), if it says."""
    for step in (deployment.pull_steps or []) if deployment is not None else []:
        for name, args in step.items():
            if name.endswith("set_working_directory") and isinstance(args, dict) and args.get("directory"):
                return Path(args["directory"])
    return None


def _database_problems(url: str | None) -> list[str]:
    """Why this host cannot reach the results DB (none: it can), without making any database."""
    import sqlalchemy as sa

    from ablate import store

    if not url:
        return ["no results database: set ABLATE_DB_URL in the worker's environment (the sweeps' database), or "
                "deploy with `ablate deploy --db URL`"]
    url = store.resolve_url(url)
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        folder = Path(parsed.database or ".").parent
        return [] if folder.is_dir() else [f"the results database's folder {folder} does not exist here (a SQLite "
                                          "results DB must be on a path every host shares)"]
    try:
        engine = sa.create_engine(url, connect_args={"connect_timeout": 10} if "postgresql" in url else {})
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # noqa: BLE001 - any driver's error: said in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return [f"the results database {store.redact(url)} does not answer ({first}): check ABLATE_DB_URL and that "
                "the server is up"]
    return []


def _not_writable(folder: Path) -> str | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".ablate-host-check-"):
            pass
    except OSError as exc:
        return (f"the artifacts folder {folder} is not writable ({exc.strerror or type(exc).__name__}): the trials "
                "write their logs, token caches and checkpoints there")
    return None


# ---------------------------------------------------------------- drain after repeated host faults


def say_trial(ok: bool, reason: str = "") -> None:
    """A trial flow on this host says how it went, in the worker's health file (nothing outside `ablate worker`)."""
    path = os.environ.get(HEALTH_ENV)
    if not path:
        return
    line = "ok\n" if ok else "fault " + " ".join(reason.split())[:300] + "\n"
    try:
        with open(path, "a") as f:
            f.write(line)
    except OSError:  # the health file itself on a broken disk: the trial's own error says enough
        pass


def faults_in_a_row(path: Path) -> list[str]:
    """The reasons of the trials this host failed since its last one that went well, newest last."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    since_ok = lines[max((i for i, line in enumerate(lines) if line == "ok"), default=-1) + 1:]
    return [line.removeprefix("fault ") for line in since_ok if line.startswith("fault ")]


def mark_drained(pool: str, queue: str, reason: str | None) -> None:
    """Pause the host's own queue with why as its description (`reason`), or resume it (None: taken back)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        found = client.read_work_queue_by_name(queue, work_pool_name=pool)
        client.update_work_queue(found.id, is_paused=reason is not None, description=DRAINED + reason if reason else
                                 "one host's trials: a sweep sends a run here to avoid hosts that failed it")


def drained_hosts(pool: str, api: str | None = None, timeout: float = 3.0) -> dict[str, str]:
    """{host: why} for the pool's drained hosts (their paused queues), from the Prefect API at `api` (default
    PREFECT_API_URL); {} without one, or when it does not answer within `timeout` (a status read never waits on it)."""
    import httpx

    api = api or os.environ.get("PREFECT_API_URL")
    if not api:
        return {}
    try:
        answer = httpx.post(f"{api.rstrip('/')}/work_pools/{pool}/queues/filter", json={}, timeout=timeout)
        answer.raise_for_status()
        queues = answer.json()
    except (httpx.HTTPError, ValueError):
        return {}
    return {q["name"].removeprefix("host-"): q["description"].removeprefix(DRAINED) for q in queues
            if q.get("is_paused") and (q.get("description") or "").startswith(DRAINED)}


def drained_of_sweep(engine: Any, name: str) -> list[str]:
    """'host gpu-a is drained (pool lab): why', a line per drained host of the sweep's pool (its budget's hardware):
    what `ablate sweep status` and the dashboard say. None without a Prefect API or when it does not answer."""
    from ablate import store

    spec = store.sweep_named(engine, name, store.Sweep.spec).spec or {}
    pool = (spec.get("budget") or {}).get("hardware", "cpu")
    return [f"host {host} is drained (pool {pool}): {why}" for host, why in drained_hosts(pool).items()]


__all__ = ["DRAIN_AFTER", "check_host", "drained_hosts", "drained_of_sweep", "faults_in_a_row", "mark_drained",
           "say_trial"]
