"""Grid expansion: a sweep's blocks become its trials, in grid order, each checked where it came from."""

from __future__ import annotations

import itertools
import math
from typing import Any

from pydantic import ValidationError

from ablate.config import registry
from ablate.config.errors import SpecError, did_you_mean, flow, one_of, show as _show
from ablate.config.sweep import SweepSpec, same_value
from ablate.config.trial import AXIS_FIELDS, SWEEP_LEVEL_FIELDS, TrialConfig, with_recipe

MAX_TRIALS = 10_000

def axes_of(block: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    """(key, values) per axis of a block; option axes are keyed 'options.NAME'."""
    axes: list[tuple[str, list[Any]]] = []
    for key, value in block.items():
        if key in ("zip", "seeds"):
            continue
        if key == "options":
            for opt, ov in value.items():
                axes.append((f"options.{opt}", ov if isinstance(ov, list) else [ov]))
        else:
            axes.append((key, value if isinstance(value, list) else [value]))
    return axes


def count_trials(spec: SweepSpec) -> int:
    total = 0
    for block in spec.grid:
        n = math.prod(len(v) for _, v in axes_of(block))
        if "zip" in block:
            n *= len(next(iter(block["zip"].values())))
        seeds = block.get("seeds")
        n *= seeds if isinstance(seeds, int) else len(seeds) if seeds else 1
        total += n
    return total * spec.adaptive.seeds.min if spec.adaptive is not None else total


def count_cells(spec: SweepSpec) -> int:
    """The configurations of an adaptive sweep (its grid without seeds): each runs min to max seeds."""
    return count_trials(spec) // spec.adaptive.seeds.min if spec.adaptive is not None else count_trials(spec)


def expand_grid(spec: SweepSpec, source: str = "<spec>", max_trials: int = MAX_TRIALS) -> list[TrialConfig]:
    """All trials of the sweep, in grid order, duplicates (same fingerprint) removed."""
    _check_size(spec, source, max_trials)
    trials: list[TrialConfig] = []
    seen: set[str] = set()
    problems: dict[str, list[str]] = {}  # a mistake -> the trials it breaks
    sweep_level = {k: getattr(spec, k) for k in SWEEP_LEVEL_FIELDS}
    for i, block in enumerate(spec.grid):
        axes = axes_of(block)
        zipped = block.get("zip") or {}
        zip_rows = [dict(zip(zipped, row)) for row in zip(*zipped.values())] if zipped else [{}]
        seeds = spec.adaptive.seeds.min if spec.adaptive is not None else block.get("seeds")  # a race's first round
        seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds) if seeds else [None]
        for combo in itertools.product(*(v for _, v in axes)):
            for zrow in zip_rows:
                for seed in seed_list:
                    values = {**{k: v for k, v in spec.defaults.items() if k != "options"}}
                    options = dict(spec.defaults.get("options") or {})
                    for key, value in list(zip((k for k, _ in axes), combo)) + list(zrow.items()):
                        if key.startswith("options."):
                            options[key.removeprefix("options.")] = value
                        else:
                            values[key] = value
                    if seed is not None:
                        values["seed"] = seed
                    values["options"] = options
                    origin = {k: f"grid[{i}].{k}" if (k in block or k in zipped) else f"defaults.{k}" for k in values}
                    values = with_recipe(spec.recipe, values)
                    origin.update({k: f"recipe {spec.recipe}: {k}" for k in values if k not in origin})
                    try:
                        trial = TrialConfig(**values, **sweep_level)
                    except ValidationError as exc:
                        label = ", ".join(f"{k}={str(values[k])[:24]}" for k in ("architecture", "d_model", "heads")
                                          if k in values)
                        for err in exc.errors():
                            key = str(err["loc"][0]) if err["loc"] else _field_named_by(err["msg"])
                            where = origin.get(key, f"grid[{i}]") + "".join(
                                f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"][1:]
                            )
                            if err["type"] == "missing":
                                msg = f"required trial field '{key}' is set neither in defaults nor in the block"
                                where = f"grid[{i}]"
                            else:
                                msg = err["msg"].removeprefix("Value error, ")
                                inp = err.get("input")
                                if not isinstance(inp, dict) and err["type"] != "value_error":
                                    msg += f" (got {_show(inp)})"
                                if where.startswith("defaults.") and isinstance(inp, list):
                                    msg += (f"; a list of values is a grid axis: put it in a grid block, e.g. "
                                            f"grid: [{{{key}: {_show(inp)}}}]")
                            problems.setdefault(f"{where}: {msg}", []).append(label)
                        continue
                    fp = trial.fingerprint()
                    if fp not in seen:
                        seen.add(fp)
                        trials.append(trial)
    if problems:  # each mistake once, with the first trial it breaks (a default breaks every one)
        raise SpecError([f"{said} [trial {labels[0]}" + (f"; and {len(labels) - 1} more trial(s)]" if len(labels) > 1
                                                         else "]") for said, labels in problems.items()], source)
    later: list[str] = []
    for j, ref in enumerate(spec.reference):
        if not any(ref.matches(t) for t in trials):
            later.append(f"reference[{j}].match: {_show(ref.match)} matches no trial of the grid; "
                            "check the axis names and values")
    later += _check_report_axes(spec, trials)
    later += _check_claim_sides(spec, trials)
    later += _check_race_can_test(spec, trials)
    if later:
        raise SpecError(later, source)
    return trials


