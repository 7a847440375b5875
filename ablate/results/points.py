"""Runs' metric points read in chunks: as rows (the report's CSV) or as one array per run and split (the figures,
and the losses read at an equal budget)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from ablate import store

IN_CHUNK = 900  # run ids per metrics query: under SQLite's smallest bound-parameter limit (999)


def metric_points(engine: sa.Engine, run_ids: list[int], split: str | None = None) -> Iterator[Any]:
    """The runs' metric points (of one split, or all) as rows (run_id, split, step, elapsed_seconds, tokens, loss),
    ordered as the unique index uq_metrics_run_split_step is: one query per IN_CHUNK runs, not one per run."""
    columns = (store.Metric.run_id, store.Metric.split, store.Metric.step, store.Metric.elapsed_seconds, store.Metric.tokens,
               store.Metric.loss)
    ids = sorted(run_ids)
    only = () if split is None else (store.Metric.split == split,)
    with engine.connect() as conn:
        for start in range(0, len(ids), IN_CHUNK):
            # all() fetches a chunk at once: iterating the result fetches row by row (~5 µs each through psycopg)
            yield from conn.execute(sa.select(*columns).where(store.Metric.run_id.in_(ids[start:start + IN_CHUNK]), *only)
                                    .order_by(store.Metric.run_id, store.Metric.split, store.Metric.step)).all()


def run_points(engine: sa.Engine, run_ids: list[int], split: str | None = None) -> dict[tuple[int, str], Any]:
    """Each run's points of each split (or of one), in step order, as an array of rows (elapsed_seconds, tokens,
    step, loss)."""
    import numpy as np

    grouped: dict[tuple[int, str], list[tuple[Any, ...]]] = {}
    for p in metric_points(engine, run_ids, split):  # (run_id, split, step, elapsed_seconds, tokens, loss)
        grouped.setdefault((p[0], p[1]), []).append((p[3], p[4], p[2], p[5]))
    return {key: np.array(rows, dtype=float) for key, rows in grouped.items()}
