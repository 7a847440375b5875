"""What a live view of the results DB reads (the web dashboard, `ablate ui`): every sweep with its counts, a sweep's
runs as light rows (row columns and stored options only: no trial config is validated, so 10,000 runs stay cheap),
a change token that moves whenever a run's status or latest point does, and curves downsampled on this side (their
seed means and bands: results/bands.py, as the report draws them; the rows: results/status.py, as the terminal).

Everything here reads; nothing writes. The statistics (cells, orderings, verdicts) are not recomputed here: the
dashboard asks `results.orderings` and the report's tables, the one code path the report uses too.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.config.axes import AXIS_FIELDS
from ablate.config.errors import AblateError
from ablate.config.trial import fields_that_differ
from ablate.config.units import X_KINDS
from ablate.results.bands import MAX_POINTS, thin
from ablate.results.equal import x_of
from ablate.results.points import run_points
from ablate.results.status import EXTRA, FIRST, RUN_COLUMNS, status_row



def sweep_summaries(engine: sa.Engine) -> list[dict[str, Any]]:
    """Every sweep, newest first: its name, description, counts by status, hardware, recipe and budget."""
    with engine.connect() as conn:
        sweeps = conn.execute(sa.select(store.Sweep.id, store.Sweep.name, store.Sweep.description, store.Sweep.spec,
                                        store.Sweep.created_at).order_by(store.Sweep.created_at.desc())).all()
        counts: dict[int, dict[str, int]] = defaultdict(dict)
        for sid, status, n in conn.execute(sa.select(store.Run.sweep_id, store.Run.status, sa.func.count())
                                           .group_by(store.Run.sweep_id, store.Run.status)):
            counts[sid][status] = n
    out = []
    for s in sweeps:
        spec = s.spec or {}
        budget = (spec.get("defaults") or {}).get("budget") or spec.get("budget") or {}
        out.append({"name": s.name, "description": s.description or "", "created": s.created_at.isoformat(" ", "seconds"),
                    "counts": dict(sorted(counts[s.id].items())), "runs": sum(counts[s.id].values()),
                    "hardware": budget.get("hardware") or "", "recipe": spec.get("recipe") or "",
                    "budget": _budget_text(budget)})
    return out


def _budget_text(budget: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in budget.items() if k != "hardware" and v not in (None, ""))


def sweep_row(engine: sa.Engine, name: str) -> Any:
    """The sweep's row (id, name, description, spec), or one clear error naming the sweeps there are."""
    s = store.Sweep
    return store.sweep_named(engine, name, s.id, s.name, s.description, s.spec)


def change_tokens(engine: sa.Engine, sweep_id: int) -> tuple[str, str]:
    """Two short texts from one aggregate query: the first changes whenever a run of the sweep changes status or
    logs a point, the second only when a run finishes (what a page polls before it asks for anything bigger)."""
    r = store.Run
    with engine.connect() as conn:
        n, steps, last_eval, final_eval, finished_at, running, finished = conn.execute(
            sa.select(sa.func.count(), sa.func.sum(sa.func.coalesce(r.last_step, 0)),
                      sa.func.sum(sa.func.coalesce(r.last_eval_loss, 0.0)), sa.func.sum(sa.func.coalesce(r.final_eval_loss, 0.0)),
                      sa.func.max(r.finished_at), sa.func.sum(sa.case((r.status == "running", 1), else_=0)),
                      sa.func.sum(sa.case((r.status.in_(store.FINISHED), 1), else_=0)))
            .where(r.sweep_id == sweep_id)).one()
    text = lambda *values: "|".join("" if v is None else f"{v:.9g}" if isinstance(v, float) else str(v)  # noqa: E731
                                    for v in values)
    return text(n, steps, last_eval, final_eval, finished_at, running, finished), text(n, final_eval, finished_at, finished)


_SELECTED = tuple(dict.fromkeys(RUN_COLUMNS + EXTRA))  # a light row's columns, in the order selected
_EXTRA_OF = operator.itemgetter(*(_SELECTED.index(k) for k in EXTRA))  # a row's EXTRA fields, by position


def run_rows(engine: sa.Engine, sweep_id: int) -> list[dict[str, Any]]:
    """The sweep's runs in trial order as flat dicts: the row's axes (options as `options.KEY`, as stored), every
    other config field that differs between the sweep's runs (weight_decay, budget.steps, ...: what tells its
    configurations apart), status, progress, the latest losses, epochs and the first line of an error."""
    r = store.Run
    with engine.connect() as conn:
        rows = conn.execute(sa.select(*(getattr(r, c) for c in _SELECTED), r.config)
                            .where(r.sweep_id == sweep_id)
                            .order_by(r.trial_index)).all()
    out = [_flat(row) for row in rows]
    varying, flats = fields_that_differ([row.config for row in rows], skip=("seed", "options", "objective_options"))
    varying = [k for k in varying if not any(k in flat for flat in out)]
    for flat, config in zip(out, flats):
        flat.update({k: config.get(k) for k in varying})
    return out


def some_runs(engine: sa.Engine, ids: Sequence[int]) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """A few runs of any sweeps as flat rows (their sweep's name first) and their trial configs by id."""
    r = store.Run
    with engine.connect() as conn:
        rows = conn.execute(sa.select(*(getattr(r, c) for c in _SELECTED), r.config,
                                      store.Sweep.name.label("sweep_name"))
                            .join(store.Sweep, store.Sweep.id == r.sweep_id).where(r.id.in_(list(ids)))).all()
    return [{"sweep": row.sweep_name, **_flat(row)} for row in rows], {row.id: row.config for row in rows}


def _flat(row: Any) -> dict[str, Any]:
    """A run's status row (results/status.py), its options as `options.KEY` columns, then the EXTRA fields."""
    out = status_row(row)
    options = out.pop("options")
    at = list(out).index(FIRST[-1]) + 1 + len(AXIS_FIELDS)  # after the axes, as the terminal shows them
    items = list(out.items())
    extra = dict(zip(EXTRA, _EXTRA_OF(row)))  # by position, not by name: 10,000 rows x 14 fields
    if extra["started_at"] is not None:
        extra["started_at"] = extra["started_at"].isoformat(" ", "seconds")
    return dict(items[:at] + [(f"options.{k}", v) for k, v in options.items()] + items[at:]) | extra


def curves(engine: sa.Engine, run_ids: Sequence[int], x: str = "steps", split: str = "eval",
           max_points: int = MAX_POINTS) -> dict[int, tuple[list[float], list[float]]]:
    """Each run's curve of `split` loss against `x` (steps, tokens, seconds or FLOPs: tokens × the run's FLOPs per
    token), at most `max_points` points (the first and the last kept, the rest evenly spaced)."""
    if x not in X_KINDS:
        raise AblateError(f"x must be one of {', '.join(X_KINDS)}, not {x!r}")
    if split not in ("train", "eval"):
        raise AblateError(f"y must be train or eval, not {split!r}")
    if not run_ids:
        return {}
    with engine.connect() as conn:
        fpt = dict(conn.execute(sa.select(store.Run.id, store.Run.flops_per_token)
                                .where(store.Run.id.in_(list(run_ids)))).all())
    out = {}
    for (run_id, s), points in run_points(engine, list(run_ids), split).items():
        xs = x_of(x, points, fpt.get(run_id))
        if xs is None or s != split:
            continue
        keep = thin(len(xs), max_points)
        out[run_id] = (xs[keep].tolist(), points[keep, 3].tolist())
    return out
