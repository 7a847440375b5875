"""Flow `sweep(spec)`: check the sweep's data, register its runs and dispatch one flow `trial(run_id)` per run
still owed.

Locally the trials run as nested flow runs, one per GPU slot at a time (sequential on CPU); on a
cluster (`use_deployments=True`) each goes to the `trial/<hardware>` deployment of the spec's work
pool (see `flows/dispatch.py`: dead machines, cancels, pools without a worker).

Prefect states say what happened: a trial flow whose run failed ends Failed with the reason, a cancelled one
Cancelled; `oom` and `diverged` are results (the study's OOM cells), so their trial flows end Completed with
the status as their result. The sweep flow ends Failed when any of its trials failed (so `prefect deployment
run --watch` exits non-zero), Cancelled when it was cancelled, else Completed.
"""

from __future__ import annotations

import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Cancelled

from ablate import runner, store
from ablate.config.fusion import FUSE_MODES
from ablate.config.launch import LaunchOptions, launch_options
from ablate.config.errors import AblateError, one_line
from ablate.runner.keeper import StudyKeeper, keep_final
from flows.health import say_trial
from flows.hosts import first_error, owed_report, tagged


class TrialFailed(Exception):
    """A trial's run ended `failed` (the message is the first line of its error)."""


class TrialsFailed(Exception):
    """Some of a sweep's trials ended `failed`."""


# No `log_prints` on these flows: Prefect would send every print() to the run's log, including the disassembly
# that dill prints to a captured stdout to find a function's globals while `datasets` hashes the token cache's
# map functions (110 lines of bytecode per sweep, and the scan then sees nothing). What the flows say goes through
# get_run_logger(); warnings of the runner go to the worker's stderr.
@flow(name="trial")
def trial(run_id: int, launch: LaunchOptions | None = None, retry_failed: bool = False,
          database: str | None = None, run_ids: list[int] | None = None) -> Any:
    """Claim one run and train it (resuming from its checkpoint); its status. A run another process holds,
    finished or that a user cancelled is left alone. (`retry_failed` is kept for older deployments: the sweep
    flow makes cancelled runs it retries pending before dispatching them.) `launch`: the sweep's LaunchOptions,
    one parameter (ablate/config/launch.py); its `warm` forks the trainer from this process's warm helper
    (ablate/runner/warm.py), which the sweep flow's local trials share, while a deployment's trial runs alone in its
    flow-run process, where a helper would cost more than it saves, so it starts cold (the default here).
    `database`: the id of the sweep's results DB, given by a cluster sweep: this host's DB (`launch.db_url` or
    ABLATE_DB_URL) must be that one, or the trial fails before touching any database. `run_ids`: a fused group
    (`run_id` first; ablate/runner/groups.py) claimed and trained in one trainer process (runner.run_group):
    {run id: status}, Failed when any member failed, Cancelled when any was cancelled, as of one run.
    An error says this host first (flows/hosts.py), so that the sweep sends the run elsewhere."""
    ids = list(run_ids) if run_ids else [run_id]
    runs = f"run {run_id}" if len(ids) == 1 else f"runs {ids}"
    opts = launch or LaunchOptions(warm=False)
    claimed: list[bool] = []
    try:
        if database is not None:
            opts = opts.but(db_url=runner.cluster_db_url(opts.db_url, database))
        statuses = runner.run_group(ids, opts, on_claimed=lambda: claimed.append(True))
    except Exception as exc:  # a host-level fault (no DB, a missing driver, a full or read-only disk), before the
        # runs are claimed or after (the claims are then given back): the sweep sends the runs elsewhere
        message = tagged(f"{runs}: {one_line(exc, 'the worker log')}")
        say_trial(False, message)  # `ablate worker` drains a host that fails trials in a row (flows/health.py)
        raise TrialFailed(message) from exc
    if claimed:  # a run left alone (held or finished elsewhere) says nothing of this host's health
        say_trial(True)
    get_run_logger().info("%s: %s", runs, statuses[run_id] if len(ids) == 1 else statuses)
    failed = [rid for rid in ids if statuses[rid] == "failed"]
    if failed:
        engine = store.connect(opts.db_url)
        raise TrialFailed(tagged("; ".join(f"run {rid} failed: {_reason(engine, rid)}" for rid in failed)))
    cancelled = [rid for rid in ids if statuses[rid] == "cancelled"]
    if cancelled:
        return Cancelled(message=f"run {cancelled[0]} was cancelled" if len(cancelled) == 1
                         else f"runs {cancelled} were cancelled")
    return statuses[run_id] if len(ids) == 1 else statuses


