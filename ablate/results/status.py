"""A sweep's runs as status rows: what `ablate sweep status`, the live view of `ablate sweep run` and the
dashboard's runs table show of each run. One row, in one column order, with one progress and one reason,
wherever it is shown; read from run-row columns only (the latest points are kept there), never the metrics table.

    status_rows / status_view / status_counts   the queries (a big sweep's table reads only what it shows)
    status_row(row)                             one run as plain values: FIRST, the axes, options, LAST
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.config.axes import AXIS_FIELDS

# the run-row columns a status row is made of
RUN_COLUMNS = ("id", "trial_index", "status", *AXIS_FIELDS, "options", "budget_kind", "budget_amount",
               "train_seconds", "steps", "last_step", "last_elapsed_seconds", "final_train_loss", "last_train_loss",
               "final_eval_loss", "last_eval_loss", "epochs", "params", "flops_per_token", "tokens", "error", "finished_at",
               "heartbeat_at", "claimed_by", "pid")
FIRST = ("run", "status", "progress")  # a status row's columns before the axes and options
LAST = ("steps", "train", "eval", "epochs", "reason")  # and after them
# run-row fields the dashboard's rows also carry, shown on request (its column chooser), filtered and sorted by
EXTRA = ("params", "flops_per_token", "tokens_per_second", "tokens", "train_seconds", "mfu", "peak_memory_mb",
         "final_eval_accuracy", "precision", "code_version", "host", "device_name", "attempts", "started_at")
REASON_CHARS = 200  # a reason is the first line of the error, cut here


def status_row(row: Any) -> dict[str, Any]:
    """One run as plain values, in the order every view shows them: run, status, progress (the fraction of its
    budget used), the axes, `options` (a dict), steps, the latest train and eval loss (final once finished),
    epochs and the reason (why it failed, or why a `running` row is stale)."""
    pick = lambda final, last: final if final is not None else last  # noqa: E731
    out: dict[str, Any] = {"run": row.id, "status": row.status, "progress": progress(row)}
    out.update({k: getattr(row, k) for k in AXIS_FIELDS})
    out.update({"options": dict(sorted((row.options or {}).items())), "steps": pick(row.steps, row.last_step),
                "train": pick(row.final_train_loss, row.last_train_loss),
                "eval": pick(row.final_eval_loss, row.last_eval_loss),
                "epochs": None if row.epochs is None else round(row.epochs, 3), "reason": reason(row)})
    return out


def progress(row: Any) -> float | None:
    """The fraction of its budget a run has used: 1 once completed; otherwise (running, and a run that ended
    early: diverged, oom, failed, cancelled, pruned) from its clock, steps, tokens or FLOPs, as far as it got;
    None where the row does not say."""
    if row.status == "completed":
        return 1.0
    if not row.budget_amount:
        return None
    steps = row.steps if row.steps is not None else row.last_step
    tokens = getattr(row, "tokens", None)
    used = {"wall_clock": row.train_seconds if row.train_seconds is not None else row.last_elapsed_seconds,
            "steps": steps, "tokens": tokens,
            "flops": None if tokens is None or not row.flops_per_token else tokens * row.flops_per_token,
            }.get(row.budget_kind)
    return None if used is None else round(min(used / row.budget_amount, 1.0), 4)


def reason(row: Any) -> str:
    """The first line of a run's error (why it failed, oom'd or was stopped), why a `running` row is stale, or
    that a cancelled run's trainer is still stopping."""
    if row.status == "running" and hasattr(row, "heartbeat_at") and not store.is_live(row):
        beat = f"{(store.utcnow() - row.heartbeat_at).total_seconds():.0f} s ago" if row.heartbeat_at else "never"
        return f"stale: its trainer last beat {beat} (machine or process gone); the next runner takes it over"
    if row.status == "cancelled" and hasattr(row, "pid") and store.trainer_running(row):
        return (f"cancelling: trainer still running (pid {row.pid} on {(row.claimed_by or '?').partition(':')[0]}); "
                "it checkpoints and stops, or is killed after its grace")
    error = (row.error or "").strip()
    return error.splitlines()[0][:REASON_CHARS] if error else ""


# ---------------------------------------------------------------- the queries


def status_rows(engine: sa.Engine, name: str) -> list[sa.Row]:
    """The sweep's runs for a status table, in trial order: one query over run-row columns."""
    sid = _sweep_id(engine, name)
    with engine.connect() as conn:
        return list(conn.execute(_select().where(store.Run.sweep_id == sid).order_by(store.Run.trial_index)))


def status_view(engine: sa.Engine, name: str, limit: int) -> tuple[list[sa.Row], dict[str, int]]:
    """What a status table of at most `limit` rows needs, without reading every run of a big sweep: the sweep's
    counts by status, and, in trial order, the first `limit` unfinished runs that are not waiting, the latest
    `limit` finished ones and the next `limit` waiting ones (cli.shown_runs picks from these)."""
    counts = status_counts(engine, name)
    if sum(counts.values()) <= limit:
        return status_rows(engine, name), counts
    r = store.Run
    base = _select().where(r.sweep_id == _sweep_id(engine, name))
    finished = r.status.in_(store.FINISHED)
    parts = (base.where(r.status != "pending", ~finished).order_by(r.trial_index),
             base.where(finished).order_by(r.finished_at.is_(None), r.finished_at.desc(), r.id.desc()),
             base.where(r.status == "pending").order_by(r.trial_index))
    with engine.connect() as conn:
        rows = {row.id: row for part in parts for row in conn.execute(part.limit(limit))}
    return sorted(rows.values(), key=lambda row: row.trial_index), counts


def status_counts(engine: sa.Engine, name: str) -> dict[str, int]:
    """How many of the sweep's runs are in each status."""
    sid = _sweep_id(engine, name)
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(store.Run.status, sa.func.count()).where(store.Run.sweep_id == sid)
                                 .group_by(store.Run.status).order_by(store.Run.status)).all())


def _select() -> sa.Select:
    return sa.select(*(getattr(store.Run, c) for c in RUN_COLUMNS))


def _sweep_id(engine: sa.Engine, name: str) -> int:
    return store.sweep_named(engine, name, store.Sweep.id).id


def eta(engine: sa.Engine, name: str, at_once: int) -> str:
    """'~9 min left · 1 at a time': the work still owed (runs not started at the mean wall time of the runs finished
    so far, running ones at what of it is left) over the trials at once; '' before a run has finished."""
    sid = _sweep_id(engine, name)
    r = store.Run
    with engine.connect() as conn:
        rows = conn.execute(sa.select(r.status, r.started_at, r.finished_at).where(r.sweep_id == sid)).all()
    took = [(f - s).total_seconds() for status, s, f in rows if status in store.FINISHED and s and f and f >= s]
    if not took:
        return ""
    mean, now = sum(took) / len(took), store.utcnow()
    owed = sum(1 for status, *_ in rows if status in store.OWED_UNSTARTED)
    running = [max(mean - (now - s).total_seconds(), 0.0) for status, s, _ in rows if status == "running" and s]
    left = (owed * mean + sum(running)) / max(at_once, 1)
    return f"{_minutes(left)} left · {at_once} at a time"


def _minutes(seconds: float) -> str:
    if seconds < 60:
        return "<1 min"
    minutes = round(seconds / 60)
    return f"~{minutes} min" if minutes < 90 else f"~{minutes // 60} h {minutes % 60} min"
