"""Runs into TensorBoard event files: LOGDIR/SWEEP/run-ID-FINGERPRINT/, the curves as scalars `loss/train` and
`loss/eval` at their steps, final metrics as `final/NAME`, the trial config and the status as text. The ledger
(ledger.py) keeps what was sent: an export run again writes only newer points, in a new event file of the same
folder (TensorBoard reads a folder's files as one run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.export.ledger import Ledger
from ablate.export.runs import ExportRun, slug


class TensorboardTarget:
    def __init__(self, uri: str, sweep: str) -> None:
        self.root = Path(uri).expanduser() / slug(sweep)
        self.ledger = Ledger(self.root)

    def folder(self, run: ExportRun) -> Path:
        return self.root / f"run-{run.run_id}-{run.fingerprint}"  # its folder kept across exports (the name may grow)

    def export(self, run: ExportRun) -> int:
        new = self.ledger.new_points(run)
        count = sum(map(len, new.values()))
        if not count and not self.ledger.changed(run):
            return 0
        from torch.utils.tensorboard import SummaryWriter

        last = max((p.step for points in run.curves.values() for p in points), default=0)
        with SummaryWriter(log_dir=str(self.folder(run))) as writer:
            if not self.ledger.known(run):
                rows = "\n".join(f"| {k} | {v} |" for k, v in run.params.items())
                writer.add_text("config", "| parameter | value |\n| --- | --- |\n" + rows, 0)
            for split, points in new.items():
                for p in points:
                    writer.add_scalar(f"loss/{split}", p.loss, p.step, walltime=run.start_ms() / 1000 + p.seconds)
            if self.ledger.changed(run):
                for key, value in run.final.items():
                    writer.add_scalar(f"final/{key}", value, last)
                writer.add_text("status", run.status + (f": {run.error.splitlines()[0]}" if run.error else ""), last)
        self.ledger.record(run)
        return count

    def where(self) -> dict[str, Any]:
        return {"logdir": str(self.root)}
