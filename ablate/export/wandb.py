"""Runs into Weights & Biases, offline: one W&B run per ablate run (its id: the run's fingerprint; project: the
sweep), written under DIR/wandb/offline-run-*/ for `wandb sync` later. The trial config is the run's config, the
curves are `train/loss` and `eval/loss` at their steps, the status and final metrics are its summary. The ledger
(ledger.py) keeps what was sent: an export run again resumes each changed run by its id and logs only newer points
(W&B refuses steps below a run's last one, so nothing is duplicated when the files are synced)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ablate.export.ledger import Ledger
from ablate.export.runs import ExportRun, slug


class WandbTarget:
    def __init__(self, uri: str, sweep: str) -> None:
        self.dir = Path(uri).expanduser()
        self.project = slug(sweep)
        self.ledger = Ledger(self.dir, self.project)  # DIR is every project's: the ledger is the sweep's
        os.environ.setdefault("WANDB_SILENT", "true")

    def export(self, run: ExportRun) -> int:
        new = self.ledger.new_points(run)
        count = sum(map(len, new.values()))
        if not count and not self.ledger.changed(run):
            return 0
        import wandb

        self.dir.mkdir(parents=True, exist_ok=True)
        steps: dict[int, dict[str, float]] = {}
        for split, points in new.items():
            for p in points:
                steps.setdefault(p.step, {})[f"{split}/loss"] = p.loss
        self.drop_partial(run)
        settings = wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True, silent=True)
        w = wandb.init(mode="offline", dir=str(self.dir), project=self.project, id=run.fingerprint, name=run.name,
                       config=run.params, resume="allow", settings=settings, reinit="create_new")
        written = [*self.ledger.entry(run).get("wandb_runs", []), Path(w.dir).parent.name]
        try:
            for step in sorted(steps):
                w.log(steps[step], step=step)
            w.summary.update({"status": run.status, "ablate_run_id": run.run_id, **run.final,
                              **({"error": run.error[:2000]} if run.error else {})})
        finally:
            w.finish(exit_code=0 if run.status in ("completed", "running", "pending") else 1)
        self.ledger.record(run, wandb_runs=written)
        return count

    def drop_partial(self, run: ExportRun) -> None:
        """Remove the offline run folders of this run that no ledger entry records: what an export killed while
        writing it left (its points are sent again now, and `wandb sync` would upload both)."""
        sent = self.ledger.recorded_anywhere(run.fingerprint, "wandb_runs")
        for folder in (self.dir / "wandb").glob(f"offline-run-*-{run.fingerprint}"):
            if folder.name not in sent:
                shutil.rmtree(folder, ignore_errors=True)

    def where(self) -> dict[str, Any]:
        return {"dir": str(self.dir / "wandb")}
