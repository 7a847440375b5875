"""Claiming trials: which trials use up n_trials, re-queueing a dead or interrupted worker's trial, the study lock
(threads, processes, machines), and `claim`, which hands a worker its next trial under that lock."""

from __future__ import annotations

import fcntl
import os
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import sqlalchemy as sa
from optuna.trial import FrozenTrial, TrialState

from ablate.config.errors import AblateError

MAX_REQUEUES = 2  # a trial whose worker died is re-queued at most this many times
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)


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


@contextmanager
def vanishing_lock(path: Path, timeout: float) -> Iterator[None]:
    """An exclusive lock on the file `path` that leaves no file behind: the holder removes it before letting go,
    and a process that locked a file since removed tries again (its lock guards nothing). A killed holder's lock
    is released with the process; its file is reused by the next one."""
    deadline = time.monotonic() + timeout
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"another search worker held {path} for {timeout:g} s") from None
                    time.sleep(0.05)
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            if current is not None and (current.st_ino, current.st_dev) == (os.fstat(fd).st_ino, os.fstat(fd).st_dev):
                break  # the lock is on the file the path names: ours
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder removed it meanwhile: lock the path's new file
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # while still holding it: whoever waits on this file tries again
        os.close(fd)


_THREAD_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextmanager
def study_lock(engine: sa.Engine, name: str) -> Iterator[None]:
    """One worker at a time counts the study's trials and asks for the next one (threads, processes, machines)."""
    with _THREAD_LOCKS_GUARD:
        local = _THREAD_LOCKS.setdefault((str(engine.url), name), threading.Lock())
    with local:
        if engine.dialect.name == "sqlite":
            with vanishing_lock(Path(f"{engine.url.database}.search-{name}.lock"), timeout=600):
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
        take_over_dead(study, storage, engine)
        trials = study.get_trials(deepcopy=False)
        if trials_counted(trials) >= n_trials:
            return None
        if sampler is not None:
            study.sampler = sampler(len(trials))  # the number the next new trial gets (asked under the lock)
        trial = study.ask()  # pops a queued trial (a retry, or one enqueued by hand) before sampling a new one
        storage.record_heartbeat(trial._trial_id)  # Optuna's own heartbeat thread uses this private id too
        return trial


def take_over_dead(study: optuna.Study, storage: optuna.storages.BaseStorage, engine: sa.Engine) -> list[int]:
    """RUNNING trials whose run's trainer is gone by the sweeps' rule (the run `running` with a stale heartbeat, or
    its processes gone from this host: store.is_live) are failed and re-queued, so a live worker trains them (from
    their checkpoint) instead of counting them as running; their numbers. Optuna's own heartbeat rule (a worker
    silent for the grace period) still catches a worker that died before its trainer started."""
    from ablate import store

    taken = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        run_id = trial.user_attrs.get("run_id")
        if run_id is None:
            continue
        try:
            run = store.get_run(engine, run_id)
        except AblateError:  # a row deleted meanwhile: Optuna's heartbeat rule decides
            continue
        if run.status != "running" or store.is_live(run):
            continue
        try:
            storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        except RuntimeError:  # its worker told it meanwhile: not dead after all
            continue
        requeue(study, trial)
        taken.append(trial.number)
    return taken


def unfinished(study: optuna.Study) -> int:
    """Trials of the study still running: a worker that finds n_trials counted waits for these (one may die and be
    re-queued) rather than end the search with them unfinished."""
    return len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
