"""The sweep flow on a cluster: each owed run becomes a flow run of deployment `trial/<hardware>`, and this
module watches them until every run has an outcome.

What a cluster does to trials, and what happens here (every ABLATE_DISPATCH_POLL_SECONDS):
- a pool with no live worker: a warning in the sweep's log within seconds (and every minute while trials wait);
- a machine that dies mid-trial: its trial flow run stays Running in Prefect, holding a pool slot, while the
  run's heartbeat (`runs.heartbeat_at`, beaten by the trainer) goes stale. The flow run is set Crashed, which
  frees the slot, and the run is dispatched again: any worker resumes it from its last checkpoint (shared
  artifacts); a worker stopped while it was starting a trial (a drain, a kill) leaves its flow run Pending for
  ever: Crashed and dispatched again the same way once it has not claimed its run within the stale limit;
- a trial flow run that ended while its run is still owed (a worker stopped: `preempted`; a host that failed it
  before claiming it: no results DB, a missing driver): dispatched again, up to MAX_DISPATCHES times, to a live
  host that has not failed it (flows/hosts.py); a run still owed after that fails the sweep (flows/sweep.py). A host
  that fails after claiming the run gives the claim back (runner.run_trial); a row still claimed when its trial flow
  run has ended is never taken as trained: it is watched until it has an outcome or its claim goes stale;
- a run sent to a host's own queue while that host then stops beating: sent to the pool's default queue once the
  host has shown no heartbeat for longer than its bound, since the run was sent or since its last beat if later
  (flows/hosts.py `host_gone`);
- a run cancelled in the DB (`ablate sweep cancel`, any host): its trial flow run is cancelled too;
- this sweep flow run cancelled in Prefect: its trial flow runs are cancelled and their runs marked
  `cancelled` (their trainers checkpoint and stop within a heartbeat), by this process as it is stopped and
  again by the sweep flow's `on_cancellation` hook, which Prefect runs in the worker after it has killed
  this process (so a flow process that was stuck, or killed before it could, cancels its sweep all the same:
  the flow run carries the sweep's name and database as labels); after a server restart long enough that
  Prefect's cancellation observer gave up, this process finds itself Cancelling and does it (all of it in
  flows/cancel.py);
- the Prefect API unreachable (a server restart): every call is retried with backoff for up to
  ABLATE_API_OUTAGE_SECONDS while the trainers go on (the log says when it went away and when it is back, or, when
  Prefect's own client retries hid it, that a call answered only after SLOW_CALL_SECONDS; either way the pool's
  workers are checked again only WORKER_CHECK_SECONDS later, once they have beaten); a trial flow run whose
  process ended meanwhile stays Running in Prefect, so a run whose row has its outcome is taken from the row (its
  flow run marked Crashed once that is older than the stale limit, freeing the slot);
- a fused group (`fuse:`, ablate/runner/groups.py): one trial flow run trains its runs in one trainer on one
  worker; a member that ends early leaves the group, a member cancelled is stopped alone (the flow run is cancelled
  once none trains), and the members owed when the flow run ends or dies go out again as one group;
- a sweep flow run started again (its first one died anyway): runs still training under the first one's
  trial flow runs are watched through those (found by their tag), not dispatched twice.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa

from ablate import runner, store
from ablate.config.errors import AblateError
from ablate.config.units import HARDWARE_PROFILES
from ablate.config.settings import environment
from flows.cancel import (CANCEL_CHECK_SECONDS, cancel_flow_run, cancel_trials, cancelled_in_prefect,
                          stop_if_cancelled)
from flows.hosts import first_error, host_gone, redispatch_host

WORKER_CHECK_SECONDS = 60.0  # how often a sweep whose trials wait re-checks that their pool has a live worker
API_BACK_AT = float("-inf")  # when the Prefect API last came back after an outage (time.monotonic)
SLOW_CALL_SECONDS = 15.0  # a call that took longer rode out an outage inside Prefect's own client retries (2+4+8 s)
MAX_DISPATCHES = 5  # flow runs per run within one sweep flow run (each resumes the last one's checkpoint)


class Dispatched:
    """What a sweep flow run did with its runs on a pool: each run's final status (`results`), how often each went
    out (`dispatches`) and the first error of each trial flow run that failed it (`failures`, host first)."""

    def __init__(self) -> None:
        self.results: dict[int, str] = {}
        self.dispatches: Counter[int] = Counter()
        self.failures: dict[int, list[str]] = {}
        self.steered: dict[int, tuple[str, dt.datetime]] = {}  # run id -> the host whose queue it went to, and when


def dispatch_to_pool(hardware: str, todo: list[int], opts: runner.LaunchOptions, engine: sa.Engine,
                     log: Any, attach: list[int] = (), fuse: str = "off") -> Dispatched:
    """Run each of `todo` as a flow run of `trial/<hardware>` (with `opts` as its parameters) and watch them, and
    `attach` (runs another sweep flow run dispatched, still training) through their trial flow runs. A run
    dispatched again after a host failed it goes to another live host (flows/hosts.py). Under `fuse`, each fused
    group (ablate/runner/groups.py) is one trial flow run, on one worker; its members owed when it ends go again
    as one group."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.runtime import flow_run as this_flow_run

    live: dict[int, Any] = {}  # run id -> its current trial flow run id (None: none known, the row says)
    done = Dispatched()
    dispatches = done.dispatches
    database = store.database_id(engine)  # a trial's host must find this very database (runner.cluster_db_url)
    # a run dispatched again (its machine died, its worker stopped) is scheduled before every trial of the sweep
    # still waiting: workers take flow runs in order of scheduled time, so it does not queue behind the whole sweep
    first_dispatch = dt.datetime.now(dt.timezone.utc)

    tag = run_tag(engine)

    def submit(ids: list[int], host: str | None = None) -> None:
        """One trial flow run for the runs `ids` (one, or a fused group): on the queue of `host` (a host that has
        not failed them), else the pool's."""
        first = ids[0]
        again = {"scheduled_time": first_dispatch - dt.timedelta(seconds=1)} if dispatches[first] else {}
        # the same key for a retried request: a creation whose answer was lost in an outage is not made twice
        key = f"{this_flow_run.id}:{','.join(map(str, ids))}:{dispatches[first]}"
        queue = runner.host_queue(host) if host else None
        group = {"run_ids": ids} if len(ids) > 1 else {}  # a solo trial's parameters are what older workers take
        flow_run = ride_out(lambda: run_deployment(
            f"trial/{hardware}", parameters={"run_id": first, **group, "launch": opts.for_trial_flow(),
                                             "database": database},
            timeout=0, as_subflow=True, tags=[tag(rid) for rid in ids], idempotency_key=key, work_queue_name=queue,
            **again), log, f"dispatching {'run' if len(ids) == 1 else 'runs'} {','.join(map(str, ids))}")
        for rid in ids:
            live[rid] = flow_run.id
            dispatches[rid] += 1
            if host:
                done.steered[rid] = (host, dt.datetime.now(dt.timezone.utc))
            else:
                done.steered.pop(rid, None)

    with get_client(sync_client=True) as client:
        ride_out(lambda: check_workers(client, hardware, log), log, "checking the pool's workers")
        for ids in runner.plan_groups(engine, todo, fuse, pool_gpus(hardware)):
            submit(ids)
        if attach:
            found = ride_out(lambda: _trial_flow_runs(client, [tag(rid) for rid in attach]), log, "finding trials")
            for rid in attach:
                live[rid] = found.get(tag(rid))
                dispatches[rid] += 1
            log.info("%d runs still training under an earlier sweep flow run: watched, not dispatched again",
                     len(attach))
        next_worker_check = time.monotonic() + WORKER_CHECK_SECONDS
        next_cancel_check = time.monotonic() + CANCEL_CHECK_SECONDS
        try:
            while live:
                time.sleep(environment().dispatch_poll_seconds)
                if time.monotonic() >= next_cancel_check:
                    next_cancel_check = time.monotonic() + CANCEL_CHECK_SECONDS
                    ride_out(lambda: stop_if_cancelled(client, engine, live, log), log, "looking for a cancel")
                waiting = ride_out(lambda: _watch_once(client, engine, live, done, submit, hardware, log), log,
                                   "watching the trials")
                # workers beat again only some seconds after the API is back: none looks live until then
                if waiting and time.monotonic() >= max(next_worker_check, API_BACK_AT + WORKER_CHECK_SECONDS):
                    ride_out(lambda: check_workers(client, hardware, log), log, "checking the pool's workers")
                    next_worker_check = time.monotonic() + WORKER_CHECK_SECONDS
        except BaseException:
            if cancelled_in_prefect(client):
                cancel_trials(client, engine, live, log)
            raise
    return done


