"""A report put together and written: `build_report` (one sweep) and `build_comparison` (several side by side) load
the runs, lay out the tables, draw the figures, and write report.md, report.html (from the jinja2 template
templates/report.html.j2, autoescaped: every name, description, label and note a user wrote is escaped by the
template engine), the figures and runs.csv."""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import sqlalchemy as sa

from ablate import store
from ablate.config import SweepSpec, TableSpec
from ablate.config.errors import AblateError
from ablate.report.curves import draw_curves, plan_curves, write_curve_points
from ablate.report.answer import answer
from ablate.report.notes import check_orderings, floor_line, recipe_lines
from ablate.report.race import RaceTable, apply_race, read_race
from ablate.report.reading import at_note, with_reading, write_tables_csv
from ablate.report.samples import prompt_completions
from ablate.report.scaling import draw_laws, scaling_lines, write_scaling_csv
from ablate.report.tables import Table, one_table, layout_tables
from ablate.report.verdicts import VerdictTable, verdict_table
from ablate.report.views import long_lived
from ablate.config.units import parse_at
from ablate.results.equal import read_runs_at
from ablate.results.laws import Laws, fit_laws
from ablate.results.csvtext import write_records_csv
from ablate.results.orderings import CLAIM_COLUMNS, Claims, check_claims, claim_rows, noise_floor
from ablate.results.views import RunView, load_views

FORMATS = ("md", "html", "png", "svg", "csv")  # the default; "points" adds each table's every point (curves-*.csv)
KNOWN_FORMATS = (*FORMATS, "points")


@dataclass
class Report:
    """What was built: the tables, the figure files, every file written (in `out`), the orderings checked."""

    sweep: str
    tables: list[Table]
    figures: list[Path]
    out: Path
    files: list[Path]
    orderings: list[str] = field(default_factory=list)
    answer: list[str] = field(default_factory=list)  # each claim's verdict as a sentence (report/answer.py)
    scaling: list[str] = field(default_factory=list)
    claims: Claims | None = None  # the orderings' comparisons, verdicts and noise floor (claims.csv)
    floor: str | None = None  # the noise floor line, where orderings were checked
    method: str | None = None  # how the verdicts were reached, where orderings were checked
    seconds: dict[str, float] = field(default_factory=dict)  # CPU seconds per part (load, tables, figures, ...)


class Parts(dict):
    """CPU seconds of this process per part of a report, as `with parts("tables"): ...` (bench/db.py prints them);
    `say`: told each part as it starts, with the seconds the last one took (`ablate report`'s progress)."""

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.say = say
        self.wall = time.monotonic()

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.say is not None:
            self.say(f"report: {PART_WORDS.get(name, name)} ({time.monotonic() - self.wall:.0f} s so far)")
        start = time.process_time()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.process_time() - start


PART_WORDS = {"load": "reading the runs", "tables": "the tables", "figures": "drawing the curves",
              "scaling": "fitting the scaling laws", "claims": "testing the claims", "files": "writing the files"}


@dataclass
class Figures:
    """The tables' loss-curve figures: the image files written, every run's points (CSV), and for each table in
    order its caption and the base64 PNG report.html embeds (none when no figure was drawn)."""

    files: list[Path] = field(default_factory=list)  # png, svg
    points: list[Path] = field(default_factory=list)  # curves-*.csv
    captions: list[str] = field(default_factory=list)
    embedded: list[str] = field(default_factory=list)
    scaling: str | None = None  # the scaling figure's base64 PNG, when one was drawn
    together: tuple[str, str] | None = None  # (caption, base64 PNG) of every table's runs on one axis, when drawn


@dataclass
class Page:
    """What report.md and report.html both say, worked out once."""

    spec: SweepSpec
    tables: list[Table]
    out: Path
    summary: str
    recipe: list[str]  # the recipes the runs trained with, and the spec's overrides
    orderings: list[str]  # the study's published orderings, checked
    claims: Claims
    floor: str | None  # the noise floor the orderings are read against
    verdicts: VerdictTable | None  # the claims as a table, with the method line (None: no orderings)
    scaling: list[str]  # each architecture's fitted laws and the crossovers, in words
    samples: list[tuple[int, str, str]]  # (run id, label, completion of the prompt)
    of_runs: str  # which runs the completions are, when not every run with a checkpoint
    figures: Figures
    race: RaceTable | None = None  # an adaptive sweep's decisions, round by round
    answer: list[str] = field(default_factory=list)  # each claim's verdict as a sentence: the page opens with it


