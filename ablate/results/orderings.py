"""The study's published orderings tested on our runs, and the noise floor they are read against.

`check_claims` groups a sweep's completed runs by each ordering's `at` axes, compares the two sides across seeds
(stats.welch), adjusts every comparison of the report together (Holm) and gives each a verdict. A run that
trained fewer than the report's `min_steps` steps is left out of every comparison: a cell made only of such runs
gets the verdict "too few steps" instead of one. `noise_floor` is the seed-to-seed standard deviation of each
architecture's test loss, pooled over its configurations; an effect smaller than the floor of either side is
flagged. One code path for the report, the UI and `ablate.results.claims`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ablate.config import Ordering, SweepSpec
from ablate.results import stats
from ablate.results.views import RunView, _matches, _sort_key

TOO_FEW_STEPS = "too few steps"

Value = Callable[[RunView], "float | None"]  # the number a run is compared by (its final test loss, by default)


def final_eval_loss(view: RunView) -> float | None:
    return view.row.final_eval_loss


def comparable(view: RunView, min_steps: int) -> bool:
    """A completed run that trained at least `min_steps` optimizer steps (a run of unknown steps counts)."""
    steps = view.row.steps
    return steps is None or steps >= min_steps


@dataclass
class ClaimCell:
    """One ordering at one combination of its `at` axes: the comparison, its adjusted p-values and verdict."""

    ordering: Ordering
    where: dict[str, Any]
    comparison: stats.Comparison | None  # None: too few steps on a side
    verdict: str = stats.UNTESTED
    p_adjusted: float | None = None
    p_against_adjusted: float | None = None
    left_out: int = 0  # runs of this cell left out for training fewer than min_steps steps
    floor: float | None = None  # the larger noise floor of the two sides' architectures

    @property
    def below_floor(self) -> bool:
        return self.comparison is not None and self.floor is not None and abs(self.comparison.effect) < self.floor


@dataclass
class Claims:
    """Every ordering's cells, and what was needed to read them."""

    cells: list[ClaimCell] = field(default_factory=list)
    floor: dict[str, tuple[float | None, int]] = field(default_factory=dict)  # architecture -> (std, cells)
    tests: int = 0  # comparisons adjusted together (Holm's m)
    min_steps: int = 0

    def of(self, ordering: Ordering) -> list[ClaimCell]:
        return [c for c in self.cells if c.ordering is ordering]


def noise_floor(views: list[RunView], min_steps: int = 0, value: Value = final_eval_loss
                ) -> dict[str, tuple[float | None, int]]:
    """Per architecture: the seed-to-seed std of `value`, pooled over its configurations (runs that differ only by
    seed), and the number of configurations with two seeds or more."""
    configs: dict[tuple[str, str], list[float]] = {}
    for v in views:
        x = value(v) if v.row.status == "completed" and comparable(v, min_steps) else None
        if x is None:
            continue
        key = repr(sorted((k, repr(a)) for k, a in v.axes.items() if k != "seed"))
        configs.setdefault((str(v.axes.get("architecture")), key), []).append(x)
    by_arch: dict[str, list[list[float]]] = {}
    for (arch, _), values in configs.items():
        by_arch.setdefault(arch, []).append(values)
    return {arch: stats.pooled_std(groups) for arch, groups in sorted(by_arch.items())}


def check_claims(spec: SweepSpec, views: list[RunView], value: Value = final_eval_loss,
                 min_steps: int | None = None) -> Claims:
    """Each of the spec's orderings at each value of its `at` axes: Welch across seeds, Holm over all of them."""
    min_steps = spec.report.min_steps if min_steps is None else min_steps
    floor = noise_floor(views, min_steps, value)
    result = Claims(floor=floor, min_steps=min_steps)
    for order in spec.report.orderings:
        result.cells += _cells_of(order, views, value, min_steps, floor)
    tested = [c for c in result.cells if c.comparison is not None and c.comparison.tested]
    result.tests = len(tested)
    adjusted = stats.holm([c.comparison.p for c in tested])
    against = stats.holm([c.comparison.p_against for c in tested])
    for cell, p, q in zip(tested, adjusted, against):
        cell.p_adjusted, cell.p_against_adjusted = p, q
        cell.verdict = stats.verdict(p, q)
    return result


def _cells_of(order: Ordering, views: list[RunView], value: Value, min_steps: int,
              floor: dict[str, tuple[float | None, int]]) -> list[ClaimCell]:
    sides: dict[tuple, dict[str, list[float]]] = {}
    left_out: dict[tuple, int] = {}
    archs: dict[tuple, set[str]] = {}
    for v in views:
        x = value(v) if v.row.status == "completed" else None
        if x is None:
            continue
        for side in ("better", "worse"):
            if not _matches(v, getattr(order, side)):
                continue
            key = tuple(v.axes.get(k) for k in order.at)
            cell = sides.setdefault(key, {"better": [], "worse": []})
            archs.setdefault(key, set()).add(str(v.axes.get("architecture")))
            if comparable(v, min_steps):
                cell[side].append(x)
            else:
                left_out[key] = left_out.get(key, 0) + 1
    cells = []
    for key in sorted(sides, key=lambda k: [_sort_key(x) for x in k]):
        better, worse = sides[key]["better"], sides[key]["worse"]
        where = dict(zip(order.at, key))
        arch = tuple(sorted(archs[key]))
        floors = [floor.get(a, (None, 0))[0] for a in arch]
        known = [f for f in floors if f is not None and math.isfinite(f)]
        common = dict(ordering=order, where=where, left_out=left_out.get(key, 0),
                      floor=max(known) if known else None)
        if not better or not worse:
            if left_out.get(key):
                cells.append(ClaimCell(comparison=None, verdict=TOO_FEW_STEPS, **common))
            continue  # one side never ran: nothing to compare yet
        cells.append(ClaimCell(comparison=stats.welch(better, worse), **common))
    return cells


CLAIM_COLUMNS = ("claim", "where", "better", "better_mean", "better_low", "better_high", "better_n", "worse",
                 "worse_mean", "worse_low", "worse_high", "worse_n", "effect", "effect_low", "effect_high", "p",
                 "p_adjusted", "p_against_adjusted", "tests", "verdict", "noise_floor", "below_floor", "left_out")


def claims_frame(claims: Claims):
    """One row per ordering cell (pandas): both sides' means, intervals and n, the effect and its interval, the raw
    and Holm-adjusted p-values, the verdict and the noise floor. claims.csv of a report; `ablate.results.claims`."""
    import json

    import pandas as pd

    rows = []
    for cell in claims.cells:
        c = cell.comparison
        side = {}
        for name in ("better", "worse"):
            e = getattr(c, name) if c is not None else None
            side[name] = (json.dumps(getattr(cell.ordering, name), sort_keys=True),
                          *((e.mean, e.low, e.high, e.n) if e is not None else (None, None, None, 0)))
        rows.append((cell.ordering.claim, json.dumps(cell.where, sort_keys=True, default=str), *side["better"],
                     *side["worse"], c.effect if c else None, c.low if c else None, c.high if c else None,
                     c.p if c else None, cell.p_adjusted, cell.p_against_adjusted, claims.tests, cell.verdict,
                     cell.floor, cell.below_floor, cell.left_out))
    return pd.DataFrame.from_records(rows, columns=list(CLAIM_COLUMNS))
