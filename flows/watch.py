"""`ablate sweep watch NAME`: follow a sweep to its end through the results DB and its sweep flow runs, riding
out Prefect API outages, and say how it ended by the exit code.

`prefect deployment run ... --watch` follows one flow run through the API: it exits 1 when the server restarts
(the sweep rides that out) and 1 for a cancelled sweep, so a script cannot tell "lost the watch" from "failed".
Here the sweep flow run is found by the labels it gives itself (flows/cancel.py `label_sweep_flow_run`), the
runs are read from the DB, and an unreachable API only means the DB is read alone until it answers again.
Without PREFECT_API_URL (a sweep run here, `ablate sweep run`) the DB alone says when nothing is owed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from ablate import runner, store
from ablate.runner import UNSETTLED as OWED  # statuses that are not an outcome yet
from ablate.config.errors import AblateError
from ablate.results.status import status_counts
from flows.cancel import DB_LABEL, SWEEP_LABEL

COMPLETED, FAILED, CANCELLED = 0, 1, 3  # exit codes
NEW_RUN_SECONDS = 60.0  # how long a watch that finds the sweep's last flow run ended with runs owed waits for a new one


class _Api:
    """The Prefect API as the watch sees it: the sweep's newest flow run, or None while unreachable (said once
    when it goes away and once when it is back)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say, self.away_since = say, None

    def newest(self, name: str, database: str) -> tuple[bool, Any]:
        """(reachable, the newest sweep flow run labelled with this sweep and database, or None)."""
        import httpx

        try:
            found = _newest_sweep_flow_run(name, database)
        except (httpx.TransportError, httpx.HTTPStatusError, OSError) as exc:
            if self.away_since is None:
                self.away_since = time.monotonic()
                self.say(f"the Prefect API went away ({type(exc).__name__}): following the results DB meanwhile")
            return False, None
        if self.away_since is not None:
            self.say(f"the Prefect API is back after {time.monotonic() - self.away_since:.0f} s")
            self.away_since = None
        return True, found


RENAMING = ("budget", "source", "holdout", "vocab_size", "gpus", "hardware", "set")  # sweep flow parameters that
# name the sweep after themselves (flows/sweep.py) unless `name` is given


