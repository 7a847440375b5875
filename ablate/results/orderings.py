"""The study's published orderings tested on our runs, and the noise floor they are read against.

`check_claims` compares, for each ordering, one configuration of its better side with one of its worse side:
the runs matching each side are split by every axis that differs among them (cells.py), the axes both sides
share values of are held equal (the ordering's `at` axes and any other), and an axis only one side varies splits
that side. Each cell compares its sides across seeds (stats.welch); the verdicts read the two-sided p-values
Holm-adjusted over every comparison of the report, and the effect's sign; where the claim has a smallest effect
of interest (SESOI), two one-sided tests that the effect lies within ±SESOI, Holm-adjusted over the report's
claims with one, can make it "equivalent". A run gives no number when it did not
complete, its loss is not finite, or it trained fewer than the report's `min_steps` steps (under `--at`, fewer
steps by the budget read); each cell says what it left out and why. A side that lost seeds to divergence is
tested with each counted at the comparison's worst finished loss whenever leaving them out could flatter it (the
claim's better side for "holds", its worse side for "reversed"): survivors alone overstate a side. (Counted at the
side's own worst, a seed added at an observed value only raises n, and Welch's p fell in every case tried: no
check.) `noise_floor` is the seed-to-seed standard deviation of each architecture's test loss, pooled over its
configurations: one number per architecture for the whole report, flagged beside any effect smaller than the
floor of either side. One code path for the report, the UI and `ablate.results.claims`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ablate.config import Ordering, SweepSpec
from ablate.config.errors import flow
from ablate.results import stats
from ablate.results.cells import Seeds, config_keys, differing, read_seeds, split_axes
from ablate.results.equal import RowAt
from ablate.results.views import RunView, matches_where, sort_key

TOO_FEW_STEPS = "too few steps"

Value = Callable[[RunView], "float | None"]  # the number a run is compared by (its final test loss, by default)


def final_eval_loss(view: RunView) -> float | None:
    return view.row.final_eval_loss


def comparable(view: RunView, min_steps: int) -> bool:
    """A run that trained at least `min_steps` optimizer steps (read at a budget: by that budget; a run of unknown
    steps counts)."""
    steps = view.row.steps_read if isinstance(view.row, RowAt) else view.row.steps
    return steps is None or steps >= min_steps


@dataclass
class ClaimCell:
    """One configuration of an ordering's better side against one of its worse side, the axes they share held
    equal (`where`): the comparison of their finished seeds, the test the verdict reads, its Holm-adjusted p."""

    ordering: Ordering
    where: dict[str, Any]  # the `at` axes and the axes both sides share, held equal
    better: Seeds
    worse: Seeds
    comparison: stats.Comparison | None  # of the seeds that finished; None: a side has none
    better_where: dict[str, Any] = field(default_factory=dict)  # what else names this side's configuration
    worse_where: dict[str, Any] = field(default_factory=dict)
    test: stats.Comparison | None = None  # what the verdict reads (diverged seeds counted at the worst loss)
    counted_worst: tuple[str, int, float] | None = None  # (side, diverged seeds, the loss they were counted at)
    verdict: str = stats.UNTESTED
    p_adjusted: float | None = None  # the two-sided p of `test`, Holm-adjusted over the report
    sesoi: float | None = None  # the smallest effect of interest (nats): the ordering's, or the report's
    p_equivalent: float | None = None  # the TOST p of `test` within ±sesoi, Holm-adjusted over the report
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
    unmatched: list[tuple[Ordering, str]] = field(default_factory=list)  # a side no run matches, in words

    def of(self, ordering: Ordering) -> list[ClaimCell]:
        return [c for c in self.cells if c.ordering is ordering]

    def why_none(self, ordering: Ordering) -> str:
        """Why an ordering has no cell: the side no run matches, or no pair of runs yet."""
        said = [why for order, why in self.unmatched if order is ordering]
        return said[0] if said else "no pair of runs to compare yet"


def noise_floor(views: list[RunView], min_steps: int = 0, value: Value = final_eval_loss
                ) -> dict[str, tuple[float | None, int]]:
    """Per architecture: the seed-to-seed std of `value`, pooled over its configurations (runs that differ only by
    seed), and the number of configurations with two seeds or more. The report's one floor: its tables print it."""
    configs: dict[tuple[str, tuple], list[float]] = {}
    for v, key in zip(views, config_keys(views)):
        x = value(v) if v.row.status == "completed" and comparable(v, min_steps) else None
        if x is None or not math.isfinite(x):
            continue
        configs.setdefault((str(v.axes.get("architecture")), key), []).append(x)
    by_arch: dict[str, list[list[float]]] = {}
    for (arch, _), values in configs.items():
        by_arch.setdefault(arch, []).append(values)
    return {arch: stats.pooled_std(groups) for arch, groups in sorted(by_arch.items())}


