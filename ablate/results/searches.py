"""Optuna searches as the read side sees them: their studies live in the results DB beside the runs (Optuna's own
tables), read here with plain SELECTs through the caller's read-only engine (opening Optuna's storage would create
and check its tables: a reader never does)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from ablate.config.errors import AblateError, did_you_mean


def _tables(engine: sa.Engine) -> dict[str, sa.Table] | None:
    """Optuna's tables, reflected; None where no search ever ran on this DB."""
    names = ("studies", "study_directions", "trials", "trial_values", "trial_params", "trial_user_attributes")
    inspector = sa.inspect(engine)
    if not all(inspector.has_table(n) for n in names):
        return None
    meta = sa.MetaData()
    return {n: sa.Table(n, meta, autoload_with=engine) for n in names}


def search_summaries(engine: sa.Engine) -> list[dict[str, Any]]:
    """Every search study: its direction, trials counted by state, and its best trial (number, value, params, run)."""
    t = _tables(engine)
    if t is None:
        return []
    with engine.connect() as conn:
        studies = conn.execute(sa.select(t["studies"].c.study_id, t["studies"].c.study_name)
                               .order_by(t["studies"].c.study_id.desc())).all()
    return [_summary(engine, t, sid, name) for sid, name in studies]


def _summary(engine: sa.Engine, t: dict[str, sa.Table], study_id: int, name: str) -> dict[str, Any]:
    trials, _ = _trials(engine, t, study_id)
    direction = _direction(engine, t, study_id)
    counts: dict[str, int] = {}
    for tr in trials:
        counts[tr["state"]] = counts.get(tr["state"], 0) + 1
    done = [tr for tr in trials if tr["state"] == "COMPLETE" and tr["value"] is not None]
    pick = max if direction == "MAXIMIZE" else min
    best = pick(done, key=lambda tr: tr["value"]) if done else None
    return {"name": name, "direction": direction.lower(), "trials": len(trials), "counts": dict(sorted(counts.items())),
            "best": best}


def search_trials(engine: sa.Engine, name: str) -> dict[str, Any]:
    """One study's trials in order (number, state, value, parameters as suggested, run id and times), each parameter's
    kind (log scale, choices) and its distribution (`kinds`, what `importances` reads)."""
    t = _tables(engine)
    with engine.connect() as conn:
        names = [] if t is None else conn.execute(sa.select(t["studies"].c.study_name)).scalars().all()
        study_id = None if t is None else conn.execute(
            sa.select(t["studies"].c.study_id).where(t["studies"].c.study_name == name)).scalar()
    if study_id is None:
        raise AblateError(f"no search study named {name!r} in the results DB{did_you_mean(name, names)}; known: "
                          f"{', '.join(names) or 'none yet'}")
    direction = _direction(engine, t, study_id).lower()
    trials, kinds = _trials(engine, t, study_id)
    return {"name": name, "direction": direction, "trials": trials,
            "params": {k: {"log": v["log"], "choices": v["choices"]} for k, v in kinds.items()},
            "kinds": kinds}  # for importances(): each parameter's distribution


def _direction(engine: sa.Engine, t: dict[str, sa.Table], study_id: int) -> str:
    d = t["study_directions"]
    with engine.connect() as conn:
        found = conn.execute(sa.select(d.c.direction).where(d.c.study_id == study_id).order_by(d.c.objective)).first()
    return str(getattr(found[0], "name", found[0])) if found else "MINIMIZE"


def _trials(engine: sa.Engine, t: dict[str, sa.Table], study_id: int
            ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    from optuna.distributions import json_to_distribution

    tr, vals, params, attrs = t["trials"], t["trial_values"], t["trial_params"], t["trial_user_attributes"]
    with engine.connect() as conn:
        rows = conn.execute(sa.select(tr.c.trial_id, tr.c.number, tr.c.state, tr.c.datetime_start,
                                      tr.c.datetime_complete).where(tr.c.study_id == study_id).order_by(tr.c.number)).all()
        ids = [r.trial_id for r in rows]
        values = dict(conn.execute(sa.select(vals.c.trial_id, vals.c.value)
                                   .where(vals.c.trial_id.in_(ids), vals.c.objective == 0)).all()) if ids else {}
        chosen: dict[int, dict[str, Any]] = {}
        kinds: dict[str, dict[str, Any]] = {}
        for tid, pname, pvalue, dist in (conn.execute(sa.select(params.c.trial_id, params.c.param_name,
                                                                params.c.param_value, params.c.distribution_json)
                                                      .where(params.c.trial_id.in_(ids))) if ids else ()):
            d = json_to_distribution(dist)
            chosen.setdefault(tid, {})[pname] = d.to_external_repr(pvalue)
            kinds.setdefault(pname, {"json": dist, "log": bool(getattr(d, "log", False)),
                                     "choices": list(getattr(d, "choices", ())) or None})
        runs = {tid: json.loads(v) for tid, v in (conn.execute(
            sa.select(attrs.c.trial_id, attrs.c.value_json).where(attrs.c.trial_id.in_(ids), attrs.c.key == "run_id"))
            if ids else ())}
    when = lambda v: v.isoformat(" ", "seconds") if v is not None else None  # noqa: E731
    return [{"number": r.number, "state": str(getattr(r.state, "name", r.state)), "value": values.get(r.trial_id),
             "params": chosen.get(r.trial_id, {}), "run": runs.get(r.trial_id), "started": when(r.datetime_start),
             "finished": when(r.datetime_complete)} for r in rows], kinds


def importances(trials: list[dict[str, Any]], kinds: dict[str, dict[str, Any]], direction: str
                ) -> dict[str, Any]:
    """Each parameter's importance to the value, by Optuna's PED-ANOVA (offline, no scikit-learn) over the
    completed trials, computed on an in-memory copy of them (the results DB is only read); or why there is none."""
    import optuna
    from optuna.distributions import json_to_distribution

    done = [t for t in trials if t["state"] == "COMPLETE" and t["value"] is not None and set(t["params"]) == set(kinds)]
    if len(kinds) < 2 or len(done) < 4:
        return {"values": {}, "why": "importances need at least 2 parameters and 4 completed trials"}
    dists = {k: json_to_distribution(v["json"]) for k, v in kinds.items()}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=direction)
    study.add_trials([optuna.trial.create_trial(params=t["params"], distributions=dists, value=t["value"])
                      for t in done])
    try:
        found = optuna.importance.get_param_importances(study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError) as exc:  # too few trials above its quantile, a constant value
        return {"values": {}, "why": f"Optuna could not compute importances: {exc}"}
    return {"values": {k: round(float(v), 4) for k, v in found.items()}, "why": "PED-ANOVA (Optuna), completed trials"}
