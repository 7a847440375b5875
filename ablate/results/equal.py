"""Runs re-read at an equal budget of another kind: each run's loss at the same FLOPs, tokens, seconds or steps,
interpolated on its own curve.

A sweep trains every run for the same wall clock (or tokens, steps, FLOPs); a reader on other hardware asks how
the ordering looks at equal compute. Every metric point records its step, tokens and budget-clock seconds, and
FLOPs are tokens × the run's training FLOPs per token, so any run can be read at any budget it reached: linear
interpolation between the two logged points around it. A budget past a run's last point (or before its first)
is refused for that run: the run did not get there, and the cell says so instead of extrapolating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ablate.config.units import At, parse_at

__all__ = ["BEFORE_FIRST", "NOT_REACHED", "NO_FLOPS", "At", "RowAt", "loss_at", "parse_at", "read_at", "read_runs_at", "x_of"]

NOT_REACHED = "not reached"  # the status of a run read at a budget past its last point
BEFORE_FIRST = "before 1st eval"  # ... or before its first eval point
NO_FLOPS = "no FLOPs/token"  # ... or in FLOPs, when the run recorded no training FLOPs per token


def x_of(kind: str, points: Any, flops_per_token: float | None) -> Any:
    """The x of a run's points (rows elapsed_seconds, tokens, step, loss) in the budget's kind; None where the run
    has no FLOPs per token recorded."""
    if kind == "seconds":
        return points[:, 0]
    if kind == "tokens":
        return points[:, 1]
    if kind == "steps":
        return points[:, 2]
    return None if not flops_per_token else points[:, 1] * flops_per_token


def loss_at(points: Any, x: Any, amount: float, column: int = 3) -> float | None:
    """The loss (or another column of the points: 2 is the step) at `amount` on the curve (x, points[:, column]),
    linearly interpolated; None past the last point, NaN before the first."""
    import numpy as np

    if x is None or len(x) == 0 or amount > x[-1] * (1 + 1e-9):
        return None
    if amount < x[0] * (1 - 1e-9):
        return math.nan  # a run that got there but logged nothing before: no number, no extrapolation
    return float(np.interp(amount, x, points[:, column]))


@dataclass(frozen=True)
class RowAt:
    """A run's row read at an equal budget: its final losses are the interpolated ones, its status NOT_REACHED
    where it stopped short (or has no points there), `steps_read` the optimizer steps it had trained by then (what
    report.min_steps is held to); every other field is the run's own."""

    row: Any
    final_train_loss: float | None
    final_eval_loss: float | None
    status: str
    steps_read: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.row, name)


def read_at(views: list[Any], at: At, curves: dict[tuple[int, str], Any]) -> list[Any]:
    """The views with each row read at `at`: `curves` maps (run id, split) to the run's points (run_points)."""
    out = []
    for v in views:
        row = v.row
        values = {}
        for split in ("train", "eval"):
            pts = curves.get((row.id, split))
            values[split] = None if pts is None else loss_at(pts, x_of(at.kind, pts, row.flops_per_token), at.amount)
        pts = curves.get((row.id, "eval"))
        steps = None if pts is None else loss_at(pts, x_of(at.kind, pts, row.flops_per_token), at.amount, column=2)
        status = row.status
        if status == "completed" and at.kind == "flops" and not row.flops_per_token:
            status = NO_FLOPS
        elif status == "completed" and values["eval"] is None:
            status = NOT_REACHED
        elif status == "completed" and math.isnan(values["eval"]):
            status = BEFORE_FIRST
        values = {k: None if x is None or math.isnan(x) else x for k, x in values.items()}
        steps = None if steps is None or math.isnan(steps) else steps
        out.append(replace(v, row=RowAt(row, values["train"], values["eval"], status, steps)))
    return out


def read_runs_at(engine: Any, views: list[Any], at: At | None) -> list[Any]:
    """The views read at `at` on their curves from the DB (each completed run's points around it); unchanged for
    None."""
    if at is None:
        return views
    from ablate.results.points import points_around

    ids = [v.row.id for v in views if v.row.status == "completed"]
    return read_at(views, at, points_around(engine, ids, at.kind, at.amount))
