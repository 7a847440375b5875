"""Runs' metric points read in chunks: as rows (the report's CSV) or as one array per run and split (the figures,
and the losses read at an equal budget)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from ablate import store

IN_CHUNK = 900  # run ids per metrics query: under SQLite's smallest bound-parameter limit (999)


def metric_points(engine: sa.Engine, run_ids: list[int], split: str | None = None,
                  most: int | None = None) -> Iterator[Any]:
    """The runs' metric points (of one split, or all) as rows (run_id, split, step, elapsed_seconds, tokens, loss),
    ordered as the unique index uq_metrics_run_split_step is: one query per IN_CHUNK runs, not one per run.
    `most`: at most about that many of each run's points of a split, evenly spaced, its first and last among them
    (thinned by the database: a figure of 2,000 runs' seed means needs no more than it can draw)."""
    m = store.Metric
    columns = (m.run_id, m.split, m.step, m.elapsed_seconds, m.tokens, m.loss)
    ids = sorted(run_ids)
    only = () if split is None else (m.split == split,)
    with engine.connect() as conn:
        for start in range(0, len(ids), IN_CHUNK):
            query = sa.select(*columns).where(m.run_id.in_(ids[start:start + IN_CHUNK]), *only)
            if most is not None:
                query = _thinned(query, most)
            # all() fetches a chunk at once: iterating the result fetches row by row (~5 µs each through psycopg)
            yield from conn.execute(query.order_by(*query.selected_columns[:3])).all()


def _thinned(query: sa.Select, most: int) -> sa.Select:
    """Each run's and split's every k-th point, k = ceil(points / most), and its last (window functions: SQLite
    and PostgreSQL both)."""
    m = store.Metric
    key = dict(partition_by=(m.run_id, m.split))
    numbered = query.add_columns(
        (sa.func.row_number().over(**key, order_by=m.step) - 1).label("i"),
        sa.func.count().over(**key).label("n")).subquery()
    every = (numbered.c.n + most - 1) // most
    return (sa.select(*(numbered.c[name] for name in ("run_id", "split", "step", "elapsed_seconds", "tokens", "loss")))
            .where(sa.or_(numbered.c.n <= most, numbered.c.i == numbered.c.n - 1, numbered.c.i % every == 0)))


def run_points(engine: sa.Engine, run_ids: list[int], split: str | None = None,
               most: int | None = None) -> dict[tuple[int, str], Any]:
    """Each run's points of each split (or of one), in step order, as an array of rows (elapsed_seconds, tokens,
    step, loss); `most`: thinned as metric_points does."""
    import numpy as np

    grouped: dict[tuple[int, str], list[tuple[Any, ...]]] = {}
    for p in metric_points(engine, run_ids, split, most):  # (run_id, split, step, elapsed_seconds, tokens, loss)
        grouped.setdefault((p[0], p[1]), []).append((p[3], p[4], p[2], p[5]))
    return {key: np.array(rows, dtype=float) for key, rows in grouped.items()}


def points_around(engine: sa.Engine, run_ids: list[int], kind: str, amount: float) -> dict[tuple[int, str], Any]:
    """run_points cut to what reading each run at `amount` of `kind` (seconds, tokens, steps, flops) needs: per run
    and split the points on either side of it (its first point when the amount comes before it, its last when
    after). Interpolated by equal.loss_at they give what every point gives, for 1 to 3 rows a run and split instead
    of all of them (100,000 runs x 200 points read in Python cost 148 CPU-s and 6 GB)."""
    import numpy as np

    m, r = store.Metric, store.Run
    x = {"seconds": m.elapsed_seconds, "tokens": m.tokens, "steps": m.step,
         "flops": m.tokens * r.flops_per_token}[kind]
    key = dict(partition_by=(m.run_id, m.split), order_by=m.step)
    grouped: dict[tuple[int, str], list[tuple[Any, ...]]] = {}
    ids = sorted(run_ids)
    with engine.connect() as conn:
        for start in range(0, len(ids), IN_CHUNK):
            inner = (sa.select(m.run_id, m.split, m.step, m.elapsed_seconds, m.tokens, m.loss, x.label("x"),
                               sa.func.lag(x).over(**key).label("before"), sa.func.lead(x).over(**key).label("after"))
                     .join(r, r.id == m.run_id).where(m.run_id.in_(ids[start:start + IN_CHUNK])).subquery())
            near = sa.or_(sa.and_(inner.c.x <= amount, sa.or_(inner.c.after.is_(None), inner.c.after >= amount)),
                          sa.and_(inner.c.x >= amount, sa.or_(inner.c.before.is_(None), inner.c.before <= amount)))
            rows = conn.execute(sa.select(inner.c.run_id, inner.c.split, inner.c.step, inner.c.elapsed_seconds,
                                          inner.c.tokens, inner.c.loss).where(near)
                                .order_by(inner.c.run_id, inner.c.split, inner.c.step)).all()
            for p in rows:
                grouped.setdefault((p[0], p[1]), []).append((p[3], p[4], p[2], p[5]))
    return {k: np.array(v, dtype=float) for k, v in grouped.items()}
