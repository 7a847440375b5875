"""Reports: the studies' comparison tables and loss curves, rendered from the results database.

`build_report` reads one sweep's runs and metrics, lays out the tables its spec's `report` block
declares (rows Train / Test, columns the varying axis, published numbers beside ours), draws the
loss curves, and writes report.md, a self-contained report.html, the figures and runs.csv.
"""

from __future__ import annotations

import base64
import gc
import html
import io
import math
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.config.errors import AblateError
from ablate.config import Reference, SweepSpec, TableSpec, TrialConfig
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


@dataclass
class Table:
    title: str
    columns: list[str]  # column labels
    rows: list[tuple[str, list[str]]]  # (row label, cells)
    runs: list[list[RunView]] = field(default_factory=list)  # runs behind each column
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        head = "| | " + " | ".join(self.columns) + " |"
        rule = "| --- |" + " --- |" * len(self.columns)
        body = ["| " + label + " | " + " | ".join(cells) + " |" for label, cells in self.rows]
        notes = [f"\n_{n}_" for n in self.notes]
        return "\n".join([f"**{self.title}**", "", head, rule, *body, *notes])

    def html(self) -> str:
        th = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        trs = "".join(
            f"<tr><th>{html.escape(label)}</th>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
            for label, cells in self.rows
        )
        notes = "".join(f"<p class=note>{html.escape(n)}</p>" for n in self.notes)
        return f"<h3>{html.escape(self.title)}</h3><table><tr><th></th>{th}</tr>{trs}</table>{notes}"


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    return (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None)


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


def _matches(view: RunView, where: dict[str, Any]) -> bool:
    return all(_same(view.axes.get(k), v) for k, v in where.items())


def _varying(views: list[RunView], exclude: set[str]) -> list[str]:
    keys = sorted({k for v in views for k in v.axes} - exclude - {"seed"})
    # an option one family lacks (None) does not make an axis vary; differing values do
    return [k for k in keys if len({repr(v.axes.get(k)) for v in views if v.axes.get(k) is not None}) > 1]


def _label(axes: dict[str, Any], keys: list[str]) -> str:
    short = {"d_model": "d", "layers": "n", "heads": "h", "batch_size": "b", "context": "ctx"}
    return ", ".join(f"{short.get(k, k.removeprefix('options.'))}={axes.get(k)}" for k in keys)


def layout_tables(spec: SweepSpec, views: list[RunView]) -> list[Table]:
    tables = []
    for tspec in spec.report.tables:
        chosen = [v for v in views if _matches(v, tspec.where)]
        groups: dict[tuple, list[RunView]] = {}
        for v in chosen:
            groups.setdefault(tuple(repr(v.axes.get(k)) for k in tspec.group_by), []).append(v)
        for key, members in groups.items():
            tables.append(_one_table(spec, tspec, members))
    return tables


