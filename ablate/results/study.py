"""The study as the dashboard shows it: the report's comparison tables, claims table and race, as plain data, by
the report's own code; or the same as the sweep's runner kept it in the results DB (study_cache).

Computing it reads and validates every run (about 0.5 CPU-s at 10,000 runs) and runs the statistics over them (about
0.4 more; a cell whose runs did not change since the process's last read reuses its exact std), and a dashboard only
reads: it cannot keep what it computed. So the runner of a sweep of KEEP_RUNS runs
or more keeps it (store.keep_study) while the sweep trains, again after runs finish (runner/keeper.py), and at its
end, with its key (what it depends on: the runs' statuses and finishes, the spec, the race's decisions) and the
code that computed it. A dashboard shows the kept one whose key and code are the sweep's and this code's, or,
while the sweep trains, one kept less than FRESH seconds ago (runs finished since: it says so); else it computes
it, re-reading only the runs that changed since its last read (results/liveviews.py).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from typing import Any

import sqlalchemy as sa

from ablate import store

KEEP_RUNS = 1_000  # a sweep this big keeps its study (smaller ones compute it in well under 0.5 CPU-s)
FRESH = 30.0  # seconds: a kept study this recent is shown though runs finished since (the dashboard's own lag)


def study(engine: sa.Engine, sweep: str, live: Any = None) -> dict[str, Any]:
    """The report's comparison tables and its claims table, by the report's own code; `live`: the sweep's
    LiveViews, held by the caller between reads (default: every run read now)."""
    from ablate.report.answer import answer
    from ablate.report.race import apply_race, read_race
    from ablate.report.tables import layout_tables
    from ablate.report.verdicts import verdict_table
    from ablate.results.orderings import check_claims

    if live is None:
        from ablate.results.liveviews import LiveViews

        live = LiveViews(sweep)
    spec, views = live(engine)
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
            "verdicts": verdicts, "answer": answer(spec, claims) if table is not None else [],
            "race": None if race is None else {"head": list(race.head), "rows": race.rows, "spent": race.spent,
                                               "method": race.method},
            "read_at": store.utcnow().isoformat(" ", "seconds") + " UTC"}


def study_key(engine: sa.Engine, sweep_id: int) -> str:
    """What the study depends on, as one text: per run status, the count, the steps trained, the final eval
    losses and the last finish; the spec's fingerprint; the race's decisions. A run's progress while it trains is
    not in it (its row gets its steps and losses when it finishes), so it moves only when runs start or finish."""
    r, d = store.Run, store.RaceDecision
    with engine.connect() as conn:
        statuses = conn.execute(
            sa.select(r.status, sa.func.count(), sa.func.sum(sa.func.coalesce(r.steps, 0)),
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
    """The study kept for this sweep by this code, if it was kept at `key`, or less than FRESH seconds ago (then
    its read_at says that runs have finished since); else None."""
    c = store.StudyCache
    with engine.connect() as conn:
        row = conn.execute(sa.select(c.key, c.code, c.payload, c.computed_at).where(c.sweep_id == sweep_id)).first()
    if row is None or row.code != study_code():
        return None
    age = (store.utcnow() - row.computed_at) / dt.timedelta(seconds=1)
    if row.key != key and not 0 <= age < FRESH:
        return None
    kept = {**json.loads(row.payload), "kept": True}
    if row.key != key:  # `behind`: the dashboard asks again at its next request, not when runs finish next
        kept["read_at"] += f" (kept by the sweep's runner {age:.0f} s ago; runs have started or finished since)"
        kept["behind"] = True
    return kept


def read_study(engine: sa.Engine, sweep_id: int, sweep: str, live: Any = None) -> dict[str, Any]:
    """The sweep's study: the one kept, if it is still the sweep's (or recent), else computed (`live`: the
    sweep's LiveViews, which re-reads only the runs that changed since the caller's last read)."""
    return kept_study(engine, sweep_id, study_key(engine, sweep_id)) or study(engine, sweep, live)
