"""Register deployments: `sweep/<spec-name>` for every sweeps/*.yaml, `search/<spec-name>` for those with a
`search` block, and `trial/<hardware>` per hardware class.

Sweep flows run on the `sweeps` work pool (orchestration only, no GPU); trials run on one pool per
hardware class, with no pool-wide limit unless `slots` sets one: each worker runs one trial per GPU
(`ablate worker`), so the pool runs as many trials as its machines have GPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from prefect import flow

from ablate import store
from ablate.config.errors import AblateError
from ablate.config import load_spec
from ablate.config.launch import LaunchOptions
from ablate.config.settings import environment

REPO = Path(__file__).resolve().parent.parent
SWEEP_POOL = "sweeps"
ZOMBIES = "ablate: crash flow runs whose machine died"


def ensure_pool(name: str, concurrency: int | None) -> None:
    """Create a `process` work pool if it does not exist, and set its concurrency limit."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
            client.update_work_pool(name, WorkPoolUpdate(concurrency_limit=concurrency))
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type="process", concurrency_limit=concurrency))


def ensure_zombie_automation() -> str:
    """The server-side automation that marks a flow run Crashed when its heartbeats stop (its machine or worker
    died), as Prefect documents for self-hosted servers: search flow runs have no sweep flow watching them, and a
    Crashed flow run frees its pool's concurrency slot. Flow runs beat every PREFECT_FLOWS_HEARTBEAT_FREQUENCY
    seconds (Prefect's default: 180); silence for ABLATE_ZOMBIE_SECONDS (default three beats, at least 540 s: a
    server restart shorter than that loses heartbeats without crashing anything) makes a zombie. Created or
    updated; a sentence for `say`."""
    import datetime as dt

    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    beat = PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() or 180
    silent = int(environment().zombie_seconds or max(3 * beat, 540))
    ended = {f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed")}
    wanted = Automation(
        name=ZOMBIES,
        description="flow runs (sweep, trial, search) that stopped beating: their process or machine is gone",
        trigger=EventTrigger(after={"prefect.flow-run.heartbeat"}, expect={"prefect.flow-run.heartbeat", *ended},
                             match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
                             for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1,
                             within=dt.timedelta(seconds=silent)),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message=f"no heartbeat for {silent} s: its machine or worker died")])
    try:
        existing = Automation.read(name=ZOMBIES)
    except ValueError:
        wanted.create()
        return f"automation {ZOMBIES!r}: flow runs silent for {silent} s are marked Crashed"
    existing.trigger, existing.actions, existing.description = wanted.trigger, wanted.actions, wanted.description
    existing.update()
    return f"automation {ZOMBIES!r} updated: flow runs silent for {silent} s are marked Crashed"


def ensure_host_queue(pool: str, queue: str) -> None:
    """The work queue of one host's trials in a pool (`ablate worker`), making the pool (no limit) if none exists
    yet; a pool `ablate deploy` made keeps its limit."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            try:
                client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            except ObjectAlreadyExists:  # another worker made it meanwhile
                pass
        try:
            client.create_work_queue(name=queue, work_pool_name=pool,
                                     description="one host's trials: a sweep sends a run here to avoid hosts that "
                                                 "failed it")
        except ObjectAlreadyExists:
            pass


def wait_for_api(timeout: float | None = None, say: Any = print) -> str:
    """Wait until the Prefect API at PREFECT_API_URL answers (a server that is still starting, as in docker
    compose); its URL. An AblateError saying what to do when none is set, or none answers within `timeout`
    seconds (default $ABLATE_DEPLOY_WAIT or 120)."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise AblateError("PREFECT_API_URL is not set: deployments go to a Prefect server. Start one (`prefect server "
                          "start`) and set PREFECT_API_URL=http://HOST:4200/api")
    timeout = environment().deploy_wait if timeout is None else timeout
    deadline, next_say = time.monotonic() + timeout, time.monotonic() + 5
    while True:
        with get_client(sync_client=True) as client:
            problem = client.api_healthcheck()
        if problem is None:
            return url
        if time.monotonic() >= deadline:
            raise AblateError(f"the Prefect API at {url} did not answer within {timeout:.0f} s "
                              f"({type(problem).__name__}: {str(problem).splitlines()[0][:200] if str(problem) else ''}). "
                              "Start the server (`prefect server start`, or the prefect-server service), or point "
                              "PREFECT_API_URL at it; ABLATE_DEPLOY_WAIT sets how long to wait")
        if time.monotonic() >= next_say:
            say(f"waiting for the Prefect API at {url} ...")
            next_say = time.monotonic() + 10
        time.sleep(1)


