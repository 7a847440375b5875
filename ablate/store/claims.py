"""Run rows while they train: claims (exactly one trainer per run), heartbeats and liveness, column updates,
and metric points (with the latest ones mirrored on the run row)."""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from ablate.config.errors import AblateError
from ablate.config.settings import environment
from ablate.store.engine import describe_url, session_factory
from ablate.store.schema import OWED_UNSTARTED, Metric, Run, utcnow


def update_run(engine: sa.Engine, run_id: int, claimant: str | None = None, **fields: Any) -> bool:
    """Set columns of a run; with `claimant`, only while that process still holds the run's claim.
    Returns whether the row was updated."""
    unknown = set(fields) - set(Run.__table__.columns.keys())
    if unknown:
        raise ValueError(f"not columns of runs: {sorted(unknown)}")
    where = [Run.id == run_id] + ([Run.claimed_by == claimant] if claimant is not None else [])
    with engine.begin() as conn:
        return conn.execute(sa.update(Run).where(*where).values(**fields)).rowcount == 1

# ---------------------------------------------------------------- claims: exactly one trainer per run

# How often a claimant says it is alive, and how long a silent `running` row takes to count as a dead process's (any
# host): it is owed again. ABLATE_HEARTBEAT_SECONDS / ABLATE_STALE_SECONDS set them (every host must agree); read
# where they are used, never frozen at import, so a forked trainer with another environment gets its own.


def heartbeat_seconds() -> float:
    return environment().heartbeat_seconds


def stale_seconds() -> float:
    return environment().stale_seconds


def new_claimant() -> str:
    """An id for one claiming process: host, pid and a nonce (pids are reused)."""
    import uuid

    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def stale_before() -> dt.datetime:
    return utcnow() - dt.timedelta(seconds=stale_seconds())


def is_live(run: Any) -> bool:
    """A running row whose claimant beat recently and, if it claimed on this host, still exists: some
    process (on any host) is training it. Anything else `running` belongs to a dead process."""
    return (run.status == "running" and run.heartbeat_at is not None and run.heartbeat_at >= stale_before()
            and not _dead_here(run.claimed_by, run.pid))


def trainer_running(run: Any) -> bool:
    """Whether the trainer of a row (whatever its status says, e.g. `cancelled` a moment ago) still runs: its
    pid exists when it was claimed on this host, else its heartbeat is fresh. A trainer clears `pid` as it ends."""
    if not run.pid:
        return False
    host, _, rest = (run.claimed_by or "").partition(":")
    if host == socket.gethostname():
        return pid_alive(run.pid)
    fresh = utcnow() - dt.timedelta(seconds=max(3 * heartbeat_seconds(), 5.0))
    return run.heartbeat_at is not None and run.heartbeat_at >= fresh


def _dead_here(claimed_by: str | None, pid: int | None) -> bool:
    """Whether a claim was made on this host by a process that is gone, and its trainer too."""
    host, _, rest = (claimed_by or "").partition(":")
    if host != socket.gethostname() or not rest.partition(":")[0].isdigit():
        return False
    return not pid_alive(int(rest.partition(":")[0])) and not pid_alive(pid)


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this id runs on this machine (a zombie counts until it is reaped)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim_run(engine: sa.Engine, run_id: int, claimant: str, statuses: Iterable[str] | None = None) -> bool:
    """Atomically take a run to train it: one conditional UPDATE, so of processes racing for the same run
    exactly one wins. A run may be taken from `statuses` (default: owed work that holds no result) or from a
    `running` row whose claimant is dead: its heartbeat is stale (any host), or it was made on this host by
    processes that no longer exist. The winner's row is `running`, attempt + 1."""
    allowed = tuple(statuses) if statuses is not None else OWED_UNSTARTED
    now = utcnow()
    takeable = sa.or_(Run.status.in_(allowed),
                      sa.and_(Run.status == "running", sa.or_(Run.heartbeat_at.is_(None), Run.heartbeat_at < stale_before())))
    with engine.connect() as conn:
        row = conn.execute(sa.select(Run.status, Run.claimed_by, Run.pid).where(Run.id == run_id)).first()
    if row is not None and row.status == "running" and _dead_here(row.claimed_by, row.pid):
        # its processes are gone from this host: take it over unless someone else did first (compare-and-set)
        takeable = sa.or_(takeable, sa.and_(Run.status == "running", Run.claimed_by == row.claimed_by))
    with engine.begin() as conn:
        won = conn.execute(sa.update(Run).where(Run.id == run_id, takeable).values(
            status="running", claimed_by=claimant, heartbeat_at=now, started_at=now, finished_at=None, error=None,
            host=socket.gethostname(), pid=None, attempts=Run.attempts + 1)).rowcount
    return won == 1


def heartbeat(engine: sa.Engine, run_id: int, claimant: str) -> str | None:
    """Say the claimant is alive; the run's status (`cancelled` when a user cancelled it meanwhile, from any
    host), or None when the claim was lost (another process took the run as stale)."""
    with engine.begin() as conn:
        if conn.execute(sa.update(Run).where(Run.id == run_id, Run.claimed_by == claimant)
                        .values(heartbeat_at=utcnow())).rowcount != 1:
            return None
        return conn.execute(sa.select(Run.status).where(Run.id == run_id)).scalar()


def write_metrics(engine: sa.Engine, run_id: int, rows: list[dict[str, Any]]) -> int:
    """Insert metric points in one transaction; points already present (same run, split, step) are skipped."""
    if not rows:
        return 0
    with engine.begin() as conn:
        have = {
            (s, st) for s, st in conn.execute(
                sa.select(Metric.split, Metric.step).where(
                    Metric.run_id == run_id, Metric.step >= min(r["step"] for r in rows)
                )
            )
        }
        fresh = [{"eval_point": None, **r, "run_id": run_id} for r in rows if (r["split"], r["step"]) not in have]
        if fresh:
            conn.execute(sa.insert(Metric), fresh)
        latest = _latest_fields(rows)
        if latest:
            conn.execute(sa.update(Run).where(Run.id == run_id).values(**latest))
    return len(fresh)


def _latest_fields(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run-row columns that mirror the newest train and eval points among `rows`."""
    out: dict[str, Any] = {}
    train = [r for r in rows if r["split"] == "train"]
    if train:
        last = max(train, key=lambda r: r["step"])
        out.update(last_step=last["step"], last_elapsed_seconds=last["elapsed_seconds"], last_train_loss=last["loss"])
    evals = [r for r in rows if r["split"] == "eval"]
    if evals:
        out["last_eval_loss"] = max(evals, key=lambda r: r["step"])["loss"]
    return out


def get_run(engine: sa.Engine, run_id: int) -> Run:
    with session_factory(engine)() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise AblateError(f"no run with id {run_id} in {describe_url(str(engine.url))}")
        return run
