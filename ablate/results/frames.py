"""Runs and metric points as pandas DataFrames, for notebooks, `ablate export`-style csv and the report."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.results import csvtext


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
    rows = sorted(rows, key=lambda r: r.id)
    frame = _frame(rows, sweep)
    for key, values in csvtext.varying_fields(rows, frame.columns).items():
        frame[key] = values
    return frame


def _frame(rows: list[Any], sweep: str) -> Any:
    """The runs' columns and their sweep's name, integers kept (rows sorted by id)."""
    import pandas as pd

    columns = [*(name for name, _ in csvtext.table_keys()), "sweep"]
    return _integers(pd.DataFrame.from_records(csvtext.records(rows, sweep), columns=columns, coerce_float=True))


def _with_varying(frame: Any) -> Any:
    """A column for every config field that differs between the runs and has none yet (weight_decay, warmup,
    budget.steps, ...): what tells their configurations apart, beside the axes the run table keeps."""
    import json

    if "config" in frame and not frame.empty:
        configs = [json.loads(c) if isinstance(c, str) else c for c in frame["config"]]
        for key, values in csvtext.varying_of(configs, frame.columns).items():
            frame[key] = values
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


def to_csv(frame: Any, path: Any) -> None:
    """A DataFrame as csv whose JSON columns (config, options, ...) are JSON text that json.loads reads back;
    written csvtext.CSV_CHUNK rows at a time (pandas formats its own chunks of a few thousand rows apart anyway)."""
    chunk = csvtext.CSV_CHUNK
    with open(path, "w", encoding="utf-8", newline="") as f:
        for start in range(0, max(len(frame), 1), chunk):
            _write_part(frame.iloc[start:start + chunk].copy(), f, header=start == 0)


def _write_part(part: Any, f: Any, header: bool) -> None:
    """Rows of a runs frame (its own: its JSON columns become text) as csv into the open file `f`."""
    import orjson

    as_text = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
    for column in store.Run.__table__.columns:
        if isinstance(column.type, sa.JSON) and column.name in part:
            part[column.name] = [None if v is None else orjson.dumps(v, option=as_text).decode()
                                 for v in part[column.name]]
    part.to_csv(f, index=False, lineterminator="\n", header=header)


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
