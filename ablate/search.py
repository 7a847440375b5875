"""Optuna searches over the results DB: one study per spec with a `search` block, one run row per trial.

The study lives in the results database beside `runs` (Optuna's tables: studies, trials, trial_values,
trial_params, ...), named after the spec. Each Optuna trial samples its parameters, becomes a run row
(`runs.study_name`, `runs.study_trial`), trains through the runner, and reports the run's intermediate
evals (Optuna step k = the k-th fraction of `eval.at`) so the pruner can stop it. Workers (threads here,
or processes on any machine using the same DB) ask and tell on the shared storage until the study holds
n_trials trials; a study stopped half-way continues where it stopped.

A worker that dies leaves its trial RUNNING with a stale heartbeat: the next worker to ask marks it FAIL
and re-queues its parameters, which map to the same run row (same fingerprint), so the run resumes from
its checkpoint, or is told from its row if its trainer finished on its own.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.trial import FrozenTrial, TrialState
from pydantic import ValidationError

from ablate import budget as bud
from ablate import runner, store
from ablate.config.errors import AblateError, SpecError, did_you_mean
from ablate.config import (GRID_FIELDS, SWEEP_LEVEL_FIELDS, SearchBlock, SearchParam, SweepSpec, TrialConfig, load_spec,
                         with_recipe)

HEARTBEAT_SECONDS = 30  # a running trial's worker records a heartbeat this often
GRACE_SECONDS = 180  # a RUNNING trial without a heartbeat for this long belongs to a dead worker
MAX_REQUEUES = 2  # a trial whose worker died is re-queued at most this many times
MEDIAN_STARTUP_TRIALS = 2  # the median pruner prunes once this many trials have completed
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)


@dataclass(frozen=True)
class TrialOutcome:
    """What one Optuna trial came to: its state in the study and its run's status."""

    number: int
    state: str  # COMPLETE, PRUNED or FAIL
    run_id: int | None
    run_status: str  # completed, pruned, oom, diverged, failed, preempted, cancelled, invalid
    value: float | None
    params: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- checks


def check_search(spec: SweepSpec, source: str = "<spec>") -> SearchBlock:
    """The spec's search block, with the problems pydantic cannot see (base keys, `when` references, sampler fit)."""
    search = spec.search
    if search is None:
        raise AblateError(f"{source}: sweep {spec.name!r} has no `search:` block; add search: {{parameters: ...}}, "
                          "or run its grid with `ablate sweep run`")
    problems = []
    for key in search.base:
        if key in SWEEP_LEVEL_FIELDS:
            problems.append(f"search.base.{key}: '{key}' is set once per sweep at the top level")
        elif key not in GRID_FIELDS:
            problems.append(f"search.base: unknown trial field '{key}'{did_you_mean(key, GRID_FIELDS)}")
    for name, param in search.parameters.items():
        if param.log and param.step is not None:
            problems.append(f"search.parameters.{name}: give log or step, not both")
        bad = [c for c in param.choices or () if c is not None and not isinstance(c, (bool, int, float, str))]
        if bad:
            problems.append(f"search.parameters.{name}.choices: Optuna takes numbers, strings, booleans or null "
                            f"(got {bad[0]!r})")
        for other in param.when or {}:
            if other == name:
                problems.append(f"search.parameters.{name}.when: a parameter cannot depend on itself")
            elif other not in search.parameters and other not in GRID_FIELDS and not other.startswith("options."):
                problems.append(f"search.parameters.{name}.when: '{other}' is neither a search parameter nor a trial "
                                f"field{did_you_mean(other, [*search.parameters, *GRID_FIELDS])}")
    if not problems:
        try:
            _sampling_order(search)
        except ValueError as exc:
            problems.append(f"search.parameters: {exc}")
    if search.sampler == "grid":
        for name, param in search.parameters.items():
            if param.when:
                problems.append(f"search.parameters.{name}.when: the grid sampler needs every parameter in every trial; "
                                "drop `when` or use sampler: tpe")
            elif param.type != "categorical" and param.step is None:
                problems.append(f"search.parameters.{name}: the grid sampler needs choices (type: categorical) "
                                "or a step to enumerate low..high")
    if problems:
        raise SpecError(problems, source)
    if search.sampler == "cmaes":
        _require_cmaes()
    return search


