"""Cancelling a sweep on a cluster, from either side: its trial flow runs and its runs in the results DB.

- `ablate sweep cancel` (any host) marks runs `cancelled`; the sweep flow's watch (flows/dispatch.py) then
  cancels their trial flow runs (`cancel_flow_run`);
- the sweep flow run cancelled in Prefect: `cancel_trials` from the watch as the process is stopped, and
  `cancel_sweep_of`, the flow's `on_cancellation` hook, which Prefect runs in the worker after killing the process
  (it finds the sweep by the labels `label_sweep_flow_run` gave the flow run);
- after a server restart long enough that Prefect's cancellation observer gave up, the sweep flow finds itself
  Cancelling every CANCEL_CHECK_SECONDS and does it (`stop_if_cancelled`); `end_cancelled` ends a sweep flow whose
  runs were cancelled as a cancelled flow run does.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from ablate import runner, store
from ablate.config.errors import AblateError

CANCEL_CHECK_SECONDS = 5.0  # how often the sweep flow asks whether it is being cancelled (see stop_if_cancelled)
CANCEL_SEEN = False  # this flow run found itself Cancelling without Prefect having stopped it


def cancel_flow_run(client: Any, flow_run_id: Any, state: Any) -> None:
    """Cancel a trial flow run: a running one through Cancelling (its worker stops the process), else at once."""
    from prefect.states import Cancelled, Cancelling

    if state.is_final():
        return
    new = Cancelling() if state.is_running() else Cancelled(message="its sweep or run was cancelled")
    client.set_flow_run_state(flow_run_id, new, force=True)


def cancelling(client: Any) -> bool:
    """Whether this (sweep) flow run is being cancelled in Prefect; an unreachable API raises (for ride_out)."""
    from prefect.runtime import flow_run

    state = client.read_flow_run(flow_run.id).state
    return state is not None and (state.is_cancelling() or state.is_cancelled())


def cancelled_in_prefect(client: Any) -> bool:
    """`_cancelling`, False where there is no API to ask (on the way out: do not guess that the user cancelled)."""
    try:
        return cancelling(client)
    except Exception:  # noqa: BLE001
        return False


def stop_if_cancelled(client: Any, engine: sa.Engine, live: dict[int, Any], log: Any) -> None:
    """Cancel the trials of a sweep flow run that is being cancelled in Prefect but still runs: the process
    worker's cancellation observer gives up for good after about 30 s without an API (its poller's third failed
    look), so after a longer server restart Prefect would never stop this process nor reach the trainers."""
    global CANCEL_SEEN
    if CANCEL_SEEN or not cancelling(client):
        return
    log.warning("this sweep flow run is being cancelled in Prefect and was not stopped: cancelling its trials here")
    cancel_trials(client, engine, live, log)
    CANCEL_SEEN = True


def end_cancelled(message: str, wait_seconds: float = 120.0) -> None:
    """A deployment's sweep flow whose runs were cancelled (`ablate sweep cancel`) ends as a cancelled flow run does:
    it asks Prefect to cancel it and waits to be stopped, so the worker logs a cancellation, not the error and
    traceback that a flow returning a Cancelled state gets on a worker. Returns (to end Cancelled by returning the
    state) where there is no deployment (`ablate sweep run`) or nothing stopped it within `wait_seconds`."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import deployment, flow_run
    from prefect.states import Cancelling

    if deployment.id is None:
        return
    if CANCEL_SEEN:  # cancelled in Prefect, and nothing stopped this process then: nothing will now
        wait_seconds = min(wait_seconds, 10.0)
    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run.id, Cancelling(message=message), force=True)
    except Exception:  # noqa: BLE001 - no API to ask: end by returning the state
        return
    time.sleep(wait_seconds)


SWEEP_LABEL, DB_LABEL = "ablate.sweep", "ablate.database"


def label_sweep_flow_run(engine: sa.Engine, name: str) -> None:
    """Label this sweep flow run with its sweep and database, for `cancel_sweep_of` (run by the worker)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    with get_client(sync_client=True) as client:
        client.update_flow_run_labels(flow_run.id, {SWEEP_LABEL: name, DB_LABEL: store.database_id(engine)})


def cancel_sweep_of(flow_run_id: Any) -> str | None:
    """The sweep flow's `on_cancellation` hook (in the worker, after it killed the flow's process, or in that
    process): every owed run of the labelled sweep becomes `cancelled`, as `ablate sweep cancel` does (trainers
    stop at their next heartbeat), and the flow run's trial flow runs still waiting or running are cancelled.
    What it did, or None for a flow run that registered no sweep."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterParentFlowRunId, FlowRunFilterState,
                                                FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)  # fresh: the labels came after the run started
        name, database = flow_run.labels.get(SWEEP_LABEL), flow_run.labels.get(DB_LABEL)
        if not name:
            return None
        engine = store.connect(flow_run.parameters.get("db_url"))
        if store.database_id(engine) != database:
            raise AblateError(f"sweep {name!r}: the database at {engine.url!r} is not the one this flow run "
                              f"registered it in ({database}); cancel it there with `ablate sweep cancel {name}`")
        waiting, stopping, _ = runner.cancel(engine, name, wait=0)
        waiting_trials = FlowRunFilter(  # its trial flow runs not ended nor being cancelled, 200 at a time
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run.id]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(not_any_=[
                StateType.COMPLETED, StateType.FAILED, StateType.CANCELLED, StateType.CRASHED, StateType.CANCELLING])))
        seen: set[Any] = set()
        while batch := [fr for fr in client.read_flow_runs(flow_run_filter=waiting_trials, limit=200)
                        if fr.id not in seen]:
            for trial in batch:
                cancel_flow_run(client, trial.id, trial.state)
                seen.add(trial.id)
    return (f"sweep {name} cancelled: {waiting} waiting and {stopping} running runs marked cancelled (trainers "
            f"stop at their next heartbeat), {len(seen)} trial flow runs cancelled")


def cancel_trials(client: Any, engine: sa.Engine, live: dict[int, Any], log: Any) -> None:
    """The sweep flow run was cancelled: its runs become `cancelled` (trainers on any host checkpoint and stop
    within a heartbeat) and its trial flow runs are cancelled."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with engine.begin() as conn:
        conn.execute(sa.update(store.Run).where(store.Run.id.in_(list(live)), store.Run.status.in_(
            ("pending", "preempted", "failed", "running"))).values(status="cancelled"))
    if live:
        for fr in client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(live.values()))),
                                        limit=len(live)):
            if fr.state is not None:
                cancel_flow_run(client, fr.id, fr.state)
    log.warning("sweep cancelled: %d trial flow runs cancelled, their runs marked cancelled", len(live))
