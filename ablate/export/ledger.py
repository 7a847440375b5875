"""What an export already sent, per (sweep, run fingerprint), for targets that cannot be asked (TensorBoard event
files, W&B offline runs): the last step of each curve, the status and the final metrics. One small file per run
under `FOLDER/.ablate-export/[SCOPE/]`, replaced whole after the run is sent (write, then rename): an interrupted
export resumes where it stopped, and a repeated one adds only what is new. Two sweeps holding the same trials keep
separate entries (a folder every project shares is scoped by the sweep), and `exclusive` keeps a second export
out of a target while one writes into it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ablate.config.errors import AblateError
from ablate.export.runs import ExportRun, Point

NAME = ".ablate-export"


@contextmanager
def exclusive(lock: Path | None, target: str) -> Iterator[None]:
    """While inside, this process alone exports into `target` (an advisory lock on the file `lock`, released
    when the process ends, even by kill -9); a second export is refused at once, saying why."""
    if lock is None:
        yield
        return
    import fcntl

    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AblateError(f"another export is writing into {target} now; two at once would send the same points "
                              "twice: wait for it to end (or stop it), then export again (it adds only what is new)"
                              ) from None
        yield


class Ledger:
    def __init__(self, folder: Path, scope: str | None = None) -> None:
        self.root = folder / NAME
        self.folder = self.root / scope if scope else self.root

    def entry(self, run: ExportRun) -> dict[str, Any]:
        return self._was(run) or {}

    def recorded_anywhere(self, fingerprint: str, key: str) -> set[str]:
        """The values under `key` of every scope's entry for `fingerprint` (e.g. the W&B run folders written)."""
        found: set[str] = set()
        for path in self.root.glob(f"**/{fingerprint}.json"):
            try:
                found.update(json.loads(path.read_text()).get(key, []))
            except (OSError, ValueError):
                continue
        return found

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

    def record(self, run: ExportRun, **more: Any) -> None:
        entry = {"run_id": run.run_id, "status": run.status, "final": run.final,
                 "steps": {split: points[-1].step for split, points in run.curves.items() if points}, **more}
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{run.fingerprint}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entry, sort_keys=True))
        os.replace(tmp, path)