def _require_cmaes() -> None:
    try:
        import cmaes  # noqa: F401
    except ImportError:
        raise AblateError("sampler cmaes needs the `cmaes` package: pip install cmaes (or use sampler: tpe)") from None


def _sampling_order(search: SearchBlock) -> list[str]:
    """Parameters in an order where each comes after the search parameters its `when` reads."""
    order: list[str] = []
    pending = dict(search.parameters)
    while pending:
        ready = [n for n, p in pending.items() if not any(d in pending for d in (p.when or {}))]
        if not ready:
            raise ValueError(f"the `when` conditions of {sorted(pending)} depend on each other in a cycle")
        for name in ready:
            order.append(name)
            del pending[name]
    return order


def grid_space(search: SearchBlock) -> dict[str, list[Any]]:
    """Every value of every parameter, for the grid sampler (choices, or low..high by step)."""
    space = {}
    for name, p in search.parameters.items():
        if p.type == "categorical":
            space[name] = list(p.choices or ())
        else:
            count = math.floor((p.high - p.low) / p.step + 1e-9) + 1  # type: ignore[operator]
            values = [p.low + i * p.step for i in range(count)]  # type: ignore[operator]
            space[name] = [int(v) for v in values] if p.type == "int" else [round(v, 12) for v in values]
    return space


def planned_trials(search: SearchBlock, n_trials: int | None = None) -> int:
    """n_trials, capped at the grid's size for the grid sampler (it has nothing new to offer after that)."""
    n = n_trials or search.n_trials
    if search.sampler == "grid":
        n = min(n, math.prod(len(v) for v in grid_space(search).values()))
    return n


# ---------------------------------------------------------------- storage and study


def open_storage(url: str | None = None, *, create: bool = False, heartbeat_seconds: int = HEARTBEAT_SECONDS,
                 grace_seconds: int = GRACE_SECONDS) -> optuna.storages.RDBStorage:
    """Optuna's storage on the results DB (creating its tables when `create`).

    The ablate schema is brought up first; its Alembic revision lives in `ablate_alembic_version`, so
    Optuna's own (`alembic_version`) and its schema version check work as on a database of its own.
    """
    url = store.resolve_url(url)
    store.connect(url) if create else store.reader(url)  # reading a study (its report) never creates or migrates
    is_sqlite = sa.make_url(url).get_backend_name() == "sqlite"
    engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if is_sqlite else {"pool_pre_ping": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat_interval
        storage = optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs, skip_table_creation=not create,
            heartbeat_interval=heartbeat_seconds, grace_period=grace_seconds, heartbeat_stale_trial_callback=requeue,
        )
    if create:  # `ablate sql` (as the reader role on PostgreSQL) may join runs with Optuna's trials
        store.grant_reader(store.connect(url))
    return storage


def create_study(spec: SweepSpec, db_url: str | None = None, spec_path: str | None = None,
                 storage: optuna.storages.RDBStorage | None = None) -> optuna.Study:
    """Create the study of a spec (once, before any worker starts; idempotent) and the sweep row its runs join."""
    check_search(spec, spec_path or "<spec>")
    url = store.resolve_url(db_url)
    engine = store.connect(url)
    store.register_sweep(engine, spec, [], spec_path=spec_path)
    storage = storage or open_storage(url, create=True)
    study = optuna.create_study(storage=storage, study_name=spec.name, direction=spec.search.direction,
                                load_if_exists=True)
    study.set_user_attr("eval_at", list(spec.eval.at))  # Optuna step k is the eval at eval_at[k - 1]
    study.set_user_attr("objective", spec.search.objective)
    return study


def make_sampler(search: SearchBlock, seed: int | None) -> optuna.samplers.BaseSampler:
    if search.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed)  # constant_liar is on by default (Optuna 5): parallel-safe
    if search.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if search.sampler == "grid":
        return optuna.samplers.GridSampler(grid_space(search), seed=seed)
    _require_cmaes()
    # CMA-ES samples float and int parameters; categorical ones fall back to random sampling
    return optuna.samplers.CmaEsSampler(seed=seed, independent_sampler=optuna.samplers.RandomSampler(seed=seed),
                                        warn_independent_sampling=False)


def make_pruner(search: SearchBlock, n_evals: int) -> optuna.pruners.BasePruner:
    """Pruners read the intermediate evals, reported at steps 1..n_evals."""
    if search.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS, n_warmup_steps=0)
    if search.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(n_evals, 1), reduction_factor=3)
    return optuna.pruners.NopPruner()


