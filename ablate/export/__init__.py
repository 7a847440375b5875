"""`ablate export SWEEP --to mlflow|tensorboard|wandb`: a sweep's runs into the trackers a lab already runs, keyed
by each run's fingerprint, so that exporting again updates and never duplicates.

runs.py reads the runs (config flattened into parameters, status, final metrics, curves); each target writes them:
mlflow.py (asks the tracking server what each run holds), tensorboard.py and wandb.py (event files and offline
runs, with ledger.py remembering what was sent). Each tracker is an optional extra: `pip install 'ablate[mlflow]'`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config.errors import AblateError
from ablate.export.ledger import exclusive
from ablate.results.live import sweep_row

TARGETS = {"mlflow": ("ablate.export.mlflow", "MlflowTarget", "mlflow", "sqlite:///results/mlflow.db"),
           "tensorboard": ("ablate.export.tensorboard", "TensorboardTarget", "tensorboard", "results/tensorboard"),
           "wandb": ("ablate.export.wandb", "WandbTarget", "wandb", "results/wandb")}


@dataclass
class Exported:
    runs: int = 0
    updated: int = 0  # runs that had new points
    points: int = 0
    where: dict[str, Any] = field(default_factory=dict)


def export_sweep(sweep: str, to: str, uri: str | None = None, url: str | None = None, progress: Any = None,
                 follow: float | None = None, say: Any = None) -> Exported:
    """Every run of `sweep` into tracker `to` at `uri` (default: TARGETS' under results/); `progress(done, total)`
    is called after each run. `follow`: then, every that many seconds until every run has finished, send again
    the runs whose status or latest point moved (a live mirror that costs the trainers nothing), saying each
    round's news with `say`. One export at a time into a target (a second is refused); a tracker's own error is
    one line."""
    from ablate import store

    require(to)  # before the database: a missing extra is the first thing to fix
    engine = store.reader(url)
    sweep_row(engine, sweep)  # a clear error for an unknown sweep, before the target is created
    uri = uri or TARGETS[to][3]
    try:
        with exclusive(lock_for(to, uri, sweep), f"{to} at {uri}"):
            return _export(engine, sweep, target_for(to, uri, sweep), progress, follow, say)
    except AblateError:
        raise
    except Exception as exc:  # noqa: BLE001 - the tracker's own store or folder: one line, not its traceback
        raise AblateError(tracker_error(to, uri, exc)) from None


def _export(engine: Any, sweep: str, target: Any, progress: Any, follow: float | None, say: Any) -> Exported:
    import time

    from ablate import store
    from ablate.export.runs import export_runs

    out = Exported(where=target.where())
    total = store_runs(engine, sweep)
    seen = run_states(engine, sweep)
    for run in export_runs(engine, sweep):
        _count(out, target.export(run))
        if progress is not None:
            progress(out.runs, total)
    while follow and any(status not in store.FINISHED for status, *_ in seen.values()):
        time.sleep(follow)
        now = run_states(engine, sweep)
        moved = [run_id for run_id, state in now.items() if seen.get(run_id) != state]
        seen = now
        points = out.points
        for run in export_runs(engine, sweep, run_ids=moved) if moved else ():
            _count(out, target.export(run), again=True)
        if say is not None and moved:
            say(f"{len(moved)} run(s) moved: {out.points - points:,} new points sent")
    return out


def lock_for(to: str, uri: str, sweep: str) -> Path | None:
    """The file an export into (`to`, `uri`) holds locked: in the folder it writes, beside an MLflow SQLite store;
    none for a tracking server (it orders its own writes)."""
    from ablate.export.ledger import NAME
    from ablate.export.runs import slug

    if to == "tensorboard":
        return Path(uri).expanduser() / slug(sweep) / NAME / "lock"
    if to == "wandb":
        return Path(uri).expanduser() / NAME / "lock"
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///").split("?", 1)[0] + ".ablate-export.lock").expanduser()
    return None if "://" in uri else Path(uri).expanduser() / ".ablate-export.lock"


def tracker_error(to: str, uri: str, exc: BaseException) -> str:
    """A tracker's failure in one line: a folder that cannot be written names the fix."""
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return (f"cannot write the {to} export at {uri}{where}: {exc.strerror or exc}; give --uri a folder you can "
                "write (it is created)")
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"exporting to {to} at {uri} failed: {type(exc).__name__}: {first}"


def _count(out: Exported, new: int, again: bool = False) -> None:
    out.runs += not again
    out.points += new
    out.updated += bool(new)


def run_states(engine: Any, sweep: str) -> dict[int, tuple]:
    """Per run of the sweep: (status, last step, latest eval loss, final eval loss), one light query: what moves
    when a trainer flushes points or a run ends."""
    import sqlalchemy as sa

    from ablate import store

    r = store.Run
    with engine.connect() as conn:
        rows = conn.execute(sa.select(r.id, r.status, r.last_step, r.last_eval_loss, r.final_eval_loss)
                            .where(r.sweep_id == sweep_row(engine, sweep).id)).all()
    return {row[0]: tuple(row[1:]) for row in rows}


def require(to: str) -> None:
    """A known tracker whose package is installed, else one message naming the extra that brings it."""
    if to not in TARGETS:
        raise AblateError(f"--to must be one of {', '.join(TARGETS)}, not {to!r}")
    package = TARGETS[to][2]
    try:
        importlib.import_module(package)
    except ImportError:
        raise AblateError(f"exporting to {to} needs the {package} package: pip install 'ablate[{to}]'") from None


def target_for(to: str, uri: str | None, sweep: str) -> Any:
    """The tracker `to` at `uri` (default: TARGETS' under results/), for `sweep`."""
    require(to)
    module, cls, _, default = TARGETS[to]
    return getattr(importlib.import_module(module), cls)(uri or default, sweep)


def store_runs(engine: Any, sweep: str) -> int:
    import sqlalchemy as sa

    from ablate import store

    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).where(store.Run.sweep_id == sweep_row(engine, sweep).id)).scalar()


__all__ = ["TARGETS", "Exported", "export_sweep", "require", "target_for"]
