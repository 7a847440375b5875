"""A sweep's runs as trackers take them: one record per run, keyed by its fingerprint, with its trial config
flattened into parameters, its status and final metrics, and its train/eval curves at their steps."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.results.live import sweep_row
from ablate.results.points import IN_CHUNK, metric_points

FINAL = ("final_train_loss", "final_eval_loss", "final_eval_accuracy", "params", "tokens", "steps", "train_seconds",
         "tokens_per_second", "mfu", "epochs", "peak_memory_mb")


@dataclass
class Point:
    step: int
    seconds: float
    tokens: int
    loss: float


@dataclass
class ExportRun:
    run_id: int
    fingerprint: str
    name: str  # the name a tracker shows: the values the sweep's runs differ in, and the run's id
    params: dict[str, Any]  # the trial config, flattened (dataset.source, budget.kind, ...)
    status: str
    error: str
    final: dict[str, float]  # the run row's final metrics that are set
    started_at: dt.datetime | None
    curves: dict[str, list[Point]] = field(default_factory=dict)  # split -> points in step order
    created_at: dt.datetime | None = None

    def start_ms(self) -> int:
        """When the run started (ms since the epoch, UTC): the base of its points' timestamps. A run not started
        yet (pending at export time) is dated when it was registered, not shown as created decades ago."""
        when = self.started_at or self.created_at or store.utcnow()
        return int(when.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)


def sweep_of(engine: sa.Engine, run_id: int) -> str:
    """The name of the sweep a run belongs to."""
    with engine.connect() as conn:
        return conn.execute(sa.select(store.Sweep.name).join(store.Run, store.Run.sweep_id == store.Sweep.id)
                            .where(store.Run.id == run_id)).scalar_one()


def export_runs(engine: sa.Engine, sweep: str, run_ids: list[int] | None = None) -> Iterator[ExportRun]:
    """The sweep's runs (or those of `run_ids`) in trial order, read IN_CHUNK at a time with their curves (a
    10,000-run sweep never sits in memory whole)."""
    sid = sweep_row(engine, sweep).id
    r = store.Run
    only = () if run_ids is None else (r.id.in_(run_ids),)
    with engine.connect() as conn:
        ids = conn.execute(sa.select(r.id).where(r.sweep_id == sid, *only).order_by(r.trial_index)).scalars().all()
    differ = varying(engine, sid)
    for start in range(0, len(ids), IN_CHUNK):
        chunk = ids[start:start + IN_CHUNK]
        with engine.connect() as conn:
            rows = {row.id: row for row in conn.execute(sa.select(r.__table__).where(r.id.in_(chunk)))}
        curves: dict[int, dict[str, list[Point]]] = {}
        for run_id, split, step, seconds, tokens, loss in metric_points(engine, chunk):
            curves.setdefault(run_id, {}).setdefault(split, []).append(Point(step, seconds, tokens, loss))
        for run_id in chunk:
            row = rows[run_id]
            params = flatten(row.config)
            yield ExportRun(run_id=row.id, fingerprint=row.fingerprint, name=run_name(row.id, params, differ),
                            params=params, status=row.status, error=(row.error or "").strip(),
                            final={k: float(getattr(row, k)) for k in FINAL if getattr(row, k) is not None},
                            started_at=row.started_at, curves=curves.get(run_id, {}), created_at=row.created_at)


def varying(engine: sa.Engine, sweep_id: int) -> list[str]:
    """The flattened config keys whose values differ between the sweep's runs, in key order (read IN_CHUNK runs at a
    time: only the first value of each key is kept)."""
    r = store.Run
    first: dict[str, Any] = {}
    differ: set[str] = set()
    seen = 0
    with engine.connect() as conn:
        ids = conn.execute(sa.select(r.id).where(r.sweep_id == sweep_id)).scalars().all()
    for start in range(0, len(ids), IN_CHUNK):
        with engine.connect() as conn:
            configs = conn.execute(sa.select(r.config).where(r.id.in_(ids[start:start + IN_CHUNK]))).scalars().all()
        for config in configs:
            params = flatten(config)
            if seen:
                differ |= {k for k in first.keys() | params.keys() if first.get(k, _NONE) != params.get(k, _NONE)}
            else:
                first = params
            seen += 1
    return sorted(differ)


_NONE = object()


def run_name(run_id: int, params: dict[str, Any], differ: list[str]) -> str:
    """'architecture=mixer d_model=64 seed=1 · run 12': what tells the run from the sweep's others, then its id (a
    key shown by its last part where no other varying key shares it)."""
    last = [k.rsplit(".", 1)[-1] for k in differ]
    shown = " ".join(f"{short if last.count(short) == 1 else key}={params.get(key, 'null')}"
                     for key, short in zip(differ, last))
    return f"{shown} · run {run_id}" if shown else f"run {run_id}"


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as one level of dotted keys; lists as JSON text, None as "null"."""
    out: dict[str, Any] = {}
    for key, value in sorted(config.items()):
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple, dict)):
            out[name] = json.dumps(value, sort_keys=True)
        else:
            out[name] = "null" if value is None else value
    return out


def slug(name: str) -> str:
    """A sweep's name as a folder or project name: letters, digits, _ . - only (a name in the DB is data: it never
    walks out of the export folder)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "sweep"
