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
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ablate import store
from ablate.config.errors import AblateError
from ablate.config.units import X_KINDS
from ablate.results import live, searches
from ablate.results.bands import group_curves
from ablate.ui import table

HERE = Path(__file__).parent
PAGE_ROWS = 50  # runs per page of the table
MAX_SERIES = 40  # curves per chart: the first ones the table's filter and sort pick
MAX_CURVE_RUNS = 1000  # runs whose points one chart reads (10,000 runs x 20 eval points: ~1 CPU-s; this ~0.1)
LOG_TAIL = 200  # lines of a run's log on its page
SAMPLE_MODELS, MAX_SAMPLE_TOKENS, MAX_PROMPT = 2, 256, 1000  # models kept loaded; a sample's bounds
STUDY_EVERY = 30.0  # seconds: the study (the report's tables and tests, ~3 CPU-s at 10,000 runs) is read at most this often
COOKIE = "ablate_ui_token"
HEADERS = {"Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                      "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


class Cache:
    """Per sweep, what was read at a change token: read again only when the token moved, and (`every`) no sooner
    than that many seconds after the last read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[tuple[str, int], tuple[str, float, Any]] = {}

    def get(self, kind: str, sweep_id: int, token: str, read: Any, every: float = 0.0) -> Any:
        with self._lock:
            hit = self._items.get((kind, sweep_id))
        if hit is not None and (hit[0] == token or time.monotonic() - hit[1] < every):
            return hit[2]
        value = read()
        with self._lock:
            self._items[(kind, sweep_id)] = (token, time.monotonic(), value)
        return value


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

    def rows_of(self, sweep: str) -> tuple[str, list[dict[str, Any]], list[str]]:
        """The change token, the sweep's rows and the table's columns (read again only when the token moved)."""
        row = live.sweep_row(self.engine, sweep)
        now, _ = live.change_tokens(self.engine, row.id)

        def read() -> tuple[list[dict[str, Any]], list[str]]:
            rows = live.run_rows(self.engine, row.id)
            return rows, table.columns(rows)

        return now, *self.cache.get("rows", row.id, now, read)

    def sweeps(self) -> dict[str, Any]:
        return {"sweeps": live.sweep_summaries(self.engine), "searches": searches.search_summaries(self.engine)}

    def search(self, name: str) -> dict[str, Any]:
        with self.engine.connect() as conn:
            sweep = conn.execute(sa.select(store.Sweep.name).where(store.Sweep.name == name)).scalar()
        return {**searches.search_trials(self.engine, name), "sweep": sweep}

    def token(self, sweep: str) -> dict[str, Any]:
        now, finished = live.change_tokens(self.engine, live.sweep_row(self.engine, sweep).id)
        return {"token": now, "finished": finished}

    def runs(self, sweep: str, filter: str = "", sort: str = "", offset: int = 0,  # noqa: A002 - the query's name
             limit: int = PAGE_ROWS) -> dict[str, Any]:
        now, rows, cols = self.rows_of(sweep)
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        return {**table.page(rows, filter, sort, offset, max(1, min(limit, 500)), cols), "token": now,
                "counts": dict(sorted(counts.items()))}

    def curves(self, sweep: str, filter: str = "", sort: str = "", x: str = "steps",  # noqa: A002
               y: str = "eval", group: str = "seeds") -> dict[str, Any]:
        now, rows, cols = self.rows_of(sweep)
        groups = _groups(table.selected(rows, filter, sort), group, cols)
        shown = dict(list(groups.items())[:MAX_SERIES])
        each = max(1, MAX_CURVE_RUNS // max(1, len(shown)))
        read = {label: ids[:each] for label, ids in shown.items()}
        series = live.curves(self.engine, [i for ids in read.values() for i in ids], x, y)
        notes = []
        if len(groups) > MAX_SERIES:
            notes.append(f"showing the first {MAX_SERIES} of {len(groups):,} curves (the table's order): filter to narrow")
        if any(len(ids) > each for ids in shown.values()):
            notes.append(f"a curve averages at most {each:,} runs, the first in the table's order "
                         f"({sum(map(len, read.values())):,} of {sum(map(len, shown.values())):,} runs read)")
        return {"series": group_curves(series, read), "note": "; ".join(notes), "token": now, "x": x, "y": y}

    def study(self, sweep: str) -> dict[str, Any]:
        row = live.sweep_row(self.engine, sweep)
        _, finished = live.change_tokens(self.engine, row.id)
        return self.cache.get("study", row.id, finished, lambda: _study(self.engine, row.name), every=STUDY_EVERY)

    def run(self, run_id: int) -> dict[str, Any]:
        run_id = _run_id(run_id)
        return _run(self.engine, run_id, self.artifacts)

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
                       ("/api/runs", board.runs), ("/api/curves", board.curves), ("/api/study", board.study),
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
    """The four HTML pages: skeletons (autoescaped) that the page script fills from the JSON endpoints."""
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


def _same(given: str, token: str) -> bool:
    """The token compared in constant time (as bytes: compare_digest refuses non-ASCII text)."""
    return hmac.compare_digest(given.encode(), token.encode())


def _groups(rows: list[dict[str, Any]], group: str, columns: list[str]) -> dict[str, list[int]]:
    """Runs by curve: `runs` one curve each; `seeds` (the default) the runs that differ only by seed; else the
    named axes, comma separated (every other axis averaged)."""
    axes = [c for c in columns if c not in table.FIRST and c not in table.LAST]
    if group == "runs":
        keys = ["run"]
    elif group in ("", "seeds"):
        keys = [c for c in axes if c != "seed"]
    else:
        keys = [k.strip() for k in group.split(",") if k.strip()]
        unknown = [k for k in keys if k not in axes and not any(k in r for r in rows[:1])]
        if unknown:
            raise AblateError(f"group: no axis {unknown[0]!r}; axes: {', '.join(axes) or 'none vary'} (or runs, seeds)")
    out: dict[str, list[int]] = {}
    for r in rows:
        label = " ".join(f"{k}={r.get(k)}" for k in (axes if keys == ["run"] else keys) if r.get(k) is not None)
        label = f"run {r['run']}: {label}" if keys == ["run"] else label or "all runs"
        out.setdefault(label, []).append(r["run"])
    return out


def _study(engine: sa.Engine, sweep: str) -> dict[str, Any]:
    """The report's comparison tables and its claims table, by the report's own code."""
    from ablate.config.units import parse_at
    from ablate.report.tables import layout_tables
    from ablate.report.race import apply_race, read_race
    from ablate.report.verdicts import verdict_table
    from ablate.results.equal import read_runs_at
    from ablate.results.orderings import check_claims
    from ablate.results.views import load_views

    spec, views = load_views(engine, sweep)
    views = read_runs_at(engine, views, parse_at(spec.report.at))
    claims = check_claims(spec, views)
    race, raced = read_race(engine, spec, views)
    apply_race(claims, raced)
    table = verdict_table(spec, claims, raced)
    verdicts: dict[str, int] = {}
    for c in claims.cells:
        verdicts[c.verdict] = verdicts.get(c.verdict, 0) + 1
    return {"tables": [{"title": t.title, "columns": t.columns, "rows": [[label, *cells] for label, cells in t.rows],
                        "notes": t.notes} for t in layout_tables(spec, views)],
            "claims": None if table is None else {"head": list(table.head), "rows": table.rows,
                                                  "statements": table.statements, "method": table.method,
                                                  "floor": table.floor},
            "verdicts": verdicts,
            "race": None if race is None else {"head": list(race.head), "rows": race.rows, "spent": race.spent,
                                               "method": race.method},
            "read_at": store.utcnow().isoformat(" ", "seconds") + " UTC"}


def _run(engine: sa.Engine, run_id: int, artifacts: Path | None) -> dict[str, Any]:
    """A run's page: its row (config, timings, losses), error and the tail of its log."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(store.Run.__table__, store.Sweep.name.label("sweep_name"))
                           .join(store.Sweep, store.Sweep.id == store.Run.sweep_id).where(store.Run.id == run_id)).first()
    if row is None:
        raise AblateError(f"no run with id {run_id} in the results DB")
    run = row._mapping
    skip = {"config", "options", "error", "library_versions", "notes", "pid", "claimed_by"}
    fields = {c.key: _plain(run[c.key]) for c in store.Run.__table__.columns if c.key not in skip}
    log, log_path = _log_tail(engine, run_id, artifacts)
    return {"sweep": run["sweep_name"], "fields": fields, "config": run["config"], "error": run["error"] or "",
            "notes": run["notes"], "log": log, "log_path": log_path}


def _plain(v: Any) -> Any:
    return v.isoformat(" ", "seconds") if hasattr(v, "isoformat") else v


def _log_tail(engine: sa.Engine, run_id: int, artifacts: Path | None) -> tuple[str, str]:
    """The last LOG_TAIL lines of the run's log under the artifacts folder (where this host's runner wrote it)."""
    if artifacts is None:
        return "", ""
    path = artifacts / "logs" / store.database_id(engine)[:16] / f"run-{run_id}.log"
    if not path.is_file():
        return "", str(path)
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 256 * 1024))
        lines = f.read().decode("utf-8", "replace").splitlines()
    return "\n".join(lines[-LOG_TAIL:]), str(path)
