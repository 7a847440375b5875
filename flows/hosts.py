"""Which host a trial ran on, and where a run goes when hosts fail it.

A trial flow that fails says its host in its message (`[host NAME] ...`, `tagged`); `ablate worker` names its
Prefect workers `HOST-POOL-GPUS-PID` and polls its host's queue (`runner.host_queue`) beside the pool's default
one. So the sweep flow knows which hosts failed a run, which hosts have a live worker, and can send the run again
to the queue of a host that has not failed it (`redispatch_host`), instead of to the default queue, where the host
that failed it, idle again at once, would take it first; and a run that waits on the queue of a host that has
stopped beating since is sent to the default queue instead (`host_gone`).
"""

from __future__ import annotations

import re
from typing import Any

from ablate import runner, store

_TAG = re.compile(r"\[host ([^\]]{1,100})\]")


def tagged(message: str) -> str:
    """A trial's error as its flow run says it: this host's name first."""
    return f"[host {runner.worker_host()}] {message}"


def host_of(message: str | None) -> str | None:
    """The host a trial flow run's message names (None: it failed before it could say, e.g. a crash)."""
    found = _TAG.search(message or "")
    return found.group(1) if found else None


def first_error(state: Any) -> str:
    """A final trial flow run state's reason in one line, without Prefect's preamble."""
    message = (state.message or state.name or "").strip()
    message = re.sub(r"^Flow run encountered an exception:\s*(TrialFailed:\s*)?", "", message)
    return (message.splitlines() or [state.name])[0][:300]


def live_hosts(client: Any, pool: str) -> list[str]:
    """The hosts with a live `ablate worker` in the pool (read from their workers' names), in a stable order. Live by
    ablate's rule, not Prefect's ONLINE flag alone (which holds for three missed beats: a worker stopped 87 s before
    was still listed): a beat within 1.5 of the worker's own heartbeat interval, plus 2 s."""
    name = _worker_name(pool)
    hosts = {m.group(1) for w in client.read_workers_for_work_pool(pool)
             if _beating(w) and (m := name.match(w.name))}
    return sorted(hosts)


def host_gone(client: Any, pool: str, host: str, since: Any) -> float | None:
    """For a run sent to `host`'s queue at `since` (UTC) and not taken yet: how long it has waited, once that host
    has shown no heartbeat for longer than one beat's bound, counted from the later of `since` and its last beat
    (its worker stopped or its machine froze, whatever Prefect still lists: a host that beat once more after the run
    was sent, then stopped, is as gone); None while the host may still take it."""
    import datetime as dt

    name = _worker_name(pool)
    workers = [w for w in client.read_workers_for_work_pool(pool) if (m := name.match(w.name)) and m.group(1) == host]
    now = dt.datetime.now(dt.timezone.utc)
    quiet_since = max([since, *(w.last_heartbeat_time for w in workers if w.last_heartbeat_time is not None)])
    bound = max((_beat_bound(w) for w in workers), default=_beat_bound(None))
    return (now - since).total_seconds() if (now - quiet_since).total_seconds() > bound else None


def _worker_name(pool: str) -> re.Pattern[str]:
    """`ablate worker`'s Prefect worker names in `pool`: HOST-POOL-GPUS-PID (group 1: the host)."""
    return re.compile(rf"^(.+)-{re.escape(pool)}-[^-]+-\d+$")


def _beat_bound(worker: Any) -> float:
    """How long a live worker may go without a beat: 1.5 of its heartbeat interval (Prefect's default 30 s) + 2 s
    (47 s; Prefect lists a worker ONLINE until three intervals have passed)."""
    interval = (worker.heartbeat_interval_seconds if worker is not None else None) or 30
    return 1.5 * interval + 2.0


def _beating(worker: Any) -> bool:
    import datetime as dt

    from prefect.client.schemas.objects import WorkerStatus

    if worker.status != WorkerStatus.ONLINE or worker.last_heartbeat_time is None:
        return False
    return (dt.datetime.now(dt.timezone.utc) - worker.last_heartbeat_time).total_seconds() <= _beat_bound(worker)


def redispatch_host(client: Any, pool: str, rids: list[int], row: store.Run, state: Any,
                    failures: dict[int, list[str]], log: Any) -> str | None:
    """Runs owed after their trial flow run ended (`state`; one run, or a fused group's members, `row` the first's)
    go again: to the queue of a live host that has not failed them when they failed on some (`failures`: each run's
    failures so far, `[host NAME] error`, this one added): that host's name; else None (the pool's default queue).
    Said in the sweep's log: why, on which host, their checkpoint."""
    why = first_error(state)
    if state.is_failed() or state.is_crashed():
        for rid in rids:
            failures.setdefault(rid, []).append(why)
    bad = {host_of(m) for rid in rids for m in failures.get(rid, [])} - {None}
    others = [h for h in live_hosts(client, pool) if h not in bad] if bad else []
    target = others[rids[0] % len(others)] if others else None
    checkpoint = (f"it resumes from its checkpoint (step {row.last_step})" if row.checkpoint_path
                  else "it has no checkpoint: it starts from the beginning")
    where = (f"to host {target}, which has not failed it" if target else
             "to any worker (every live host has failed it)" if bad else "to any worker")
    runs = (f"run {rids[0]} is owed ({row.status}) after its" if len(rids) == 1 else
            f"runs {', '.join(map(str, rids))} (a fused group) are owed ({row.status}) after their")
    log.warning("%s trial flow run ended %s (%s): dispatched again %s; %s", runs, state.name, why, where, checkpoint)
    return target


def owed_report(owed: dict[int, str], failures: dict[int, list[str]], dispatches: dict[int, int]) -> str:
    """Each owed run (run id -> its status): how often it went out, the hosts that failed it and their first
    errors."""
    parts = []
    for rid, status in owed.items():
        by_host: dict[str, tuple[int, str]] = {}
        for message in failures.get(rid, []):
            host = host_of(message) or "a host that did not say"
            count, first = by_host.get(host, (0, _TAG.sub("", message).strip()))
            by_host[host] = (count + 1, first)
        said = "; ".join(f"failed {n}x on {host}: {first}" for host, (n, first) in by_host.items())
        sent = f"dispatched {dispatches[rid]}x" if dispatches.get(rid) else "never started"
        parts.append(f"run {rid} ({status}, {sent}{'; ' + said if said else ''})")
    return "; ".join(parts)