TRIAL_PARAMETERS = frozenset(inspect.signature(trial.fn).parameters)  # what a trial deployment may store


def _reason(engine: Any, run_id: int) -> str:
    error = (store.get_run(engine, run_id).error or "").strip()
    return error.splitlines()[0][:300] if error else "no error recorded"


def _cancel_sweep(flow: Any, flow_run: Any, state: Any) -> None:
    """on_cancellation: the sweep's owed runs and waiting trial flow runs are cancelled (flows/cancel.py), also
    when the flow's process was killed before it could do so itself (Prefect runs this hook in the worker)."""
    from prefect.logging.loggers import flow_run_logger

    from flows.cancel import cancel_sweep_of

    done = cancel_sweep_of(flow_run.id)
    if done:
        flow_run_logger(flow_run).warning("%s", done)


@flow(name="sweep", on_cancellation=[_cancel_sweep])
def sweep(spec: str, db_url: str | None = None, artifacts: str = "results/artifacts", gpu_slots: int = 1,
          retry_failed: bool = False, use_deployments: bool = False, checkpoint_every: float | None = None,
          memory_cap_mb: float | None = None, threads: int | None = None, budget: str | None = None,
          source: str | None = None, vocab_size: int | None = None, name: str | None = None,
          merge: bool = False, prepare_data: bool = True, holdout: int | None = None, gpus: int | None = None,
          hardware: str | None = None, set: list[str] | None = None,  # noqa: A002 - the parameter users type
          registered: runner.Registration | None = None, fuse: str | None = None) -> Any:
    """Run every trial of a sweep file that is not finished yet; returns {run id: status}.

    Overrides without editing the file (`prefect deployment run sweep/NAME --param budget=10m`): `budget`
    ("10m", "steps=200", ...), `source` (the dataset; a local one where the spec evaluates on a named split holds
    out documents instead), `holdout` (N documents), `vocab_size`, `gpus` (per trial; the global batch is kept),
    `hardware` (the profile and work pool), `set` (any field: `["defaults.lr=1e-3", "grid.0.d_model=[64,128]"]`);
    the sweep is then named after them unless `name` is given. `merge`: add the trials to a sweep of the same name
    that holds other trials' results.
    `prepare_data`: build the token caches here first (a dataset problem fails the sweep before any trial
    starts). `threads`: torch threads per trainer process; default, the cores other jobs leave free, shared by
    the trials at once. `registered`: the sweep as `ablate sweep run` registered it from `spec` a moment before
    (its data built, its runs written): the flow runs those runs, without reading and registering the spec again
    (the overrides, `merge` and `prepare_data` are then what that registration used). `fuse`: train the runs
    in fused groups (off, seeds, shapes, auto: ablate/config/fusion.py), here or a group to one worker of the pool;
    default, the spec's `fuse:`.
    """
    log = get_run_logger()
    try:
        opts = launch_options(dict(db_url=db_url, artifacts=artifacts, checkpoint_every=checkpoint_every,
                                   memory_cap_mb=memory_cap_mb, threads=threads), where="the sweep flow's parameters: ")
        if registered is None:
            registered = _register(log, spec, opts, use_deployments, merge, prepare_data, {
                "budget": budget, "source": source, "holdout": holdout, "vocab_size": vocab_size, "gpus": gpus,
                "hardware": hardware, "name": name, "set": set})
        if fuse is not None:
            registered = registered.model_copy(update={"fuse": _fuse_mode(fuse)})
        return _sweep(log, registered, opts, gpu_slots, retry_failed, use_deployments)
    except (AblateError, TrialsFailed) as exc:  # the reason as a log line: `prefect deployment run --watch` shows it
        log.error("%s", exc)
        raise


