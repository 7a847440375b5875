"""Loss curves: which lines a table's figure draws (one per run, or the best configurations' seed means past
MAX_CURVES runs), every point written to a CSV (points read by ablate/results/points.py), and the figure drawn."""

from __future__ import annotations

import io
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ablate.report.tables import Table, finished_values
from ablate.report.views import RunView, config_label, varying_axes
from ablate.results.bands import mean_band
from ablate.results.equal import x_of
from ablate.results.points import metric_points, run_points


FIGURE_POINTS = 64  # points per run and split read for a seed mean's band (every point of a single run's line)
MAX_CURVES = 10  # lines per panel (matplotlib's colour cycle: no two share a colour); a table with more runs
# draws its best configurations' seed means instead


@dataclass
class Curve:
    """One line of a figure: a run, or the seeds of one configuration (mean line, min–max band)."""

    label: str
    runs: list[RunView]
    gid: str  # run-<id>, or config-<rank>


@dataclass
class CurvePlan:
    """What a table's figure draws, and the configuration (label without the seed) of every run behind it."""

    curves: list[Curve]
    configuration: dict[int, str]  # run id -> configuration label
    runs: list[RunView]
    is_aggregate: bool = False
    caption: str = ""  # says what an aggregate figure leaves out; empty when every run is a line


def plan_curves(table: Table, points_csv: str | None = None, cap: int = MAX_CURVES,
                group: tuple[str, ...] | None = None) -> CurvePlan:
    """One line per run up to `cap` runs; past it, runs that differ only by seed are one configuration, and the
    `cap` configurations with the lowest mean final test loss are drawn (`points_csv`: where every run is).
    `group`: a line per combination of these axes (mean and band over the runs it averages), whatever the count."""
    runs = [r for col in table.runs for r in col]
    keys = list(group) if group else varying_axes(runs, set()) or ["architecture"]
    configuration = {r.row.id: config_label(r.axes, keys) for r in runs}
    if len(runs) <= cap and not (group and len(set(configuration.values())) < len(runs)):
        curves = [Curve(f"run {r.row.id}: {configuration[r.row.id]}", [r], f"run-{r.row.id}") for r in runs]
        return CurvePlan(curves, configuration, runs)
    configs: dict[str, list[RunView]] = {}
    for r in runs:
        configs.setdefault(configuration[r.row.id], []).append(r)
    ranked = sorted(configs.items(), key=lambda c: statistics.fmean(finished_values(c[1], "final_eval_loss") or [math.inf]))
    curves = [Curve(f"{label} ({len(members)} run{'s' * (len(members) > 1)})", members, f"config-{rank}")
              for rank, (label, members) in enumerate(ranked[:cap])]
    caption = (f"showing {len(curves)} of {len(configs)} {'groups' if group else 'configurations'} ({len(runs)} "
               "runs), those with the lowest mean final test loss; line: mean over seeds, band: min–max")
    if group and len(configs) <= cap:
        caption = f"one line per {', '.join(keys)} ({len(runs)} runs); line: mean over its runs, band: min–max"
    caption += f"; every run's points in {points_csv}" if points_csv else "; every run's points: add points to --format"
    return CurvePlan(curves, configuration, runs, is_aggregate=True, caption=caption)


POINT_COLUMNS = ("run_id", "configuration", "seed", "split", "step", "elapsed_seconds", "tokens", "loss")
AGGREGATE_CHUNK = 2_000  # runs per query of their points as text (PostgreSQL): ~25 MB of text at 200 points a run
# each run's points as its CSV lines (split,step,elapsed_seconds,tokens,loss), joined by the server; concat writes
# a NULL as nothing and a float as PostgreSQL prints it (the shortest text that reads back the same double)
POINTS_AS_TEXT = ("SELECT m.run_id, string_agg(concat(m.split, ',', m.step, ',', m.elapsed_seconds, ',', m.tokens, ',', "
                  "m.loss), E'\\n' ORDER BY m.split, m.step) FROM metrics m WHERE m.run_id = ANY(%s) GROUP BY m.run_id "
                  "ORDER BY m.run_id")


def write_curve_points(engine: sa.Engine, plan: CurvePlan, path: Path) -> None:
    """Every point of every run of a figure's table, drawn or not: the data behind an aggregate figure.

    On PostgreSQL the server writes each run's lines (one text value per run) and Python puts the run's columns in
    front of each: 20 million points cost ~0.1 µs each on the client instead of ~3 with Python's csv writer (kept
    for SQLite). The same values; PostgreSQL spells a whole float without ".0" and NaN as NaN."""
    import csv

    run = {r.row.id: (plan.configuration[r.row.id], r.axes.get("seed")) for r in plan.runs}
    with path.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(POINT_COLUMNS)
        if engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg":
            _write_points_as_text(engine, run, f)
            return
        # by position, not name: a million points write in half the time
        out.writerows((p[0], *run[p[0]], *p[1:]) for p in metric_points(engine, list(run)))