def build_report(sweep: str, url: str | None = None, out: Path | None = None,
                 formats: tuple[str, ...] = FORMATS, skip: tuple[str, ...] = (),
                 artifacts: str | Path | None = None, at: str | None = None,
                 group: tuple[str, ...] | None = None, progress: Callable[[str], None] | None = None) -> Report:
    """The report of one sweep, laid out as its spec's `report` block says (`artifacts`: where the runs'
    checkpoints are, for the prompt completions; `at`, `group`: over the block's, see reading.py; `progress`: told
    each part as it starts). Reads the database, never writes it."""
    engine = store.reader(url)
    parts = Parts(progress)
    with long_lived() as loaded:
        with parts("load"):
            spec, views = load_views(engine, sweep)
            loaded()
            spec = with_reading(spec, views, at, group)
            read = read_runs_at(engine, views, parse_at(spec.report.at))  # as the tables read them
        with parts("tables"):
            floor = noise_floor(read, spec.report.min_steps)  # the tables' and the claims' one floor
            tables = layout_tables(spec, read, floor)
        return _render(engine, spec, read, tables, [sweep], url, out or Path("results/reports") / sweep, formats,
                       skip, artifacts, stored=views, parts=parts, floor=floor)


def build_comparison(sweeps: list[str], url: str | None = None, out: Path | None = None,
                     formats: tuple[str, ...] = FORMATS, skip: tuple[str, ...] = (),
                     artifacts: str | Path | None = None) -> Report:
    """Several sweeps side by side: one table whose columns are the sweeps (and what varies within them)."""
    if len(sweeps) < 2:
        raise AblateError("--compare needs at least two sweep names")
    engine = store.reader(url)
    views: list[RunView] = []
    specs = []
    with long_lived() as loaded:
        for name in sweeps:
            spec, vs = load_views(engine, name)
            specs.append(spec)
            for v in vs:
                v.axes["sweep"] = name
            views += vs
        _fill_unvaried(views)
        loaded()
        title = " vs ".join(sweeps)
        combined = specs[0].model_copy(update={"name": "compare-" + "-".join(sweeps),
                                               "description": f"Comparison: {title}"})
        table = one_table(combined, TableSpec(title=title, group_by=(), columns="sweep"), views)
        return _render(engine, combined, views, [table], sweeps, url,
                       out or Path("results/reports") / combined.name, formats, skip, artifacts)


def _fill_unvaried(views: list[RunView]) -> None:
    """An axis one sweep varies and another holds constant: the other's runs get their own value of it, from their
    configuration, not None (a column 'weight_decay=None' for runs whose config holds 0.0)."""
    keys = {k for v in views for k in v.axes}
    for v in views:
        missing = keys - v.axes.keys()
        if missing and v.trial is not None:
            flat = v.trial.flat()
            v.axes.update({k: flat[k] for k in sorted(missing) if k in flat})


def _render(engine: sa.Engine, spec: SweepSpec, views: list[RunView], tables: list[Table], sweeps: list[str],
            url: str | None, out: Path, formats: tuple[str, ...], skip: tuple[str, ...],
            artifacts: str | Path | None = None, stored: list[RunView] | None = None,
            parts: Parts | None = None, floor: dict[str, tuple[float | None, int]] | None = None) -> Report:
    """Draw the figures, then write each file `formats` asks for (`views`: the runs as the tables read them;
    `stored`: as the DB holds them, for runs.csv and the samples; `parts`: CPU seconds per part, added to;
    `floor`: the views' noise floor, where the tables computed it)."""
    stored = views if stored is None else stored
    parts = Parts() if parts is None else parts
    out.mkdir(parents=True, exist_ok=True)
    with parts("figures"):
        figures = _draw_figures(engine, spec, tables, out, formats)
    with parts("scaling"):
        laws = fit_laws(views, spec.report.min_steps) if spec.report.kind == "loss" else Laws()
        if laws.laws and {"png", "svg", "html"} & set(formats):
            embedded: list[str] = []
            figures.files += _save_figure(draw_laws(laws, spec.name), out / "scaling", formats, embedded)
            figures.scaling = embedded[0]
    with parts("claims"):
        page = _page(spec, views, tables, out, figures, url, skip, artifacts, stored, scaling_lines(laws),
                     read_race(engine, spec, views), floor)
    with parts("files"):
        files = _write_files(page, laws, figures, stored, sweeps, formats)
    return Report(sweep=spec.name, tables=tables, figures=figures.files, out=out, files=files,
                  orderings=page.orderings, answer=page.answer, claims=page.claims, floor=page.floor, scaling=page.scaling,
                  method=page.verdicts.method if page.verdicts and page.claims.cells else None, seconds=dict(parts))


