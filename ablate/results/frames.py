"""Runs and metric points as pandas DataFrames, for notebooks, `ablate export`-style csv and the report."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ablate import store


def runs(sweep: str | None = None, url: str | None = None):
    """A DataFrame of runs (one row per trial), optionally of one sweep."""
    import pandas as pd

    engine = store.reader(url)
    q = sa.select(store.Run, store.Sweep.name.label("sweep")).join(store.Sweep, store.Run.sweep_id == store.Sweep.id)
    if sweep is not None:
        q = q.where(store.Sweep.id == _sweep_id(engine, sweep))
    with engine.connect() as conn:
        frame = pd.read_sql(q.order_by(store.Run.id), conn)
    return _with_varying(_integers(frame))


def runs_of(rows: list[Any], sweep: str):
    """The DataFrame `runs(sweep)` reads, from the sweep's runs already in memory (rows of the runs table, or Runs) (a report has loaded every
    run: reading 100,000 again, their JSON parsed again, cost 6 CPU-s): the same columns, order and types."""
    import pandas as pd

    mapper = sa.inspect(store.Run)
    keys = [(column.name, mapper.get_property_by_column(column).key) for column in store.Run.__table__.columns]
    names = tuple(name for name, _ in keys)
    records = []
    table_rows: dict[Any, bool] = {}  # per result a row came from (its _fields: 2.5 µs a call)
    for run in sorted(rows, key=lambda r: r.id):
        if isinstance(run, sa.Row) and table_rows.setdefault(run._parent, run._fields == names):
            records.append((*run, sweep))  # a row of the runs table (load_views): its values
        else:  # an ORM Run
            records.append((*(getattr(run, key) for _, key in keys), sweep))
    return _with_varying(_integers(pd.DataFrame.from_records(records, columns=[*(name for name, _ in keys), "sweep"],
                                                             coerce_float=True)))


def _with_varying(frame: Any) -> Any:
    """A column for every config field that differs between the runs and has none yet (weight_decay, warmup,
    budget.steps, ...): what tells their configurations apart, beside the axes the run table keeps."""
    import json

    from ablate.config.trial import fields_that_differ

    if "config" not in frame or frame.empty:
        return frame
    varying, flats = fields_that_differ([json.loads(c) if isinstance(c, str) else c for c in frame["config"]],
                                        skip=("seed", "options", "objective_options"))
    for key in varying:
        if key not in frame:
            frame[key] = [flat.get(key) for flat in flats]
    return frame


def _integers(frame: Any) -> Any:
    """Integer columns stay integers where some rows are NULL (pandas would make heads 4.0)."""
    for column in store.Run.__table__.columns:
        if isinstance(column.type, sa.Integer) and column.name in frame:
            frame[column.name] = frame[column.name].astype("Int64")
    return frame


def _sweep_id(engine: sa.Engine, name: str) -> int:
    """The sweep's id, or an AblateError with a did-you-mean (not an empty frame for a typo)."""
    return store.sweep_named(engine, name, store.Sweep.id).id


CSV_CHUNK = 10_000  # rows whose JSON columns are text at one time (100,000 runs' configs as text: 200 MB)


def to_csv(frame: Any, path: Any) -> None:
    """A DataFrame as csv whose JSON columns (config, options, ...) are JSON text that json.loads reads back;
    written CSV_CHUNK rows at a time (pandas formats its own chunks of a few thousand rows apart anyway)."""
    import orjson

    as_text = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
    json_columns = [c.name for c in store.Run.__table__.columns if isinstance(c.type, sa.JSON) and c.name in frame]
    with open(path, "w", encoding="utf-8", newline="") as f:
        for start in range(0, max(len(frame), 1), CSV_CHUNK):
            part = frame.iloc[start:start + CSV_CHUNK].copy()
            for name in json_columns:
                part[name] = [None if v is None else orjson.dumps(v, option=as_text).decode() for v in part[name]]
            part.to_csv(f, index=False, lineterminator="\n", header=start == 0)


def metrics(run_ids: list[int] | None = None, sweep: str | None = None, url: str | None = None):
    """A DataFrame of metric points (run_id, step, split, elapsed_seconds, tokens, loss, lr, eval_point)."""
    import pandas as pd

    engine = store.reader(url)
    q = sa.select(store.Metric)
    if run_ids is not None:
        q = q.where(store.Metric.run_id.in_(run_ids))
    if sweep is not None:
        q = q.join(store.Run, store.Metric.run_id == store.Run.id).where(store.Run.sweep_id == _sweep_id(engine, sweep))
    with engine.connect() as conn:
        return pd.read_sql(q.order_by(store.Metric.run_id, store.Metric.split, store.Metric.step), conn)


def claims(sweep: str, url: str | None = None, min_steps: int | None = None, at: str | dict | None = None):
    """The sweep's published orderings tested on its runs (claims_frame): effect, interval, p, verdict per cell;
    `at` (e.g. "flops=1e15"): each run read at that budget on its own curve, as `ablate report --at`."""
    from ablate.config.units import parse_at
    from ablate.results.equal import read_runs_at
    from ablate.results.orderings import check_claims, claims_frame
    from ablate.results.views import load_views

    engine = store.reader(url)
    spec, views = load_views(engine, sweep)
    views = read_runs_at(engine, views, parse_at(at if at is not None else spec.report.at))
    return claims_frame(check_claims(spec, views, min_steps=min_steps))