def _check_size(spec: SweepSpec, source: str, max_trials: int) -> None:
    """The grid expands to some trials and not too many; an adaptive sweep's most trials fit too."""
    n = count_trials(spec)
    if n == 0:
        raise SpecError(["grid: expands to 0 trials; give every axis at least one value"], source)
    if n > max_trials:
        raise SpecError(
            [f"grid: expands to {n:,} trials, over the limit of {max_trials:,}; narrow the grid or pass --max-trials {n}"],
            source,
        )
    if spec.adaptive is None:
        return
    if spec.adaptive.mode == "best" and count_cells(spec) < 2:
        raise SpecError(["adaptive.mode: best races the sweep's cells against each other, and this grid has one; "
                         "give an axis two values or more"], source)
    most = count_cells(spec) * spec.adaptive.seeds.max
    if most > max_trials:
        raise SpecError([f"adaptive.seeds.max: {count_cells(spec):,} cells at up to {spec.adaptive.seeds.max} seeds "
                         f"each is {most:,} trials, over the limit of {max_trials:,}; lower max or pass --max-trials "
                         f"{most}"], source)


def report_axes(spec: SweepSpec, trials: list[TrialConfig]) -> set[str]:
    """The axis names reports can group, filter and order by: those of TrialConfig.axes() for these trials,
    and for a search the options its parameters (or its architecture choices) can bring in."""
    known = set(AXIS_FIELDS)
    for trial in trials:
        known.update(trial.axes())
    if spec.search is not None:
        known.update(n for n in spec.search.parameters if n.startswith(("options.", "objective_options.")))
        arch = spec.search.parameters.get("architecture")
        for name in (arch.choices or ()) if arch is not None else ():
            cls = registry.options_model(name) if isinstance(name, str) and name in registry.families() else None
            known.update(f"options.{k}" for k in getattr(cls, "model_fields", {}))
    return known


def _check_report_axes(spec: SweepSpec, trials: list[TrialConfig]) -> list[str]:
    """Unknown axis names in report tables and orderings: a typo there would silently match nothing."""
    known = report_axes(spec, trials)
    named: list[tuple[str, str]] = []
    for i, table in enumerate(spec.report.tables):
        named += [(f"report.tables[{i}].group_by", n) for n in table.group_by]
        named += [(f"report.tables[{i}].columns", table.columns)]
        named += [(f"report.tables[{i}].where", n) for n in table.where]
    for j, order in enumerate(spec.report.orderings):
        for part in ("better", "worse"):
            named += [(f"report.orderings[{j}].{part}", n) for n in getattr(order, part)]
        named += [(f"report.orderings[{j}].at", n) for n in order.at]
    return [f"{where}: '{name}' is not an axis of this sweep's trials{did_you_mean(name, known)}; axes: {one_of(known)}"
            for where, name in named if name not in known]


def _check_claim_sides(spec: SweepSpec, trials: list[TrialConfig]) -> list[str]:
    """A claim compares two configurations: a trial that both of its sides match would be compared with itself
    (p = 1, counted in Holm's m) while the configuration it should meet is dropped."""
    problems = []
    for j, order in enumerate(spec.report.orderings):
        both = [t for t in trials if _matches(t, order.better) and _matches(t, order.worse)]
        if both:
            other = "matches" if order.parity else "worse"
            example = " ".join(f"{k}={v}" for k, v in both[0].axes().items() if k in {*order.better, *order.worse})
            problems.append(f"report.orderings[{j}]: better {flow(order.better)} and {other} {flow(order.worse)} "
                            f"both match {len(both)} trial(s) (e.g. {example}), which would be compared with "
                            "themselves; give the sides values of one axis that tell them apart, e.g. "
                            "better: {architecture: mixer}, worse: {architecture: llama}")
    return problems


def _check_race_can_test(spec: SweepSpec, trials: list[TrialConfig]) -> list[str]:
    """A race whose runs all stop short of report.min_steps gets no number from any cell: every look is n = 0 and
    each round adds seeds for nothing."""
    steps = [t.budget.steps for t in trials]
    if spec.adaptive is None or not steps or None in steps or max(steps) >= spec.report.min_steps:
        return []
    return [f"adaptive: every trial trains budget.steps={max(steps)} steps or fewer, under report.min_steps="
            f"{spec.report.min_steps}, so no cell of the race gets a number and each round would add seeds for "
            f"nothing; raise budget.steps to {spec.report.min_steps} or more, or lower report.min_steps"]


def _matches(trial: TrialConfig, where: dict[str, Any]) -> bool:
    axes = trial.axes()
    return all(k in axes and same_value(axes[k], v) for k, v in where.items())


def _field_named_by(message: str) -> str:
    """The trial field a whole-trial validation message is about (for its key path)."""
    message = message.removeprefix("Value error, ")
    for prefix, field in (("objective_options", "objective_options"), ("objective ", "objective"), ("heads=", "heads"), ("kv_heads=", "kv_heads"), ("unknown architecture", "architecture"),
                          ("unknown objective", "objective"), ("unknown ", "options"), ("option ", "options")):
        if message.startswith(prefix):
            return field
    return ""


