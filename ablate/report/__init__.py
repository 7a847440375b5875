"""Reports: the studies' comparison tables and loss curves, rendered from the results database.

`build_report` reads one sweep's runs and metrics, lays out the tables its spec's `report` block
declares (rows Train / Test, columns the varying axis, published numbers beside ours), draws the
loss curves, and writes report.md, a self-contained report.html, the figures and runs.csv.

- `views.py`: which axes vary among runs, their labels (runs themselves: RunView, load_views in ablate.results).
- `tables.py`: the tables (Table, layout_tables) and their cells' formatting.
- `notes.py`: what is said beside the tables: run notes, recipes, the study's orderings checked, the method line.
- `verdicts.py`: the claims as a table (report.md, report.html and the dashboard's study).
- `curves.py`: the loss curves: which lines a figure draws, the metric points, their CSV, the figure.
- `samples.py`: completions of the sweep's prompt by the best runs' models.
- `reading.py`: `--at` / `--group` over the spec's report block, and tables.csv (every cell as numbers).
- `scaling.py`: the scaling section: fitted laws in words, their figure, scaling.csv.
- `render.py`: build_report and build_comparison; report.md, report.html (jinja2, from
  `templates/report.html.j2`, autoescaped), the figures and runs.csv written.
"""

from __future__ import annotations

from ablate.report.curves import (
    AGGREGATE_CHUNK,
    MAX_CURVES,
    POINT_COLUMNS,
    POINTS_AS_TEXT,
    X_LABELS,
    Curve,
    CurvePlan,
    draw_curves,
    plan_curves,
    time_unit,
    write_curve_points,
)
from ablate.results.points import IN_CHUNK, metric_points, run_points
from ablate.report.notes import check_orderings, recipe_lines, run_notes
from ablate.report.render import Report, build_comparison, build_report, render_html, render_markdown
from ablate.report.samples import MAX_COMPLETIONS, prompt_completions
from ablate.report.tables import Table, layout_tables
from ablate.report.views import UNFINISHED
from ablate.results.views import RunView, load_views

__all__ = [
    "AGGREGATE_CHUNK", "IN_CHUNK", "MAX_COMPLETIONS", "MAX_CURVES", "POINT_COLUMNS", "POINTS_AS_TEXT", "UNFINISHED",
    "X_LABELS", "Curve", "CurvePlan", "Report", "RunView", "Table", "build_comparison", "build_report",
    "check_orderings", "draw_curves", "layout_tables", "load_views", "metric_points", "plan_curves", "prompt_completions",
    "recipe_lines", "render_html", "render_markdown", "run_notes", "run_points", "time_unit", "write_curve_points",
]