def _watch_once(client: Any, engine: sa.Engine, live: dict[int, Any], done: Dispatched, submit: Any, pool: str,
                log: Any) -> int:
    """One look at every trial flow run still live and its runs' rows; returns how many runs wait for a worker."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    known = list({fid for fid in live.values() if fid is not None})
    flows = {fr.id: fr for fr in client.read_flow_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=known)), limit=len(known))} if known else {}
    with store.session_factory(engine)() as session:
        rows = {r.id: r for r in session.scalars(sa.select(store.Run).where(store.Run.id.in_(list(live))))}
    by_flow: dict[Any, dict[int, store.Run]] = {}  # a fused group's runs share their trial flow run
    for rid, fid in list(live.items()):
        row = rows.get(rid)
        if row is None:  # deleted meanwhile (an edit of the spec dropped it): nothing is owed
            del live[rid]
        elif fid is not None:
            by_flow.setdefault(fid, {})[rid] = row
        elif row.status not in runner.UNSETTLED:  # no flow run known (attached): the row is the truth
            done.results[rid] = row.status
            del live[rid]
        elif runner.owed(row):  # attached, and its trainer is gone
            submit([rid])
    return sum(_watch_flow_run(client, fid, flows[fid].state if fid in flows else None, members, live, done, submit,
                               pool, log) for fid, members in by_flow.items())


def _watch_flow_run(client: Any, fid: Any, state: Any, members: dict[int, store.Run], live: dict[int, Any],
                    done: Dispatched, submit: Any, pool: str, log: Any) -> int:
    """One look at a trial flow run (`state`, None when Prefect did not list it) and the rows of its runs (one, or a
    fused group's: a member that ends early leaves the group training); how many of them wait for a worker."""
    from prefect.states import Cancelled, Crashed

    def settle(rids: Any) -> None:
        for rid in rids:
            done.results[rid] = members[rid].status
            del live[rid]

    unsettled = [rid for rid, row in members.items() if row.status in runner.UNSETTLED]
    if not unsettled and (state is None or not state.is_final()) and all(
            _settled_long_ago(row, fid) for row in members.values()):
        # the rows have the outcome but the trial flow run never said so (its process ended while the API was
        # away, or there is none): the rows are the truth; a flow run still Running is marked Crashed
        if state is not None:
            ended = ", ".join(f"run {rid} {row.status}" for rid, row in members.items())
            client.set_flow_run_state(fid, Crashed(message=f"{ended} (in the results DB) while its flow run could "
                                                           "not report it"), force=True)
        settle(list(members))
        return 0
    if state is None:
        return 0
    if not unsettled and not state.is_final():
        if any(row.status == "cancelled" for row in members.values()):  # a member of a group training on is
            cancel_flow_run(client, fid, state)  # stopped by its trainer alone, at its heartbeat
    elif state.is_final():
        # a row still claimed after its flow run ended: by a trainer that is ending, by another process that took
        # the run, or by a flow process that died between its claim and its trainer's start. Never taken as
        # trained: watched until the row has an outcome or its heartbeat goes stale (owed)
        ended = [rid for rid, row in members.items() if not (row.status == "running" and store.is_live(row))]
        owed = [rid for rid in ended if runner.owed(members[rid])]
        again = [rid for rid in owed if done.dispatches[rid] < MAX_DISPATCHES] if not runner.STOP.is_set() else []
        if again:
            submit(again, redispatch_host(client, pool, again, members[again[0]], state, done.failures, log))
        if set(owed) - set(again) and (state.is_failed() or state.is_crashed()):  # the last error, for the end
            for rid in set(owed) - set(again):
                done.failures.setdefault(rid, []).append(first_error(state))
        settle(rid for rid in ended if rid not in again)
    elif (state.is_running() or state.is_pending()) and all(_dead(members[rid], state) for rid in unsettled):
        # Pending too: a worker stopped (a drain, a kill) while it was starting the flow run leaves it Pending
        # for ever, and no worker takes a Pending flow run
        row = members[unsettled[0]]
        beat = f"{(store.utcnow() - row.heartbeat_at).total_seconds():.0f} s ago" if row.heartbeat_at else "never"
        runs = _runs(unsettled)
        log.warning("%s: its trainer on %s last beat %s, its trial flow run %s since %s (the machine or its "
                    "worker died): that flow run is marked Crashed, freeing the pool slot, and %s dispatched again; "
                    "it resumes from its last checkpoint on any worker", runs, row.host or "an unknown host", beat,
                    state.name, _clock(state.timestamp), "it is" if len(unsettled) == 1 else "they are")
        client.set_flow_run_state(fid, Crashed(message=f"{runs}: trainer heartbeat stale ({beat}); "
                                                       "re-dispatched by the sweep flow"), force=True)
        settle(rid for rid in members if rid not in unsettled)
        submit(unsettled)
    elif state.is_scheduled() and unsettled[0] in done.steered and (
            waited := host_gone(client, pool, *done.steered[unsettled[0]])) is not None:
        # sent to a host that has stopped since (Prefect may list it online for three missed beats): not left
        # waiting for it while other hosts idle
        host, runs = done.steered[unsettled[0]][0], _runs(unsettled)
        log.warning("%s waited %.0f s on the queue of host %s, which went quiet (no heartbeat within its bound since "
                    "it was sent or since its last beat: its worker stopped or its machine froze): sent to any worker "
                    "instead", runs, waited, host)
        client.set_flow_run_state(fid, Cancelled(message=f"host {host} went quiet (no heartbeat within its bound): "
                                                         f"{runs}, {waited:.0f} s on its queue, sent to any worker"),
                                  force=True)
        settle(rid for rid in members if rid not in unsettled)
        submit(unsettled)
    elif state.is_scheduled() or state.is_pending():
        return len(unsettled)
    return 0


def _runs(rids: list[int]) -> str:
    return f"run {rids[0]}" if len(rids) == 1 else f"runs {', '.join(map(str, rids))}"


def pool_gpus(hardware: str) -> int:
    """The GPUs `fuse: auto` counts on a worker of pool `hardware`: one for a GPU profile's pool, none for `cpu` or a
    pool named by no profile (auto fuses nothing there; `seeds` and `shapes` fuse on any pool)."""
    profile = HARDWARE_PROFILES.get(hardware)
    return 0 if profile is None or profile.device == "cpu" else 1


def _settled_long_ago(row: store.Run, fid: Any) -> bool:
    """Whether an outcome in the row is old enough to be taken over a flow run that has not caught up (at once
    when there is no flow run to wait for)."""
    if fid is None or row.finished_at is None:
        return fid is None
    return (store.utcnow() - row.finished_at).total_seconds() > store.stale_seconds()


def run_tag(engine: sa.Engine) -> Any:
    """The tag of a run's trial flow runs (database and run id): a later sweep flow run finds them by it."""
    database = store.database_id(engine)[:12]
    return lambda rid: f"ablate-run:{database}:{rid}"


def _trial_flow_runs(client: Any, tags: list[str]) -> dict[str, Any]:
    """{tag: id of its newest non-final trial flow run} for the given run tags."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    found: dict[str, Any] = {}
    for fr in client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(any_=tags)),
                                    sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=10 * len(tags) + 10):
        if fr.state is None or fr.state.is_final():
            continue
        for t in fr.tags:
            if t in tags and t not in found:
                found[t] = fr.id
    return found


def ride_out(call: Any, log: Any, what: str) -> Any:
    """`call()`, retried with backoff (2 s doubling to 30 s) while the Prefect API is unreachable or answers
    5xx (a server restart), for up to ABLATE_API_OUTAGE_SECONDS; any other error at once."""
    import httpx

    global API_BACK_AT
    start = time.monotonic()
    deadline = start + environment().api_outage_seconds  # a Prefect server restart ridden out
    wait = 2.0
    while True:
        try:
            result = call()
        except (httpx.TransportError, httpx.HTTPStatusError) as exc:
            status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
            if (status is not None and status < 500) or time.monotonic() + wait > deadline:
                raise
            reason = f"HTTP {status}" if status else type(exc).__name__
            log.warning("the Prefect API is unreachable (%s): %s again in %.0f s; the trainers go on meanwhile",
                        reason, what, wait)
            time.sleep(wait)
            wait = min(wait * 2, 30.0)
            continue
        took = time.monotonic() - start
        if wait > 2.0:  # it was away
            API_BACK_AT = time.monotonic()
            log.info("the Prefect API is back after %.0f s: %s went through", took, what)
        elif took > SLOW_CALL_SECONDS:  # away too, but Prefect's client retried (up to 5 times, about a minute)
            API_BACK_AT = time.monotonic()
            log.warning("the Prefect API answered only after %.0f s (a server restart that Prefect's own retries "
                        "waited out, or an overloaded server): %s went through", took, what)
        return result


def _clock(at: dt.datetime | None) -> str:
    return "?" if at is None else at.astimezone(dt.timezone.utc).strftime("%H:%M:%S UTC")


def _dead(row: store.Run, state: Any) -> bool:
    """Whether a Running (or Pending) trial flow run's trainer is gone: its run is `running` with a stale heartbeat
    (or its processes are gone from this host), or it never claimed its run within the stale limit. A row whose last beat
    is older than this flow run is still the trainer's before it (a run dispatched again after a machine died): the
    new one has not claimed it yet, so it is not judged by that trainer's death (which would dispatch it again)."""
    since = None if state.timestamp is None else state.timestamp.astimezone(dt.timezone.utc).replace(tzinfo=None)
    claimed = row.status == "running" and (since is None or (row.heartbeat_at is not None and row.heartbeat_at >= since))
    if claimed:
        return not store.is_live(row)
    if row.status in ("pending", "preempted", "running") and since is not None:
        return (store.utcnow() - since).total_seconds() > store.stale_seconds()
    return False


def check_deployment(hardware: str, takes: Collection[str]) -> None:
    """The trial deployment of the sweep's hardware exists and its stored parameters are ones the trial flow
    `takes`, or one message says how to make it (checked before the sweep registers or dispatches anything)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            stored = client.read_deployment_by_name(f"trial/{hardware}").parameters or {}
    except ObjectNotFound:
        raise AblateError(f"no deployment trial/{hardware}: this sweep's hardware {hardware!r} (an override?) has no work "
                          f"pool here; run `ablate deploy --pool {hardware}` and start workers for that pool") from None
    unknown = sorted(set(stored) - set(takes))
    if unknown:  # every trial it ran would fail on them: say it once, here
        raise AblateError(f"deployment trial/{hardware} was registered by an older ablate: its parameters "
                          f"{', '.join(unknown)} are not the trial flow's; run `ablate deploy` again")


def check_workers(client: Any, pool: str, log: Any) -> bool:
    """Whether the work pool has a live worker; a warning in the sweep's log when it has none."""
    from prefect.client.schemas.objects import WorkerStatus
    from prefect.exceptions import ObjectNotFound

    try:
        workers = client.read_workers_for_work_pool(pool)
    except ObjectNotFound:
        log.warning("there is no work pool %r: register it with `ablate deploy`", pool)
        return False
    if any(w.status == WorkerStatus.ONLINE for w in workers):
        return True
    log.warning("work pool %r has no live worker: this sweep's trials wait until one starts. Start one on a machine "
                "of that class (`ablate worker --pool %s`; docker-compose.yml: the gpu-worker or cpu-worker service)",
                pool, pool)
    return False