def _newest_sweep_flow_run(name: str, database: str) -> Any:
    """The newest sweep flow run of this sweep: labelled with its name and database (the flow labels itself once it
    has registered the sweep), or a newer one of deployment sweep/NAME that has not labelled itself yet (a second
    `prefect deployment run` still Scheduled, or one that failed before registering) and whose parameters do not
    rename the sweep."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(f"sweep/{name}").id
        except ObjectNotFound:
            deployment = None
        for fr in client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["sweep"])),
                                        sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=200):
            if fr.labels.get(SWEEP_LABEL) == name and fr.labels.get(DB_LABEL) == database:
                return fr
            params, named = fr.parameters or {}, (fr.parameters or {}).get("name")
            ours = named == name if named else not any(params.get(k) for k in RENAMING)
            if SWEEP_LABEL not in fr.labels and deployment is not None and fr.deployment_id == deployment and ours:
                return fr
    return None


def _counts(engine: sa.Engine, name: str) -> dict[str, int]:
    try:
        return status_counts(engine, name)
    except AblateError:  # not registered yet: its sweep flow run has not started
        return {}


def _line(name: str, counts: dict[str, int], flow_run: Any) -> str:
    total = sum(counts.values())
    done = {s: n for s, n in counts.items() if s not in OWED}
    finished = ", ".join(f"{n} {s}" for s, n in sorted(done.items()))
    owed = ", ".join(f"{counts[s]} {s}" for s in OWED if counts.get(s))
    where = f"; flow run {flow_run.name}: {flow_run.state.name}" if flow_run is not None and flow_run.state else ""
    return (f"sweep {name}: {sum(done.values())}/{total} finished{' (' + finished + ')' if finished else ''}"
            f"{', ' + owed if owed else ''}{where}")


def watch_sweep(name: str, db: str | None, say: Callable[[str], None], poll_seconds: float = 5.0,
                start_seconds: float = 600.0, use_api: bool = True) -> int:
    """Follow sweep `name` until it ends; 0 completed, 1 failed (its failed runs' first errors said), 3 cancelled.
    Waits up to `start_seconds` for the sweep to be registered (a deployment run that has not started yet)."""
    engine = store.reader(db)
    database = store.database_id(engine)
    api = _Api(say) if use_api else None
    started, seen_live, last = time.monotonic(), False, None
    while True:
        counts = _counts(engine, name)
        reachable, flow_run = api.newest(name, database) if api else (False, None)
        state = flow_run.state if flow_run is not None else None
        line = _line(name, counts, flow_run)
        if line != last:
            say(line)
            last = line
        live = state is not None and not state.is_final()
        seen_live = seen_live or live or (not use_api and any(counts.get(s) for s in OWED))
        if state is not None and state.is_final() and (
                seen_live or not _starting(counts) or time.monotonic() - started > NEW_RUN_SECONDS):
            return _outcome(engine, name, counts, state, say)
        if not reachable and counts and not any(counts.get(s) for s in OWED) and (seen_live or not use_api):
            return _outcome(engine, name, counts, None, say)  # no API to ask: the DB says nothing is owed
        if not counts and time.monotonic() - started > start_seconds:
            raise AblateError(f"sweep {name} was not registered within {start_seconds:.0f} s: is the name right "
                              "(`ablate sweep status` lists none), and did its flow run start (a sweeps worker)?")
        time.sleep(poll_seconds)


def _starting(counts: dict[str, int]) -> bool:
    """Whether a new sweep flow run may be about to start (waited for NEW_RUN_SECONDS): runs are still owed while
    the newest one has ended."""
    return any(counts.get(s) for s in ("pending", "preempted"))


def _outcome(engine: sa.Engine, name: str, counts: dict[str, int], state: Any, say: Callable[[str], None]) -> int:
    """The exit code, with the failed runs' first errors and the runs still owed said: a sweep whose flow run
    ended Completed with a run untrained (runner.owed) exits 1, never 0."""
    with engine.connect() as conn:
        failed = conn.execute(sa.select(store.Run.id, store.Run.error).where(
            store.Run.sweep_id == runner.sweep_id(engine, name), store.Run.status == "failed")
            .order_by(store.Run.id).limit(10)).all()
    for run in failed:
        first = ((run.error or "").strip().splitlines() or ["no error recorded"])[0][:300]
        say(f"run {run.id} failed: {first}")
    if counts.get("failed", 0) > len(failed):
        say(f"... and {counts['failed'] - len(failed)} more failed runs: `ablate sweep status {name}` lists them")
    owed = _owed(engine, name)
    if owed:
        listed = ", ".join(f"run {r.id} ({r.status})" for r in owed[:10]) + (", ..." if len(owed) > 10 else "")
        say(f"{len(owed)} run(s) still owed, never trained: {listed}")
    if state is not None and state.message:
        say(f"the sweep flow run ended {state.name}: {state.message.splitlines()[0][:500]}")
    if state is not None:
        if state.is_completed():
            return FAILED if owed else COMPLETED
        if state.is_cancelled():
            return CANCELLED
        return FAILED
    if failed or owed:
        return FAILED
    return CANCELLED if counts.get("cancelled") else COMPLETED


def _owed(engine: sa.Engine, name: str) -> list[Any]:
    """The sweep's runs that still need a trainer (runner.owed), by id."""
    with store.session_factory(engine)() as session:
        rows = session.scalars(sa.select(store.Run).where(
            store.Run.sweep_id == runner.sweep_id(engine, name), store.Run.status.in_(OWED)).order_by(store.Run.id))
        return [r for r in rows if runner.owed(r)]
