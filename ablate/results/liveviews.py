"""A sweep's views held between reads, for what reads one sweep again and again while it trains (the dashboard's
study, the runner's study keeper): each read re-reads only the runs that changed since the one before.

A read asks the DB for every run's id, status and finish time (three small columns), then reads in full only the
runs that are new, whose status or finish moved, or that are running (a running run's notes may move; a sweep
runs a few at once). A configuration is validated once; the axes of every run are made again only when runs were
added or removed (a new configuration can make another field vary); under `report.at` only the changed runs that
completed have their curves read. What a read returns is what `load_views` and `read_runs_at` return over the
whole sweep at that moment (tests/results/test_liveviews.py checks it after every kind of change).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.config import SweepSpec, TrialConfig
from ablate.config.units import parse_at
from ablate.results.cells import check_seeds
from ablate.results.views import RunView, Shared, read_pages, trial_axes, view_of, with_every_varying_field

IN_CHUNK = 1_000  # run ids per query of changed runs


class LiveViews:
    """One sweep's views, held by its name; calling it returns (spec, views) as they are in the DB now."""

    def __init__(self, sweep: str) -> None:
        self.sweep = sweep
        self._lock = threading.Lock()  # the dashboard answers requests in threads
        self._reset(None, None)

    def _reset(self, fingerprint: str | None, spec: SweepSpec | None) -> None:
        self.fingerprint, self.spec = fingerprint, spec
        self.marks: dict[int, tuple[Any, ...]] = {}  # run id -> (status, finished_at) when last read
        self.views: dict[int, RunView] = {}  # run id -> its view, in trial order
        self.read: dict[int, RunView] = {}  # run id -> its view read at spec.report.at (when the spec has one)
        self.keys: dict[int, bytes] = {}  # run id -> its configuration (config JSON without the seed)
        self.shared = Shared()
        self.validated: dict[bytes, tuple[TrialConfig, dict[str, Any]]] = {}
        self.changed = 0  # runs read in full by the last read (what it cost beyond the marks)

    def __call__(self, engine: sa.Engine) -> tuple[SweepSpec, list[RunView]]:
        with self._lock:
            try:
                return self._refresh(engine)
            except BaseException:
                self._reset(None, None)  # nothing half-read is held: the next read reads the sweep whole
                raise

    def _refresh(self, engine: sa.Engine) -> tuple[SweepSpec, list[RunView]]:
        s, r = store.Sweep, store.Run
        sweep = store.sweep_named(engine, self.sweep, s.id, s.spec, s.spec_fingerprint)
        if sweep.spec_fingerprint != self.fingerprint or self.spec is None:  # a merge: new trials, new spec
            self._reset(sweep.spec_fingerprint, SweepSpec.model_validate(sweep.spec))
        with engine.connect() as conn:
            marks = {m.id: (m.status, m.finished_at) for m in
                     conn.execute(sa.select(r.id, r.status, r.finished_at).where(r.sweep_id == sweep.id))}
        changed = [i for i, m in marks.items() if self.marks.get(i) != m or m[0] == "running"]
        gone = self.views.keys() - marks.keys()
        self.changed = len(changed)
        if not changed and not gone:
            return self.spec, self._listed()
        rows = self._rows(engine, sweep.id, changed, everything=not self.views)
        added = any(row.id not in self.views for row in rows)
        for i in gone:
            for held in (self.marks, self.views, self.read, self.keys):
                held.pop(i, None)
        for row in rows:
            self.marks[row.id] = (row.status, row.finished_at)
            old = self.views.get(row.id)
            if old is None:
                self.keys[row.id] = self.shared.keys.pop(id(row.config))
                self.views[row.id] = view_of(self.spec, row, *trial_axes(row.config, self.keys[row.id], self.validated),
                                             self.sweep)
            else:  # its configuration, hence its axes, is the same: the row is new
                self.shared.keys.pop(id(row.config), None)
                self.views[row.id] = replace(old, row=row)
        if added or gone:
            self._axes_again()
        self._read_at(engine, [row.id for row in rows] if not (added or gone) else list(self.views))
        return self.spec, self._listed()

    def _rows(self, engine: sa.Engine, sweep_id: int, ids: list[int], everything: bool) -> list[Any]:
        """The runs `ids` in full (on the first read, the whole sweep a page at a time, as load_views reads it)."""
        query = self.shared.select().where(store.Run.sweep_id == sweep_id)
        if everything:
            return read_pages(engine, query)
        rows: list[Any] = []
        with engine.connect() as conn:
            for start in range(0, len(ids), IN_CHUNK):
                rows += conn.execute(query.where(store.Run.id.in_(ids[start:start + IN_CHUNK]))).all()
        return rows

    def _axes_again(self) -> None:
        """Runs came or went: every view's axes made again (a field may vary now, or no longer), the views put in
        trial order, and two runs of one configuration with one seed refused, as load_views does."""
        order = sorted(self.views.values(), key=lambda v: (v.row.trial_index, v.row.id))
        views = [view_of(self.spec, v.row, *trial_axes(v.row.config, self.keys[v.row.id], self.validated), self.sweep)
                 for v in order]
        with_every_varying_field(views)
        check_seeds(views)
        self.views = {v.row.id: v for v in views}

    def _read_at(self, engine: sa.Engine, ids: list[int]) -> None:
        """Under the spec's `report.at`, the views `ids` read at it (the curves of those that completed)."""
        at = parse_at(self.spec.report.at)
        if at is None:
            return
        from ablate.results.equal import read_at
        from ablate.results.points import points_around

        views = [self.views[i] for i in ids]
        curves = points_around(engine, [v.row.id for v in views if v.row.status == "completed"], at.kind, at.amount)
        self.read.update((v.row.id, v) for v in read_at(views, at, curves))

    def _listed(self) -> list[RunView]:
        held = self.read if parse_at(self.spec.report.at) is not None else self.views
        return [held[i] for i in self.views]