def _deploy(entrypoint: str, source: Path, say: Any, **kwargs: Any) -> str:
    """One deployment, with Prefect's own table and notices (printed for every deployment) kept out of the
    terminal: one line here instead, and Prefect's text in the error if it fails."""
    import contextlib
    import io

    captured = io.StringIO()
    name = f"{entrypoint.rsplit(':', 1)[1]}/{kwargs['name']}"
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            flow.from_source(source=str(source), entrypoint=entrypoint).deploy(print_next_steps=False, **kwargs)
    except Exception as exc:
        raise AblateError(f"deployment {name} could not be registered: {type(exc).__name__}: {exc}\n"
                          f"{captured.getvalue()[-2000:]}") from exc
    say(f"deployed {name} (work pool {kwargs['work_pool_name']})")
    return name


def deploy_all(sweeps_dir: Path = REPO / "sweeps", db_url: str | None = None, artifacts: str | None = None,
               slots: dict[str, int] | None = None, source: Path = REPO, pools: list[str] | tuple[str, ...] = (),
               say: Any = print) -> list[str]:
    """Register every deployment, one line each through `say`; returns their names ("sweep/smoke", "trial/cpu",
    ...). `pools`: hardware names beyond the sweep files' that get a work pool and a trial deployment (for
    `hardware` overrides)."""
    slots = slots or {}
    if db_url and sa.make_url(store.resolve_url(db_url)).password:
        raise AblateError("--db carries a password, which Prefect would keep in plain text in every deployment's "
                          "parameters: deploy without --db and give the workers ABLATE_DB_URL in their environment (as "
                          "docker-compose.yml does), or use the URL without its password plus PGPASSWORD or ~/.pgpass")
    found = sorted(sweeps_dir.glob("*.yaml"))
    if not found:  # e.g. run outside the checkout: --sweeps is read from the working directory
        where = sweeps_dir.resolve()
        raise AblateError(f"--sweeps {sweeps_dir}: {'no sweep files (*.yaml) in' if where.is_dir() else 'no folder'} "
                          f"{where}, so nothing would be registered (not even the trial deployments). Run `ablate "
                          f"deploy` in the checkout the workers share (its sweeps/ folder), or pass --sweeps PATH")
    specs = {p: load_spec(p) for p in found}
    wait_for_api()
    names = []
    ensure_pool(SWEEP_POOL, None)
    say(ensure_zombie_automation())
    shared = {"db_url": db_url} | ({"artifacts": artifacts} if artifacts else {})
    for hardware in sorted({s.budget.hardware for s in specs.values()} | set(pools)):
        ensure_pool(hardware, slots.get(hardware))  # None: no pool-wide cap; each worker runs one trial per GPU
        names.append(_deploy("flows/sweep.py:trial", source, say, name=hardware, work_pool_name=hardware,
                             parameters={"launch": LaunchOptions(**shared).for_trial_flow()}))
    for path, spec in specs.items():
        rel = path.resolve().relative_to(source.resolve()) if path.resolve().is_relative_to(source.resolve()) else path
        names.append(_deploy("flows/sweep.py:sweep", source, say, name=spec.name, work_pool_name=SWEEP_POOL,
                             parameters={"spec": str(rel), "use_deployments": True, **shared},
                             description=spec.description))
        if spec.search is not None:  # on the GPU pool: a search flow run is a worker training its trials where it runs
            names.append(_deploy("flows/search.py:search", source, say, name=spec.name,
                                 work_pool_name=spec.budget.hardware, parameters={"spec": str(rel), **shared},
                                 description=spec.description))
    return names
