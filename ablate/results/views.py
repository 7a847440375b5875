"""Runs as the read side sees them: each run's row, its axes (options flattened with defaults) and the published
numbers it is compared with, loaded from the results database. The report, `ablate.results` and the statistics
(orderings.py) all read runs through `load_views`; its axes hold every field that differs between the sweep's
trials (cells.py: a cell is one configuration)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.config import Reference, SweepSpec, TrialConfig
from ablate.config.sweep import same_value
from ablate.config.trial import fields_that_differ
from ablate.results.cells import check_seeds


@dataclass
class RunView:
    """A run as reports see it: its row, its axes (options flattened with defaults) and its reference."""

    row: Any
    axes: dict[str, Any]
    reference: Reference | None
    trial: TrialConfig | None = None  # its configuration, shared by its seeds (the run's seed: axes["seed"])
    sweep: str = ""  # the sweep's name

    def cell(self, key: str) -> Any:
        return self.axes.get(key)


def load_views(engine: sa.Engine, sweep: str) -> tuple[SweepSpec, list[RunView]]:
    row = store.sweep_named(engine, sweep, store.Sweep.id, store.Sweep.spec)
    spec = SweepSpec.model_validate(row.spec)
    # rows, not ORM instances: a third of the memory and no instrumented attribute per read (a report reads
    # 100,000 runs' fields millions of times); a Row reads by the column names, which are the ORM's attribute names.
    # All at once: rows fetched in chunks (yield_per) held 300 MB less, but lay scattered in memory, and every later
    # pass over the runs read them up to 2x slower
    with engine.connect() as conn:
        runs = conn.execute(sa.select(store.Run.__table__).where(store.Run.sweep_id == row.id)
                            .order_by(store.Run.trial_index)).all()
    views = []
    validated: dict[bytes, tuple[TrialConfig, dict[str, Any], dict[str, Any]]] = {}
    versions: dict[bytes, dict[str, Any]] = {}
    for r in runs:
        trial, axes = _trial(r.config, validated)
        _share(r.library_versions, versions)
        matching = [ref for ref in spec.reference if ref.matches_axes(axes)]
        ref = max(matching, key=lambda x: len(x.match)) if matching else None
        views.append(RunView(row=r, axes=axes, reference=ref, trial=trial, sweep=sweep))
    with_every_varying_field(views)
    check_seeds(views)
    return spec, views


def _trial(config: dict[str, Any], validated: dict[bytes, tuple[TrialConfig, dict[str, Any], dict[str, Any]]]
           ) -> tuple[TrialConfig, dict[str, Any]]:
    """A run's trial and axes, validated once per configuration (100,000 runs are a few hundred configurations
    and their seeds; validating each cost 0.3 ms). The seeds of a configuration share its TrialConfig (a copy per
    run cost 2 CPU-s at 100,000 runs): its seed is the first one's; the run's own is in its axes. Their stored
    configs, equal but for the seed, hold the first one's values (one dataset dict, not one per run)."""
    import orjson

    key = orjson.dumps({k: v for k, v in config.items() if k != "seed"}, option=orjson.OPT_SORT_KEYS)
    if key not in validated:
        trial = TrialConfig.model_validate(config)
        validated[key] = (trial, trial.axes(), config)
    trial, axes, first = validated[key]
    seed = config.get("seed", 0)
    if first is not config:
        given = "seed" in config
        config.update(first)  # equal values (the key says so: JSON tells 1 from 1.0 and true), held once
        if given:
            config["seed"] = seed
        else:
            config.pop("seed", None)
    return trial, {**axes, "seed": seed}


def _share(value: Any, seen: dict[bytes, dict[str, Any]]) -> None:
    """A dict equal to one seen before (every run's library versions) holds that one's values, not its own."""
    import orjson

    if isinstance(value, dict) and value:
        first = seen.setdefault(orjson.dumps(value, option=orjson.OPT_SORT_KEYS), value)
        if first is not value:
            value.update(first)


def with_every_varying_field(views: list[RunView]) -> None:
    """Each view's axes, plus every field that differs between the sweep's frozen configs (weight_decay, warmup,
    budget.steps after a merge, ...): a cell is then one configuration, whatever the grid varied."""
    varying, flats = fields_that_differ([v.row.config for v in views], flat=lambda i: views[i].trial.flat())
    extra = [k for k in varying if not any(k in v.axes for v in views)]
    for v, flat in zip(views, flats):
        v.axes.update({k: flat.get(k) for k in extra})


def matches_where(view: RunView, where: dict[str, Any]) -> bool:
    return all(same_value(view.axes.get(k), v) for k, v in where.items())


def sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))
