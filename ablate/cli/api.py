"""The Python door: a sweep from a notebook or a script, by the code the CLI runs.

    import ablate
    s = ablate.sweep("sweeps/smoke.yaml", overrides=["defaults.lr=1e-3"], db="sqlite:///results/ablate.db")
    s.plan()      # the trials, as `ablate plan` lists them
    s.run()       # `ablate sweep run`: 0 when every run it owed finished
    s.status()    # the runs as `ablate sweep status` shows them (one dict each)
    s.report()    # `ablate report`: the tables, the claims, the answer, the files written

`run` starts `ablate sweep run` in a child process (its own local Prefect server and trainers, its output shown as
it comes): a notebook's event loop and threads never meet Prefect's, and Ctrl-C stops the child as it would the
command (trainers checkpoint; the next `run` resumes). The rest read the spec and the results DB here.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Sweep:
    """A sweep file with its overrides (`KEY=VALUE` as on the command line) and the results DB (None: ABLATE_DB_URL,
    else results/ablate.db)."""

    spec: str | Path
    overrides: Sequence[str] = field(default_factory=tuple)
    db: str | None = None

    def _loaded(self) -> tuple[Any, list[Any]]:
        from ablate.config import load_trials

        return load_trials(self.spec, overrides={"set": list(self.overrides) or None})

    @property
    def name(self) -> str:
        """The sweep's name in the results DB (overrides rename it, as on the command line)."""
        return self._loaded()[0].name

    def plan(self) -> list[Any]:
        """The trials (TrialConfig), checked as `ablate plan` checks them; a bad spec raises naming the field."""
        return self._loaded()[1]

    def run(self, *flags: str, check: bool = False) -> int:
        """`ablate sweep run SPEC OVERRIDES... FLAGS...` (e.g. "--gpu-slots", "2"): its exit code (0: every run it owed
        finished; 1: some failed; 130: stopped). `check`: raise CalledProcessError on a nonzero code."""
        command = [sys.executable, "-m", "ablate.cli", "sweep", "run", str(self.spec), *self.overrides,
                   *(("--db", self.db) if self.db else ()), *flags]
        try:
            done = subprocess.run(command, check=check)
        except KeyboardInterrupt:  # the child got it too: it checkpoints and says how to resume
            return 130
        return done.returncode

    def status(self) -> list[dict[str, Any]]:
        """Each run as `ablate sweep status` shows it: run, status, progress, the axes, options, steps, losses,
        epochs, reason."""
        from ablate import store
        from ablate.results.status import status_row, status_rows

        return [status_row(r) for r in status_rows(store.reader(self.db), self.name)]

    def report(self, out: str | Path | None = None, formats: Sequence[str] | None = None, **options: Any) -> Any:
        """`ablate report NAME`: the Report (its tables, `answer`, `claims`, the files written to `out`, default
        results/reports/NAME/); `options`: build_report's (at, group, artifacts)."""
        from ablate.report import build_report
        from ablate.report.render import FORMATS

        return build_report(self.name, self.db, Path(out) if out else None, formats=tuple(formats or FORMATS),
                            **options)


def sweep(spec: str | Path, overrides: Sequence[str] = (), db: str | None = None) -> Sweep:
    """A sweep from Python: see the module's docstring."""
    return Sweep(spec, tuple(overrides), db)
