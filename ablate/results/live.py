"""What a live view of the results DB reads (the web dashboard, `ablate ui`): every sweep with its counts, a sweep's
runs as light rows (row columns and stored options only: no trial config is validated, so 10,000 runs stay cheap),
a change token that moves whenever a run's status or latest point does, and curves downsampled on this side.

Everything here reads; nothing writes. The statistics (cells, orderings, verdicts) are not recomputed here: the
dashboard asks `results.orderings` and the report's tables, the one code path the report uses too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.config.axes import AXIS_FIELDS
from ablate.config.errors import AblateError
from ablate.config.trial import fields_that_differ
from ablate.results.equal import x_of
from ablate.results.points import run_points

X_KINDS = ("steps", "tokens", "seconds", "flops")
MAX_POINTS = 200  # points per curve sent to a browser, whatever a run logged
ROW_COLUMNS = ("id", "trial_index", "status", "architecture", "objective", "options", "d_model", "layers", "heads",
               "context", "lr", "batch_size", "seed", "budget_kind", "budget_amount", "train_seconds", "steps",
               "last_step", "last_elapsed_seconds", "final_train_loss", "last_train_loss", "final_eval_loss",
               "last_eval_loss", "epochs", "params", "flops_per_token", "error", "finished_at")


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


def run_rows(engine: sa.Engine, sweep_id: int) -> list[dict[str, Any]]:
    """The sweep's runs in trial order as flat dicts: the row's axes (options as `options.KEY`, as stored), every
    other config field that differs between the sweep's runs (weight_decay, budget.steps, ...: what tells its
    configurations apart), status, progress, the latest losses, epochs and the first line of an error."""
    r = store.Run
    with engine.connect() as conn:
        rows = conn.execute(sa.select(*(getattr(r, c) for c in ROW_COLUMNS), r.config).where(r.sweep_id == sweep_id)
                            .order_by(r.trial_index)).all()
    out = [_flat(row) for row in rows]
    varying, flats = fields_that_differ([row.config for row in rows], skip=("seed", "options", "objective_options"))
    varying = [k for k in varying if not any(k in flat for flat in out)]
    for flat, config in zip(out, flats):
        flat.update({k: config.get(k) for k in varying})
    return out


def _flat(row: Any) -> dict[str, Any]:
    pick = lambda final, last: final if final is not None else last  # noqa: E731
    out: dict[str, Any] = {"run": row.id, "status": row.status}
    out.update({k: getattr(row, k) for k in AXIS_FIELDS})
    out.update({f"options.{k}": v for k, v in sorted((row.options or {}).items())})
    out.update({"progress": _progress(row), "steps": pick(row.steps, row.last_step),
                "train": pick(row.final_train_loss, row.last_train_loss),
                "eval": pick(row.final_eval_loss, row.last_eval_loss),
                "epochs": None if row.epochs is None else round(row.epochs, 3),
                "reason": (row.error or "").strip().splitlines()[0][:200] if (row.error or "").strip() else ""})
    return out


def _progress(row: Any) -> float | None:
    """The fraction of its budget a run has used: 1 when finished, from its clock or steps while it trains."""
    if row.status in store.FINISHED:
        return 1.0
    if not row.budget_amount:
        return None
    used = {"wall_clock": row.train_seconds if row.train_seconds is not None else row.last_elapsed_seconds,
            "steps": row.last_step}.get(row.budget_kind)
    return None if used is None else round(min(used / row.budget_amount, 1.0), 4)


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


def thin(n: int, max_points: int) -> Any:
    """Indices of at most `max_points` of n points: evenly spaced, the first and the last always among them."""
    import numpy as np

    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(int))


def group_curves(series: dict[int, tuple[list[float], list[float]]], groups: dict[str, list[int]],
                 max_points: int = MAX_POINTS) -> list[dict[str, Any]]:
    """One curve per group of runs (seeds, or every axis not grouped by): the mean over its runs on a common x (the
    range every run reached, `max_points` even steps, each run interpolated linearly), with the min and max as a
    band; a group of one run is that run's curve as logged."""
    import numpy as np

    out = []
    for label, ids in groups.items():
        have = [series[i] for i in ids if i in series and len(series[i][0])]
        if not have:
            continue
        if len(have) == 1:
            out.append({"label": label, "runs": ids, "x": have[0][0], "mean": have[0][1], "low": None, "high": None})
            continue
        lo, hi = max(min(xs) for xs, _ in have), min(max(xs) for xs, _ in have)
        if hi <= lo:  # no common range (a run with one point): the first run's curve
            out.append({"label": label, "runs": ids, "x": have[0][0], "mean": have[0][1], "low": None, "high": None})
            continue
        grid = np.linspace(lo, hi, min(max_points, max(len(xs) for xs, _ in have)))
        ys = np.array([np.interp(grid, xs, vals) for xs, vals in have])
        out.append({"label": label + f" (n={len(have)})", "runs": ids, "x": grid.tolist(), "mean": ys.mean(0).tolist(),
                    "low": ys.min(0).tolist(), "high": ys.max(0).tolist()})
    return out
