"""The search space: checking a spec's search block, the grid sampler's values, how many trials a search plans,
and sampling one trial's config from the block (defaults + search.base + the sampled parameters)."""

from __future__ import annotations

import importlib
import math
from typing import Any

import optuna
from pydantic import ValidationError

from ablate.config.errors import AblateError, SpecError, did_you_mean
from ablate.config import (GRID_FIELDS, SWEEP_LEVEL_FIELDS, SearchBlock, SearchParam, SweepSpec, TrialConfig,
                         with_recipe)

# ---------------------------------------------------------------- checks


def check_search(spec: SweepSpec, source: str = "<spec>") -> SearchBlock:
    """The spec's search block, with the problems pydantic cannot see (base keys, `when` references, sampler fit)."""
    search = spec.search
    if search is None:
        raise AblateError(f"{source}: sweep {spec.name!r} has no `search:` block; add search: {{parameters: ...}}, "
                          "or run its grid with `ablate sweep run`")
    problems = []
    for key in search.base:
        if key in SWEEP_LEVEL_FIELDS:
            problems.append(f"search.base.{key}: '{key}' is set once per sweep at the top level")
        elif key not in GRID_FIELDS:
            problems.append(f"search.base: unknown trial field '{key}'{did_you_mean(key, GRID_FIELDS)}")
    for name, param in search.parameters.items():
        if param.log and param.step is not None:
            problems.append(f"search.parameters.{name}: give log or step, not both")
        bad = [c for c in param.choices or () if c is not None and not isinstance(c, (bool, int, float, str))]
        if bad:
            problems.append(f"search.parameters.{name}.choices: Optuna takes numbers, strings, booleans or null "
                            f"(got {bad[0]!r})")
        for other in param.when or {}:
            if other == name:
                problems.append(f"search.parameters.{name}.when: a parameter cannot depend on itself")
            elif other not in search.parameters and other not in GRID_FIELDS and not other.startswith("options."):
                problems.append(f"search.parameters.{name}.when: '{other}' is neither a search parameter nor a trial "
                                f"field{did_you_mean(other, [*search.parameters, *GRID_FIELDS])}")
    if not problems:
        try:
            _sampling_order(search)
        except ValueError as exc:
            problems.append(f"search.parameters: {exc}")
    if search.sampler == "grid":
        for name, param in search.parameters.items():
            if param.when:
                problems.append(f"search.parameters.{name}.when: the grid sampler needs every parameter in every trial; "
                                "drop `when` or use sampler: tpe")
            elif param.type != "categorical" and param.step is None:
                problems.append(f"search.parameters.{name}: the grid sampler needs choices (type: categorical) "
                                "or a step to enumerate low..high")
    if problems:
        raise SpecError(problems, source)
    if search.sampler == "cmaes":
        require_cmaes()
    return search


def require_cmaes() -> None:
    try:
        importlib.import_module("cmaes")  # only whether it imports
    except ImportError:
        raise AblateError("sampler cmaes needs the `cmaes` package: pip install cmaes (or use sampler: tpe)") from None


def _sampling_order(search: SearchBlock) -> list[str]:
    """Parameters in an order where each comes after the search parameters its `when` reads."""
    order: list[str] = []
    pending = dict(search.parameters)
    while pending:
        ready = [n for n, p in pending.items() if not any(d in pending for d in (p.when or {}))]
        if not ready:
            raise ValueError(f"the `when` conditions of {sorted(pending)} depend on each other in a cycle")
        for name in ready:
            order.append(name)
            del pending[name]
    return order


def grid_space(search: SearchBlock) -> dict[str, list[Any]]:
    """Every value of every parameter, for the grid sampler (choices, or low..high by step)."""
    space = {}
    for name, p in search.parameters.items():
        if p.type == "categorical":
            space[name] = list(p.choices or ())
        else:
            count = math.floor((p.high - p.low) / p.step + 1e-9) + 1  # type: ignore[operator]
            values = [p.low + i * p.step for i in range(count)]  # type: ignore[operator]
            space[name] = [int(v) for v in values] if p.type == "int" else [round(v, 12) for v in values]
    return space


def planned_trials(search: SearchBlock, n_trials: int | None = None) -> int:
    """n_trials, capped at the grid's size for the grid sampler (it has nothing new to offer after that)."""
    n = n_trials or search.n_trials
    if search.sampler == "grid":
        n = min(n, math.prod(len(v) for v in grid_space(search).values()))
    return n


# ---------------------------------------------------------------- sampling a trial


def suggest_trial(trial: optuna.Trial, spec: SweepSpec) -> TrialConfig:
    """Sample the trial's parameters over defaults + search.base; raises ValueError if the result is no valid trial.

    A parameter with `when: {key: value}` is sampled only when that field (sampled or fixed) has that value,
    or one of them when `value` is a list.
    """
    search = spec.search
    values = {k: v for k, v in {**spec.defaults, **search.base}.items() if k != "options"}
    options = {**(spec.defaults.get("options") or {}), **(search.base.get("options") or {})}
    for name in _sampling_order(search):
        param = search.parameters[name]
        current = {**values, **{f"options.{k}": v for k, v in options.items()}}
        if not all(_matches(current.get(key), want) for key, want in (param.when or {}).items()):
            continue
        value = _suggest(trial, name, param)
        if name.startswith("options."):
            options[name.removeprefix("options.")] = value
        else:
            values[name] = value
    try:
        return TrialConfig(**with_recipe(spec.recipe, {**values, "options": options}),
                           **{k: getattr(spec, k) for k in SWEEP_LEVEL_FIELDS})
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or 'trial'}: {e['msg'].removeprefix('Value error, ')}"
                    for e in exc.errors()]
        raise ValueError("; ".join(problems)) from None


def _matches(value: Any, want: Any) -> bool:
    return value in want if isinstance(want, (list, tuple)) else value == want


def _suggest(trial: optuna.Trial, name: str, p: SearchParam) -> Any:
    if p.type == "categorical":
        return trial.suggest_categorical(name, list(p.choices or ()))
    if p.type == "int":
        return trial.suggest_int(name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)  # type: ignore[arg-type]
    return trial.suggest_float(name, p.low, p.high, step=p.step, log=p.log)  # type: ignore[arg-type]

