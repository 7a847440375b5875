"""Runs as reports see them: each run's row, its axes and the published numbers it is compared with, loaded from
the results database (and held aside from the cyclic collector while a report is built); which axes vary among
runs, and the labels that name them."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.config import Reference, SweepSpec, TrialConfig
from ablate.config.errors import AblateError
from ablate.config.sweep import _same

UNFINISHED = ("pending", "running", "failed", "preempted", "cancelled")


@dataclass
class RunView:
    """A run as reports see it: its row, its axes (options flattened with defaults) and its reference."""

    row: Any
    axes: dict[str, Any]
    reference: Reference | None
    trial: TrialConfig | None = None
    sweep: str = ""  # the sweep's name

    def cell(self, key: str) -> Any:
        return self.axes.get(key)


def load_views(engine: sa.Engine, sweep: str) -> tuple[SweepSpec, list[RunView]]:
    with store.session_factory(engine)() as session:
        row = session.scalar(sa.select(store.Sweep).where(store.Sweep.name == sweep))
        if row is None:
            known = session.scalars(sa.select(store.Sweep.name)).all()
            raise AblateError(f"no sweep named {sweep!r} in the results DB; known: {', '.join(known) or 'none yet'}")
        spec = SweepSpec.model_validate(row.spec)
        runs = list(session.scalars(sa.select(store.Run).where(store.Run.sweep_id == row.id).order_by(store.Run.trial_index)))
    views = []
    for r in runs:
        trial = TrialConfig.model_validate(r.config)
        matching = [ref for ref in spec.reference if ref.matches(trial)]
        ref = max(matching, key=lambda x: len(x.match)) if matching else None
        views.append(RunView(row=r, axes=trial.axes(), reference=ref, trial=trial, sweep=sweep))
    return spec, views


@contextmanager
def _long_lived() -> Iterator[Callable[[], None]]:
    """A report holds a view of every run (100,000 at a lab's scale) to its end. Python's cyclic collector would
    walk them all again each time a few hundred thousand new objects (ORM rows, metric rows) are made: half the
    CPU of loading them, and of drawing after. Collection waits while they load; `loaded()` then sets what is
    alive aside (gc.freeze) until the report is built, and the collector runs as usual on what comes after.
    Unfrozen at the end: in a long-lived process (a notebook) their cycles are collected as ever."""
    enabled = gc.isenabled()
    gc.disable()
    frozen = False

    def loaded() -> None:
        nonlocal frozen
        gc.freeze()
        frozen = True
        if enabled:
            gc.enable()

    try:
        yield loaded
    finally:
        if frozen:
            gc.unfreeze()
        if enabled:
            gc.enable()


def _matches(view: RunView, where: dict[str, Any]) -> bool:
    return all(_same(view.axes.get(k), v) for k, v in where.items())


def _varying(views: list[RunView], exclude: set[str]) -> list[str]:
    keys = sorted({k for v in views for k in v.axes} - exclude - {"seed"})
    # an option one family lacks (None) does not make an axis vary; differing values do
    return [k for k in keys if len({repr(v.axes.get(k)) for v in views if v.axes.get(k) is not None}) > 1]


def _label(axes: dict[str, Any], keys: list[str]) -> str:
    short = {"d_model": "d", "layers": "n", "heads": "h", "batch_size": "b", "context": "ctx"}
    return ", ".join(f"{short.get(k, k.removeprefix('options.'))}={axes.get(k)}" for k in keys)


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))