def _register(log: Any, spec: str, opts: LaunchOptions, use_deployments: bool, merge: bool,
              prepare_data: bool, overrides: dict[str, Any]) -> runner.Registration:
    """Check the spec (and its data, with `prepare_data`) and register its runs."""
    hardware = overrides["hardware"]
    if use_deployments and hardware:  # a pool `ablate deploy` may not have made: said before anything is registered
        from flows.dispatch import check_deployment

        check_deployment(hardware, TRIAL_PARAMETERS)
    parsed, sweep_id, run_ids = runner.register(spec, opts.db_url, say=log.info, overrides=overrides, merge=merge,
                                                artifacts=opts.artifacts if prepare_data else None)
    return runner.Registration.of(parsed, sweep_id, run_ids)


def _sweep(log: Any, registered: runner.Registration, opts: LaunchOptions, gpu_slots: int,
           retry_failed: bool, use_deployments: bool) -> Any:
    """Run the registered sweep's runs that are owed, here or on its pool."""
    engine = store.connect(opts.db_url)
    run_ids, name = registered.run_ids, registered.name
    if retry_failed:  # the user's word: run cancelled runs again (trial flows never claim a cancelled run)
        runner.uncancel(engine, run_ids)
    todo = runner.runs_to_do(engine, registered.sweep_id, run_ids, retry_failed=retry_failed)
    log.info("sweep %s: %d trials, %d to run", name, len(run_ids), len(todo))
    keeper = StudyKeeper.start_for(engine, name, log)  # a big sweep's study kept as it trains, for the dashboard
    try:
        done = _train(log, registered, opts, gpu_slots, retry_failed, use_deployments, engine, todo)
    finally:
        if keeper is not None:
            keeper.stop()
    keep_final(log, engine, name, keeper)
    return _final(done, engine, name)


def _train(log: Any, registered: runner.Registration, opts: LaunchOptions, gpu_slots: int, retry_failed: bool,
           use_deployments: bool, engine: Any, todo: list[int]) -> Any:
    """The owed runs trained, here or on the pool, and an adaptive sweep's race run to its end."""
    run_ids, name = registered.run_ids, registered.name
    if use_deployments:
        from flows.cancel import label_sweep_flow_run
        from flows.dispatch import check_deployment, dispatch_to_pool, ride_out

        ride_out(lambda: check_deployment(registered.hardware, TRIAL_PARAMETERS), log, "reading the trial deployment")
        # before any dispatch: a cancel from now on finds the sweep
        ride_out(lambda: label_sweep_flow_run(engine, name), log, "labelling the sweep flow run")

        # runs training under an earlier sweep flow run of this sweep (one that died: a run of the deployment
        # again resumes the sweep) are watched, not dispatched twice
        attach = [r.id for r in runner.sweep_runs(engine, name)
                  if r.id in run_ids and r.id not in todo and r.status == "running"]
        done = dispatch_to_pool(registered.hardware, todo, opts, engine, log, attach=attach, fuse=registered.fuse)
    else:
        done = _run_here(registered, todo, opts, gpu_slots, engine)
    from ablate.runner.race import is_adaptive

    if is_adaptive(engine, name):  # the claims decide the next seeds, round after round
        def run(ids: list[int]) -> Any:
            if use_deployments:
                return dispatch_to_pool(registered.hardware, ids, opts, engine, log, fuse=registered.fuse)
            return _run_here(registered, ids, opts, gpu_slots, engine)

        _race(log, engine, name, done, run, retry_failed)
    return done


def _race(log: Any, engine: Any, name: str, done: Any, run: Any, retry_failed: bool) -> None:
    """Round after round of an adaptive sweep: its decisions from the DB, then the seeds they ask for, run here or
    on the pool, until the race is over (or the user stops the sweep). Runs another runner trains are waited for."""
    import time

    from ablate.config.settings import environment
    from ablate.runner.race import next_round, say_round

    while not runner.STOP.is_set():
        state = next_round(engine, name, retry_failed)
        say_round(state, log.info, name)
        if state.over is not None:
            return
        if state.owed:
            more = run(state.owed)
            done.results.update(more.results)
            done.dispatches.update(more.dispatches)
            done.failures.update(more.failures)
        else:  # the round's last runs train under another runner
            time.sleep(environment().dispatch_poll_seconds)