def _one_table(spec: SweepSpec, tspec: TableSpec, members: list[RunView]) -> Table:
    col_axis = tspec.columns
    extra = _varying(members, set(tspec.group_by) | {col_axis})
    columns: dict[tuple, list[RunView]] = {}
    for v in sorted(members, key=lambda v: (_sort_key(v.axes.get(col_axis)), [repr(v.axes.get(k)) for k in extra])):
        columns.setdefault((repr(v.axes.get(col_axis)), *[repr(v.axes.get(k)) for k in extra]), []).append(v)
    group_label = _label(members[0].axes, list(tspec.group_by)) if tspec.group_by else ""
    title = tspec.title or group_label or spec.name
    if tspec.title and group_label and len(tspec.group_by) and tspec.where.keys() != set(tspec.group_by):
        title = f"{tspec.title} ({group_label})" if group_label not in tspec.title else tspec.title
    labels = []
    for runs in columns.values():
        label = _label(runs[0].axes, [col_axis])
        if extra:
            label += " (" + _label(runs[0].axes, extra) + ")"
        labels.append(label)
    if spec.report.kind == "memory":
        rows = [("Peak memory (MB)", [_memory_cell(runs) for runs in columns.values()]),
                ("Published (MB)", [_ref_memory(runs) for runs in columns.values()])]
        return Table(title=title, columns=labels, rows=rows, runs=list(columns.values()))
    rows = [("Train", [_loss_cell(runs, "final_train_loss") for runs in columns.values()]),
            ("Test", [_loss_cell(runs, "final_eval_loss") for runs in columns.values()]),
            ("Epochs", [_epochs_cell(runs) for runs in columns.values()])]
    if any(getattr(r.row, "final_eval_accuracy", None) is not None for runs in columns.values() for r in runs):
        rows.append(("Test accuracy", [_loss_cell(runs, "final_eval_accuracy") for runs in columns.values()]))
    notes = []
    repeated = [label for label, runs in zip(labels, columns.values()) if _max_epochs(runs) > 1]
    if repeated:
        most = max(_max_epochs(runs) for runs in columns.values())
        notes.append(f"Data repeated: {', '.join(repeated)} saw the training data more than once (up to {most:.1f} "
                     "epochs), so their test − train gap includes memorisation and the budget compares unequal data.")
    if any(r[0].reference for r in columns.values()):
        rows.append(("Train (published)", [_ref_cell(runs, "train") for runs in columns.values()]))
        rows.append(("Test (published)", [_ref_cell(runs, "eval") for runs in columns.values()]))
        rows.append(("Test − published", [_diff_cell(runs) for runs in columns.values()]))
    seeds = [len(runs) for runs in columns.values()]
    if max(seeds, default=1) > 1:
        spreads = [_mean_std([r.row.final_eval_loss for r in runs if r.row.final_eval_loss is not None])[1]
                   for runs in columns.values() if sum(r.row.final_eval_loss is not None for r in runs) > 1]
        spreads = [s for s in spreads if s is not None]
        if spreads:
            notes.append(f"Noise floor: seed std of test loss up to {max(spreads):.3f}; "
                         "differences smaller than that are not wins.")
    notes += run_notes([v for runs in columns.values() for v in runs])
    notes.append("Losses are token-weighted cross-entropy in nats (the studies averaged per-batch means).")
    return Table(title=title, columns=labels, rows=rows, runs=list(columns.values()), notes=notes)


def run_notes(views: list[RunView]) -> list[str]:
    """What a table's reader must know about how its runs were computed: non-causal training losses, and runs
    whose device was not the sweep's hardware profile."""
    notes = []
    if any(v.axes.get("architecture") == "mod" for v in views):
        from ablate.models.mod_options import TRAINING_NOTE

        notes.append(f"Mixture-of-depths: {TRAINING_NOTE}.")
    elsewhere = {}
    for v in views:
        hw = (v.row.notes or {}).get("hardware") if isinstance(v.row.notes, dict) else None
        if hw and hw.get("mismatch"):
            elsewhere.setdefault((hw.get("profile"), hw.get("device"), hw.get("memory_cap_mb")), []).append(v.row.id)
    for (profile, device, cap), ids in elsewhere.items():
        capped = f", memory capped at {cap / 1024:g} GB" if cap else ""
        notes.append(f"Hardware: run(s) {', '.join(map(str, ids[:10]))}{' …' if len(ids) > 10 else ''} ran on "
                     f"{device}, not the sweep's {profile}{capped}; speeds and wall-clock budgets differ from the study.")
    return notes


def recipe_lines(views: list[RunView]) -> list[str]:
    """The optimisation recipe(s) the runs used, with the precision each actually trained in."""
    from ablate.config import describe_recipe

    found: dict[str, set[str]] = {}
    for v in views:
        if v.trial is not None:
            found.setdefault(describe_recipe(v.trial), set()).add(getattr(v.row, "precision", None) or "not yet run")
    return [f"Recipe: {text} (ran in {', '.join(sorted(ran))})" for text, ran in found.items()]


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


