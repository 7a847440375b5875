"""Reading results: read-only SQL and pandas DataFrames of runs and metrics, for the CLI and notebooks."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from ablate import db
from ablate.errors import AblateError


def read_only_query(query: str, url: str | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one SQL statement on a connection the database itself keeps read-only; writes fail there."""
    db.connect(url)  # reachable, and at the newest schema (so documented views exist)
    engine = db.make_engine(url, read_only=True)
    try:
        with engine.connect() as conn:
            try:
                result = conn.execute(sa.text(query))
                if not result.returns_rows:
                    raise AblateError("that statement returns no rows; `ablate sql` runs read-only queries (SELECT, WITH, EXPLAIN)")
                columns = list(result.keys())
                rows = [tuple(r) for r in result]
            finally:
                conn.rollback()
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        if "readonly" in reason.replace("-", "").replace(" ", "").lower() or "read-only" in reason.lower():
            raise AblateError(f"refused: `ablate sql` is read-only ({reason}); change results through ablate commands") from None
        raise AblateError(f"SQL error: {reason}") from None
    finally:
        engine.dispose()
    return columns, rows


def runs(sweep: str | None = None, url: str | None = None):
    """A DataFrame of runs (one row per trial), optionally of one sweep."""
    import pandas as pd

    engine = db.connect(url)
    q = sa.select(db.Run, db.Sweep.name.label("sweep")).join(db.Sweep, db.Run.sweep_id == db.Sweep.id)
    if sweep is not None:
        q = q.where(db.Sweep.name == sweep)
    with engine.connect() as conn:
        frame = pd.read_sql(q.order_by(db.Run.id), conn)
    # integer columns stay integers where some rows are NULL (pandas would make heads 4.0)
    for column in db.Run.__table__.columns:
        if isinstance(column.type, sa.Integer) and column.name in frame:
            frame[column.name] = frame[column.name].astype("Int64")
    return frame


def to_csv(frame: Any, path: Any) -> None:
    """A DataFrame as csv whose JSON columns (config, options, ...) are JSON text that json.loads reads back."""
    import json

    frame = frame.copy()
    for column in db.Run.__table__.columns:
        if isinstance(column.type, sa.JSON) and column.name in frame:
            frame[column.name] = [None if v is None else json.dumps(v, sort_keys=True) for v in frame[column.name]]
    frame.to_csv(path, index=False, lineterminator="\n")


def metrics(run_ids: list[int] | None = None, sweep: str | None = None, url: str | None = None):
    """A DataFrame of metric points (run_id, step, split, elapsed_seconds, tokens, loss, lr)."""
    import pandas as pd

    engine = db.connect(url)
    q = sa.select(db.Metric)
    if run_ids is not None:
        q = q.where(db.Metric.run_id.in_(run_ids))
    if sweep is not None:
        q = q.join(db.Run, db.Metric.run_id == db.Run.id).join(db.Sweep, db.Run.sweep_id == db.Sweep.id).where(
            db.Sweep.name == sweep
        )
    with engine.connect() as conn:
        return pd.read_sql(q.order_by(db.Metric.run_id, db.Metric.split, db.Metric.step), conn)