def check_claims(spec: SweepSpec, views: list[RunView], value: Value = final_eval_loss,
                 min_steps: int | None = None, floor: dict[str, tuple[float | None, int]] | None = None) -> Claims:
    """Each of the spec's orderings, configuration against configuration: Welch across seeds, the two-sided p
    Holm-adjusted over all of them. `floor`: noise_floor of these views, value and min_steps, where the caller
    has it already (a report's tables print the same one)."""
    min_steps = spec.report.min_steps if min_steps is None else min_steps
    floor = noise_floor(views, min_steps, value) if floor is None else floor
    result = Claims(floor=floor, min_steps=min_steps)
    for order in spec.report.orderings:
        result.cells += _cells_of(order, views, value, min_steps, floor)
        sides = [("better", order.better), ("matches" if order.parity else "worse", order.worse)]
        empty = [f"{name} {flow(where)}" for name, where in sides if not any(matches_where(v, where) for v in views)]
        if empty:
            result.unmatched.append((order, f"no run matches its {' or its '.join(empty)}"))
    tested = [c for c in result.cells if c.test is not None and c.test.tested]
    result.tests = len(tested)
    for cell in result.cells:
        cell.sesoi = spec.report.sesoi_of(cell.ordering)
    bounded = [c for c in tested if c.sesoi is not None]
    for cell, p in zip(bounded, stats.holm([stats.equivalence(c.test, c.sesoi) for c in bounded])):
        cell.p_equivalent = p
    for cell, p in zip(tested, stats.holm([c.test.p_two_sided for c in tested])):
        cell.p_adjusted = p
        cell.verdict = stats.verdict(p, cell.test.effect, sesoi=cell.sesoi, p_equivalent=cell.p_equivalent)
        if cell.ordering.parity:
            cell.verdict = stats.parity_text(cell.verdict, cell.sesoi)
    return result


def _cells_of(order: Ordering, views: list[RunView], value: Value, min_steps: int,
              floor: dict[str, tuple[float | None, int]]) -> list[ClaimCell]:
    sides = {"better": [v for v in views if matches_where(v, order.better)],
             "worse": [v for v in views if matches_where(v, order.worse)]}
    held = _held_equal(order, sides["better"], sides["worse"])
    pairs: dict[tuple, dict[str, list[RunView]]] = {}
    for name, members in sides.items():
        for v in members:
            pairs.setdefault(tuple(repr(v.axes.get(k)) for k in held), {"better": [], "worse": []})[name].append(v)
    cells = []
    for key in sorted(pairs, key=lambda k: [sort_key(_value_of(pairs[k], a)) for a in held]):
        both = pairs[key]
        if not both["better"] or not both["worse"]:
            continue  # one side never ran here: nothing to compare
        where = {a: _value_of(both, a) for a in held}
        for b_where, b_runs in _configurations(both["better"], held):
            for w_where, w_runs in _configurations(both["worse"], held):
                cells.append(_cell(order, where, b_where, b_runs, w_where, w_runs, value, min_steps, floor))
    return cells


def _held_equal(order: Ordering, better: list[RunView], worse: list[RunView]) -> list[str]:
    """The ordering's `at` axes, then every other axis that differs among its runs and has values on both sides
    (a side-only axis, like Llama's heads or a per-architecture batch size, splits that side instead)."""
    held = list(order.at)
    for k in differing(better + worse, exclude={*order.better, *order.worse, *held}):
        if {repr(v.axes.get(k)) for v in better} & {repr(v.axes.get(k)) for v in worse}:
            held.append(k)
    return held


def _configurations(runs: list[RunView], held: list[str]) -> list[tuple[dict[str, Any], list[RunView]]]:
    """A side's runs at one value of the held axes, one group per configuration, with the axes that tell them apart."""
    extra = split_axes(runs, held)[len(held):]
    groups: dict[tuple, list[RunView]] = {}
    for v in runs:
        groups.setdefault(tuple(repr(v.axes.get(k)) for k in extra), []).append(v)
    return [({k: members[0].axes.get(k) for k in extra}, members) for members in groups.values()]