def _status_of(runs: list[RunView]) -> str | None:
    """A status word for a cell whose runs have no final loss yet (or ended without one)."""
    statuses = {r.row.status for r in runs}
    for s in ("oom", "diverged", "pruned", "running", "failed", "preempted", "pending", "cancelled"):
        if s in statuses and all(r.row.status != "completed" for r in runs):
            return s
    return None


def _completed(runs: list[RunView], column: str) -> list[float]:
    """The column's values of the runs that completed with one (a cell's, or a configuration's, numbers)."""
    return [getattr(r.row, column) for r in runs if r.row.status == "completed" and getattr(r.row, column) is not None]


def _loss_cell(runs: list[RunView], column: str) -> str:
    values = _completed(runs, column)
    if not values:
        return _status_of(runs) or "-"
    mean, std = _mean_std(values)
    return f"{mean:.2f} ± {std:.2f}" if std is not None else f"{mean:.2f}"


def _epochs_of(runs: list[RunView]) -> list[float]:
    return [r.row.epochs for r in runs if r.row.epochs is not None]


def _max_epochs(runs: list[RunView]) -> float:
    return max(_epochs_of(runs), default=0.0)


def _epochs_cell(runs: list[RunView]) -> str:
    values = _epochs_of(runs)
    return f"{statistics.fmean(values):.2f}" if values else "-"


def check_orderings(spec: SweepSpec, views: list[RunView]) -> list[str]:
    """For each published ordering in the spec: does our table agree, at each value of its `at` axes?"""
    lines = []
    for order in spec.report.orderings:
        cells: dict[tuple, dict[str, list[float]]] = {}
        for v in views:
            if v.row.status != "completed" or v.row.final_eval_loss is None:
                continue
            for side in ("better", "worse"):
                if _matches(v, getattr(order, side)):
                    key = tuple(v.axes.get(k) for k in order.at)
                    cells.setdefault(key, {"better": [], "worse": []})[side].append(v.row.final_eval_loss)
        verdicts = []
        for key in sorted(cells, key=lambda k: [_sort_key(x) for x in k]):
            better, worse = cells[key]["better"], cells[key]["worse"]
            if not better or not worse:
                continue
            b, w = statistics.fmean(better), statistics.fmean(worse)
            where = ", ".join(f"{k}={x}" for k, x in zip(order.at, key)) or "overall"
            verdicts.append((b < w, f"{where}: {_label_of(order.better)} {b:.2f} vs {_label_of(order.worse)} {w:.2f} "
                                    f"({'agrees' if b < w else 'disagrees'})"))
        if not verdicts:
            lines.append(f"Study: {order.claim} Here: no completed pair of runs to compare yet.")
            continue
        agree = sum(ok for ok, _ in verdicts)
        overall = "agrees" if agree == len(verdicts) else "disagrees" if agree == 0 else "agrees in part"
        lines.append(f"Study: {order.claim} Here, test loss: " + "; ".join(text for _, text in verdicts)
                     + f". Our ordering {overall} with the study's ({agree} of {len(verdicts)}).")
    return lines


def _label_of(match: dict[str, Any]) -> str:
    return " ".join(str(v) for v in match.values())


def _ref_cell(runs: list[RunView], which: str) -> str:
    ref = runs[0].reference
    return _fmt(getattr(ref, which)) if ref is not None else ""


def _diff_cell(runs: list[RunView]) -> str:
    ref = runs[0].reference
    values = _completed(runs, "final_eval_loss")
    if ref is None or ref.eval is None or not values:
        return ""
    return f"{statistics.fmean(values) - ref.eval:+.2f}"


def _memory_cell(runs: list[RunView]) -> str:
    r = runs[0].row
    if r.status == "oom":
        return "OOM"
    if r.status == "completed" and r.peak_memory_mb is not None:
        return f"{r.peak_memory_mb:.0f}"
    return r.status


def _ref_memory(runs: list[RunView]) -> str:
    ref = runs[0].reference
    if ref is None or ref.memory_mb is None:
        return ""
    return ref.memory_mb if isinstance(ref.memory_mb, str) else f"{ref.memory_mb:.0f}"