def _write_points_as_text(engine: sa.Engine, run: dict[int, tuple[str, Any]], f: Any) -> None:
    import csv

    prefix = io.StringIO()
    quoted = csv.writer(prefix, lineterminator="")
    ids = sorted(run)
    with engine.connect() as conn:
        conn.exec_driver_sql("SET LOCAL jit = off")  # compiling each query's plan costs more than it saves
        with conn.connection.driver_connection.cursor() as cursor:
            for start in range(0, len(ids), AGGREGATE_CHUNK):
                # not prepared: from its 6th run psycopg would prepare it, and PostgreSQL's generic plan for an array
                # of unknown length scans every point (21 s instead of 0.2 for the last chunk of 100,000 runs)
                chunk = ids[start:start + AGGREGATE_CHUNK]
                for run_id, lines in cursor.execute(POINTS_AS_TEXT, (chunk,), prepare=False).fetchall():
                    prefix.seek(0)
                    prefix.truncate()
                    quoted.writerow((run_id, *run[run_id], ""))  # "id,configuration,seed," quoted as csv would
                    head = prefix.getvalue()
                    f.write(head + lines.replace("\n", "\n" + head) + "\n")
        conn.rollback()


X_LABELS = {"seconds": "training wall clock ({unit})", "tokens": "tokens seen", "steps": "steps",
            "flops": "training FLOPs"}  # by config.units.X_KINDS, the dashboard's and `at`'s x kinds


def draw_curves(engine: sa.Engine, table: Table, x_axes: tuple[str, ...] = ("seconds", "tokens"),
                plan: CurvePlan | None = None, read: dict[tuple[int, str], Any] | None = None):
    """One figure per table: rows train / eval loss, columns the x axes; each panel draws the plan's curves
    (one line per run in a table of up to MAX_CURVES runs; past it a configuration's seed mean and min–max band,
    results/bands.py, as the dashboard draws them, from each run's points thinned to FIGURE_POINTS). Wall-clock
    seconds are drawn in hours, minutes or seconds. `read`: points already read (another figure's), added to."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ablate.config.units import short_count

    plan = plan or plan_curves(table)
    points = _points(engine, [r.row.id for c in plan.curves for r in c.runs], plan.is_aggregate,
                     {} if read is None else read)
    none = np.empty((0, 4))
    fig, axes = plt.subplots(2, len(x_axes), figsize=(5.5 * len(x_axes), 7.5), squeeze=False, sharey="row")
    longest = max((float(np.nanmax(pts[:, 0])) for pts in points.values() if len(pts)), default=0.0)
    unit, per = time_unit(longest)
    for i, split in enumerate(("train", "eval")):
        for j, x in enumerate(x_axes):
            ax = axes[i][j]
            scale = per if x == "seconds" else 1.0
            for curve in plan.curves:
                series = [_series(points.get((r.row.id, split), none), x, r, scale) for r in curve.runs]
                style = dict(marker="o" if split == "eval" else None, markersize=3, linewidth=1.4, label=curve.label,
                             gid=f"{curve.gid}-{split}-{x}")
                band = mean_band(series) if plan.is_aggregate else None
                if band is None:  # one run, or seeds that share no range: the first as logged
                    ax.plot(*series[0], **style)
                    continue
                xs, mean, low, high = band
                (line,) = ax.plot(xs, mean, **style)
                ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            ax.set_xlabel(X_LABELS[x].format(unit=unit))
            if x in ("tokens", "flops"):  # 350k, not 350000
                ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: short_count(value) if value else "0"))
            ax.set_ylabel(f"{split} loss (nats)")
            ax.grid(alpha=0.3)
    configs = len(set(plan.configuration.values()))
    title = f"{len(plan.curves)} of {configs} configurations; band: min–max over seeds" if plan.is_aggregate else None
    axes[0][0].legend(fontsize=8, loc="upper right", title=title, title_fontsize=8)
    fig.suptitle(table.title)
    fig.tight_layout()
    return fig


def _points(engine: sa.Engine, ids: list[int], thinned: bool, read: dict[tuple[int, str], Any]) -> dict:
    """The runs' points, read once per report: a seed mean's runs thinned (their band is drawn on at most
    bands.MAX_POINTS points anyway), a single run's every point; kept in `read` by (run id, split, thinned)."""
    missing = sorted({i for i in ids if (i, thinned) not in read})
    for (run_id, split), pts in run_points(engine, missing, most=FIGURE_POINTS if thinned else None).items():
        read[(run_id, thinned)] = read.get((run_id, thinned), {}) | {split: pts}
    for i in missing:
        read.setdefault((i, thinned), {})
    return {(i, split): pts for i in ids for split, pts in read[(i, thinned)].items()}


def _series(points: Any, x: str, run: RunView, scale: float) -> tuple[Any, Any]:
    """(x, loss) of a run's points (rows elapsed_seconds, tokens, step, loss) in kind `x`; none in FLOPs for a run
    that recorded no FLOPs per token."""
    xs = x_of(x, points, getattr(run.row, "flops_per_token", None))
    if xs is None:
        return points[:0, 0], points[:0, 3]
    return xs / scale, points[:, 3]


def time_unit(longest_seconds: float) -> tuple[str, float]:
    """Hours for real runs (the studies' axis); minutes or seconds for short ones, so ticks stay readable."""
    if longest_seconds >= 2 * 3600:
        return "hours", 3600.0
    if longest_seconds >= 600:
        return "minutes", 60.0
    return "seconds", 1.0
