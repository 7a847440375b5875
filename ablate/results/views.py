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
    shared = Shared()
    runs = read_pages(engine, shared.select().where(store.Run.sweep_id == row.id))
    validated: dict[bytes, tuple[TrialConfig, dict[str, Any]]] = {}
    views = [view_of(spec, r, *trial_axes(r.config, shared.keys.pop(id(r.config)), validated), sweep) for r in runs]
    with_every_varying_field(views)
    check_seeds(views)
    return spec, views


def view_of(spec: SweepSpec, row: Any, trial: TrialConfig, axes: dict[str, Any], sweep: str) -> RunView:
    """A run's view: its row, its axes, and the spec's reference that matches them most closely."""
    matching = [ref for ref in spec.reference if ref.matches_axes(axes)]
    ref = max(matching, key=lambda x: len(x.match)) if matching else None
    return RunView(row=row, axes=axes, reference=ref, trial=trial, sweep=sweep)


PAGE = 10_000  # runs a query reads: the driver holds a whole result's text while its rows are made


def read_pages(engine: sa.Engine, query: sa.Select) -> list[sa.Row]:
    """The query's runs in trial order, read PAGE at a time by id (the primary key's index: a page costs the
    server no sort of the sweep). Read at once, the 100,000 runs of a big sweep held 400 MB more at the peak
    (psycopg's text of every row, beside the rows), and were slower to make. (yield_per, a server-side cursor,
    held less too, but its rows lay scattered in memory: every later pass over them read them up to 2x slower.)"""
    runs: list[sa.Row] = []
    with engine.connect() as conn:
        while True:
            after = store.Run.id > runs[-1].id if runs else sa.true()
            page = conn.execute(query.where(after).order_by(store.Run.id).limit(PAGE)).all()
            runs += page
            if len(page) < PAGE:
                runs.sort(key=lambda r: r.trial_index)  # stable: a trial index two runs share, in id order
                return runs


def trial_axes(config: dict[str, Any], key: bytes, validated: dict[bytes, tuple[TrialConfig, dict[str, Any]]]
           ) -> tuple[TrialConfig, dict[str, Any]]:
    """A run's trial and axes, validated once per configuration (100,000 runs are a few hundred configurations
    and their seeds; validating each cost 0.3 ms). The seeds of a configuration share its TrialConfig (a copy per
    run cost 2 CPU-s at 100,000 runs): its seed is the first one's; the run's own is in its axes."""
    if key not in validated:
        trial = TrialConfig.model_validate(config)
        validated[key] = (trial, trial.axes())
    trial, axes = validated[key]
    return trial, {**axes, "seed": config.get("seed", 0)}


class Shared:
    """The runs' JSON columns read as text and parsed as SQLAlchemy makes each row, each holding the values of an
    equal one before it: a configuration's seeds, equal but for the seed, hold the first one's values (one dataset
    dict, not one per run), and runs with equal library versions one dict of them. Shared as each row is
    parsed, the copies are freed at once and their memory taken by the next row's (shared after every row was
    parsed, they left holes among the rows; at 100,000 runs, 80 MB more held and later passes slower). These rows
    are for reading: a shared value must not be mutated. `keys`: each config's configuration (its JSON without
    the seed), by the config's id, for as long as the rows hold them."""

    def __init__(self) -> None:
        self.firsts: dict[bytes, tuple[bytes, dict[str, Any]]] = {}
        self.versions: dict[bytes, dict[str, Any]] = {}
        self.keys: dict[int, bytes] = {}

    def select(self) -> sa.Select:
        """Every column of the runs table, the JSON ones parsed and shared here."""
        return sa.select(*(self.column(c) if c.name in ("config", "library_versions") else c
                           for c in store.Run.__table__.columns))

    def column(self, column: sa.Column) -> Any:
        kind = _SharedJSON(self.config if column.name == "config" else self.library_versions)
        return sa.type_coerce(sa.cast(column, sa.Text), kind).label(column.name)

    def config(self, config: Any) -> Any:
        import orjson

        if not isinstance(config, dict):
            return config
        key = orjson.dumps({k: v for k, v in config.items() if k != "seed"}, option=orjson.OPT_SORT_KEYS)
        key, first = self.firsts.setdefault(key, (key, config))  # its first key: each dump held 10 KB of memory
        if first is not config:
            given, seed = "seed" in config, config.get("seed")
            config.update(first)  # equal values (the key says so: JSON tells 1 from 1.0 and true), held once
            if given:
                config["seed"] = seed
            else:
                config.pop("seed", None)
        self.keys[id(config)] = key
        return config

    def library_versions(self, value: Any) -> Any:
        """The first equal dict itself (nothing in it is a run's own, unlike a config's seed; a dict of them per
        run held 35 MB at 100,000 runs)."""
        import orjson

        if isinstance(value, dict):
            return self.versions.setdefault(orjson.dumps(value, option=orjson.OPT_SORT_KEYS), value)
        return value


class _SharedJSON(sa.types.TypeDecorator):
    """A JSON column cast to text, parsed (as the engine's own JSON is: orjson, Python's json for NaN) and passed
    to `share` row by row."""

    impl = sa.Text
    cache_ok = False  # each load's own memo

    def __init__(self, share: Any) -> None:
        super().__init__()
        self.share = share

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> Any:
        from ablate.store.engine import json_loads

        return None if value is None else self.share(json_loads(value))


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
