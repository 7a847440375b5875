"""`ablate export SWEEP --to mlflow|tensorboard|wandb`: a sweep's runs into the trackers a lab already runs, keyed
by each run's fingerprint, so that exporting again updates and never duplicates.

runs.py reads the runs (config flattened into parameters, status, final metrics, curves); each target writes them:
mlflow.py (asks the tracking server what each run holds), tensorboard.py and wandb.py (event files and offline
runs, with ledger.py remembering what was sent). Each tracker is an optional extra: `pip install 'ablate[mlflow]'`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from ablate.config.errors import AblateError

TARGETS = {"mlflow": ("ablate.export.mlflow", "MlflowTarget", "mlflow", "sqlite:///results/mlflow.db"),
           "tensorboard": ("ablate.export.tensorboard", "TensorboardTarget", "tensorboard", "results/tensorboard"),
           "wandb": ("ablate.export.wandb", "WandbTarget", "wandb", "results/wandb")}


@dataclass
class Exported:
    runs: int = 0
    updated: int = 0  # runs that had new points
    points: int = 0
    where: dict[str, Any] = field(default_factory=dict)


def export_sweep(sweep: str, to: str, uri: str | None = None, url: str | None = None, progress: Any = None) -> Exported:
    """Every run of `sweep` into tracker `to` at `uri` (default: TARGETS' under results/); `progress(done, total)`
    is called after each run."""
    from ablate import store
    from ablate.export.runs import export_runs
    from ablate.results.live import sweep_row

    if to not in TARGETS:
        raise AblateError(f"--to must be one of {', '.join(TARGETS)}, not {to!r}")
    module, cls, package, default = TARGETS[to]
    try:
        importlib.import_module(package)
    except ImportError:
        raise AblateError(f"exporting to {to} needs the {package} package: pip install 'ablate[{to}]'") from None
    engine = store.reader(url)
    sweep_row(engine, sweep)  # a clear error for an unknown sweep, before the target is created
    target = getattr(importlib.import_module(module), cls)(uri or default, sweep)
    out = Exported(where=target.where())
    total = store_runs(engine, sweep)
    for run in export_runs(engine, sweep):
        new = target.export(run)
        out.runs += 1
        out.points += new
        out.updated += bool(new)
        if progress is not None:
            progress(out.runs, total)
    return out


def store_runs(engine: Any, sweep: str) -> int:
    import sqlalchemy as sa

    from ablate import store
    from ablate.results.live import sweep_row

    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).where(store.Run.sweep_id == sweep_row(engine, sweep).id)).scalar()


__all__ = ["TARGETS", "Exported", "export_sweep"]