# ---------------------------------------------------------------- curves


MAX_CURVES = 10  # lines per panel (matplotlib's colour cycle: no two share a colour); a table with more runs
# draws its best configurations' seed means instead
IN_CHUNK = 900  # run ids per metrics query: under SQLite's smallest bound-parameter limit (999)


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


def plan_curves(table: Table, points_csv: str | None = None, cap: int = MAX_CURVES) -> CurvePlan:
    """One line per run up to `cap` runs; past it, runs that differ only by seed are one configuration, and the
    `cap` configurations with the lowest mean final test loss are drawn (`points_csv`: where every run is)."""
    runs = [r for col in table.runs for r in col]
    keys = _varying(runs, set()) or ["architecture"]
    configuration = {r.row.id: _label(r.axes, keys) for r in runs}
    if len(runs) <= cap:
        curves = [Curve(f"run {r.row.id}: {configuration[r.row.id]}", [r], f"run-{r.row.id}") for r in runs]
        return CurvePlan(curves, configuration, runs)
    configs: dict[str, list[RunView]] = {}
    for r in runs:
        configs.setdefault(configuration[r.row.id], []).append(r)
    ranked = sorted(configs.items(), key=lambda c: statistics.fmean(_completed(c[1], "final_eval_loss") or [math.inf]))
    curves = [Curve(f"{label} ({len(members)} run{'s' * (len(members) > 1)})", members, f"config-{rank}")
              for rank, (label, members) in enumerate(ranked[:cap])]
    caption = (f"showing {len(curves)} of {len(configs)} configurations ({len(runs)} runs), those with the lowest "
               "mean final test loss; line: mean over seeds, band: min–max")
    if points_csv:
        caption += f"; every run's points in {points_csv}"
    return CurvePlan(curves, configuration, runs, is_aggregate=True, caption=caption)


def metric_points(engine: sa.Engine, run_ids: list[int]) -> Iterator[Any]:
    """The runs' metric points as rows (run_id, split, step, elapsed_seconds, tokens, loss), ordered as the unique
    index uq_metrics_run_split_step is: one query per IN_CHUNK runs, not one per run."""
    columns = (store.Metric.run_id, store.Metric.split, store.Metric.step, store.Metric.elapsed_seconds, store.Metric.tokens,
               store.Metric.loss)
    ids = sorted(run_ids)
    with engine.connect() as conn:
        for start in range(0, len(ids), IN_CHUNK):
            # all() fetches a chunk at once: iterating the result fetches row by row (~5 µs each through psycopg)
            yield from conn.execute(sa.select(*columns).where(store.Metric.run_id.in_(ids[start:start + IN_CHUNK]))
                                    .order_by(store.Metric.run_id, store.Metric.split, store.Metric.step)).all()


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


X_COLUMN = {"hours": 0, "tokens": 1, "steps": 2}  # of a run's points array: elapsed_seconds, tokens, step, loss


def run_points(engine: sa.Engine, run_ids: list[int]) -> dict[tuple[int, str], Any]:
    """Each run's points of each split, in step order, as an array of rows (elapsed_seconds, tokens, step, loss)."""
    import numpy as np

    grouped: dict[tuple[int, str], list[tuple[Any, ...]]] = {}
    for p in metric_points(engine, run_ids):  # (run_id, split, step, elapsed_seconds, tokens, loss)
        grouped.setdefault((p[0], p[1]), []).append((p[3], p[4], p[2], p[5]))
    return {key: np.array(rows, dtype=float) for key, rows in grouped.items()}


