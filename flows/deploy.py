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

from ablate import db
from ablate.errors import AblateError
from ablate.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
SWEEP_POOL = "sweeps"


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


def wait_for_api(timeout: float | None = None, say: Any = print) -> str:
    """Wait until the Prefect API at PREFECT_API_URL answers (a server that is still starting, as in docker
    compose); its URL. An AblateError saying what to do when none is set, or none answers within `timeout`
    seconds (default $ABLATE_DEPLOY_WAIT or 120)."""
    import os
    import time

    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise AblateError("PREFECT_API_URL is not set: deployments go to a Prefect server. Start one (`prefect server "
                          "start`) and set PREFECT_API_URL=http://HOST:4200/api")
    timeout = float(os.environ.get("ABLATE_DEPLOY_WAIT", "120")) if timeout is None else timeout
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


def deploy_all(sweeps_dir: Path = REPO / "sweeps", db_url: str | None = None, artifacts: str | None = None,
               slots: dict[str, int] | None = None, source: Path = REPO, pools: list[str] | tuple[str, ...] = ()
               ) -> list[str]:
    """Register every deployment; returns their names ("sweep/smoke", "trial/cpu", ...). `pools`: hardware names
    beyond the sweep files' that get a work pool and a trial deployment (for `hardware` overrides)."""
    slots = slots or {}
    if db_url and sa.make_url(db.resolve_url(db_url)).password:
        raise AblateError("--db carries a password, which Prefect would keep in plain text in every deployment's "
                          "parameters: deploy without --db and give the workers ABLATE_DB_URL in their environment (as "
                          "docker-compose.yml does), or use the URL without its password plus PGPASSWORD or ~/.pgpass")
    specs = {p: load_spec(p) for p in sorted(sweeps_dir.glob("*.yaml"))}
    wait_for_api()
    names = []
    ensure_pool(SWEEP_POOL, None)
    shared = {"db_url": db_url} | ({"artifacts": artifacts} if artifacts else {})
    for hardware in sorted({s.budget.hardware for s in specs.values()} | set(pools)):
        ensure_pool(hardware, slots.get(hardware))  # None: no pool-wide cap; each worker runs one trial per GPU
        trial_flow = flow.from_source(source=str(source), entrypoint="flows/sweep.py:trial")
        trial_flow.deploy(name=hardware, work_pool_name=hardware, parameters=shared, print_next_steps=False)
        names.append(f"trial/{hardware}")
    for path, spec in specs.items():
        sweep_flow = flow.from_source(source=str(source), entrypoint="flows/sweep.py:sweep")
        rel = path.resolve().relative_to(source.resolve()) if path.resolve().is_relative_to(source.resolve()) else path
        sweep_flow.deploy(name=spec.name, work_pool_name=SWEEP_POOL, print_next_steps=False,
                          parameters={"spec": str(rel), "use_deployments": True, **shared},
                          description=spec.description)
        names.append(f"sweep/{spec.name}")
        if spec.search is not None:  # on the GPU pool: a search flow run is a worker training its trials where it runs
            search_flow = flow.from_source(source=str(source), entrypoint="flows/search.py:search")
            search_flow.deploy(name=spec.name, work_pool_name=spec.budget.hardware, print_next_steps=False,
                               parameters={"spec": str(rel), **shared}, description=spec.description)
            names.append(f"search/{spec.name}")
    return names