def load_study(spec: SweepSpec, storage: optuna.storages.BaseStorage, seed: int | None = None) -> optuna.Study:
    """A worker's handle on the study: the shared storage with its own sampler and pruner."""
    try:
        return optuna.load_study(study_name=spec.name, storage=storage, sampler=make_sampler(spec.search, seed),
                                 pruner=make_pruner(spec.search, len(spec.eval.at)))
    except KeyError:
        names = optuna.get_all_study_names(storage)
        raise AblateError(f"no search study named {spec.name!r} in the results DB{did_you_mean(spec.name, names)}; "
                          f"known: {', '.join(names) or 'none yet'} (`ablate search run SPEC` creates it)") from None


def default_seed(name: str) -> int:
    """A study's sampler seed when none is given: stable per spec name (numpy seeds must stay below 2**32)."""
    return zlib.crc32(name.encode()) % 2**31


# ---------------------------------------------------------------- sampling a trial


def suggest_trial(trial: optuna.Trial, spec: SweepSpec) -> TrialConfig:
    """Sample the trial's parameters over defaults + search.base; raises ValueError if the result is no valid trial.

    A parameter with `when: {key: value}` is sampled only when that field (sampled or fixed) has that value,
    or one of them when `value` is a list.
    """
    search = spec.search
    values = {k: v for k, v in {**spec.defaults, **search.base}.items() if k != "options"}
    options = {**(spec.defaults.get("options") or {}), **(search.base.get("options") or {})}
    for name in _sampling_order(search):
        param = search.parameters[name]
        current = {**values, **{f"options.{k}": v for k, v in options.items()}}
        if not all(_matches(current.get(key), want) for key, want in (param.when or {}).items()):
            continue
        value = _suggest(trial, name, param)
        if name.startswith("options."):
            options[name.removeprefix("options.")] = value
        else:
            values[name] = value
    try:
        return TrialConfig(**with_recipe(spec.recipe, {**values, "options": options}),
                           **{k: getattr(spec, k) for k in SWEEP_LEVEL_FIELDS})
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or 'trial'}: {e['msg'].removeprefix('Value error, ')}"
                    for e in exc.errors()]
        raise ValueError("; ".join(problems)) from None


def _matches(value: Any, want: Any) -> bool:
    return value in want if isinstance(want, (list, tuple)) else value == want


def _suggest(trial: optuna.Trial, name: str, p: SearchParam) -> Any:
    if p.type == "categorical":
        return trial.suggest_categorical(name, list(p.choices or ()))
    if p.type == "int":
        return trial.suggest_int(name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)  # type: ignore[arg-type]
    return trial.suggest_float(name, p.low, p.high, step=p.step, log=p.log)  # type: ignore[arg-type]


# ---------------------------------------------------------------- claiming trials


def trials_counted(trials: list[FrozenTrial]) -> int:
    """Trials that use up n_trials: finished and running ones. A FAIL that was re-queued does not count; its retry does."""
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    return sum(t.state in COUNTED or (t.state == TrialState.FAIL and t.number not in retried) for t in trials)


def requeue(study: optuna.Study, trial: FrozenTrial) -> None:
    """Queue a retry of a trial whose worker died or was interrupted: same parameters, so the same run row."""
    history = [*trial.system_attrs.get("retry_history", []), trial.number]
    if len(history) > MAX_REQUEUES:
        return
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.WAITING, params=trial.params, distributions=trial.distributions,
        user_attrs={k: v for k, v in trial.user_attrs.items() if k not in ("run_status", "error")},
        system_attrs={**trial.system_attrs, "failed_trial": history[0], "retry_history": history},
    ))


_THREAD_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextmanager
def study_lock(engine: sa.Engine, name: str) -> Iterator[None]:
    """One worker at a time counts the study's trials and asks for the next one (threads, processes, machines)."""
    with _THREAD_LOCKS_GUARD:
        local = _THREAD_LOCKS.setdefault((str(engine.url), name), threading.Lock())
    with local:
        if engine.dialect.name == "sqlite":
            from filelock import FileLock

            with FileLock(f"{engine.url.database}.search-{name}.lock", timeout=600):
                yield
        elif engine.dialect.name == "postgresql":
            key = zlib.crc32(f"ablate-search:{name}".encode()) - 2**31
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": key})
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                    conn.commit()
        else:  # other servers: workers of one process are serialised, several processes may overshoot by one
            yield