def _write_files(page: Page, laws: Laws, figures: Figures, stored: list[RunView], sweeps: list[str],
                 formats: tuple[str, ...]) -> list[Path]:
    """report.md, report.html, runs.csv, tables.csv, claims.csv and scaling.csv, as `formats` asks."""
    out, tables = page.out, page.tables
    files = figures.files + figures.points
    if "md" in formats:
        files.append(_write(out / "report.md", render_markdown(page)))
    if "html" in formats:
        files.append(_write(out / "report.html", render_html(page)))
    if "csv" in formats:
        files.append(_write_runs_csv(stored, sweeps, out / "runs.csv"))
        files.append(write_tables_csv(tables, out / "tables.csv"))
        if page.claims.cells:
            write_records_csv(claim_rows(page.claims), CLAIM_COLUMNS, out / "claims.csv")
            files.append(out / "claims.csv")
        if laws.laws:
            files.append(write_scaling_csv(laws, out / "scaling.csv"))
    return files


def _draw_figures(engine: sa.Engine, spec: SweepSpec, tables: list[Table], out: Path,
                  formats: tuple[str, ...]) -> Figures:
    """A loss report's figure of each table (png, svg, embedded in the html) and the points behind it (csv)."""
    figures = Figures()
    if spec.report.kind != "loss":
        return figures
    read: dict = {}  # each run's points read once, for its table's figure and the one of every table
    for t in tables:
        stem = _figure_stem(out, t)
        plan = plan_curves(t, stem.with_suffix(".csv").name if "points" in formats else None, group=spec.report.group)
        if "points" in formats:  # at 100,000 runs x 200 points a 1.4 GB file: written only when asked
            write_curve_points(engine, plan, stem.with_suffix(".csv"))
            figures.points.append(stem.with_suffix(".csv"))
        figures.captions.append(plan.caption)
        if {"png", "svg", "html"} & set(formats):
            figures.files += _save_figure(draw_curves(engine, t, spec.report.curves, plan, read), stem, formats,
                                          figures.embedded)
    if len(tables) > 1 and {"png", "svg", "html"} & set(formats):
        figures.together = _draw_together(engine, spec, tables, out, formats, figures, read)
    return figures


def _draw_together(engine: sa.Engine, spec: SweepSpec, tables: list[Table], out: Path, formats: tuple[str, ...],
                   figures: Figures, read: dict | None = None) -> tuple[str, str]:
    """Every table's runs in one figure, on one scale: the sweep's own comparison (mixer beside Llama) where its
    tables split the families apart."""
    together = Table(title=f"{spec.name}: every table on one axis", columns=[c for t in tables for c in t.columns],
                     rows=[], runs=[runs for t in tables for runs in t.runs])
    plan = plan_curves(together)
    png: list[str] = []
    figures.files += _save_figure(draw_curves(engine, together, spec.report.curves, plan, read),
                                  out / "curves-together", formats, png)
    return "every table's runs on one axis, one scale" + (f"; {plan.caption}" if plan.caption else ""), png[0]


