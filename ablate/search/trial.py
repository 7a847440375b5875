"""Running one trial: sample its config, register (or find) its run row and link it to the trial, train, follow or
read the run, and tell Optuna how it went (`TrialOutcome`); a worker stopping mid-trial fails and re-queues it."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.trial import TrialState

from ablate import runner, store
from ablate.config import SweepSpec, TrialConfig
from ablate.plugins.stored import records_of
from ablate.search.claims import COUNTED, requeue
from ablate.search.follower import EvalFollower, follow_evals
from ablate.search.gate import Gate
from ablate.search.space import suggest_trial
from ablate.search.study import HEARTBEAT_SECONDS


@dataclass(frozen=True)
class TrialOutcome:
    """What one Optuna trial came to: its state in the study and its run's status."""

    number: int
    state: str  # COMPLETE, PRUNED or FAIL
    run_id: int | None
    run_status: str  # completed, pruned, oom, diverged, failed, preempted, cancelled, invalid
    value: float | None
    params: dict[str, Any] = field(default_factory=dict)


def register_trial(engine: sa.Engine, spec: SweepSpec, config: TrialConfig, spec_path: str | None) -> int:
    for attempt in range(3):
        try:
            _, (run_id,) = store.register_sweep(engine, spec, [config], spec_path=spec_path, plugins=records_of([config]))
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
            opts: runner.LaunchOptions, *,
            spec_path: str | None = None, poll_seconds: float = 1.0, heartbeat_seconds: float = HEARTBEAT_SECONDS,
            stop: threading.Event | None = None, gate: Gate | None = None) -> TrialOutcome:
    """Sample, register, train (or follow, or read) the trial's run, and tell the study how it went. `gate`: the
    run trains fused with other workers' (ablate/search/gate.py)."""
    engine = store.connect(opts.db_url)
    try:
        config = suggest_trial(trial, spec)
    except ValueError as exc:  # e.g. heads that do not divide d_model: a point of the space with no valid trial
        trial.set_user_attr("run_status", "invalid")
        trial.set_user_attr("error", str(exc)[:1000])
        study.tell(trial, state=TrialState.FAIL)
        return TrialOutcome(trial.number, "FAIL", None, "invalid", None, dict(trial.params))
    try:
        run_id = register_trial(engine, spec, config, spec_path)
        trial.set_user_attr("run_id", run_id)
        trial.set_user_attr("fingerprint", config.fingerprint())
        run = store.get_run(engine, run_id)
        _link(engine, study, run, trial.number)
        follower = EvalFollower(engine, run_id, storage, trial, len(spec.eval.at), heartbeat_seconds, stop)
        if store.is_live(run):  # the same config is training under another trial (or a dead worker's trainer): follow it
            follow_evals(engine, run_id, follower, poll_seconds)
            run = store.get_run(engine, run_id)
        if run.status not in store.FINISHED and not (stop is not None and stop.is_set()):
            status = (gate.train(run_id, follower, opts, poll_seconds) if gate is not None else
                      runner.run_trial(run_id, opts, should_stop=follower.should_stop, poll_seconds=poll_seconds,
                                       statuses=store.OWED_UNSTARTED))
            if status == "preempted" and follower.pruned:
                store.update_run(engine, run_id, status="pruned", finished_at=store.utcnow())
            elif status == "running":  # another process claimed it first: follow that one
                follow_evals(engine, run_id, follower, poll_seconds)
        follower.report_new()  # evals logged after the last poll
        return _tell(study, trial, store.get_run(engine, run_id))
    except optuna.exceptions.UpdateFinishedTrialError:
        # our heartbeat lapsed and another worker failed and re-queued this trial: its retry reads the run row
        return TrialOutcome(trial.number, "FAIL", run_id, store.get_run(engine, run_id).status, None, dict(trial.params))
    except BaseException:
        _abandon(study, trial)
        raise


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