def claim(study: optuna.Study, storage: optuna.storages.RDBStorage, engine: sa.Engine, n_trials: int,
          sampler: Callable[[int], optuna.samplers.BaseSampler] | None = None) -> optuna.Trial | None:
    """The next trial for this worker, or None when the study holds n_trials. Stale trials are failed and re-queued.

    `sampler(n)` gives the sampler for trial number n: seeded by n, a trial's draws do not depend on which
    worker (thread, process, machine) asks for it, and two workers never replay each other's draws.
    """
    with study_lock(engine, study.study_name), warnings.catch_warnings():
        # heartbeats are experimental, and meant for Study.optimize; this loop records them itself
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used", category=UserWarning)
        optuna.storages.fail_stale_trials(study)
        trials = study.get_trials(deepcopy=False)
        if trials_counted(trials) >= n_trials:
            return None
        if sampler is not None:
            study.sampler = sampler(len(trials))  # the number the next new trial gets (asked under the lock)
        trial = study.ask()  # pops a queued trial (a retry, or one enqueued by hand) before sampling a new one
        storage.record_heartbeat(trial._trial_id)  # Optuna's own heartbeat thread uses this private id too
        return trial


# ---------------------------------------------------------------- running a trial


class _EvalFollower:
    """Reports a run's new intermediate evals to its Optuna trial, keeps the heartbeat, and asks the pruner."""

    def __init__(self, engine: sa.Engine, run_id: int, storage: optuna.storages.RDBStorage, trial: optuna.Trial,
                 n_evals: int, heartbeat_seconds: float, stop: threading.Event | None):
        self.engine, self.run_id, self.storage, self.trial = engine, run_id, storage, trial
        self.n_evals, self.heartbeat_seconds, self.stop = n_evals, heartbeat_seconds, stop
        self.reported = 0
        self.last_beat = time.monotonic()
        self.pruned = False

    def beat(self) -> None:
        if time.monotonic() - self.last_beat >= self.heartbeat_seconds:
            self.storage.record_heartbeat(self.trial._trial_id)
            self.last_beat = time.monotonic()

    def report_new(self) -> int:
        """Report evals not yet reported; returns how many. The k-th eval of the run is Optuna step k."""
        run = store.get_run(self.engine, self.run_id)
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(store.Metric.step, store.Metric.elapsed_seconds, store.Metric.tokens, store.Metric.loss)
                .where(store.Metric.run_id == self.run_id, store.Metric.split == "eval").order_by(store.Metric.step)
            ).all()
        # the final eval (at the whole budget) is the run's result, not an intermediate value
        flops = run.flops_per_token or 0.0
        intermediate = [r for r in rows if bud.budget_fraction(run.budget_kind, run.budget_amount, r.elapsed_seconds,
                                                               r.step, r.tokens, flops) < 1 - 1e-9][: self.n_evals]
        fresh = intermediate[self.reported:]
        for k, r in enumerate(fresh, start=self.reported + 1):
            if math.isfinite(r.loss):
                self.trial.report(r.loss, step=k)
        self.reported += len(fresh)
        return len(fresh)

    def should_stop(self) -> bool:
        """True when the pruner says so (then `pruned` is set), or when this worker is told to stop."""
        if self.stop is not None and self.stop.is_set():
            return True
        self.beat()
        if self.report_new() and self.trial.should_prune():
            self.pruned = True
            return True
        return False


def _register(engine: sa.Engine, spec: SweepSpec, config: TrialConfig, spec_path: str | None) -> int:
    for attempt in range(3):
        try:
            _, (run_id,) = store.register_sweep(engine, spec, [config], spec_path=spec_path)
            return run_id
        except sa.exc.IntegrityError:  # another worker registered the same config at the same moment
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _link(engine: sa.Engine, study: optuna.Study, run: store.Run, number: int) -> None:
    """Point the run row at this trial, unless another trial of the study holds its result or is running it."""
    if run.study_name == study.study_name and run.study_trial is not None:
        if run.study_trial == number:
            return
        owner = next((t for t in study.get_trials(deepcopy=False) if t.number == run.study_trial), None)
        if owner is not None and owner.state in COUNTED:  # COMPLETE, PRUNED or RUNNING: that trial owns the run
            return
    elif run.study_name is not None:  # a run of another study stays that study's
        return
    store.update_run(engine, run.id, study_name=study.study_name, study_trial=number, trial_index=number)