def _page(spec: SweepSpec, views: list[RunView], tables: list[Table], out: Path, figures: Figures, url: str | None,
          skip: tuple[str, ...], artifacts: str | Path | None, stored: list[RunView], scaling: list[str],
          race: tuple[RaceTable | None, dict[str, str] | None] = (None, None),
          floor: dict[str, tuple[float | None, int]] | None = None) -> Page:
    recipe = recipe_lines(views) + [f"Override: {note}" for note in spec.overrides]  # incl. hardware not the study's
    recipe += [line for line in [at_note(spec)] if line]
    claims = check_claims(spec, views, floor=floor)
    apply_race(claims, race[1])
    orderings = check_orderings(spec, views, claims)
    samples, sampleable = (prompt_completions(stored, spec.report.prompt, url, artifacts) if spec.report.prompt
                           and "samples" not in skip else ([], 0))
    of_runs = (f" ({len(samples)} of {sampleable} runs with a checkpoint: the lowest test losses)"
               if len(samples) < sampleable else "")
    return Page(spec=spec, tables=tables, out=out, summary=_summary(views), recipe=recipe, orderings=orderings,
                claims=claims, floor=floor_line(claims) if claims.cells else None,
                verdicts=verdict_table(spec, claims, race[1]), scaling=scaling, samples=samples,
                of_runs=of_runs, figures=figures, race=race[0], answer=answer(spec, claims))


def render_markdown(page: Page) -> str:
    """report.md: the tables in markdown, each with its figure (the png beside it) and caption."""
    spec = page.spec
    md = [f"# {spec.name}", "", spec.description, "", page.summary, ""]
    md += ["**The answer.**", "", *(f"- {line}" for line in page.answer), ""] if page.answer else []
    md += [f"{line}  " for line in page.recipe] + ([""] if page.recipe else [])
    md += [page.verdicts.markdown(), ""] if page.verdicts else []
    md += [page.race.markdown(), ""] if page.race else []
    drawn = set(page.figures.files)
    for i, t in enumerate(page.tables):
        md += [t.markdown(), ""]
        png = _figure_stem(page.out, t).with_suffix(".png")
        if png in drawn:
            md += [f"![{t.title}]({png.name})", ""]
            caption = page.figures.captions[i]
            md += [f"_Figure: {caption}._", ""] if caption else []
    if page.out / "curves-together.png" in drawn:
        md += ["**All tables on one axis.**", "", "![all tables on one axis](curves-together.png)", "",
               f"_Figure: {page.figures.together[0]}._", ""]
    if page.scaling:
        md += ["**Scaling.** Test loss fitted per architecture as L = E + A·x^-α:", ""]
        md += [f"- {line}" for line in page.scaling] + [""]
        md += ["![scaling](scaling.png)", ""] if page.out / "scaling.png" in drawn else []
    if page.samples:
        md += [f"**Completions of the prompt** _{spec.report.prompt}_{page.of_runs}", ""]
        md += [f"- run {rid} ({label}): {text}" for rid, label, text in page.samples]
    return "\n".join(md)


def render_html(page: Page) -> str:
    """report.html, self-contained (figures embedded as base64 PNG): the template escapes every string."""
    figures = page.figures
    shown = [{"table": t, "png": figures.embedded[i] if i < len(figures.embedded) else None,
              "caption": figures.captions[i] if i < len(figures.embedded) else ""} for i, t in enumerate(page.tables)]
    return _templates().get_template("report.html.j2").render(
        name=page.spec.name, description=page.spec.description, summary=page.summary, answer=page.answer,
        recipe=page.recipe,
        verdicts=page.verdicts, race=page.race, tables=shown, prompt=page.spec.report.prompt, of_runs=page.of_runs,
        samples=page.samples, scaling=page.scaling, scaling_png=figures.scaling, together=figures.together)


@functools.cache
def _templates() -> jinja2.Environment:
    # autoescape on for every template: select_autoescape would go by the name, and ours ends in .j2
    return jinja2.Environment(loader=jinja2.PackageLoader("ablate.report", "templates"), autoescape=True,
                              trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _write_runs_csv(views: list[RunView], sweeps: list[str], path: Path) -> Path:
    """runs.csv from the runs already loaded (the bytes `results.runs` would give), each tagged with its sweep."""
    from ablate.results.csvtext import write_runs_csv

    by_sweep: dict[str, list[Any]] = {name: [] for name in sweeps}
    for v in views:
        by_sweep[v.sweep].append(v.row)
    write_runs_csv(by_sweep, path)
    return path


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:60] or "table"


def _figure_stem(out: Path, table: Table) -> Path:
    return out / f"curves-{_slug(table.title)}"


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


def _summary(views: list[RunView]) -> str:
    counts: dict[str, int] = {}
    for v in views:
        counts[v.row.status] = counts.get(v.row.status, 0) + 1
    return f"{len(views)} runs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