def _seed_band(series: list[Any]) -> tuple[Any, Any, Any, Any]:
    """(x, mean, min, max) of the k-th logged point over the seeds that reached it (seeds log at the same
    fractions of the budget, so their k-th points line up); `series`: one (n, 2) array of (x, loss) per seed."""
    import numpy as np

    longest = max((len(s) for s in series), default=0)
    values = np.zeros((len(series), longest, 2))
    reached = np.zeros((len(series), longest), dtype=bool)
    for i, s in enumerate(series):
        values[i, :len(s)] = s
        reached[i, :len(s)] = True
    count = reached.sum(axis=0)
    mean = np.where(reached[..., None], values, 0.0).sum(axis=0) / count[:, None]  # a NaN loss stays NaN, as in fmean
    loss = values[..., 1]
    return (mean[:, 0], mean[:, 1], np.where(reached, loss, np.inf).min(axis=0),
            np.where(reached, loss, -np.inf).max(axis=0))


def draw_curves(engine: sa.Engine, table: Table, x_axes: tuple[str, ...] = ("hours", "tokens"),
                plan: CurvePlan | None = None):
    """One figure per table: rows train / eval loss, columns the x axes; each panel draws the plan's curves
    (one line per run in a table of up to MAX_CURVES runs)."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan = plan or plan_curves(table)
    points = run_points(engine, [r.row.id for c in plan.curves for r in c.runs])
    none = np.empty((0, 4))
    fig, axes = plt.subplots(2, len(x_axes), figsize=(5.5 * len(x_axes), 7.5), squeeze=False, sharey="row")
    longest = max((float(np.nanmax(pts[:, 0])) for pts in points.values() if len(pts)), default=0.0)
    unit, per = time_unit(longest)
    for i, split in enumerate(("train", "eval")):
        for j, x in enumerate(x_axes):
            ax = axes[i][j]
            scale = per if x == "hours" else 1.0
            for curve in plan.curves:
                series = [points.get((r.row.id, split), none)[:, [X_COLUMN[x], 3]] / (scale, 1.0) for r in curve.runs]
                style = dict(marker="o" if split == "eval" else None, markersize=3, linewidth=1.4, label=curve.label,
                             gid=f"{curve.gid}-{split}-{x}")
                if not plan.is_aggregate:
                    ax.plot(series[0][:, 0], series[0][:, 1], **style)
                    continue
                xs, mean, low, high = _seed_band(series)
                (line,) = ax.plot(xs, mean, **style)
                ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            ax.set_xlabel({"hours": f"training wall clock ({unit})", "tokens": "tokens seen", "steps": "steps"}[x])
            ax.set_ylabel(f"{split} loss (nats)")
            ax.grid(alpha=0.3)
    configs = len(set(plan.configuration.values()))
    title = f"{len(plan.curves)} of {configs} configurations; band: min–max over seeds" if plan.is_aggregate else None
    axes[0][0].legend(fontsize=8, loc="upper right", title=title, title_fontsize=8)
    fig.suptitle(table.title)
    fig.tight_layout()
    return fig


def time_unit(longest_seconds: float) -> tuple[str, float]:
    """Hours for real runs (the studies' axis); minutes or seconds for short ones, so ticks stay readable."""
    if longest_seconds >= 2 * 3600:
        return "hours", 3600.0
    if longest_seconds >= 600:
        return "minutes", 60.0
    return "seconds", 1.0


# ---------------------------------------------------------------- output


@dataclass
class Report:
    sweep: str
    tables: list[Table]
    figures: list[Path]
    out: Path
    files: list[Path]
    orderings: list[str] = field(default_factory=list)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:60] or "table"


def build_report(sweep: str, url: str | None = None, out: Path | None = None,
                 formats: tuple[str, ...] = ("md", "html", "png", "svg", "csv"), skip: tuple[str, ...] = (),
                 artifacts: str | Path | None = None) -> Report:
    """The report of one sweep, laid out as its spec's `report` block says (`artifacts`: where the runs'
    checkpoints are, for the prompt completions). Reads the database, never writes it."""
    engine = store.reader(url)
    with _long_lived() as loaded:
        spec, views = load_views(engine, sweep)
        loaded()
        return _render(engine, spec, views, layout_tables(spec, views), [sweep], url,
                       out or Path("results/reports") / sweep, formats, skip, artifacts)


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