def run_one(study: optuna.Study, storage: optuna.storages.RDBStorage, trial: optuna.Trial, spec: SweepSpec,
            opts: runner.RunOptions, *,
            spec_path: str | None = None, poll_seconds: float = 1.0, heartbeat_seconds: float = HEARTBEAT_SECONDS,
            stop: threading.Event | None = None) -> TrialOutcome:
    """Sample, register, train (or follow, or read) the trial's run, and tell the study how it went."""
    engine = store.connect(opts.db_url)
    try:
        config = suggest_trial(trial, spec)
    except ValueError as exc:  # e.g. heads that do not divide d_model: a point of the space with no valid trial
        trial.set_user_attr("run_status", "invalid")
        trial.set_user_attr("error", str(exc)[:1000])
        study.tell(trial, state=TrialState.FAIL)
        return TrialOutcome(trial.number, "FAIL", None, "invalid", None, dict(trial.params))
    try:
        run_id = _register(engine, spec, config, spec_path)
        trial.set_user_attr("run_id", run_id)
        trial.set_user_attr("fingerprint", config.fingerprint())
        run = store.get_run(engine, run_id)
        _link(engine, study, run, trial.number)
        follower = _EvalFollower(engine, run_id, storage, trial, len(spec.eval.at), heartbeat_seconds, stop)
        if store.is_live(run):  # the same config is training under another trial (or a dead worker's trainer): follow it
            _follow(engine, run_id, follower, poll_seconds)
            run = store.get_run(engine, run_id)
        if run.status not in store.FINISHED and not (stop is not None and stop.is_set()):
            status = runner.run_trial(run_id, opts, should_stop=follower.should_stop, poll_seconds=poll_seconds,
                                      statuses=store.OWED_UNSTARTED)
            if status == "preempted" and follower.pruned:
                store.update_run(engine, run_id, status="pruned", finished_at=store.utcnow())
            elif status == "running":  # another process claimed it first: follow that one
                _follow(engine, run_id, follower, poll_seconds)
        follower.report_new()  # evals logged after the last poll
        return _tell(study, trial, store.get_run(engine, run_id))
    except optuna.exceptions.UpdateFinishedTrialError:
        # our heartbeat lapsed and another worker failed and re-queued this trial: its retry reads the run row
        return TrialOutcome(trial.number, "FAIL", run_id, store.get_run(engine, run_id).status, None, dict(trial.params))
    except BaseException:
        _abandon(study, trial)
        raise


def _follow(engine: sa.Engine, run_id: int, follower: _EvalFollower, poll_seconds: float) -> None:
    """Wait for a run another process is training, reporting its evals; a prune stops it if it trains on this host."""
    while store.is_live(run := store.get_run(engine, run_id)):
        if follower.should_stop():
            if follower.pruned and run.host == socket.gethostname() and runner.pid_alive(run.pid):
                os.killpg(run.pid, signal.SIGTERM)  # the trainer checkpoints and records `preempted`
                deadline = time.monotonic() + 120
                while runner.pid_alive(run.pid) and time.monotonic() < deadline:
                    time.sleep(0.2)
                if store.get_run(engine, run_id).status == "preempted":
                    store.update_run(engine, run_id, status="pruned", finished_at=store.utcnow())
            return
        time.sleep(poll_seconds)


def _tell(study: optuna.Study, trial: optuna.Trial, run: store.Run) -> TrialOutcome:
    params = dict(trial.params)
    trial.set_user_attr("run_status", run.status)
    if run.status == "completed" and run.final_eval_loss is not None and math.isfinite(run.final_eval_loss):
        study.tell(trial, run.final_eval_loss)
        return TrialOutcome(trial.number, "COMPLETE", run.id, run.status, run.final_eval_loss, params)
    if run.status == "pruned":
        frozen = study.tell(trial, state=TrialState.PRUNED)
        return TrialOutcome(trial.number, "PRUNED", run.id, run.status, frozen.value, params)
    if run.error:
        trial.set_user_attr("error", run.error[-1000:])
    frozen = study.tell(trial, state=TrialState.FAIL)  # oom, diverged and failed runs are results: the study goes on
    if run.status in ("preempted", "running", "pending"):  # stopped from outside (or by our own stop): resume later
        requeue(study, frozen)
    return TrialOutcome(trial.number, "FAIL", run.id, run.status, None, params)


