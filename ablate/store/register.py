"""Registering a sweep: its row and one pending run per new trial (bulk, idempotent, race-safe), the stamps
each run gets (code and library versions), and dropping runs an edited grid no longer has."""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from ablate.config.axes import AXIS_FIELDS
from ablate.config.errors import AblateError
from ablate.config.registry import code_parts
from ablate.config.settings import environment
from ablate.store.engine import session_factory
from ablate.store.plugins import PluginRecords
from ablate.store.plugins import save as save_plugins
from ablate.store.schema import OWED_UNSTARTED, Metric, PluginSource, Run, Sweep, utcnow

if TYPE_CHECKING:
    from ablate.config.trial import TrialConfig


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "datasets", "tokenizers", "prefect", "optuna", "sqlalchemy", "ablate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def code_version() -> str | None:
    """The git commit of the ablate checkout, with '+dirty' when the tree has changes; without a checkout (a
    container image), the version stamped at build time (ABLATE_CODE_VERSION), else the installed version. A run's
    code_version adds the identity of the plugins its trial runs (`run_code`)."""
    import subprocess

    from ablate import __version__

    root = Path(__file__).resolve().parents[2]  # ablate/store/register.py -> the checkout
    stamp = environment().code_version or f"ablate=={__version__}"
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return stamp
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        return sha.stdout.strip()[:12] + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return stamp


def run_code(ablate_code: str | None, trial: TrialConfig) -> str | None:
    """A run's code_version: ablate's, then the identity of the plugins its trial runs (the names are in its
    config's `code`); past the column's 64 characters, one hash of them all."""
    from ablate.config.trial import fingerprint

    if not trial.code:
        return ablate_code
    plugins = " ".join(identity for _, identity in code_parts(trial.code))
    code = " ".join(part for part in (ablate_code, plugins) if part)
    return code if len(code) <= 64 else f"{(ablate_code or '')[:27]} plugins:{fingerprint(trial.code)}".lstrip()


def register_sweep(engine: sa.Engine, spec: Any, trials: Iterable[Any], spec_path: str | None = None,
                   merge: bool = False, plugins: PluginRecords = PluginRecords(), first_index: int = 0
                   ) -> tuple[int, list[int]]:
    """Insert (or update) the sweep and one pending run per new trial fingerprint, atomically.

    Idempotent: trials already registered keep their row and status. Returns (sweep id, run ids in trial order).
    Processes registering the same sweep at the same moment all succeed (the loser of a race retries).
    A spec that would leave results (finished or running runs) of trials it no longer has under its name (a
    modified copy, or an edit of a sweep that has results) is refused unless `merge`: one name, one experiment.
    `plugins`: the sources and facts of the plugins the trials run (ablate.plugins.stored.records_of(trials)),
    stored with them; a file plugin's source that is neither given nor stored is refused before anything is written.
    `first_index`: the trial index of the first of `trials` (an adaptive sweep's later seeds go after its grid).
    """
    trials = list(trials)
    _refuse_unstored_sources(engine, trials, plugins)
    for attempt in range(5):
        try:
            return _register_once(engine, spec, trials, spec_path, merge, plugins, first_index)
        except sa.exc.IntegrityError:  # another process inserted the sweep or a run first: read theirs
            if attempt == 4:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _refuse_unstored_sources(engine: sa.Engine, trials: list[Any], plugins: PluginRecords) -> None:
    """A worker that never saw a plugin file builds it from the source stored here: a run must not name one that
    is missing (a caller that forgot `plugins=`)."""
    given = {source.identity for source in plugins.sources}
    named = {(name, identity) for t in trials for name, identity in code_parts(t.code or "")
             if identity.startswith("file:") and identity not in given}
    if not named:
        return
    with engine.connect() as conn:
        have = set(conn.scalars(sa.select(PluginSource.identity).where(
            PluginSource.identity.in_({identity for _, identity in named}))))
    missing = sorted(name for name, identity in named if identity not in have)
    if missing:
        raise AblateError(f"register_sweep: the trials run plugin {missing[0]!r}, whose source was neither given nor "
                          "stored; pass plugins=ablate.plugins.stored.records_of(trials)")


def _register_once(engine: sa.Engine, spec: Any, trials: list[Any], spec_path: str | None,
                   merge: bool, plugins: PluginRecords, first_index: int = 0) -> tuple[int, list[int]]:
    from ablate.config.trial import fingerprint, trial_fingerprint

    versions = library_versions()
    code = code_version()
    configs = [t.model_dump(mode="json") for t in trials]  # each trial dumped once: its fingerprint and row
    fps = [trial_fingerprint(c) for c in configs]
    # an edited plugin is an edited sweep: its code is part of the sweep's identity (built-ins: the spec's alone)
    codes = sorted({t.code for t in trials if t.code})
    spec_fp = fingerprint([spec.fingerprint(), codes]) if codes else spec.fingerprint()
    with session_factory(engine)() as session, session.begin():
        save_plugins(session, plugins)  # before any run names them: a worker may claim one at once
        sweep = session.scalar(sa.select(Sweep).where(Sweep.name == spec.name))
        if sweep is None:
            sweep = Sweep(name=spec.name)
            session.add(sweep)
        elif not merge and spec.search is None and sweep.spec_fingerprint != spec_fp:
            _refuse_mixing(session, sweep, trials, set(fps), spec_path)
        sweep.description = spec.description
        sweep.spec = spec.model_dump(mode="json")
        sweep.spec_fingerprint = spec_fp
        sweep.spec_path = spec_path
        session.flush()
        ids = dict(session.execute(sa.select(Run.fingerprint, Run.id).where(Run.sweep_id == sweep.id)).all())
        rows, seen = [], set(ids)
        for index, (trial, config, fp) in enumerate(zip(trials, configs, fps)):
            if fp not in seen:
                seen.add(fp)
                rows.append(run_row(trial, config, fp, sweep.id, first_index + index, code, versions))
        if rows and engine.dialect.driver == "psycopg":  # COPY: 10,000 rows in ~0.2 CPU-s instead of ~2.4
            copy_rows(session.connection(), Run.__table__, rows)
            ids.update(session.execute(sa.select(Run.fingerprint, Run.id).where(Run.sweep_id == sweep.id)).all())
        else:  # one multi-row INSERT .. RETURNING per chunk, not a flush per row
            for start in range(0, len(rows), 5000):
                result = session.execute(sa.insert(Run).returning(Run.fingerprint, Run.id), rows[start:start + 5000])
                ids.update(result.all())
    if len(rows) >= 1000 and engine.dialect.name == "sqlite":
        analyze(engine)  # PostgreSQL's autovacuum does this by itself
    return sweep.id, [ids[fp] for fp in fps]


