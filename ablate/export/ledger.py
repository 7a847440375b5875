"""What an export already sent, per run fingerprint, for targets that cannot be asked (TensorBoard event files,
W&B offline runs): the last step of each curve, the status and the final metrics. Saved after every run (write to
a temporary file, then rename), so an interrupted export resumes where it stopped and a repeated one adds only what
is new."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ablate.export.runs import ExportRun, Point

NAME = "ablate-export.json"


class Ledger:
    def __init__(self, folder: Path) -> None:
        self.path = folder / NAME
        self.runs: dict[str, dict[str, Any]] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def new_points(self, run: ExportRun) -> dict[str, list[Point]]:
        """Each split's points past the last step sent."""
        sent = self.runs.get(run.fingerprint, {}).get("steps", {})
        return {split: [p for p in points if p.step > sent.get(split, -1)] for split, points in run.curves.items()}

    def changed(self, run: ExportRun) -> bool:
        """Whether the status or a final metric differs from what was sent (or nothing was)."""
        was = self.runs.get(run.fingerprint)
        return was is None or was.get("status") != run.status or was.get("final") != run.final

    def known(self, run: ExportRun) -> bool:
        return run.fingerprint in self.runs

    def record(self, run: ExportRun) -> None:
        self.runs[run.fingerprint] = {
            "run_id": run.run_id, "status": run.status, "final": run.final,
            "steps": {split: points[-1].step for split, points in run.curves.items() if points}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.runs, indent=1, sort_keys=True))
        os.replace(tmp, self.path)