def _abandon(study: optuna.Study, trial: optuna.Trial) -> None:
    """This worker is stopping mid-trial (Ctrl-C, an error): fail the trial and queue its retry, if the DB lets us."""
    try:
        frozen = study.tell(trial, state=TrialState.FAIL)
        requeue(study, frozen)
    except Exception:  # noqa: BLE001, S110 - the heartbeat expires and the next worker re-queues it instead
        pass


# ---------------------------------------------------------------- the search loop


def run_worker(spec: SweepSpec, storage: optuna.storages.RDBStorage, opts: runner.RunOptions, n_trials: int, *,
               seed: int | None, spec_path: str | None = None, poll_seconds: float = 1.0,
               heartbeat_seconds: float = HEARTBEAT_SECONDS, on_trial: Callable[[TrialOutcome], None] | None = None,
               stop: threading.Event | None = None) -> list[TrialOutcome]:
    """One worker: claim a trial, run it, tell it; until the study holds n_trials (or `stop` is set).

    With a seed, trial n samples with seed + n (reproducible for one worker, distinct across workers).
    """
    study = load_study(spec, storage, seed)
    engine = store.connect(opts.db_url)
    outcomes = []
    while not (stop is not None and stop.is_set()):
        trial = claim(study, storage, engine, n_trials,
                      sampler=None if seed is None else lambda n: make_sampler(spec.search, seed + n))
        if trial is None:
            break
        outcome = run_one(study, storage, trial, spec, opts, spec_path=spec_path, poll_seconds=poll_seconds,
                          heartbeat_seconds=heartbeat_seconds, stop=stop)
        outcomes.append(outcome)
        if on_trial is not None:
            on_trial(outcome)
    return outcomes


def run_search(spec: SweepSpec | str | Path, db_url: str | None = None, opts: runner.RunOptions | None = None, *,
               workers: int = 1, n_trials: int | None = None, seed: int | None = None, poll_seconds: float = 1.0,
               on_trial: Callable[[TrialOutcome], None] | None = None, stop: threading.Event | None = None,
               heartbeat_seconds: int = HEARTBEAT_SECONDS, grace_seconds: int = GRACE_SECONDS) -> list[TrialOutcome]:
    """Run (or continue) a spec's search here with `workers` threads; returns the outcomes of the trials run here.

    The study is created first (once, before any worker). n_trials defaults to the spec's; trials already
    in the study count, so a stopped search continues where it stopped. On a GPU machine each worker gets
    its own GPUs (`budget.gpus` each) unless `opts.gpu_ids` is set.
    """
    spec_path = str(spec) if isinstance(spec, (str, Path)) else None
    spec = load_spec(spec) if isinstance(spec, (str, Path)) else spec
    url = store.resolve_url(db_url)
    storage = open_storage(url, create=True, heartbeat_seconds=heartbeat_seconds, grace_seconds=grace_seconds)
    create_study(spec, url, spec_path=spec_path, storage=storage)  # the storage is shared by the worker threads
    total = planned_trials(spec.search, n_trials)
    seed = default_seed(spec.name) if seed is None else seed
    opts = replace(opts or runner.RunOptions(), db_url=url)
    gpu_groups = _gpu_groups(workers, spec.budget.gpus) if opts.gpu_ids is None else None
    stop = stop or threading.Event()

    def worker(i: int) -> list[TrialOutcome]:
        worker_opts = replace(opts, gpu_ids=gpu_groups[i]) if gpu_groups else opts
        return run_worker(spec, storage, worker_opts, total, seed=seed, spec_path=spec_path,
                          poll_seconds=poll_seconds, heartbeat_seconds=heartbeat_seconds, on_trial=on_trial, stop=stop)

    if workers <= 1:
        return worker(0)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="search-worker") as pool:
        futures = [pool.submit(worker, i) for i in range(workers)]
        try:
            results = [f.result() for f in futures]
        except BaseException:
            stop.set()  # the other workers stop their trainers (checkpointed) and re-queue their trials
            for f in futures:
                f.exception()
            raise
    return sorted((o for r in results for o in r), key=lambda o: o.number)


