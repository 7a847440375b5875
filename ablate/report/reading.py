"""How a report reads the runs, beside what they are: at an equal budget of another kind (`report.at`, `--at`),
grouped by any axes with the rest averaged (`report.group`, `--group`), and every table cell as numbers
(tables.csv: mean, 95% interval, n, steps)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any


from ablate.config import SweepSpec
from ablate.config.errors import AblateError, did_you_mean
from ablate.config.units import parse_at
from ablate.report.tables import Table, finished_values
from ablate.results.stats import mean_ci
from ablate.results.views import RunView


def with_reading(spec: SweepSpec, views: list[RunView], at: str | None = None,
                 group: tuple[str, ...] | None = None) -> SweepSpec:
    """The spec with the command line's --at and --group over its report block's, both checked."""
    changes: dict[str, Any] = {}
    if at is not None:
        try:
            parsed = parse_at(at)
        except ValueError as e:
            raise AblateError(f"--at {at}: {e}") from None
        changes["at"] = {parsed.kind: parsed.amount}
    if group:
        changes["group"] = tuple(group)
    spec = spec.model_copy(update={"report": spec.report.model_copy(update=changes)}) if changes else spec
    known = sorted({k for v in views for k in v.axes})
    for axis in spec.report.group or ():
        if known and axis not in known:
            raise AblateError(f"--group {axis}: no run has that axis{did_you_mean(axis, known)}; "
                              f"the axes are {', '.join(known)}")
    return spec


def at_note(spec: SweepSpec) -> str | None:
    at = parse_at(spec.report.at)
    if at is None:
        return None
    return (f"Read at {at.text()}: each run's loss interpolated linearly between the two logged points around it "
            f"on its own curve{' (FLOPs = tokens × the run’s training FLOPs per token)' if at.kind == 'flops' else ''}; "
            "'not reached': the run ended before that budget (no extrapolation); 'no FLOPs/token': the run recorded "
            "none, so it cannot be read in FLOPs. Steps, Epochs and Train time are "
            "the whole run's.")


TABLE_COLUMNS = ("table", "column", "split", "mean", "ci_low", "ci_high", "n", "steps_min", "steps_max", "runs")


def write_tables_csv(tables: list[Table], path: Path) -> Path:
    """Every table cell as numbers: mean, 95% t-interval, n seeds, the steps its runs trained, their ids."""
    with path.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(TABLE_COLUMNS)
        for t in tables:
            for label, runs in zip(t.columns, t.runs):
                steps = [r.row.steps for r in runs if r.row.steps is not None]
                for split, column in (("train", "final_train_loss"), ("eval", "final_eval_loss")):
                    values = finished_values(runs, column)
                    e = mean_ci(values) if values else None
                    out.writerow((t.title, label, split, *(("", "", "", 0) if e is None else
                                                           (e.mean, blank(e.low), blank(e.high), e.n)),
                                  min(steps, default=""), max(steps, default=""),
                                  " ".join(str(r.row.id) for r in runs)))
    return path


def blank(value: float | None) -> Any:
    """None as an empty csv field."""
    return "" if value is None else value