def _value_of(both: dict[str, list[RunView]], axis: str) -> Any:
    return (both["better"] or both["worse"])[0].axes.get(axis)


def _cell(order: Ordering, where: dict[str, Any], b_where: dict[str, Any], b_runs: list[RunView],
          w_where: dict[str, Any], w_runs: list[RunView], value: Value, min_steps: int,
          floor: dict[str, tuple[float | None, int]]) -> ClaimCell:
    better = read_seeds(b_runs, value, min_steps, comparable)
    worse = read_seeds(w_runs, value, min_steps, comparable)
    archs = sorted({str(v.axes.get("architecture")) for v in b_runs + w_runs})
    known = [f for a in archs if (f := floor.get(a, (None, 0))[0]) is not None and math.isfinite(f)]
    cell = ClaimCell(ordering=order, where=where, better=better, worse=worse, comparison=None, better_where=b_where,
                     worse_where=w_where, floor=max(known) if known else None)
    if not better.values or not worse.values:
        empty = better if not better.values else worse
        reason = empty.reason()
        cell.verdict = TOO_FEW_STEPS if reason.startswith("under ") else reason
        return cell
    cell.comparison = cell.test = stats.welch(better.values, worse.values)
    flattered = "better" if cell.comparison.effect > 0 else "worse" if cell.comparison.effect < 0 else None
    side = better if flattered == "better" else worse if flattered == "worse" else None
    if side is not None and side.diverged:
        worst = max(better.values + worse.values)
        counted = side.values + [worst] * side.diverged
        cell.test = (stats.welch(counted, worse.values) if flattered == "better" else
                     stats.welch(better.values, counted))
        cell.counted_worst = (flattered, side.diverged, worst)
    return cell


CLAIM_COLUMNS = ("claim", "where", "better", "better_mean", "better_low", "better_high", "better_n", "better_left_out",
                 "worse", "worse_mean", "worse_low", "worse_high", "worse_n", "worse_left_out", "effect", "effect_low",
                 "effect_high", "p", "p_two_sided", "p_adjusted", "tests", "verdict", "counted_worst", "noise_floor",
                 "below_floor", "sesoi", "p_equivalent")


def side_name(cell: ClaimCell, side: str) -> dict[str, Any]:
    """A side's configuration as the ordering names it, with the axes only that side varies."""
    return {**getattr(cell.ordering, side), **getattr(cell, f"{side}_where")}


def label_of(match: dict[str, Any]) -> str:
    """A side as its values read: {'architecture': 'mixer', 'lr': 0.01} -> 'mixer 0.01'."""
    return " ".join(str(v) for v in match.values())


def worst_text(cell: ClaimCell) -> str:
    """'1 diverged seed of mixer counted at 3.150 (the comparison's worst finished loss)', '' when none was."""
    if cell.counted_worst is None:
        return ""
    side, k, loss = cell.counted_worst
    label = label_of(side_name(cell, side))
    return f"{k} diverged seed{'s' * (k > 1)} of {label} counted at {loss:.3f} (the comparison's worst finished loss)"


def claim_rows(claims: Claims) -> list[tuple[Any, ...]]:
    """One row per claim cell: both sides' means, intervals and n with what each left out, the effect and
    its interval, the one-sided p in the claim's direction, the two-sided p the verdict reads and its Holm
    adjustment, the verdict and the noise floor, as CLAIM_COLUMNS names them: claims.csv of a report."""
    import json

    rows = []
    for cell in claims.cells:
        c = cell.comparison
        side = {}
        for name in ("better", "worse"):
            e = getattr(c, name) if c is not None else None
            seeds = getattr(cell, name)
            side[name] = (json.dumps(side_name(cell, name), sort_keys=True, default=str),
                          *((e.mean, e.low, e.high, e.n) if e is not None else (None, None, None, seeds.n)),
                          seeds.said())
        rows.append((cell.ordering.claim, json.dumps(cell.where, sort_keys=True, default=str), *side["better"],
                     *side["worse"], c.effect if c else None, c.low if c else None, c.high if c else None,
                     c.p if c else None, cell.test.p_two_sided if cell.test else None, cell.p_adjusted,
                     claims.tests, cell.verdict, worst_text(cell), cell.floor, cell.below_floor, cell.sesoi,
                     cell.p_equivalent))
    return rows


def claims_frame(claims: Claims):
    """claim_rows as a pandas DataFrame: `ablate.results.claims`."""
    import pandas as pd

    return pd.DataFrame.from_records(claim_rows(claims), columns=list(CLAIM_COLUMNS))