def copy_rows(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """Insert `rows` (dicts of the same columns) with PostgreSQL's COPY, inside `conn`'s transaction (psycopg 3).

    A multi-row INSERT is mostly client work there: psycopg parses each statement's hundreds of thousands of
    placeholders in Python. A unique violation is raised as SQLAlchemy's IntegrityError, as an INSERT's would be."""
    import psycopg

    columns = list(rows[0])
    as_json = {c for c in columns if isinstance(table.c[c].type, sa.JSON)}
    quote = conn.dialect.identifier_preparer.quote
    statement = f"COPY {quote(table.name)} ({', '.join(quote(c) for c in columns)}) FROM STDIN"
    try:
        with conn.connection.driver_connection.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row([json.dumps(row[c]) if c in as_json and row[c] is not None else row[c]
                                for c in columns])
    except psycopg.IntegrityError as exc:
        raise sa.exc.IntegrityError(statement, None, exc) from exc


def _cell(values: Any) -> tuple[Any, ...]:
    """The table cell a run fills: its axis columns (an object with those attributes)."""
    return (*(getattr(values, c) for c in AXIS_FIELDS), json.dumps(dict(values.options or {}), sort_keys=True))


def _refuse_mixing(session: Session, sweep: Sweep, trials: list[Any], fps: set[str], spec_path: str | None) -> None:
    """An AblateError when the sweep holds results (finished or running runs) of other trials in the same cells as
    `trials`: the same axes with another budget, dataset, tokenizer or recipe. Reports would pick either.
    Removing or adding cells (an edited grid) is fine: the results of removed cells stay as results."""
    cells = {_cell(t): t for t in trials}
    clashes: dict[str, int] = {}
    for run in session.execute(sa.select(Run.fingerprint, Run.status, Run.options, *(getattr(Run, c) for c in AXIS_FIELDS))
                               .where(Run.sweep_id == sweep.id, Run.study_name.is_(None),
                                      Run.status.not_in(OWED_UNSTARTED))):
        if run.fingerprint not in fps and _cell(run) in cells:
            clashes[run.status] = clashes.get(run.status, 0) + 1
    if clashes:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(clashes.items()))
        where = f" (registered from {sweep.spec_path})" if sweep.spec_path and sweep.spec_path != spec_path else ""
        raise AblateError(
            f"sweep {sweep.name!r} already holds results for the same cells with other settings ({counts}){where}: "
            f"{spec_path or 'this spec'} changes something besides the grid axes (budget, dataset, tokenizer, "
            "a plugin's code, "
            "recipe ...), and registering it would mix two experiments under one name, so reports would pick cells "
            "from either. Give this spec another `name:` (a deployment run: --param name=NEW, or an override, which "
            "names the sweep after itself), or add --merge (flow parameter merge=true) to add its trials on purpose")


def analyze(engine: sa.Engine) -> None:
    """Refresh SQLite's planner statistics after a large write (stale ones can pick a full scan)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")

def drop_stale_runs(engine: sa.Engine, sweep_id: int, keep: set[int]) -> int:
    """Delete the sweep's grid runs not in `keep` (run ids of the trials its spec holds now) that hold no result
    (pending, failed, cancelled, preempted), with their metrics; finished runs stay as results. Returns how many."""
    with engine.begin() as conn:
        stale = [rid for rid in conn.execute(
            sa.select(Run.id).where(Run.sweep_id == sweep_id, Run.study_name.is_(None),
                                    Run.status.in_(OWED_UNSTARTED))).scalars() if rid not in keep]
        if stale:
            conn.execute(sa.delete(Metric).where(Metric.run_id.in_(stale)))
            conn.execute(sa.delete(Run).where(Run.id.in_(stale)))
    return len(stale)


def run_row(trial: TrialConfig, config: dict[str, Any], fp: str, sweep_id: int, index: int, code: str | None,
            versions: dict[str, str]) -> dict[str, Any]:
    """The columns of a new pending run of `trial` (`config`: its JSON dump, `fp`: its fingerprint)."""
    return dict(
        sweep_id=sweep_id, fingerprint=fp, trial_index=index, status="pending", attempts=0, gpus=trial.budget.gpus,
        architecture=trial.architecture, objective=trial.objective, d_model=trial.d_model, layers=trial.layers,
        heads=trial.heads, context=trial.context, lr=trial.lr, batch_size=trial.batch_size, seed=trial.seed,
        options=dict(trial.options), config=config, hardware=trial.budget.hardware,
        budget_kind=trial.budget.kind, budget_amount=trial.budget.amount, created_at=utcnow(),
        code_version=run_code(code, trial), library_versions=versions,
    )