def build_comparison(sweeps: list[str], url: str | None = None, out: Path | None = None,
                     formats: tuple[str, ...] = ("md", "html", "png", "svg", "csv"), skip: tuple[str, ...] = (),
                     artifacts: str | Path | None = None) -> Report:
    """Several sweeps side by side: one table whose columns are the sweeps (and what varies within them)."""
    if len(sweeps) < 2:
        raise AblateError("--compare needs at least two sweep names")
    engine = store.reader(url)
    views: list[RunView] = []
    specs = []
    with _long_lived() as loaded:
        for name in sweeps:
            spec, vs = load_views(engine, name)
            specs.append(spec)
            for v in vs:
                v.axes["sweep"] = name
            views += vs
        loaded()
        title = " vs ".join(sweeps)
        combined = specs[0].model_copy(update={"name": "compare-" + "-".join(sweeps),
                                               "description": f"Comparison: {title}"})
        table = _one_table(combined, TableSpec(title=title, group_by=(), columns="sweep"), views)
        return _render(engine, combined, views, [table], sweeps, url,
                       out or Path("results/reports") / combined.name, formats, skip, artifacts)


def _render(engine: sa.Engine, spec: SweepSpec, views: list[RunView], tables: list[Table], sweeps: list[str],
            url: str | None, out: Path, formats: tuple[str, ...], skip: tuple[str, ...],
            artifacts: str | Path | None = None) -> Report:
    out.mkdir(parents=True, exist_ok=True)
    figures: list[Path] = []
    points_files: list[Path] = []
    embedded: list[str] = []
    captions: list[str] = []
    if spec.report.kind == "loss":
        for t in tables:
            stem = out / f"curves-{_slug(t.title)}"
            plan = plan_curves(t, stem.with_suffix(".csv").name if "csv" in formats else None)
            if "csv" in formats:
                write_curve_points(engine, plan, stem.with_suffix(".csv"))
                points_files.append(stem.with_suffix(".csv"))
            captions.append(plan.caption)
            if {"png", "svg", "html"} & set(formats):
                figures += _save_figure(draw_curves(engine, t, spec.report.curves, plan), stem, formats, embedded)
    files = figures + points_files
    summary = _summary(views)
    recipe = recipe_lines(views) + [f"Override: {note}" for note in spec.overrides]  # incl. hardware not the study's
    orderings = check_orderings(spec, views)
    samples, sampleable = (_samples(views, spec.report.prompt, url, artifacts) if spec.report.prompt
                           and "samples" not in skip else ([], 0))
    of_runs = (f" ({len(samples)} of {sampleable} runs with a checkpoint: the lowest test losses)"
               if len(samples) < sampleable else "")
    if "md" in formats:
        md = [f"# {spec.name}", "", spec.description, "", summary, ""]
        md += [f"{line}  " for line in recipe] + ([""] if recipe else [])
        md += [f"**Against the study.** {line}\n" for line in orderings]
        drawn = set(figures)
        for t, fig_index in zip(tables, range(len(tables))):
            md += [t.markdown(), ""]
            png = out / f"curves-{_slug(t.title)}.png"
            if png in drawn:
                md += [f"![{t.title}]({png.name})", ""]
                md += [f"_Figure: {captions[fig_index]}._", ""] if captions[fig_index] else []
        if samples:
            md += [f"**Completions of the prompt** _{spec.report.prompt}_{of_runs}", ""]
            md += [f"- run {rid} ({label}): {text}" for rid, label, text in samples]
        (out / "report.md").write_text("\n".join(md))
        files.append(out / "report.md")
    if "html" in formats:
        parts = [f"<h1>{html.escape(spec.name)}</h1><p>{html.escape(spec.description)}</p><p>{html.escape(summary)}</p>"]
        parts += [f"<p>{html.escape(line)}</p>" for line in recipe]
        parts += [f"<p><b>Against the study.</b> {html.escape(line)}</p>" for line in orderings]
        for i, t in enumerate(tables):
            parts.append(t.html())
            if i < len(embedded):
                parts.append(f'<img alt="{html.escape(t.title)}" src="data:image/png;base64,{embedded[i]}">')
                parts += [f"<p class=note>Figure: {html.escape(captions[i])}.</p>"] if captions[i] else []
        if samples:
            parts.append(f"<h3>Completions of the prompt</h3><p><i>{html.escape(spec.report.prompt)}</i>"
                         f"{html.escape(of_runs)}</p><ul>")
            parts += [f"<li>run {rid} ({html.escape(label)}): {html.escape(text)}</li>" for rid, label, text in samples]
            parts.append("</ul>")
        style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
                 "td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}img{max-width:100%}.note{color:#555}")
        (out / "report.html").write_text(f"<!doctype html><meta charset=utf-8><title>{html.escape(spec.name)}</title>"
                                         f"<style>{style}</style>" + "".join(parts))
        files.append(out / "report.html")
    if "csv" in formats:
        from ablate import results

        import pandas as pd

        by_sweep: dict[str, list[Any]] = {name: [] for name in sweeps}
        for v in views:
            by_sweep[v.sweep].append(v.row)
        results.to_csv(pd.concat([results.runs_of(rows, name) for name, rows in by_sweep.items()]), out / "runs.csv")
        files.append(out / "runs.csv")
    return Report(sweep=spec.name, tables=tables, figures=figures, out=out, files=files, orderings=orderings)


