"""The dashboard's web app (FastAPI, which Prefect already installs): four pages (sweeps, a sweep, a run, a search) drawn
in the browser from JSON endpoints that only read.

Read-only by construction: the engine is `store.reader`'s (a read-only connection that never creates or migrates
a database) and every route is a GET. Every user-controlled string reaches the page as data: the templates are
autoescaped, and the page's script writes cells with `textContent`, never as HTML. The Content-Security-Policy
allows scripts from this server only, so an injected `<script>` could not run even if it reached the page.
"""

from __future__ import annotations

import hmac
import threading
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.config.errors import AblateError
from ablate.config.units import X_KINDS
from ablate.results import live, searches
from ablate.ui import charts, reads, table
from ablate.ui.cache import Cache

HERE = Path(__file__).parent
PAGE_ROWS = 50  # runs per page of the table
MAX_SERIES = 40  # curves per chart: the first ones the table's filter and sort pick
MAX_COMPARE = 8  # runs one comparison shows side by side
MAX_CURVE_RUNS = 1000  # runs whose points one chart reads (10,000 runs x 20 eval points: ~1 CPU-s; this ~0.1)
SAMPLE_MODELS, MAX_SAMPLE_TOKENS, MAX_PROMPT = 2, 256, 1000  # models kept loaded; a sample's bounds
STUDY_EVERY = 30.0  # seconds: a study computed here (~0.5 CPU-s at 10,000 runs) is read at most this often
LIVE_SWEEPS = 2  # sweeps whose views the dashboard holds between reads (10,000 runs hold about 72 MiB)
COOKIE = "ablate_ui_token"
HEADERS = {"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                      "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


class Samples:
    """Greedy completions from a run's final checkpoint (inside the artifacts folder only), by the code `ablate
    generate` and the report use; the last SAMPLE_MODELS models stay loaded."""

    def __init__(self, engine: sa.Engine, artifacts: Path | None) -> None:
        self.engine, self.artifacts = engine, artifacts
        self._lock = threading.Lock()
        self._models: dict[int, Any] = {}

    def complete(self, run_id: int, prompt: str, tokens: int) -> str:
        if not 1 <= tokens <= MAX_SAMPLE_TOKENS or not prompt.strip() or len(prompt) > MAX_PROMPT:
            raise AblateError(f"a sample needs a prompt of 1 to {MAX_PROMPT} characters and tokens from 1 to "
                              f"{MAX_SAMPLE_TOKENS}")
        from ablate.train.generate import complete, load_run_model

        with self._lock:  # one model at a time on a CPU's cores
            if run_id not in self._models:
                if len(self._models) >= SAMPLE_MODELS:
                    self._models.pop(next(iter(self._models)))
                self._models[run_id] = load_run_model(run_id, self.engine, self.artifacts)
            trial, model, tokenizer = self._models[run_id]
            return complete(model, tokenizer, prompt, trial.context, max_new=tokens)


class Dashboard:
    """What the endpoints read, each as a plain method returning JSON-ready data (make_app routes them): the
    reader engine, the rows and study cached per change token, the loaded models of samples."""

    def __init__(self, engine: sa.Engine, artifacts: Path | None) -> None:
        self.engine, self.artifacts = engine, artifacts
        self.cache = Cache()
        self.samples = Samples(engine, artifacts)
        self.live: dict[int, Any] = {}  # sweep id -> its LiveViews, for the studies computed here (LIVE_SWEEPS)
        self.live_lock = threading.Lock()
        self.hosts = reads.Drained(engine)  # the sweep's pool's drained hosts

    def rows_of(self, sweep: str) -> tuple[str, list[dict[str, Any]], list[str], int]:
        """The change token, the sweep's rows, the table's columns (read again only when the token moved) and the
        sweep's id."""
        row = live.sweep_row(self.engine, sweep)
        now, _ = live.change_tokens(self.engine, row.id)

        def read() -> tuple[list[dict[str, Any]], list[str]]:
            rows = live.run_rows(self.engine, row.id)
            return rows, table.columns(rows)

        return now, *self.cache.get("rows", row.id, now, read), row.id

    def style_of(self, sweep_id: int, now: str, rows: list[dict[str, Any]], keys: list[str], color: str = "",
                 dash: str = "") -> dict[str, Any]:
        """charts.styles over the sweep's rows, kept per change token and choice of axes (the table and the chart
        ask for the same one)."""
        kind = f"style {keys} {color} {dash}"
        return self.cache.get(kind, sweep_id, now, lambda: charts.styles(rows, keys, color, dash))

    def sweeps(self) -> dict[str, Any]:
        return {"sweeps": live.sweep_summaries(self.engine), "searches": searches.search_summaries(self.engine)}

    def search(self, name: str) -> dict[str, Any]:
        """A search's trials, its parameters and their importances (computed again only when a trial completed)."""
        with self.engine.connect() as conn:
            sweep = conn.execute(sa.select(store.Sweep.name).where(store.Sweep.name == name)).scalar()
        found = searches.search_trials(self.engine, name)
        kinds = found.pop("kinds")
        done = repr([(t["number"], t["value"]) for t in found["trials"] if t["state"] == "COMPLETE"])
        found["importances"] = self.cache.get(f"importances {name}", 0, done, lambda: searches.importances(
            found["trials"], kinds, found["direction"]))
        return {**found, "sweep": sweep}

    def token(self, sweep: str) -> dict[str, Any]:
        now, finished = live.change_tokens(self.engine, live.sweep_row(self.engine, sweep).id)
        return {"token": now, "finished": finished}

    def runs(self, sweep: str, filter: str = "", sort: str = "", offset: int = 0,  # noqa: A002 - the query's name
             limit: int = PAGE_ROWS, columns: str = "") -> dict[str, Any]:
        now, rows, cols, sweep_id = self.rows_of(sweep)
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        page = table.page(rows, filter, sort, offset, max(1, min(limit, 500)), cols, columns)
        style = self.style_of(sweep_id, now, rows, charts.group_keys("seeds", cols))
        shown = {r["run"] for r in page["rows"]}
        axes = {r["run"]: r for r in rows if r["run"] in shown}
        for r in page["rows"]:  # the configuration's colour and dash, as its curve has them
            r["_color"], r["_dash"] = style["of"](axes[r["run"]])
        return {**page, "token": now, "counts": dict(sorted(counts.items())), "hosts": self.hosts(sweep)}

    def runs_csv(self, sweep: str, filter: str = "", sort: str = "", columns: str = "") -> Any:  # noqa: A002
        """Every run the filter keeps (not one page), in the table's order and columns, as CSV."""
        from fastapi.responses import Response

        _, rows, cols, _ = self.rows_of(sweep)
        shown = table.chosen(columns, table.available(rows, cols)) or cols
        text = table.csv_text(table.selected(rows, filter, sort), shown)
        return Response(text, media_type="text/csv", headers={
            "Content-Disposition": f'attachment; filename="{_file_name(sweep)}-runs.csv"'})

    def curves(self, sweep: str, filter: str = "", sort: str = "", x: str = "steps",  # noqa: A002
               y: str = "eval", group: str = "seeds", runs: str = "", facet: str = "", color: str = "",
               dash: str = "") -> dict[str, Any]:
        """The chart's curves: the runs the filter keeps (or the selected `runs`, comma separated), grouped by
        `group` (charts.group_keys), each styled as its configuration is everywhere, with its `facet` value."""
        now, rows, cols, sweep_id = self.rows_of(sweep)
        picked = table.selected(rows, filter, sort)
        if runs:
            chosen = set(_ids(runs))
            picked = [r for r in rows if r["run"] in chosen]
        keys = charts.group_keys(group, cols, facet)
        style = self.style_of(sweep_id, now, rows, keys if keys != ["run"] else charts.group_keys("seeds", cols),
                              color, dash)
        grouped = charts.groups(picked, keys, cols)
        shown = dict(list(grouped.items())[:MAX_SERIES])
        each = max(1, MAX_CURVE_RUNS // max(1, len(shown)))
        read = {label: {**g, "runs": g["runs"][:each]} for label, g in shown.items()}
        series = live.curves(self.engine, [i for g in read.values() for i in g["runs"]], x, y)
        drawn = [c for c in (charts.curve(label, g, series, style["of"], facet) for label, g in read.items()) if c]
        notes = []
        if len(grouped) > MAX_SERIES:
            notes.append(f"showing the first {MAX_SERIES} of {len(grouped):,} curves (the table's order): filter to narrow")
        if any(len(g["runs"]) > each for g in shown.values()):
            notes.append(f"a curve averages at most {each:,} runs, the first in the table's order "
                         f"({sum(len(g['runs']) for g in read.values()):,} of "
                         f"{sum(len(g['runs']) for g in shown.values()):,} runs read)")
        legend = {k: style[k] for k in ("color", "dash", "shade", "colors", "dashes")}
        return {"series": drawn, "note": "; ".join([charts.band_note(drawn), *notes]), "token": now, "x": x, "y": y,
                "facet": facet, "legend": legend, "axes": charts.axes_of(cols)}

    def curves_svg(self, sweep: str, filter: str = "", sort: str = "", x: str = "steps",  # noqa: A002
                   y: str = "eval", group: str = "seeds", runs: str = "", facet: str = "", color: str = "",
                   dash: str = "", logx: bool = False, logy: bool = False) -> Any:
        """The chart as SVG (matplotlib, as the report's figures): the same curves, colours, dashes and facets."""
        from fastapi.responses import Response

        from ablate.ui.svg import chart_svg

        data = self.curves(sweep, filter, sort, x, y, group, runs, facet, color, dash)
        return Response(chart_svg(data, logx, logy), media_type="image/svg+xml", headers={
            "Content-Disposition": f'attachment; filename="{_file_name(sweep)}-{y}-by-{x}.svg"'})

    def compare(self, runs: str, x: str = "steps", y: str = "eval", seeds: bool = False) -> dict[str, Any]:
        """A few runs (of any sweeps) side by side: their fields with the differing ones marked, their curves and
        each one's difference from the first. `seeds`: each run stands for its configuration (the runs of its
        sweep that differ from it only by seed): their mean curve and band, and the differences of the means."""
        ids = _ids(runs)
        if not 2 <= len(ids) <= MAX_COMPARE:
            raise AblateError(f"compare: give 2 to {MAX_COMPARE} run ids (runs=1,2,...), not {len(ids)}")
        rows, configs = live.some_runs(self.engine, ids)
        missing = [i for i in ids if i not in {r["run"] for r in rows}]
        if missing:
            raise AblateError(f"compare: no run with id {missing[0]} in the results DB")
        rows = sorted(rows, key=lambda r: ids.index(r["run"]))
        groups = {r["run"]: self._configuration(r) if seeds else [r["run"]] for r in rows}
        series = live.curves(self.engine, [i for g in groups.values() for i in g], x, y)
        curves, means = [], {}
        for k, (run, members) in enumerate(groups.items()):
            colour = charts.PALETTE[k % len(charts.PALETTE)]
            one = charts.curve(f"run {run}" + (" and its seeds" if seeds else ""), {"axes": {}, "runs": members},
                               series, lambda _axes, c=colour: (c, []), "")
            if one is not None:
                curves.append({**one, "run": run})
                means[run] = (one["x"], one["mean"])
        fields = charts.compare(rows, configs)
        if seeds:
            fields.insert(0, {"field": "runs (its seeds)", "values": [", ".join(map(str, g)) for g in groups.values()],
                              "differ": True})
        return {"runs": ids, "fields": fields, "series": curves, "differences": charts.differences(means, ids),
                "x": x, "y": y, "seeds": seeds}

    def _configuration(self, row: dict[str, Any]) -> list[int]:
        """The runs of `row`'s sweep that differ from it only by seed (itself first)."""
        _, rows, cols, _ = self.rows_of(row["sweep"])
        keys = charts.group_keys("seeds", cols)
        same = [r["run"] for r in rows if all(r.get(k) == row.get(k) for k in keys)]
        return [row["run"], *(i for i in same if i != row["run"])]

    def study(self, sweep: str) -> dict[str, Any]:
        """The study the sweep's runner kept, if it is still the sweep's (or recent); else computed here, from the
        sweep's views held since the last read (only the runs that changed are read again)."""
        from ablate.results.liveviews import LiveViews
        from ablate.results.study import read_study

        row = live.sweep_row(self.engine, sweep)
        _, finished = live.change_tokens(self.engine, row.id)
        with self.live_lock:
            views = self.live.pop(row.id, None) or LiveViews(row.name)
            self.live[row.id] = views  # the last read last: the oldest go first
            while len(self.live) > LIVE_SWEEPS:
                self.live.pop(next(iter(self.live)))
        # a kept study is read again whenever runs finish, and one kept before they did on every request (0.06 CPU-s)
        return self.cache.get("study", row.id, finished, lambda: read_study(self.engine, row.id, row.name, views),
                              every=lambda s: -1.0 if s.get("behind") else 0.0 if s.get("kept") else STUDY_EVERY)

    def run(self, run_id: int) -> dict[str, Any]:
        run_id = _run_id(run_id)
        return reads.run(self.engine, run_id, self.artifacts)

    def sample(self, run_id: int, prompt: str = "Once upon a time", tokens: int = 48) -> dict[str, Any]:
        run_id = _run_id(run_id)
        return {"prompt": prompt, "completion": self.samples.complete(run_id, prompt, tokens)}

    def run_curves(self, run_id: int, x: str = "steps") -> dict[str, Any]:
        run_id = _run_id(run_id)
        return {split: [{"label": split, "x": c[0], "mean": c[1], "low": None, "high": None}
                        for c in live.curves(self.engine, [run_id], x, split).values()] for split in ("train", "eval")}


def make_app(engine: sa.Engine, artifacts: Path | None = None, token: str | None = None, label: str | None = None
             ) -> Any:
    """The dashboard over `engine` (a reader; `label`: the database as its header names it). With `token`, every
    request must carry it (`?token=` once, which sets a cookie, or `Authorization: Bearer`)."""
    from fastapi import FastAPI, Response
    from fastapi.responses import JSONResponse
    from fastapi.staticfiles import StaticFiles

    app = FastAPI(title="ablate", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.middleware("http")(_guard(token))
    board = Dashboard(engine, artifacts)
    _pages(app, engine, label or store.describe_url(str(engine.url)))
    app.get("/favicon.ico")(lambda: Response(status_code=204))
    for path, read in (("/api/sweeps", board.sweeps), ("/api/search", board.search), ("/api/token", board.token),
                       ("/api/runs", board.runs), ("/api/runs.csv", board.runs_csv), ("/api/curves", board.curves),
                       ("/api/curves.svg", board.curves_svg), ("/api/compare", board.compare), ("/api/study", board.study),
                       ("/api/run/{run_id}", board.run), ("/api/run/{run_id}/sample", board.sample),
                       ("/api/run/{run_id}/curves", board.run_curves)):
        app.get(path)(read)

    @app.exception_handler(AblateError)
    def refused(_request: Any, exc: AblateError) -> JSONResponse:
        return JSONResponse({"error": store.redact(str(exc))}, status_code=400, headers=HEADERS)

    @app.exception_handler(sa.exc.OperationalError)
    def unreachable(_request: Any, exc: sa.exc.OperationalError) -> JSONResponse:
        """The database went away (a stopped server, a removed file): one line the page shows, and it retries."""
        said = store.explain(exc, str(engine.url)) or str(exc.orig).splitlines()[0][:300]
        return JSONResponse({"error": "the results DB cannot be read now: " + store.redact(said)}, status_code=503,
                            headers=HEADERS)

    return app


def _pages(app: Any, engine: sa.Engine, db_text: str) -> None:
    """The five HTML pages: skeletons (autoescaped) that the page script fills from the JSON endpoints."""
    import jinja2
    from fastapi.responses import HTMLResponse

    pages = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)

    def html(template: str, **context: Any) -> HTMLResponse:
        return HTMLResponse(pages.get_template(template).render(db=db_text, **context))

    @app.get("/", response_class=HTMLResponse)
    def sweeps_page() -> HTMLResponse:
        return html("sweeps.html.j2")

    @app.get("/sweep", response_class=HTMLResponse)
    def sweep_page(name: str) -> HTMLResponse:
        row = live.sweep_row(engine, name)
        return html("sweep.html.j2", name=row.name, description=row.description or "", x_kinds=X_KINDS)

    @app.get("/run/{run_id}", response_class=HTMLResponse)
    def run_page(run_id: int) -> HTMLResponse:
        _run_id(run_id)
        return html("run.html.j2", run_id=run_id, x_kinds=X_KINDS)

    @app.get("/compare", response_class=HTMLResponse)
    def compare_page(runs: str) -> HTMLResponse:
        return html("compare.html.j2", runs=", ".join(map(str, _ids(runs))), x_kinds=X_KINDS)

    @app.get("/search", response_class=HTMLResponse)
    def search_page(name: str) -> HTMLResponse:
        return html("search.html.j2", name=name)


def _guard(token: str | None) -> Any:
    """The middleware in front of every request: the token (when one is set), GET only, the security headers."""
    from fastapi.responses import PlainTextResponse, RedirectResponse

    async def guard(request: Any, call_next: Any) -> Any:
        if token is None and not loopback(request.headers.get("host", "")):
            return PlainTextResponse("ablate ui without a token answers only loopback host names (localhost, 127.0.0.1, "
                                     "[::1]): another name may be a web page reaching this dashboard through DNS "
                                     "rebinding. To serve other names, start it with --host and a token "
                                     "(ABLATE_UI_TOKEN)", status_code=403)
        if token is not None:
            given = request.query_params.get("token")
            if given is not None and _same(given, token):
                response = RedirectResponse(str(request.url.remove_query_params("token")), status_code=303)
                response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
                return response
            sent = request.cookies.get(COOKIE) or request.headers.get("authorization", "").removeprefix("Bearer ")
            if not sent or not _same(sent, token):
                return PlainTextResponse("ablate ui: this server needs its token: open it once with ?token=TOKEN "
                                         "(the --token or ABLATE_UI_TOKEN it was started with)", status_code=401)
        if request.method not in ("GET", "HEAD"):
            return PlainTextResponse("ablate ui only reads: no request here writes", status_code=405)
        response = await call_next(request)
        response.headers.update(HEADERS if not request.url.path.startswith("/static/") else
                                {k: v for k, v in HEADERS.items() if k != "Cache-Control"})
        return response

    return guard


MAX_RUN_ID = 2**63 - 1  # a BIGINT: a larger number is no run (and no database may be asked for it)


def _run_id(run_id: int) -> int:
    if not 1 <= run_id <= MAX_RUN_ID:
        raise AblateError(f"no run {run_id}: run ids are whole numbers from 1")
    return run_id


def loopback(host: str) -> bool:
    """Whether a Host header names this machine's loopback: localhost (or a name under it), 127.x.y.z, [::1]."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1:].split("]", 1)[0]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    name = name.rstrip(".")
    if name == "localhost" or name.endswith(".localhost") or name == "::1":
        return True
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "127" and all(p.isdigit() and int(p) < 256 for p in parts)


def _ids(text: str) -> list[int]:
    """Run ids from `1,2,3` (a selection, a comparison): each a whole number from 1, at most 10,000."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    if len(words) > 10_000 or not all(w.isdigit() for w in words):
        raise AblateError("runs: give run ids as whole numbers separated by commas (runs=12,15,40)")
    return [_run_id(int(w)) for w in dict.fromkeys(words)]


def _file_name(name: str) -> str:
    """A sweep's name as a download's file name (letters, digits, - _ . only)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80] or "sweep"


def _same(given: str, token: str) -> bool:
    """The token compared in constant time (as bytes: compare_digest refuses non-ASCII text)."""
    return hmac.compare_digest(given.encode(), token.encode())
