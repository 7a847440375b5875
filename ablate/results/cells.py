"""What one cell of a report is: exactly one configuration's seeds, and the runs it leaves out, with why.

A sweep's configurations are told apart by every field that differs between its trials' frozen configs
(`config.trial.varying_fields`), never by a hand-kept list of axes: `load_views` puts those fields among each
run's axes, and `split_axes` adds to a grouping the axes that still differ inside one of its groups, so no table
column, claim side or fitted law mixes two configurations as if they were seeds. `check_seeds` refuses two runs
of one configuration with one seed. `read_seeds` takes a cell's numbers and counts the runs that gave none, by
reason; `Seeds.said` writes them as every cell and claim line does: "1 of 4 diverged", "2 of 4 not reached".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ablate.config.errors import AblateError

DIVERGED = "diverged"


def config_key(view: Any) -> tuple:
    """A run's configuration: every axis but the seed."""
    return tuple(sorted((k, repr(x)) for k, x in view.axes.items() if k != "seed"))


def _held(view: Any) -> Any:
    """What tells a run's configuration here: its TrialConfig, which load_views gives all the seeds of one
    configuration (and from which it makes their axes, the seed aside); else the axes (the seed aside) as the
    objects that hold their values, which the seeds of one configuration share. Runs with one `_held` have one
    config_key. Valid while the views are alive."""
    trial = getattr(view, "trial", None)
    if trial is not None:
        return id(trial)
    return tuple((k, id(x)) for k, x in view.axes.items() if k != "seed")


def one_per_configuration(views: Iterable[Any]) -> list[Any]:
    """The first run of each configuration (by `_held`), in order: what differs between runs, the seed aside,
    differs between these (1 run in 20 of a sweep of 20 seeds to read)."""
    first: dict[Any, Any] = {}
    for v in views:
        first.setdefault(_held(v), v)
    return list(first.values())


def config_keys(views: list[Any]) -> list[tuple]:
    """config_key of each view, made once per configuration (its seeds found by `_held`)."""
    made: dict[Any, tuple] = {}
    keys = []
    for v in views:
        held = _held(v)
        key = made.get(held)
        if key is None:
            key = made[held] = config_key(v)
        keys.append(key)
    return keys


def differing(views: Iterable[Any], exclude: Iterable[str] = ()) -> list[str]:
    """The axes (a missing one counts as None) whose values differ between these runs, the seed aside."""
    views = one_per_configuration(views)
    skip = {"seed", *exclude}
    keys = dict.fromkeys(k for v in views for k in v.axes if k not in skip)
    return [k for k in keys if varies(views, k)]


def varies(views: list[Any], key: str, none_counts: bool = True) -> bool:
    """Two runs whose `key` differs (by repr; a missing axis is None, which counts unless `none_counts` is false):
    stops at the first such pair, so over 100,000 runs an axis that varies costs a few reads, not 100,000 (one
    that does not: give one_per_configuration's runs)."""
    first = None
    for v in views:
        value = v.axes.get(key)
        if value is None and not none_counts:
            continue
        text = repr(value)
        if first is None:
            first = text
        elif text != first:
            return True
    return False


def split_axes(views: list[Any], keys: list[str]) -> list[str]:
    """`keys`, then whatever axes still differ inside a group of runs that agree on them: grouped by the result,
    every group is one configuration."""
    groups: dict[tuple, list[Any]] = {}
    for v in views:
        groups.setdefault(tuple(repr(v.axes.get(k)) for k in keys), []).append(v)
    extra: dict[str, None] = {}
    for members in groups.values():
        extra.update(dict.fromkeys(differing(members, keys)))
    return [*keys, *sorted(extra)]


def check_seeds(views: list[Any]) -> None:
    """Two runs of one configuration with one seed would be counted as two seeds: refused, naming both."""
    seen: dict[tuple, Any] = {}
    for v, config in zip(views, config_keys(views)):
        key = (config, repr(v.axes.get("seed")))
        other = seen.setdefault(key, v)
        if other is v:
            continue
        a, b = other.row, v.row
        how = [k for k in sorted({*(a.config or {}), *(b.config or {})})
               if (a.config or {}).get(k) != (b.config or {}).get(k)] if hasattr(a, "config") else []
        written = f", written differently ({', '.join(how)})" if how else ""
        raise AblateError(
            f"runs {a.id} and {b.id} of sweep {v.sweep or '?'} are one configuration with one seed "
            f"({v.axes.get('seed')}){written}: a cell would count "
            "that seed twice. Remove one from the sweep's spec (they train the same thing) and delete its row, or "
            "give one of them another seed.")


@dataclass
class Seeds:
    """A cell's numbers (one per run that gave one) and the runs that gave none, counted by reason."""

    runs: list[Any]
    values: list[float]
    left: dict[str, int] = field(default_factory=dict)  # reason -> runs

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def diverged(self) -> int:
        return self.left.get(DIVERGED, 0)

    def said(self) -> str:
        """What the cell left out: '1 of 4 diverged, 1 of 4 running' ('' when nothing)."""
        return ", ".join(f"{k} of {len(self.runs)} {reason}" for reason, k in self.left.items())

    def reason(self) -> str:
        """Why a cell with no number has none: its runs' one reason, else how many reasons."""
        if len(self.left) == 1:
            return next(iter(self.left))
        return "no runs compared" if not self.left else "; ".join(self.left)


def read_seeds(runs: list[Any], value: Callable[[Any], float | None], min_steps: int | None = None,
               enough: Callable[[Any, int], bool] | None = None) -> Seeds:
    """The runs' numbers (completed runs with a finite `value`), and the rest counted by why they gave none: their
    status (diverged, oom, running, not reached, ...), a non-finite loss (diverged), no loss, or fewer than
    `min_steps` steps (`enough(view, min_steps)` says which are enough)."""
    seeds = Seeds(runs=list(runs), values=[])
    for v in runs:
        status = v.row.status
        x = value(v) if status == "completed" else None
        if status != "completed":
            reason = status
        elif x is None:
            reason = "with no loss"
        elif not math.isfinite(x):
            reason = DIVERGED
        elif min_steps is not None and enough is not None and not enough(v, min_steps):
            reason = f"under {min_steps} steps"
        else:
            seeds.values.append(x)
            continue
        seeds.left[reason] = seeds.left.get(reason, 0) + 1
    return seeds
