"""What an export already sent, per run fingerprint, for targets that cannot be asked (TensorBoard event files,
W&B offline runs): the last step of each curve, the status and the final metrics. One small file per run under
`FOLDER/.ablate-export/`, replaced whole after the run is sent (write, then rename): an interrupted export resumes
where it stopped, a repeated one adds only what is new, and trainers mirroring their runs at once (mirror.py)
never overwrite each other's entries."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ablate.export.runs import ExportRun, Point

NAME = ".ablate-export"


class Ledger:
    def __init__(self, folder: Path) -> None:
        self.folder = folder / NAME

    def _was(self, run: ExportRun) -> dict[str, Any] | None:
        path = self.folder / f"{run.fingerprint}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def new_points(self, run: ExportRun) -> dict[str, list[Point]]:
        """Each split's points past the last step sent."""
        sent = (self._was(run) or {}).get("steps", {})
        return {split: [p for p in points if p.step > sent.get(split, -1)] for split, points in run.curves.items()}

    def changed(self, run: ExportRun) -> bool:
        """Whether the status or a final metric differs from what was sent (or nothing was)."""
        was = self._was(run)
        return was is None or was.get("status") != run.status or was.get("final") != run.final

    def known(self, run: ExportRun) -> bool:
        return self._was(run) is not None

    def record(self, run: ExportRun) -> None:
        entry = {"run_id": run.run_id, "status": run.status, "final": run.final,
                 "steps": {split: points[-1].step for split, points in run.curves.items() if points}}
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{run.fingerprint}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entry, sort_keys=True))
        os.replace(tmp, path)