def _save_figure(fig: Any, stem: Path, formats: tuple[str, ...], embedded: list[str]) -> list[Path]:
    """Render the png once (its bytes are both the file and the HTML's embedded image), the svg once if asked."""
    import matplotlib.pyplot as plt

    saved = []
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    if "png" in formats or "html" in formats:
        stem.with_suffix(".png").write_bytes(png.getvalue())
        saved.append(stem.with_suffix(".png"))
    if "svg" in formats:
        fig.savefig(stem.with_suffix(".svg"), dpi=110)
        saved.append(stem.with_suffix(".svg"))
    embedded.append(base64.b64encode(png.getvalue()).decode())
    plt.close(fig)
    return saved


MAX_COMPLETIONS = 10  # prompt completions in a report (each loads a run's model); past it, the lowest test losses


def _samples(views: list[RunView], prompt: str, url: str | None, artifacts: str | Path | None,
             max_new: int = 48) -> tuple[list[tuple[int, str, str]], int]:
    """(run id, label, greedy completion) for the completed runs whose checkpoint is inside `artifacts`, at most
    MAX_COMPLETIONS of them (the lowest final test losses), and how many runs had such a checkpoint."""
    candidates = [v for v in views if v.row.status == "completed" and v.row.checkpoint_path
                  and v.axes.get("objective", "clm") in ("clm", "multi_token")]  # a next-token head to sample from
    if not candidates:
        return [], 0  # no model to load: torch is not even imported
    from ablate.generate import complete, load_run_model, run_checkpoint

    reachable = []
    for v in candidates:
        try:
            run_checkpoint(v.row, artifacts)
        except AblateError:  # not reachable from here (another machine's artifacts, or outside the folder)
            continue
        reachable.append(v)
    best = sorted(reachable, key=lambda v: _completed([v], "final_eval_loss") or [math.inf])[:MAX_COMPLETIONS]
    chosen = {v.row.id for v in best}
    keys = _varying(views, set()) or ["architecture"]
    out = []
    for v in reachable:
        if v.row.id in chosen:
            trial, model, tokenizer = load_run_model(v.row.id, url, artifacts)
            text = complete(model, tokenizer, prompt, trial.context, max_new=max_new).replace("\n", " ")
            out.append((v.row.id, _label(v.axes, keys), text))
    return out, len(reachable)


def _summary(views: list[RunView]) -> str:
    counts: dict[str, int] = {}
    for v in views:
        counts[v.row.status] = counts.get(v.row.status, 0) + 1
    return f"{len(views)} runs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
