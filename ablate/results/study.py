"""The study as the dashboard shows it: the report's comparison tables, claims table and race, as plain data, by
the report's own code; or the same as the runner kept it in the results DB (study_cache) at a big sweep's end.

Computing it reads and validates every run (about 1.7 CPU-s at 10,000 runs), and a dashboard only reads: it cannot
keep what it computed. So the sweep flow that ran a sweep of KEEP_RUNS runs or more computes the study once and
keeps it (store.keep_study) with its key (what it depends on: the runs' statuses, progress and final losses, the
spec, the race's decisions) and the code that computed it; a dashboard whose key and code are the same shows that
one.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import sqlalchemy as sa

from ablate import store

KEEP_RUNS = 1_000  # a sweep this big keeps its study at its end (smaller ones compute it in well under 0.5 CPU-s)


def study(engine: sa.Engine, sweep: str) -> dict[str, Any]:
    """The report's comparison tables and its claims table, by the report's own code."""
    from ablate.config.units import parse_at
    from ablate.report.race import apply_race, read_race
    from ablate.report.tables import layout_tables
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
                        "notes": t.notes} for t in layout_tables(spec, views, claims.floor)],
            "claims": None if table is None else {"head": list(table.head), "rows": table.rows,
                                                  "statements": table.statements, "method": table.method,
                                                  "floor": table.floor},
            "verdicts": verdicts,
            "race": None if race is None else {"head": list(race.head), "rows": race.rows, "spent": race.spent,
                                               "method": race.method},
            "read_at": store.utcnow().isoformat(" ", "seconds") + " UTC"}


def study_key(engine: sa.Engine, sweep_id: int) -> str:
    """What the study depends on, as one text: per run status, the count, the steps logged, the final eval losses
    and the last finish; the spec's fingerprint; the race's decisions."""
    r, d = store.Run, store.RaceDecision
    with engine.connect() as conn:
        statuses = conn.execute(
            sa.select(r.status, sa.func.count(), sa.func.sum(sa.func.coalesce(r.last_step, 0)),
                      sa.func.sum(sa.func.coalesce(r.final_eval_loss, 0.0)), sa.func.max(r.finished_at))
            .where(r.sweep_id == sweep_id).group_by(r.status).order_by(r.status)).all()
        spec = conn.execute(sa.select(store.Sweep.spec_fingerprint).where(store.Sweep.id == sweep_id)).scalar()
        decisions = conn.execute(sa.select(sa.func.count()).select_from(d).where(d.sweep_id == sweep_id)).scalar()
    text = lambda v: "" if v is None else f"{v:.9g}" if isinstance(v, float) else str(v)  # noqa: E731
    return ";".join(",".join(text(v) for v in row) for row in statuses) + f"|spec {spec}|decisions {decisions}"


@functools.cache
def study_code() -> str:
    """The code that computes the study here (a kept one from other code is computed again)."""
    return (store.code_version() or "")[:64]


def kept_study(engine: sa.Engine, sweep_id: int, key: str) -> dict[str, Any] | None:
    """The study kept for this sweep, if it was kept at `key` by this code; else None."""
    c = store.StudyCache
    with engine.connect() as conn:
        row = conn.execute(sa.select(c.key, c.code, c.payload).where(c.sweep_id == sweep_id)).first()
    if row is None or row.key != key or row.code != study_code():
        return None
    return json.loads(row.payload)


def read_study(engine: sa.Engine, sweep_id: int, sweep: str) -> dict[str, Any]:
    """The sweep's study: the one kept, if it is still the sweep's, else computed."""
    return kept_study(engine, sweep_id, study_key(engine, sweep_id)) or study(engine, sweep)