def _gpu_groups(workers: int, gpus_per_trial: int) -> list[tuple[int, ...]] | None:
    """Disjoint GPU ids per worker when this machine has enough GPUs for all of them; None on CPU."""
    if workers <= 1:
        return None
    import torch

    count = torch.cuda.device_count()
    if count < workers * gpus_per_trial:
        if count:
            raise AblateError(f"{workers} workers x {gpus_per_trial} GPUs per trial need {workers * gpus_per_trial} GPUs; "
                              f"this machine has {count}: use --workers {max(1, count // gpus_per_trial)}")
        return None
    return [tuple(range(i * gpus_per_trial, (i + 1) * gpus_per_trial)) for i in range(workers)]


# ---------------------------------------------------------------- report


@dataclass
class SearchReport:
    out: Path
    files: list[Path]
    counts: dict[str, int]
    best: dict[str, Any] | None
    importances: dict[str, float] | None


def build_search_report(name: str, db_url: str | None = None, out: Path | None = None) -> SearchReport:
    """Best trial, parameter importances, optimisation history and slice plots of a study, into results/reports/NAME/."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    storage = open_storage(db_url)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = optuna.get_all_study_names(storage)
        raise AblateError(f"no search study named {name!r} in the results DB{did_you_mean(name, names)}; "
                          f"known: {', '.join(names) or 'none yet'}") from None
    out = out or Path("results/reports") / name
    out.mkdir(parents=True, exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials) for s in TrialState if any(t.state == s for t in trials)}
    completed = [t for t in trials if t.state == TrialState.COMPLETE]
    best = None
    if completed:
        b = study.best_trial
        best = {"number": b.number, "value": b.value, "params": b.params, "run_id": b.user_attrs.get("run_id")}
    importances = None
    if len(completed) >= 2:
        try:
            importances = optuna.importance.get_param_importances(study)
        except Exception:  # noqa: BLE001 - too few distinct values, a single parameter, ...: no importances then
            importances = None
    files: list[Path] = []
    plots: list[tuple[str, Callable[[], Any]]] = [
        ("optimization_history", lambda: optuna.visualization.matplotlib.plot_optimization_history(study)),
        ("slice", lambda: optuna.visualization.matplotlib.plot_slice(study)),
    ]
    if importances:
        plots.append(("param_importances", lambda: optuna.visualization.matplotlib.plot_param_importances(study)))
    if any(t.intermediate_values for t in trials):
        plots.append(("intermediate_values", lambda: optuna.visualization.matplotlib.plot_intermediate_values(study)))
    for stem, plot in plots:
        if not completed and stem != "intermediate_values":
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental plots; matplotlib's notes on single-valued axes
            axes = plot()
        fig = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
        path = out / f"{stem}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files.append(path)
    df = study.trials_dataframe()
    if len(df):
        df.to_csv(out / "trials.csv", index=False)
        files.append(out / "trials.csv")
    summary = out / "summary.md"
    summary.write_text(_summary_markdown(study, trials, counts, best, importances))
    files.insert(0, summary)
    return SearchReport(out=out, files=files, counts=counts, best=best, importances=importances)


def _summary_markdown(study: optuna.Study, trials: list[FrozenTrial], counts: dict[str, int],
                      best: dict[str, Any] | None, importances: dict[str, float] | None) -> str:
    lines = [f"# Search {study.study_name}", "",
             "Trials: " + ", ".join(f"{n} {s.lower()}" for s, n in counts.items()), ""]
    if best:
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in best["params"].items())
        lines += [f"Best: trial {best['number']} (run {best['run_id']}), final eval loss {best['value']:.4f}: {params}", ""]
    if importances:
        lines += ["| parameter | importance |", "| --- | --- |"]
        lines += [f"| {k} | {v:.3f} |" for k, v in importances.items()] + [""]
    names = sorted({k for t in trials for k in t.params})
    lines += ["| trial | state | run | " + " | ".join(names) + " | final eval loss (pruned: last eval) |",
              "| --- | --- | --- | " + " | ".join("---" for _ in names) + " | --- |"]
    for t in trials:
        vals = [t.params.get(k) for k in names]
        shown = ["" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in vals]
        value = "" if t.value is None else f"{t.value:.4f}"
        if t.state == TrialState.PRUNED and t.intermediate_values:
            value += f" (eval {max(t.intermediate_values)})"
        lines.append(f"| {t.number} | {t.state.name.lower()} | {t.user_attrs.get('run_id', '')} | "
                     + " | ".join(shown) + f" | {value} |")
    return "\n".join(lines) + "\n"