def _run_here(registered: runner.Registration, todo: list[int], opts: LaunchOptions, gpu_slots: int,
              engine: Any) -> Any:
    """The trials as nested flow runs of this process: one per slot at a time, each slot its own GPUs; under
    `fuse`, each fused group as one flow run in one slot (ablate/runner/groups.py)."""
    from flows.dispatch import Dispatched

    gpus_per_trial = registered.gpus
    slots = max(1, gpu_slots // gpus_per_trial)
    groups = runner.plan_groups(engine, todo, registered.fuse, runner.visible_gpus())
    opts = opts.but(threads=opts.threads or runner.default_threads(min(slots, max(1, len(groups))), gpus_per_trial))
    warm = len(groups) > 1  # one helper for all of them (ablate/runner/warm.py); a single trial starts cold
    done = Dispatched()

    def one(group: list[int], gpu_ids: list[int] | None) -> None:
        # a failed trial is in its row, read below; one that failed before claiming it says why in its state
        launch = opts.but(gpu_ids=gpu_ids, warm=warm)
        state = trial(group[0], launch, run_ids=group if len(group) > 1 else None, return_state=True)
        for rid in group:
            done.dispatches[rid] += 1
            if state.is_failed():
                done.failures[rid] = [first_error(state)]
            done.results[rid] = store.get_run(engine, rid).status

    if slots == 1:
        for group in groups:
            if runner.STOP.is_set():  # the user stopped the sweep: no new trial starts
                break
            one(group, None)
        return done
    queue = list(groups)

    def drain(gpu_ids: list[int] | None) -> None:  # one trial per slot at a time, each with its CUDA_VISIBLE_DEVICES
        while not runner.STOP.is_set():
            try:
                group = queue.pop(0)  # list.pop is atomic under the GIL
            except IndexError:
                return
            one(group, gpu_ids)

    with ThreadPoolExecutor(max_workers=slots) as pool:  # the slots take the GPU groups in turn (--trials-per-gpu)
        for f in [pool.submit(drain, gpu_ids) for gpu_ids in runner.slot_devices(slots, gpus_per_trial,
                                                                                 runner.visible_gpus())]:
            f.result()
    done.results = {rid: done.results[rid] for rid in todo if rid in done.results}
    return done


def _fuse_mode(fuse: str) -> str:
    if fuse not in FUSE_MODES:
        raise AblateError(f"fuse: {fuse!r} is not one of {', '.join(FUSE_MODES)}")
    return fuse


def _final(done: Any, engine: Any, name: str) -> Any:
    """The sweep flow's end: Failed when trials failed (their reasons in the message) or runs are still owed
    when it stopped dispatching (never Completed with a run untrained: each owed run, the hosts that failed it
    and their first errors), Cancelled when any was cancelled, else the statuses. A sweep the user stopped
    (runner.STOP) leaves its owed runs for the next run of the sweep."""
    results = done.results
    failed = [rid for rid, status in results.items() if status == "failed"]
    owed = {} if runner.STOP.is_set() else {rid: s for rid, s in results.items() if s in runner.UNSETTLED and (
        s != "running" or runner.owed(store.get_run(engine, rid)))}  # one training under another runner is not
    if failed or owed:
        said = []
        if failed:
            reasons = "; ".join(f"run {rid}: {_reason(engine, rid)}" for rid in failed[:5])
            more = "; ..." if len(failed) > 5 else ""
            said.append(f"{len(failed)} of {len(results)} trials failed ({reasons}{more})")
        if owed:
            said.append(f"{len(owed)} run(s) still owed, never finished: "
                        + owed_report(dict(list(owed.items())[:5]), done.failures, done.dispatches)
                        + ("; ..." if len(owed) > 5 else ""))
        raise TrialsFailed(f"sweep {name}: {'; '.join(said)}. `ablate sweep status {name}` lists them")
    cancelled = [rid for rid, status in results.items() if status == "cancelled"]
    if cancelled:
        message = f"sweep {name}: {len(cancelled)} trials cancelled"
        from flows.cancel import end_cancelled

        end_cancelled(message)  # on a worker: ended by Prefect's own cancellation, without an error logged
        return Cancelled(message=message)  # no data: Prefect reads a Cancelled state's data as a result record
    return results
